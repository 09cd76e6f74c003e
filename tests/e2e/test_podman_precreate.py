"""podman's precreate hook stage: `gpuhook precreate` edits the spec podman hands it (root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import is_root, nodes_of, requires
from fakes import bundle

pytestmark = requires(bool(is_root() and shutil.which("podman") and shutil.which("runc") and bundle.find_busybox()),
                      "needs root, podman, runc and busybox-static (make test sets them up)")

SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=${GPUHOOK_ACCELERATOR:-none}; cat /dev/nvidia0 2>&1; true")


def run_podman(tmp_path, host_root: str, annotations: dict | None = None) -> subprocess.CompletedProcess:
    hooks = tmp_path / "hooks.d"
    hooks.mkdir(exist_ok=True)
    config = tmp_path / "gpuhook.toml"
    config.write_text(f'host_root = "{host_root}"\nlog_file = "{tmp_path}/gpuhook.log"\n')
    gpuhook = os.path.join(os.path.dirname(sys.executable), "gpuhook")
    (hooks / "gpuhook.json").write_text(json.dumps({
        "version": "1.0.0",
        "hook": {"path": gpuhook, "args": ["gpuhook", "precreate"],
                 "env": [f"GPUHOOK_CONFIG={config}", f"GPUHOOK_CACHE_DIR={tmp_path}/cache"]},
        "when": {"always": True},
        "stages": ["precreate"],
    }))
    rootfs = tmp_path / "rootfs"
    if not rootfs.exists():
        bundle.make_rootfs(str(rootfs))
    args = ["podman", "--runtime", "runc", "--hooks-dir", str(hooks), "run", "--rm", "--network", "none",
            "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
    for k, v in (annotations or {}).items():
        args += ["--annotation", f"{k}={v}"]
    return subprocess.run(args + ["--rootfs", str(rootfs), "sh", "-c", SHOW],
                          capture_output=True, text=True, timeout=120)


def test_podman_precreate_injects_the_hosts_gpus(make_host, tmp_path):
    r = run_podman(tmp_path, make_host("nvidia", mknod=True))
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    for minor in range(8):
        assert nodes[f"/dev/nvidia{minor}"] == (195, minor)
    assert "accel=nvidia" in r.stdout
    assert "No such device or address" in r.stdout  # allowed by the cgroup rule


def test_podman_precreate_honours_pod_policy_and_cpu_nodes(make_host, tmp_path):
    r = run_podman(tmp_path, make_host("nvidia", mknod=True), {"gpuhook.dev/max-gpus": "1"})
    assert r.returncode == 0, r.stderr
    assert len([p for p in nodes_of(r.stdout) if p[len("/dev/nvidia"):].isdigit()]) == 1
    r = run_podman(tmp_path, make_host("cpu"))
    assert r.returncode == 0, r.stderr
    assert nodes_of(r.stdout) == {} and "accel=none" in r.stdout
