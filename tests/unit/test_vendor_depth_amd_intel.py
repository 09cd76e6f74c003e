"""AMD MI300 compute partitions and node groups; Intel by-path links and SR-IOV."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import is_root
from conftest import plan_on
from conftest import request as req
from fakes import fakehost
from gpuhook.inventory import Device, Inventory, Node, VendorInventory
from gpuhook import hook

from gpuhook.probe import probe

needs_root = pytest.mark.skipif(not is_root(), reason="needs root: real device nodes with a group (mknod, chown)")




def build(tmp_path, scenario, mknod=False, **kw) -> str:
    fh = fakehost.FakeHost(str(tmp_path / scenario), mknod=mknod)
    getattr(fakehost, scenario)(fh, **kw)
    return fh.root


# -- AMD -------------------------------------------------------------------------------------

def test_mi300_partitions_have_their_own_render_nodes(tmp_path):
    root = build(tmp_path, "amd_mi300", gpus=2, partitions=8)
    v = probe(root).vendor("amd")
    assert len(v.devices) == 16 and {d.kind for d in v.devices} == {"partition"}
    assert [d.nodes[0].minor for d in v.devices] == list(range(128, 144))
    assert [d.parent for d in v.devices] == ["0000:05:00.0"] * 8 + ["0000:25:00.0"] * 8
    assert all(len(d.nodes) == 1 for d in v.devices)  # render only: no card node per partition
    assert not probe(root).warnings


@needs_root
def test_mi300_8_partitions_give_8_render_nodes_kfd_and_the_render_group(tmp_path):
    root = build(tmp_path, "amd_mi300", mknod=True, partitions=8, render_gid=4242, video_gid=4343)
    e = plan_on(probe(root), req()).edits
    paths = [n.path for n in e.device_nodes]
    assert paths == [f"/dev/dri/renderD{128 + i}" for i in range(8)] + ["/dev/kfd"]
    assert all((n.file_mode, n.gid) == (0o660, 4242) for n in e.device_nodes)
    assert e.additional_gids == (4242,)  # card nodes (video) are not given, so neither is video
    assert "GPUHOOK_DEVICES=" + ",".join(f"amd:0000:05:00.{i}" for i in range(8)) in e.env


def test_xcp_render_node_that_kfd_does_not_name_is_skipped(tmp_path):
    root = build(tmp_path, "amd_mi300", partitions=2)
    fh = fakehost.FakeHost(root)
    fh.drm("/sys/devices/platform/amdgpu_xcp.9", "card9", 9)
    fh.drm("/sys/devices/platform/amdgpu_xcp.9", "renderD140", 140)
    inv = probe(root)
    assert [d.nodes[0].minor for d in inv.vendor("amd").devices] == [128, 129]
    assert any("amdgpu_xcp.9" in w and "renderD140" in w for w in inv.warnings)


def test_xcp_names():
    from gpuhook.probe.amd import is_xcp

    assert is_xcp("/sys/devices/platform/amdgpu_xcp.3") and is_xcp("/sys/devices/platform/amdgpu_xcp_12")
    assert not is_xcp("/sys/devices/platform/amdgpu_xcpx") and not is_xcp("/sys/devices/pci0000:00/0000:05:00.0")


def test_groups_only_for_nodes_that_need_them():
    nodes = (Node("/dev/dri/renderD128", "c", 226, 128, 0o660, 0, 109),   # render group, 0660: needed
             Node("/dev/dri/card1", "c", 226, 1, 0o666, 0, 44),          # world rw: not needed
             Node("/dev/dri/renderD129", "c", 226, 129, None, None, None))  # not on the host yet
    kfd = Node("/dev/kfd", "c", 235, 0, 0o660, 0, 109)
    inv = Inventory("/", (VendorInventory("amd", (Device("amd", "gpu", 0, "0000:05:00.0", nodes),), (kfd,)),))
    assert plan_on(inv, req()).edits.additional_gids == (109,)


# -- Intel -----------------------------------------------------------------------------------

def test_sriov_gives_the_virtual_functions_not_the_parent(tmp_path):
    root = build(tmp_path, "intel_sriov", vfs=2)
    v = probe(root).vendor("intel")
    assert [(d.kind, d.id, d.parent) for d in v.devices] == [
        ("partition", "0000:03:00.1", "0000:03:00.0"), ("partition", "0000:03:00.2", "0000:03:00.0")]
    e = plan_on(probe(root), req()).edits
    assert [n.path for n in e.device_nodes] == ["/dev/dri/card2", "/dev/dri/renderD130",
                                                "/dev/dri/card3", "/dev/dri/renderD131"]


def test_sriov_vfs_given_to_vms_leave_nothing_for_containers(tmp_path):
    root = build(tmp_path, "intel_sriov", vfs=2, vf_driver="vfio-pci")
    inv = probe(root)
    assert inv.vendor("intel") is None
    assert any("0000:03:00.0" in w and "virtual function" in w for w in inv.warnings)


def test_sriov_disabled_is_a_plain_gpu(tmp_path):
    root = build(tmp_path, "intel_sriov", vfs=0)
    assert [(d.kind, d.id) for d in probe(root).vendor("intel").devices] == [("gpu", "0000:03:00.0")]


def test_bypath_hook_arguments(tmp_path):
    root = build(tmp_path, "intel", dgpu=True)
    e = plan_on(probe(root), req()).edits
    (h,) = e.hooks
    assert h.hook_name == "createContainer" and h.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
    assert h.kind == hook.BYPATH and h.path == hook.package_helper() and h.timeout == 10
    assert h.args[:3] == ("gpuhook-hook", "bypath", "/run/b/rootfs")
    assert h.args[3:] == ("pci-0000:00:02.0-card", "../card0", "pci-0000:00:02.0-render", "../renderD128",
                             "pci-0000:03:00.0-card", "../card1", "pci-0000:03:00.0-render", "../renderD129")
    assert plan_on(probe(root), req(rootfs=None)).edits.hooks == ()


def run_bypath(rootfs: str, *pairs: str) -> subprocess.CompletedProcess:
    """The helper as the hook runs it (it isolates itself: root only)."""
    if os.geteuid() != 0:
        pytest.skip("gpuhook-hook isolates itself in a mount namespace: root only")
    return subprocess.run([hook.package_helper(), *hook.argv(hook.BYPATH, rootfs, pairs)[1:]],
                          capture_output=True, text=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def test_bypath_script_makes_links(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev" / "dri").mkdir(parents=True)
    r = run_bypath(str(rootfs), "pci-0000:00:02.0-card", "../card0", "pci-0000:00:02.0-render", "../renderD128")
    assert r.returncode == 0, r.stderr
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:00:02.0-render") == "../renderD128"
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:00:02.0-card") == "../card0"
    # again (a restarted container): the links are replaced, not nested
    assert run_bypath(str(rootfs), "pci-0000:00:02.0-card", "../card0").returncode == 0
    assert sorted(os.listdir(rootfs / "dev/dri/by-path")) == ["pci-0000:00:02.0-card", "pci-0000:00:02.0-render"]
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:00:02.0-card") == "../card0"


@pytest.mark.parametrize("evil", ["dev", "dev/dri", "dev/dri/by-path"])
def test_bypath_script_never_follows_a_link_out_of_the_rootfs(tmp_path, evil):
    outside = tmp_path / "outside"
    outside.mkdir()
    rootfs = tmp_path / "rootfs"
    parent = rootfs / evil
    parent.parent.mkdir(parents=True, exist_ok=True)
    if evil != "dev":
        (rootfs / "dev" / "dri").mkdir(parents=True, exist_ok=True)
        if evil == "dev/dri":
            os.rmdir(rootfs / "dev" / "dri")
    os.symlink(str(outside), parent)
    r = run_bypath(str(rootfs), "pci-0000:00:02.0-card", "../card0")
    assert r.returncode == 0  # never fails the container
    assert "not made" in r.stderr
    assert list(outside.iterdir()) == []


def test_bypath_script_does_not_write_through_a_link_at_the_name(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    rootfs = tmp_path / "rootfs"
    (rootfs / "dev" / "dri" / "by-path").mkdir(parents=True)
    os.symlink(str(outside), rootfs / "dev/dri/by-path/pci-0000:00:02.0-card")
    assert run_bypath(str(rootfs), "pci-0000:00:02.0-card", "../card0").returncode == 0
    assert os.readlink(rootfs / "dev/dri/by-path/pci-0000:00:02.0-card") == "../card0"
    assert list(outside.iterdir()) == []
