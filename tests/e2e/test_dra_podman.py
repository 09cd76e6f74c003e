"""The CDI ids `gpuhook dra` answers a prepare with, injected by a real CDI consumer: podman
(4.3 on Debian 12; the same CDI library containerd 2.x uses) runs a container with the devices
of a GPU claim, and one with those of a `none` claim, from the specs the driver wrote for a
fake GPU host (real char nodes, real ELF libraries). The kubelet and containerd doing the same
are the real-cluster cases (docs/dra.md)."""

from __future__ import annotations

import os
import shutil
import subprocess

from conftest import is_root, nodes_of, requires
from gpuhook.cli.cdi import hook_paths
from gpuhook.dra import DRIVER, driver
from gpuhook.dra.publish import NodeDevices
from fakes import bundle
from podman_cdi import PODMAN

pytestmark = requires(
    bool(is_root() and shutil.which("podman") and shutil.which("runc") and bundle.find_busybox()),
    "needs root, podman, runc and busybox-static (make test sets them up)",
)

SHOW = (
    "for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T' $n; done; "
    "echo accel=$GPUHOOK_ACCELERATOR; "
    "grep -c libcuda /proc/self/mountinfo; true"
)
NODE = "node-1"


def _claim(name: str, device: str) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu/x", "driver": DRIVER, "pool": NODE, "device": device}]}
            }
        },
    }


def test_podman_injects_what_prepare_answers(make_host, tmp_path, cdi_specs):
    root = make_host("nvidia", mknod=True)
    rootfs = str(tmp_path / "rootfs")
    bundle.make_rootfs(rootfs)
    ldconfig, helper = hook_paths(root, root, None)  # as `gpuhook dra --root R --spec-root R` finds them
    node = NodeDevices(root, str(tmp_path / "cdi"), root, ldconfig, helper)
    node.refresh()
    gpu = "nvidia-gpu-00000007-1111-2222-3333-44444444444b"  # index 7, Device Minor 0 on this host
    claims = {"gpu": _claim("gpu", gpu), "none": _claim("none", "none")}
    d = driver.Driver(NODE, driver.Checkpoint(str(tmp_path / "checkpoint.json")), lambda ns, n: claims[n], node.table)
    ids = {n: [i for dev in d.prepare("ns", n, f"uid-{n}") for i in dev["cdi_ids"]] for n in claims}
    assert ids == {
        "gpu": ["gpuhook.dev/nvidia=GPU-00000007-1111-2222-3333-44444444444b"],
        "none": ["gpuhook.dev/none=none"],
    }
    cdi_specs([str(tmp_path / "cdi" / n) for n in sorted(os.listdir(tmp_path / "cdi"))])

    def run(cdi_ids):
        args = [a for i in cdi_ids for a in ("--device", i)]
        return subprocess.run(
            PODMAN + args + ["--rootfs", rootfs, "sh", "-c", SHOW],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    r = run(ids["gpu"])
    assert r.returncode == 0, r.stderr
    assert [p for p in nodes_of(r.stdout) if p[-1].isdigit()] == ["/dev/nvidia0"]  # that GPU, exactly
    assert nodes_of(r.stdout)["/dev/nvidiactl"] == (195, 255)
    assert "accel=nvidia" in r.stdout and int(r.stdout.split()[-1]) >= 1  # the vendor's libraries

    r = run(ids["none"])
    assert r.returncode == 0, r.stderr
    assert nodes_of(r.stdout) == {} and "accel=cpu" in r.stdout and r.stdout.split()[-1] == "0"
