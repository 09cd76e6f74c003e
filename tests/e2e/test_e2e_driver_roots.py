"""Real containers through gpuhook-runtime and real runc on fake NVIDIA nodes whose driver
userspace is in a driver root: the GPU Operator's /run/nvidia/driver and GKE's
/home/kubernetes/bin/nvidia; and nodes where it is missing, half-installed, of another
version, or appears only later (root)."""

from __future__ import annotations

import hashlib
import os

from conftest import needs_runc, nodes_of
from fakes import fakehost
from gpuhook.probe import ldcache

pytestmark = needs_runc

V = "550.54.14"
LIB = "/usr/lib/x86_64-linux-gnu"
SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=${GPUHOOK_ACCELERATOR:-none}; "
        "nvidia-smi 2>&1 | sed 's/^/smi: /'; "
        # field 4 of mountinfo: the mount's source path inside its file system
        "grep -E 'libcuda|nvidia-smi' /proc/self/mountinfo | while read a b c d e f g; do echo mount $e $d; done; true")


def _host(tmp_path, scenario: str, name: str = "host", **kw) -> fakehost.FakeHost:
    fh = fakehost.FakeHost(str(tmp_path / name), mknod=True)
    getattr(fakehost, scenario)(fh, **kw)
    return fh


def _ldcache(bundle: str) -> dict[str, str]:
    with open(os.path.join(bundle, "rootfs", "etc", "ld.so.cache"), "rb") as f:
        return ldcache.lookup(ldcache.parse(f.read()))


def _mounts(out: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("mount ")}


def _digest(bundle: str) -> str:
    with open(os.path.join(bundle, "config.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _assert_cpu(r, bundle: str, before: str, rec: dict, why: str) -> None:
    assert r.returncode == 0, r.stderr
    assert "accel=none" in r.stdout and nodes_of(r.stdout) == {}
    assert "smi: sh: nvidia-smi: not found" in r.stdout
    assert _digest(bundle) == before  # the container runs exactly as it was asked
    assert rec["decision"] == "declined" and rec["vendors"] == []
    assert any(w.startswith("nvidia: 1 device(s) not given: no libcuda.so.1 of driver 550.54.14")
               for w in rec["warnings"]), rec
    assert any(w.startswith("nvidia: no driver userspace") and why in w for w in rec["warnings"]), rec


def test_gpu_operator_node(tmp_path, runtime):
    fh = _host(tmp_path, "gpu_operator", gpus=2)
    rt = runtime(fh.root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, "drv-operator")
    assert r.returncode == 0, r.stderr
    assert "accel=nvidia" in r.stdout
    assert nodes_of(r.stdout)["/dev/nvidia0"] == (195, 0) and nodes_of(r.stdout)["/dev/nvidiactl"] == (195, 255)
    assert f"smi: fake nvidia-smi {V}" in r.stdout
    got = _mounts(r.stdout)
    assert got[f"{LIB}/libcuda.so.{V}"].endswith(f"/run/nvidia/driver{LIB}/libcuda.so.{V}")
    assert got["/usr/bin/nvidia-smi"].endswith("/run/nvidia/driver/usr/bin/nvidia-smi")
    assert _ldcache(b)["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected" and rec["vendors"] == ["nvidia"]
    assert f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin" in rec["mounts"]


def test_gke_node(tmp_path, runtime):
    fh = _host(tmp_path, "gke", gpus=1)
    rt = runtime(fh.root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, "drv-gke")
    assert r.returncode == 0, r.stderr
    assert "accel=nvidia" in r.stdout and nodes_of(r.stdout)["/dev/nvidia0"] == (195, 0)
    assert f"smi: fake nvidia-smi {V}" in r.stdout
    got = _mounts(r.stdout)
    assert got[f"/usr/local/nvidia/lib64/libcuda.so.{V}"].endswith(f"/home/kubernetes/bin/nvidia/lib64/libcuda.so.{V}")
    assert got["/usr/bin/nvidia-smi"].endswith("/home/kubernetes/bin/nvidia/bin/nvidia-smi")
    # no LD_LIBRARY_PATH needed: the container's ld cache has GKE's directory
    assert _ldcache(b)["libcuda.so.1"] == "/usr/local/nvidia/lib64/libcuda.so.1"
    assert rt.log_records()[-1]["decision"] == "injected"


def test_missing_driver_root_runs_on_cpu(tmp_path, runtime):
    fh = _host(tmp_path, "gpu_operator", gpus=1, installed=False)
    rt = runtime(fh.root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    before = _digest(b)
    r = rt.run(b, "drv-missing")
    _assert_cpu(r, b, before, rt.log_records()[-1], "/run/nvidia/driver: missing")


def test_half_installed_driver_root_runs_on_cpu(tmp_path, runtime):
    fh = _host(tmp_path, "gpu_operator", gpus=1, installed="partial")
    rt = runtime(fh.root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    before = _digest(b)
    r = rt.run(b, "drv-partial")
    _assert_cpu(r, b, before, rt.log_records()[-1], "/run/nvidia/driver: no libcuda.so.1 (no /run/nvidia/validations/driver-ready")


def test_configured_root_of_another_driver_version_runs_on_cpu(tmp_path, runtime):
    fh = _host(tmp_path, "gpu_operator", gpus=1, installed=False)
    fakehost.operator_driver_root(fh, "535.104.05", root="/opt/nvidia")
    rt = runtime(fh.root, nvidia_driver_root="/opt/nvidia")
    b = rt.bundle("b", ["sh", "-c", SHOW])
    before = _digest(b)
    r = rt.run(b, "drv-other")
    rec = rt.log_records()[-1]
    _assert_cpu(r, b, before, rec, "/opt/nvidia: libcuda.so.1 is of driver 535.104.05")
    assert len([w for w in rec["warnings"] if "no driver userspace" in w]) == 1
    assert not any("535" in m for m in rec["mounts"])


def test_driver_root_appearing_later_is_seen_by_the_next_create(tmp_path, runtime):
    """The GPU Operator's driver container starts after gpuhook: the cached "no driver"
    answer (probe_cache_ttl is 10 s here) is dropped as soon as the root is there."""
    fh = _host(tmp_path, "gpu_operator", gpus=1, installed=False)
    rt = runtime(fh.root)
    b = rt.bundle("b1", ["sh", "-c", SHOW])
    before = _digest(b)
    r = rt.run(b, "drv-later-1")
    _assert_cpu(r, b, before, rt.log_records()[-1], "/run/nvidia/driver: missing")
    fakehost.operator_driver_root(fh, V)
    fh.file(fakehost.OPERATOR_READY, "")
    b = rt.bundle("b2", ["sh", "-c", SHOW])
    r = rt.run(b, "drv-later-2")
    assert r.returncode == 0, r.stderr
    assert "accel=nvidia" in r.stdout and f"smi: fake nvidia-smi {V}" in r.stdout
    assert _ldcache(b)["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
    assert rt.log_records()[-1]["decision"] == "injected"
