"""Builds gpuhook-hook, the small static helper the createContainer hooks run (gpuhook/hook/),
into the package; everything else is in pyproject.toml."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithHook(build_py):
    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "gpuhook", "hook", "gpuhook-hook")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run(["sh", os.path.join("gpuhook", "hook", "build.sh"), out], check=True)


setup(cmdclass={"build_py": BuildWithHook})
