"""DRM-based probes (AMD, Intel), accel and WSL: fake hosts (pyfakefs) and real captures."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import fakehost
from fakes.fakehost import DRM_MAJOR, FakeHost
from gpuhook.probe import accel, amd, common, drm, intel, probe, wsl
from gpuhook.inventory import VendorInventory
from gpuhook.probe.host import Host

try:  # loaded now: the vendor modules must be imported before pyfakefs hides the sources
    from gpuhook.probe import nvidia  # noqa: F401
except Exception:  # another vendor's module; probe() reports its failure as a warning
    pass

ROOT = "/host"
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def node_summary(dev):
    return [(n.path, n.major, n.minor) for n in dev.nodes]


def kfd_props(simd: int, minor: int, location: int = 0, domain: int = 0, device_id: int = 0x740F) -> str:
    return (f"cpu_cores_count {0 if simd else 64}\nsimd_count {simd}\nvendor_id {4098 if simd else 0}\n"
            f"device_id {device_id if simd else 0}\nlocation_id {location}\ndomain {domain}\n"
            f"drm_render_minor {minor}\n")


@pytest.fixture
def fh(fs):
    return FakeHost(ROOT, mknod=False)


# -- fake hosts ----------------------------------------------------------------------------------

def test_cpu_only_has_no_vendors(fh):
    fakehost.cpu_only(fh)
    inv = probe(ROOT)
    assert inv.vendors == ()
    for mod in (amd, intel, accel, wsl):
        assert mod.probe(Host(ROOT)) is None


def test_amd_scenario(fh):
    fakehost.amd(fh, gpus=3)
    inv = probe(ROOT)
    assert [v.vendor for v in inv.vendors] == ["amd"]
    v = inv.vendor("amd")
    assert [(d.kind, d.index, d.id, d.pci, d.model, d.driver, d.parent) for d in v.devices] == [
        ("gpu", 0, "0000:43:00.0", "0000:43:00.0", "AMD Instinct MI210", "amdgpu", None),
        ("gpu", 1, "0000:63:00.0", "0000:63:00.0", "AMD Instinct MI210", "amdgpu", None),
        ("gpu", 2, "0000:83:00.0", "0000:83:00.0", "AMD Instinct MI210", "amdgpu", None),
    ]
    assert [node_summary(d) for d in v.devices] == [
        [(f"/dev/dri/card{i + 1}", DRM_MAJOR, i + 1), (f"/dev/dri/renderD{128 + i}", DRM_MAJOR, 128 + i)]
        for i in range(3)
    ]
    assert all(n.present for d in v.devices for n in d.nodes)
    assert [(n.path, n.type, n.major, n.minor, n.present) for n in v.control_nodes] == [
        ("/dev/kfd", "c", 235, 0, True)]
    assert inv.warnings == ()


def test_amd_kfd_order_and_render_minors_not_card_order(fh):
    """KFD node order decides the index; nodes come from the DRM device with that render minor."""
    fh.majors.update({"kfd": 511, "drm": DRM_MAJOR})
    fh.chardev("/dev/kfd", 511, 0)
    fh.drm_gpu("0000:c1:00.0", 0x1002, 0x74A1, "amdgpu", card=0, render=129)
    fh.drm_gpu("0000:11:00.0", 0x1002, 0x74A1, "amdgpu", card=1, render=128)
    topo = "/sys/class/kfd/kfd/topology/nodes"
    fh.file(f"{topo}/0/properties", kfd_props(0, 0))
    fh.file(f"{topo}/1/properties", kfd_props(0, 0))  # second socket
    fh.file(f"{topo}/2/properties", kfd_props(304, 128, 0x1100, device_id=0x74A1))
    fh.file(f"{topo}/10/properties", kfd_props(304, 129, 0xC100, device_id=0x74A1))
    fh.proc_devices()
    v = amd.probe(Host(ROOT))
    assert [(d.id, d.model) for d in v.devices] == [("0000:11:00.0", "AMD Instinct MI300X"),
                                                      ("0000:c1:00.0", "AMD Instinct MI300X")]
    assert node_summary(v.devices[0]) == [("/dev/dri/card1", DRM_MAJOR, 1), ("/dev/dri/renderD128", DRM_MAJOR, 128)]
    assert node_summary(v.devices[1]) == [("/dev/dri/card0", DRM_MAJOR, 0), ("/dev/dri/renderD129", DRM_MAJOR, 129)]
    assert [(n.major, n.minor) for n in v.control_nodes] == [(511, 0)]


def test_amd_partitions_with_platform_render_nodes(fh):
    """MI300X in CPX: partition 0's render node is on the PCI device, the others on amdgpu_xcp.N."""
    fh.majors.update({"kfd": 235, "drm": DRM_MAJOR})
    fh.chardev("/dev/kfd", 235, 0)
    path = fh.drm_gpu("0000:05:00.0", 0x1002, 0x74A1, "amdgpu", card=1, render=128)
    topo = "/sys/class/kfd/kfd/topology/nodes"
    fh.file(f"{topo}/0/properties", kfd_props(0, 0))
    for i in range(3):
        if i:
            fh.drm(f"/sys/devices/platform/amdgpu_xcp.{i}", f"renderD{128 + i}", 128 + i)
        fh.file(f"{topo}/{i + 1}/properties", kfd_props(76, 128 + i, 0x0500 + i, device_id=0x74A1))
    fh.proc_devices()
    v = amd.probe(Host(ROOT))
    assert [(d.kind, d.id, d.parent, d.pci) for d in v.devices] == [
        ("partition", f"0000:05:00.{i}", "0000:05:00.0", "0000:05:00.0") for i in range(3)]
    assert [node_summary(d) for d in v.devices] == [
        [(f"/dev/dri/renderD{128 + i}", DRM_MAJOR, 128 + i)] for i in range(3)]
    assert path  # the PCI device (with card1) is not reported a second time as a DRM-only GPU


def test_amd_drm_only_without_kfd_is_a_graphics_gpu(fh):
    fh.majors["drm"] = DRM_MAJOR
    fh.drm_gpu("0000:0a:00.0", 0x1002, 0x73BF, "amdgpu", card=0, render=128)
    fh.proc_devices()
    host = Host(ROOT)
    v = amd.probe(host)
    assert [(d.kind, d.id, d.model) for d in v.devices] == [("gpu", "0000:0a:00.0", "AMD GPU 0x73bf")]
    assert node_summary(v.devices[0]) == [("/dev/dri/card0", DRM_MAJOR, 0), ("/dev/dri/renderD128", DRM_MAJOR, 128)]
    assert v.control_nodes == ()
    assert host.warnings == []


def test_amd_kfd_major_without_node_is_lazy(fh):
    fakehost.amd(fh, gpus=1)
    os.unlink(fh.p("/dev/kfd"))
    v = amd.probe(Host(ROOT))
    assert [(n.path, n.major, n.minor, n.present) for n in v.control_nodes] == [("/dev/kfd", 235, 0, False)]


def test_amd_kfd_as_empty_file_without_major_is_skipped(fh):
    fakehost.amd(fh, gpus=1)
    fh.majors.clear()
    fh.proc_devices()
    host = Host(ROOT)
    v = amd.probe(host)
    assert len(v.devices) == 1 and v.control_nodes == ()
    assert any("/dev/kfd" in w for w in host.warnings)


def test_amd_kfd_major_from_sysfs_dev(fh):
    fakehost.amd(fh, gpus=1)
    fh.majors.clear()
    fh.proc_devices()
    fh.file("/sys/class/kfd/kfd/dev", "236:0\n")
    v = amd.probe(Host(ROOT))
    assert [(n.major, n.minor) for n in v.control_nodes] == [(236, 0)]


def test_intel_igpu_and_dgpu(fh):
    fakehost.intel(fh, dgpu=True)
    inv = probe(ROOT)
    assert [v.vendor for v in inv.vendors] == ["intel"]
    v = inv.vendor("intel")
    assert [(d.kind, d.index, d.id, d.model, d.driver) for d in v.devices] == [
        ("gpu", 0, "0000:00:02.0", "Intel GPU 0xa7a0", "i915"),
        ("gpu", 1, "0000:03:00.0", "Intel GPU 0x56c0", "xe"),
    ]
    assert node_summary(v.devices[1]) == [("/dev/dri/card1", DRM_MAJOR, 1), ("/dev/dri/renderD129", DRM_MAJOR, 129)]
    assert v.control_nodes == ()


def test_bmc_only_server_is_cpu_only(fh):
    fakehost.bmc_only(fh)
    assert probe(ROOT).vendors == ()
    devs = drm.drm_devices(Host(ROOT))
    assert [(d.pci, d.vendor_id, d.driver, d.render) for d in devs] == [("0000:03:00.0", 0x1A03, "ast", None)]


@pytest.mark.parametrize("vendor,device,driver", [
    (0x1A03, 0x2000, "ast"), (0x102B, 0x0536, "mgag200"), (0x1AF4, 0x1050, "virtio-pci"),
    (0x1234, 0x1111, "bochs-drm"), (0x15AD, 0x0405, "vmwgfx"), (0x1013, 0x00B8, "cirrus"),
])
def test_display_only_chips_are_never_reported(fh, vendor, device, driver):
    fh.majors["drm"] = DRM_MAJOR
    fh.drm_gpu("0000:00:01.0", vendor, device, driver, card=0, render=128)
    fh.proc_devices()
    assert probe(ROOT).vendors == ()


def test_simpledrm_platform_framebuffer_is_not_a_gpu(fh):
    fh.drm("/sys/devices/platform/simple-framebuffer.0", "card0", 0)
    fh.proc_devices()
    assert probe(ROOT).vendors == ()
    [d] = drm.drm_devices(Host(ROOT))
    assert d.pci is None and d.vendor_id is None and d.sysfs == "/sys/devices/platform/simple-framebuffer.0"


def test_wrong_driver_is_not_reported(fh):
    """A GPU handed to vfio-pci (or with no driver) belongs to a VM, not to containers."""
    fh.drm_gpu("0000:43:00.0", 0x1002, 0x740F, "vfio-pci", card=0, render=128)
    fh.drm_gpu("0000:03:00.0", 0x8086, 0x56C0, None, card=1, render=129)
    fh.proc_devices()
    assert probe(ROOT).vendors == ()


def test_ast_next_to_amd_gpu(fh):
    fakehost.amd(fh, gpus=1)
    fh.drm_gpu("0000:03:00.0", 0x1A03, 0x2000, "ast", card=0, render=None)
    inv = probe(ROOT)
    assert [(d.vendor, d.id) for d in inv.devices] == [("amd", "0000:43:00.0")]


def test_drm_walker_connectors_and_malformed_files(fh):
    path = fh.drm_gpu("0000:00:02.0", 0x8086, 0xA7A0, "i915", card=0, render=128)
    fh.file(f"{path}/drm/card0/card0-DP-1/status", "connected\n")
    fh.symlink("/sys/class/drm/card0-DP-1", "../../devices/pci0000:00/0000:00:02.0/drm/card0/card0-DP-1")
    fh.file("/sys/class/drm/version", "drm 1.1.0 20060810\n")
    fh.file(f"{path}/drm/renderD128/dev", "garbage\n")
    fh.file(f"{path}/vendor", "not hex\n")
    fh.symlink("/sys/class/drm/card7", "../../devices/nowhere/drm/card7")
    host = Host(ROOT)
    [d] = drm.drm_devices(host)
    assert d.vendor_id == 0x8086  # from uevent PCI_ID
    assert (d.card.minor, d.render.minor) == (0, 128)
    assert any("renderD128/dev" in w for w in host.warnings)
    assert any("/vendor" in w for w in host.warnings)
    assert any("card7" in w for w in host.warnings)


def test_drm_node_missing_from_dev_is_not_present(fh):
    fakehost.intel(fh, dgpu=False)
    os.unlink(fh.p("/dev/dri/renderD128"))
    [d] = drm.drm_devices(Host(ROOT))
    assert d.card.present and not d.render.present and (d.render.major, d.render.minor) == (DRM_MAJOR, 128)


def test_garbage_kfd_topology_warns_and_does_not_raise(fh):
    fakehost.amd(fh, gpus=1)
    topo = "/sys/class/kfd/kfd/topology/nodes"
    fh.file(f"{topo}/7/properties", "\x00\xff garbage\nsimd_count x\n")
    os.makedirs(fh.p(f"{topo}/8/properties"))  # unreadable: a directory
    fh.file(f"{topo}/bogus/properties", kfd_props(4, 130))
    host = Host(ROOT)
    v = amd.probe(host)
    assert [d.id for d in v.devices] == ["0000:43:00.0"]
    assert any("nodes/7" in w for w in host.warnings) and any("nodes/8" in w for w in host.warnings)


def test_accel_nodes(fh):
    fh.majors["accel"] = 261
    pci = fh.pci_device("0000:b3:00.0", 0x1DA3, 0x1020, "habanalabs", 0x120000)
    fh.file("/sys/devices/pci0000:00/0000:b3:00.0/accel/accel0/dev", "261:0\n")
    fh.symlink("/sys/devices/pci0000:00/0000:b3:00.0/accel/accel0/device", "../../../0000:b3:00.0")
    fh.symlink("/sys/class/accel/accel0", "../../devices/pci0000:00/0000:b3:00.0/accel/accel0")
    fh.chardev("/dev/accel/accel0", 261, 0)
    fh.chardev("/dev/accel/accel1", 261, 1)  # no sysfs entry: numbers from the name
    fh.file("/dev/accel/accel_controlD0", "")
    fh.proc_devices()
    inv = probe(ROOT)
    assert [v.vendor for v in inv.vendors] == ["accel"]
    v = inv.vendor("accel")
    assert [(d.kind, d.index, d.id, d.pci, d.driver, d.model) for d in v.devices] == [
        ("accel", 0, "0000:b3:00.0", "0000:b3:00.0", "habanalabs", "Accelerator 1da3:1020"),
        ("accel", 1, "accel1", None, None, None),
    ]
    assert [node_summary(d) for d in v.devices] == [[("/dev/accel/accel0", 261, 0)], [("/dev/accel/accel1", 261, 1)]]
    assert pci


def test_accel_default_major(fh):
    fh.proc_devices()
    fh.file("/dev/accel/accel3", "")
    [d] = accel.probe(Host(ROOT)).devices
    assert node_summary(d) == [("/dev/accel/accel3", 261, 3)]


def test_wsl_dxg(fh):
    fh.proc_devices({"dxg": 240})
    fh.file("/dev/dxg", "")
    for name in ("libdxcore.so", "libd3d12.so", "libcuda.so", "libcuda.so.1.1", "nvidia-smi"):
        fh.file(f"/usr/lib/wsl/lib/{name}", b"\x7fELF")
    inv = probe(ROOT)
    assert [v.vendor for v in inv.vendors] == ["dxg"]
    v = inv.vendor("dxg")
    [d] = v.devices
    assert (d.kind, d.id, node_summary(d)) == ("dxg", "dxg", [("/dev/dxg", 240, 0)])
    assert sorted(lib.path for lib in v.libraries) == [
        f"/usr/lib/wsl/lib/{n}" for n in ("libcuda.so", "libcuda.so.1.1", "libd3d12.so", "libdxcore.so")]
    assert {(lib.soname, lib.capability) for lib in v.libraries} == {(None, "compute")}
    assert v.binaries == ()


def test_wsl_dxg_file_without_major_is_skipped(fh):
    fh.proc_devices()
    fh.file("/dev/dxg", "")
    host = Host(ROOT)
    assert wsl.probe(host) is None
    assert any("/dev/dxg" in w for w in host.warnings)


# -- real captures (copies under tests/fixtures) ------------------------------------------------

def capture(name: str) -> str:
    path = os.path.join(FIXTURES, name)
    if not os.path.isdir(path):
        pytest.skip(f"fixture {name} missing")
    return path


def amd_capture(name: str):
    host = Host(capture(name))
    v = amd.probe(host)
    assert v is not None
    assert any("/dev/kfd is missing" in w for w in host.warnings)  # captures have no /dev
    assert v.control_nodes == ()
    return v


def renders(v):
    return [[(n.path, n.minor, n.present) for n in d.nodes] for d in v.devices]


def test_capture_mi210():
    v = amd_capture("amd-mi210-8gpu-xgmi")
    buses = ["63", "43", "03", "26", "e3", "c3", "83", "a3"]
    assert [(d.kind, d.id, d.model) for d in v.devices] == [
        ("gpu", f"0000:{b}:00.0", "AMD Instinct MI210") for b in buses]
    assert renders(v) == [[(f"/dev/dri/renderD{128 + i}", 128 + i, False)] for i in range(8)]


def test_capture_mi308x_partitions():
    v = amd_capture("amd-mi308x-8gpu-partitioned")
    assert len(v.devices) == 32 and {d.kind for d in v.devices} == {"partition"}
    parents = ["0000:0a", "0000:80", "0000:a4", "0000:c8", "0001:0b", "0001:81", "0001:a5", "0001:c9"]
    assert sorted({d.parent for d in v.devices}) == [p + ":00.0" for p in parents]
    minors = [d.nodes[0].minor for d in v.devices]
    assert minors == [128 + 8 * g + p for g in range(8) for p in range(4)]
    for d in v.devices:
        assert d.parent == parents[(d.nodes[0].minor - 128) // 8] + ":00.0"
        assert d.model == "AMD Instinct MI308X" and len(d.nodes) == 1 and not d.nodes[0].present
    assert len({d.id for d in v.devices}) == 32


def test_capture_mi300x_cpx():
    v = amd_capture("amd-mi300x-8gpu-cpx")
    assert len(v.devices) == 63 and {d.kind for d in v.devices} == {"partition"}
    assert [d.nodes[0].minor for d in v.devices] == list(range(128, 191))
    per_parent = {}
    for d in v.devices:
        per_parent.setdefault(d.parent, []).append(d.nodes[0].minor)
    assert sorted(per_parent) == [f"0000:{b}:00.0" for b in ("05", "27", "47", "65", "85", "a7", "c7", "e5")]
    assert per_parent["0000:e5:00.0"] == list(range(184, 191))
    assert all(len(m) == 8 for p, m in per_parent.items() if p != "0000:e5:00.0")
    assert [d.id for d in v.devices[:8]] == [f"0000:05:00.{f}" for f in range(8)]


def test_capture_vega10_duplicate_is_one_gpu():
    v = amd_capture("amd-vega10-1gpu-dup")
    assert [(d.kind, d.id, d.model) for d in v.devices] == [("gpu", "0000:19:00.0", "AMD Vega 10")]
    assert renders(v) == [[("/dev/dri/renderD128", 128, False)]]


def test_capture_drm_amdgpu_and_i915():
    # sysfs only, no render node, no /dev: no sign a container could be given a GPU from
    # (probe.SIGNS), so only a probe that runs every vendor module reports them
    assert probe(capture("drm-amdgpu-vega10-and-i915")).vendors == ()
    inv = probe(capture("drm-amdgpu-vega10-and-i915"), signs=False)
    assert [v.vendor for v in inv.vendors] == ["amd", "intel"]
    [a] = inv.vendor("amd").devices
    [i] = inv.vendor("intel").devices
    assert (a.id, a.driver, a.model) == ("0000:09:00.0", "amdgpu", "AMD Vega 10")
    assert (i.id, i.driver, i.model) == ("0000:00:02.0", "i915", "Intel GPU 0x5917")
    assert [(n.path, n.major, n.minor, n.present) for n in a.nodes] == [("/dev/dri/card0", 226, 0, False)]
    assert [(n.path, n.major, n.minor, n.present) for n in i.nodes] == [("/dev/dri/card1", 226, 1, False)]
    assert inv.vendor("amd").control_nodes == ()


def test_capture_with_dev_nodes_added(tmp_path):
    """The KFD-only capture plus /dev/kfd, a kfd major and some render nodes (no DRM sysfs)."""
    root = str(tmp_path / "root")
    shutil.copytree(capture("amd-mi210-8gpu-xgmi"), root, symlinks=True)
    os.chmod(root, 0o755)
    fh = FakeHost(root)
    fh.proc_devices({"kfd": 235, "drm": DRM_MAJOR})
    fh.file("/dev/kfd", "")
    fh.file("/dev/dri/renderD128", "")
    fh.file("/dev/dri/renderD129", "")
    host = Host(root)
    v = amd.probe(host)
    assert [(n.path, n.major, n.present) for n in v.control_nodes] == [("/dev/kfd", 235, True)]
    assert [d.nodes[0].present for d in v.devices] == [True, True] + [False] * 6
    assert not any("kfd" in w for w in host.warnings)


# -- parsers on arbitrary text --------------------------------------------------------------------

class TextHost(Host):
    """A Host whose every file reads as `text`."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__("/nonexistent-root")
        self.text = text

    def read_text(self, path, limit=1 << 20, quiet=False):
        return self.text


@settings(max_examples=300)
@given(st.text())
def test_kfd_properties_parser_never_raises(text):
    props = amd.parse_properties(text)
    assert all(isinstance(v, int) for v in props.values())


@given(st.text())
def test_uevent_parser_never_raises(text):
    assert isinstance(common.uevent(TextHost(text), "/sys/x/uevent"), dict)


@given(st.text())
def test_dev_parser_never_raises(text):
    dev = common.parse_dev(text)
    assert dev is None or (isinstance(dev[0], int) and isinstance(dev[1], int))
    assert drm.node_number(text) is None or drm.node_number(text)[0] in ("card", "render")


@given(st.text(alphabet="0123456789:\n ²٣x"))
def test_dev_parser_digits_like_text(text):
    """Only ASCII MAJOR:MINOR is read; digits of other scripts (², ٣) are not numbers here."""
    got = common.parse_dev(text)
    assert got is None or (re.fullmatch(r"[0-9]+:[0-9]+", text.strip()) and
                           got == tuple(int(x) for x in text.strip().split(":"))), (text, got)


@given(st.integers(), st.integers())
def test_pci_address_of_any_location(domain, location):
    addr = amd.pci_address(domain, location)
    assert len(addr) >= 12 and addr[-2] == "."


blobs = st.binary(max_size=200)


@settings(max_examples=60, deadline=None)
@given(vendor=blobs, device=blobs, ev=blobs, dev=blobs, props=blobs, gpu_id=blobs, accel_dev=blobs)
def test_probes_on_garbage_sysfs_never_raise(vendor, device, ev, dev, props, gpu_id, accel_dev):
    """Every file a probe reads holds arbitrary bytes: warnings, never an exception."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        fh = FakeHost(root)
        fakehost.amd(fh, gpus=1)
        path = fh.drm_gpu("0000:00:02.0", 0x8086, 0xA7A0, "i915", card=5, render=135)
        for name, data in (("vendor", vendor), ("device", device), ("uevent", ev)):
            fh.file(f"{path}/{name}", data)
        fh.file(f"{path}/drm/renderD135/dev", dev)
        fh.file("/sys/class/kfd/kfd/topology/nodes/1/properties", props)
        fh.file("/sys/class/kfd/kfd/topology/nodes/1/gpu_id", gpu_id)
        fh.file("/sys/class/accel/accel0/dev", accel_dev)
        fh.file("/dev/dxg", "")
        host = Host(root)
        for mod in (amd, intel, accel, wsl):
            inv = mod.probe(host)
            assert inv is None or isinstance(inv, VendorInventory), inv


def test_common_parsers_on_unicode_digits():
    assert common.parse_dev("\u00b2:1") is None
    fh_text = "Character devices:\n\u00b2 kfd\n"
    assert common.char_majors(TextHost(fh_text)) == {}


def test_imports_stay_cheap():
    code = ("import sys; before = set(sys.modules)\n"
            "import gpuhook.probe.amd, gpuhook.probe.intel, gpuhook.probe.accel, gpuhook.probe.wsl\n"
            "print(' '.join(sorted({'re', 'typing', 'dataclasses', 'pydantic'} & (set(sys.modules) - before))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), check=True)
    assert out.stdout.strip() == ""
