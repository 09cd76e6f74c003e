"""`python tests/simulate.py NODE [gpuhook plan options]`: `gpuhook plan` on a simulated node,
from the checkout. NODE is one of the tests' fake hosts (tests/fakes/fakehost.py SCENARIOS:
nvidia, amd, intel, nvidia+intel, nvidia-full, mi300, intel-sriov, gpu-operator, gke, bmc,
cpu), built in a temporary directory and given to `gpuhook plan --root`. A development entry
point: the fakes are not installed, and on a node `gpuhook plan --root DIR` reads a real or
captured host root."""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]  # gpuhook from this checkout, and the tests' fakes

from fakes import fakehost  # noqa: E402
from gpuhook.cli import main as gpuhook  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in fakehost.SCENARIOS:
        named = f"{argv[0]}: unknown node" if argv else "no node named"
        print(f"simulate: {named}; choose from {', '.join(fakehost.SCENARIOS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpuhook-sim-") as root:
        fakehost.build(root, argv[0], mknod=False)
        return gpuhook(["plan", "--root", root, *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
