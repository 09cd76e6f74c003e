"""NVIDIA probing on fake hosts (pyfakefs) and on real captures."""

from __future__ import annotations

import os

import pytest

from conftest import FIXTURES
from fakes import fakehost
from gpuhook.probe import probe
from gpuhook.probe.host import Host
from gpuhook.probe.nvidia import parse_information, parse_version

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def nvidia_host(fs, **kw) -> fakehost.FakeHost:
    fh = fakehost.FakeHost("/host", mknod=False)
    fakehost.nvidia(fh, libs=False, userspace=False, **kw)
    return fh


def add_libs(fh, version="550.54.14", names=("libcuda.so.1", "libnvidia-ml.so.1")):
    for soname in names:
        fh.library(LIBDIR, soname, version, real_elf=False)


def test_eight_gpus_minors_are_not_indices(fs):
    fh = nvidia_host(fs, gpus=8, minors=[3, 7, 1, 0, 6, 2, 5, 4])
    add_libs(fh)
    inv = probe("/host")
    nv = inv.vendor("nvidia")
    assert [d.index for d in nv.devices] == list(range(8))
    # index follows PCI order; /dev/nvidiaN follows the driver's Device Minor
    assert [d.nodes[0].path for d in nv.devices] == [f"/dev/nvidia{m}" for m in [3, 7, 1, 0, 6, 2, 5, 4]]
    assert [d.nodes[0].minor for d in nv.devices] == [3, 7, 1, 0, 6, 2, 5, 4]
    assert all(d.nodes[0].major == 195 for d in nv.devices)
    assert nv.devices[0].id.startswith("GPU-") and nv.devices[0].pci == "0000:18:00.0"
    assert nv.devices[0].model == "NVIDIA H100 80GB HBM3"
    assert nv.driver_version == "550.54.14"
    ctl = {n.path: (n.major, n.minor) for n in nv.control_nodes}
    assert ctl == {"/dev/nvidiactl": (195, 255), "/dev/nvidia-modeset": (195, 254),
                   "/dev/nvidia-uvm": (510, 0), "/dev/nvidia-uvm-tools": (510, 1)}
    libs = {lib.soname: lib for lib in nv.libraries}
    assert libs["libcuda.so.1"].path == f"{LIBDIR}/libcuda.so.550.54.14"
    assert libs["libcuda.so.1"].capability == "compute"
    assert libs["libnvidia-ml.so.1"].capability == "utility"
    assert "/usr/bin/nvidia-smi" not in nv.binaries


def test_uvm_not_created_yet(fs):
    nvidia_host(fs, gpus=1, uvm_node=False)
    nv = probe("/host").vendor("nvidia")
    uvm = {n.path: n for n in nv.control_nodes}["/dev/nvidia-uvm"]
    assert (uvm.major, uvm.minor, uvm.present) == (510, 0, False)
    assert {n.path: n for n in nv.control_nodes}["/dev/nvidiactl"].present


def test_old_frontend_name_and_dynamic_majors(fs):
    fh = nvidia_host(fs, gpus=1)
    fh.majors = {"nvidia": 195, "nvidia-uvm": 237}
    fh.proc_devices()
    nv = probe("/host").vendor("nvidia")
    assert {n.path: n.major for n in nv.control_nodes}["/dev/nvidia-uvm"] == 237


def test_stale_library_of_another_driver_is_skipped(fs):
    fh = nvidia_host(fs, gpus=1, driver="550.54.14")
    add_libs(fh, version="470.82.01", names=("libcuda.so.1",))
    add_libs(fh, version="550.54.14", names=("libnvidia-ml.so.1",))
    inv = probe("/host")
    nv = inv.vendor("nvidia")
    assert [lib.soname for lib in nv.libraries] == ["libnvidia-ml.so.1"]
    assert any("470.82.01" in w for w in inv.warnings)


def test_excluded_gpu_and_missing_information(fs):
    fh = nvidia_host(fs, gpus=2)
    info = f"/proc/driver/nvidia/gpus/0000:18:00.0/information"
    text = open(fh.p(info)).read().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes")
    fh.file(info, text)
    inv = probe("/host")
    assert [d.pci for d in inv.vendor("nvidia").devices] == ["0000:28:00.0"]


@pytest.mark.parametrize("garbage", ["", "\x00\xff", "Device Minor: ²\n", "Device Minor: -1\n", "x" * 5000])
def test_malformed_information_never_crashes(fs, garbage):
    fh = nvidia_host(fs, gpus=1)
    fh.file("/proc/driver/nvidia/gpus/0000:18:00.0/information", garbage)
    fh.file("/proc/devices", garbage)
    fh.file("/proc/driver/nvidia/version", garbage)
    inv = probe("/host")
    nv = inv.vendor("nvidia")
    assert len(nv.devices) == 1 and nv.devices[0].nodes[0].major == 195


def test_nvidia_plus_intel_igpu(fs):
    fh = nvidia_host(fs, gpus=2)
    fakehost.intel(fh, dgpu=False)
    inv = probe("/host")
    assert [v.vendor for v in inv.vendors] == ["nvidia", "intel"]
    assert inv.vendor("intel").devices[0].pci == "0000:00:02.0"


def test_cpu_only_host(fs):
    fakehost.cpu_only(fakehost.FakeHost("/host"))
    inv = probe("/host")
    assert inv.vendors == () and inv.warnings == ()


def test_bmc_only_server_has_no_gpu(fs):
    fakehost.bmc_only(fakehost.FakeHost("/host"))
    assert probe("/host").vendors == ()


def test_parsers():
    text = ("Model: \t\t Tesla V100-SXM2-16GB\nGPU UUID: \t GPU-d8f2c5d0-aaaa\nBus Location: \t 0000:00:1e.0\n"
            "Device Minor: \t 3\n")
    info = parse_information(text)
    assert info["Model"] == "Tesla V100-SXM2-16GB" and info["Device Minor"] == "3"
    assert parse_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n") == "535.129.03"
    assert parse_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build\n") == "560.35.03"
    assert parse_version("garbage") is None


# -- real captures ---------------------------------------------------------------------

def test_capture_ctk_rootfs_with_real_ld_cache():
    """NVIDIA container toolkit's test root: a real glibc ld.so.cache of a driver host, dev/
    of empty files (so the driver's numbers are used), no /proc."""
    inv = probe(os.path.join(FIXTURES, "nvidia-ctk-rootfs-1"))
    nv = inv.vendor("nvidia")
    assert [(d.nodes[0].path, d.nodes[0].major, d.nodes[0].minor) for d in nv.devices] == [("/dev/nvidia0", 195, 0)]
    assert {n.path for n in nv.control_nodes} >= {"/dev/nvidiactl"}
    # libcuda.so.1 is in the cache and on disk; libnvidia-ml.so.1 only in the cache
    assert [lib.path for lib in nv.libraries] == ["/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert any("libnvidia-ml.so.1" in w and "does not exist" in w for w in inv.warnings)


def test_capture_power9_without_information_files():
    inv = probe(os.path.join(FIXTURES, "nvidia-p9-v100-6gpu-numa"))
    nv = inv.vendor("nvidia")
    assert [d.pci for d in nv.devices] == ["0004:05:00.0", "0004:06:00.0", "0006:00:00.0",
                                           "0007:00:00.0", "0035:04:00.0", "0035:05:00.0"]
    assert [d.nodes[0].minor for d in nv.devices] == list(range(6))
    assert any("assuming PCI order" in w for w in inv.warnings)


def test_capture_proc_devices_majors():
    from gpuhook.probe.common import char_majors, first_major

    majors = char_majors(Host(os.path.join(FIXTURES, "nvidia-proc-devices-efa-nvswitch")))
    assert first_major(majors, "nvidia", "nvidia-frontend") == 195
    assert majors["nvidia-uvm"] == [510] and majors["nvidia-nvswitch"] == [511]
    assert majors["infiniband_verbs"] == [231, 240]
    assert "virtblk" not in majors  # a block device


def test_host_never_leaves_its_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (tmp_path / "secret").write_text("host secret")
    os.symlink("/../../secret", root / "etc" / "abs")
    os.symlink("../../../secret", root / "etc" / "rel")
    host = Host(str(root))
    assert host.read_text("/etc/abs") is None and host.read_text("/etc/rel") is None
    assert host.resolve("/etc/rel") == str(root / "secret")
