"""A real CDI consumer: podman (4.3 on Debian 12) runs containers with devices from the specs
`gpuhook cdi generate` wrote for a fake GPU host (real char nodes, real ELF libraries)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess


from conftest import NO_CONFIG, gpuhook, is_root, nodes_of, requires
from fakes import bundle
from podman_cdi import CDI_DIR, PODMAN
from gpuhook import cdi
from gpuhook.probe import ldcache, nodestate

pytestmark = requires(bool(is_root() and shutil.which("podman") and shutil.which("runc") and bundle.find_busybox()),
                      "needs root, podman, runc and busybox-static (make test sets them up)")

SHOW = ("for n in /dev/nvidia*; do stat -c 'node %n %t:%T' $n; done; "
        "echo accel=$GPUHOOK_ACCELERATOR; echo devices=$GPUHOOK_DEVICES; "
        "for n in /dev/nvidia[0-9]*; do cat $n >/dev/null 2>/tmp/err; echo open $n: $(cat /tmp/err); done; "
        "grep -E 'libcuda|libnvidia-ml' /proc/self/mountinfo | while read a b c d e f g; do echo mount $e $f; done; true")


def podman(rootfs: str, *devices: str) -> subprocess.CompletedProcess:
    args = [a for d in devices for a in ("--device", d)]
    return subprocess.run(PODMAN + args + ["--rootfs", rootfs, "sh", "-c", SHOW],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_podman_runs_devices_from_the_generated_specs(make_host, tmp_path, cdi_specs):
    root = make_host("nvidia", mknod=True)
    rootfs = str(tmp_path / "rootfs")
    bundle.make_rootfs(rootfs)
    out_yaml, out_json = tmp_path / "yaml", tmp_path / "json"
    # the fake host's files are what podman must use: --spec-root points the host paths at them
    for out, fmt in ((out_yaml, "yaml"), (out_json, "json")):
        r = gpuhook("cdi", "generate", "--root", root, "--spec-root", root, "--output-dir", str(out),
                    "--format", fmt, "--ldconfig", nodestate.find_ldconfig() or "/sbin/ldconfig", config=NO_CONFIG)
        assert r.returncode == 0, r.stderr
    cdi_specs([str(out_yaml / "gpuhook.dev-nvidia.yaml"), str(out_json / "gpuhook.dev-gpu.json")])

    # one GPU by index: GPU 1 has Device Minor 6 on this host
    r = podman(rootfs, "gpuhook.dev/nvidia=1")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert nodes == {"/dev/nvidia6": (195, 6), "/dev/nvidiactl": (195, 255), "/dev/nvidia-modeset": (195, 254),
                     "/dev/nvidia-uvm": (510, 0), "/dev/nvidia-uvm-tools": (510, 1)}
    # the device cgroup lets it open the node (no driver behind it: ENXIO, not EPERM)
    assert "open /dev/nvidia6: cat: can't open '/dev/nvidia6': No such device or address" in r.stdout
    assert "accel=nvidia" in r.stdout
    mounts = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("mount ")]
    # each library at its own name and at its development name (-lcuda, -lnvidia-ml)
    assert {m[0] for m in mounts} == {"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14",
                                      "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14",
                                      "/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"}
    assert all(m[1].split(",")[0] == "ro" for m in mounts), mounts
    # the CDI form of the ld-cache hook found the rootfs through the OCI state
    with open(os.path.join(rootfs, "etc", "ld.so.cache"), "rb") as f:
        names = ldcache.lookup(ldcache.parse(f.read()))
    assert names["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"

    # by UUID: GPU-...0007 is index 7, Device Minor 0
    r = podman(rootfs, "gpuhook.dev/nvidia=GPU-00000007-1111-2222-3333-44444444444b")
    assert r.returncode == 0, r.stderr
    assert [p for p in nodes_of(r.stdout) if p[-1].isdigit()] == ["/dev/nvidia0"]

    # the vendor-agnostic kind, from the JSON spec: every GPU and the env contract
    r = podman(rootfs, "gpuhook.dev/gpu=all")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert all(nodes[f"/dev/nvidia{m}"] == (195, m) for m in range(8))
    assert "accel=nvidia" in r.stdout
    assert r.stdout.count("devices=nvidia:GPU-") == 1 and r.stdout.count(",nvidia:GPU-") == 7

    # a device the node does not have is an error, as CDI says
    r = podman(rootfs, "gpuhook.dev/nvidia=8")
    assert r.returncode != 0 and "gpuhook.dev/nvidia=8" in r.stderr


def test_podman_43_and_the_cdi_version_cap(make_host, tmp_path, cdi_specs):
    """AMD nodes are group-only (render, video): the spec needs additionalGids, cdiVersion
    0.7.0, which podman 4.3 does not read; --max-cdi-version 0.5.0 leaves them out."""
    root = make_host("amd", mknod=True)
    rootfs = str(tmp_path / "rootfs")
    bundle.make_rootfs(rootfs)
    full, capped = tmp_path / "full", tmp_path / "capped"
    r = gpuhook("cdi", "generate", "--root", root, "--spec-root", root, "--output-dir", str(full), "--kind", "amd", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    r = gpuhook("cdi", "generate", "--root", root, "--spec-root", root, "--output-dir", str(capped), "--kind", "amd",
                "--max-cdi-version", "0.5.0", "--format", "json", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    spec = json.load(open(capped / "gpuhook.dev-amd.json"))
    assert spec["cdiVersion"] == "0.5.0"
    needs_gids = "additionalGids" in (full / "gpuhook.dev-amd.yaml").read_text()
    if needs_gids:
        assert "left out for cdiVersion 0.5.0: additionalGids" in r.stderr
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
    if needs_gids and " 4.3." in version:
        cdi_specs([str(full / "gpuhook.dev-amd.yaml")])
        r = subprocess.run(PODMAN + ["--device", "gpuhook.dev/amd=all", "--rootfs", rootfs, "true"],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode != 0 and "unresolvable CDI devices gpuhook.dev/amd=all" in r.stderr
        for name in os.listdir(CDI_DIR):
            if name.endswith("gpuhook.dev-amd.yaml"):
                os.unlink(os.path.join(CDI_DIR, name))
    cdi_specs([str(capped / "gpuhook.dev-amd.json")])
    r = subprocess.run(PODMAN + ["--device", "gpuhook.dev/amd=1", "--rootfs", rootfs, "sh", "-c",
                                 "for n in /dev/kfd /dev/dri/*; do stat -c 'node %n %t:%T' $n; done; "
                                 "cat /dev/kfd 2>&1; echo accel=$GPUHOOK_ACCELERATOR"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert nodes_of(r.stdout) == {"/dev/kfd": (235, 0), "/dev/dri/card2": (226, 2), "/dev/dri/renderD129": (226, 129)}
    assert "No such device or address" in r.stdout and "accel=amd" in r.stdout
