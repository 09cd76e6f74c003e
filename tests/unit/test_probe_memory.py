"""A GPU's own memory (Device.memory, probe/drm.py vram_bytes): read where its kernel driver
states it in sysfs (amdgpu's mem_info_vram_total, xe's tile<N>/physical_vram_size_bytes), never
guessed: absent on NVIDIA (no file without NVML), i915, integrated GPUs and partitions, and a
file that is not a number is a warning, not a size."""

from __future__ import annotations

import pytest

from fakes import fakehost
from gpuhook.probe import probe


def _probe(tmp_path, build):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    build(fh)
    return fh, probe(fh.root)


def _memory(inv) -> dict[str, list]:
    return {v.vendor: [d.memory for d in v.devices] for v in inv.vendors}


def test_amd_gpus_say_their_vram(tmp_path):
    _, inv = _probe(tmp_path, fakehost.amd)
    assert _memory(inv) == {"amd": [fakehost.MI210_VRAM] * 2}


def test_amd_without_the_file_has_no_memory(tmp_path):
    _, inv = _probe(tmp_path, lambda fh: fakehost.amd(fh, vram=None))
    assert _memory(inv) == {"amd": [None, None]} and inv.warnings == ()


@pytest.mark.parametrize("text", ["", "0", "lots", "-1", "１２"])
def test_a_memory_file_that_is_not_a_size_is_a_warning(tmp_path, text):
    fh, _ = _probe(tmp_path, fakehost.amd)
    fh.file("/sys/devices/pci0000:00/0000:43:00.0/mem_info_vram_total", text + "\n")
    inv = probe(fh.root)
    assert _memory(inv) == {"amd": [None, fakehost.MI210_VRAM]}
    assert [w for w in inv.warnings if "mem_info_vram_total" in w] == [
        f"/sys/devices/pci0000:00/0000:43:00.0/mem_info_vram_total: not a size in bytes ({text!r}), "
        "memory not reported"
    ]


def test_an_xe_gpu_sums_its_tiles_and_i915_says_nothing(tmp_path):
    fh, inv = _probe(tmp_path, fakehost.intel)
    assert _memory(inv) == {"intel": [None, fakehost.FLEX170_VRAM]}  # i915 iGPU, xe dGPU
    fh.file("/sys/devices/pci0000:00/0000:03:00.0/tile1/physical_vram_size_bytes", "1024\n")
    assert _memory(probe(fh.root)) == {"intel": [None, fakehost.FLEX170_VRAM + 1024]}
    # a tile that does not say: the sum would be a guess
    fh.file("/sys/devices/pci0000:00/0000:03:00.0/tile2/.keep", "")
    assert _memory(probe(fh.root)) == {"intel": [None, None]}


def test_nvidia_has_no_memory(tmp_path):
    """/proc/driver/nvidia/gpus/<bus>/information has no memory line: only NVML knows it."""
    _, inv = _probe(tmp_path, fakehost.nvidia)
    assert {d.memory for d in inv.devices} == {None}


@pytest.mark.parametrize(
    "build, files",
    [
        (fakehost.amd_mi300, ["0000:05:00.0/mem_info_vram_total"]),
        (fakehost.intel_sriov, [f"0000:03:00.{f}/tile0/physical_vram_size_bytes" for f in range(3)]),  # PF, VFs
    ],
    ids=["mi300 partitions", "sriov vfs"],
)
def test_a_partition_has_no_memory_though_a_file_says_one(tmp_path, build, files):
    """A partition's share of its GPU's memory is in no file gpuhook knows the meaning of: the
    GPU's is not the partition's, and a VF's own is not published either."""
    fh, _ = _probe(tmp_path, build)
    for f in files:
        fh.file(f"/sys/devices/pci0000:00/{f}", "17179869184\n")
    inv = probe(fh.root)
    assert inv.devices and {d.kind for d in inv.devices} == {"partition"}
    assert {d.memory for d in inv.devices} == {None}
