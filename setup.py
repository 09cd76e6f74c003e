"""Builds gpuhook's two small static programs into the package before it is copied: the
createContainer hooks' helper (gpuhook/hook/) and the runtime's front (gpuhook/runtime/, which
pyproject.toml's script-files also installs as bin/gpuhook-runtime). Everything else is in
pyproject.toml."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from distutils.command.build_scripts import build_scripts  # setuptools provides distutils

# source -> the program, next to it in the package (and so in the source tree, as `make` builds it)
PROGRAMS = {
    os.path.join("gpuhook", "hook", "gpuhook-hook.c"): os.path.join("gpuhook", "hook", "gpuhook-hook"),
    os.path.join("gpuhook", "runtime", "gpuhook-runtime.c"): os.path.join("gpuhook", "runtime", "gpuhook-runtime"),
}


class BuildWithPrograms(build_py):
    def run(self):
        for src, out in PROGRAMS.items():
            subprocess.run(["sh", os.path.join("gpuhook", "hook", "build.sh"), out, src], check=True)
        super().run()


class CopyPrograms(build_scripts):
    """The scripts are programs: copied as they are (distutils would read them as text)."""

    def copy_scripts(self):
        self.mkpath(self.build_dir)
        outfiles = []
        for script in self.scripts:
            out = os.path.join(self.build_dir, os.path.basename(script))
            self.copy_file(script, out)
            os.chmod(out, 0o755)
            outfiles.append(out)
        return outfiles, outfiles


setup(cmdclass={"build_py": BuildWithPrograms, "build_scripts": CopyPrograms})
