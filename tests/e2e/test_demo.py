"""`make demo` runs and shows what it promises."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, needs_runc


@needs_runc
def test_demo_runs_real_containers():
    r = subprocess.run([sys.executable, "tests/demo.py"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "CPU-only node" in out                        # 1. this machine
    assert "nvidia: 8 device(s), driver 550.54.14" in out  # 2. the simulated node
    assert "GPUHOOK_ACCELERATOR=nvidia" in out             # 3 and 4
    assert "/dev/nvidia0  crw-rw-rw- 195, 0" in out
    assert "No such device or address" in out
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in out
    assert "GPUHOOK_ACCELERATOR=<unset: run on CPU>" in out  # 5. this machine
    assert '"decision":"no-gpu"' in out and '"decision":"injected"' in out
