"""The planner: what a container gets from what the node has."""

from __future__ import annotations

import json
import os

from gpuhook import hook
from gpuhook.config import Config
from gpuhook.edits import Edits
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from conftest import request as req
from conftest import plan_on
from gpuhook.plan import UNMAPPED, UNREADABLE, Plan, request_from_spec

NV = VendorInventory(
    "nvidia",
    tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{7 - i}", "c", 195, 7 - i),)) for i in range(2)),
    (Node("/dev/nvidiactl", "c", 195, 255),),
    (Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.1", "libcuda.so.1", "compute"),),
    ("/usr/bin/nvidia-smi",),
    "550.1",
)
INTEL = VendorInventory("intel", (Device("intel", "gpu", 0, "0000:00:02.0", (Node("/dev/dri/card0", "c", 226, 0),
                                                                            Node("/dev/dri/renderD128", "c", 226, 128))),))
INV = Inventory("/", (NV, INTEL))




def test_all_vendors_and_the_env_contract():
    e = plan_on(INV, req(), ldconfig="/sbin/ldconfig").edits
    assert "GPUHOOK_ACCELERATOR=nvidia,intel" in e.env
    assert "GPUHOOK_DEVICES=nvidia:GPU-0,nvidia:GPU-1,intel:0000:00:02.0" in e.env
    assert [n.path for n in e.device_nodes] == ["/dev/nvidia7", "/dev/nvidia6", "/dev/nvidiactl",
                                                "/dev/dri/card0", "/dev/dri/renderD128"]
    assert all(n.permissions == "rwm" for n in e.device_nodes)
    # libcuda at its own name and at its development name (-lcuda), the same file
    assert [m.container_path for m in e.mounts] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.1",
                                                    "/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/bin/nvidia-smi"]
    assert e.mounts[0].host_path == e.mounts[1].host_path
    assert all("ro" in m.options for m in e.mounts)


def test_ldcache_hook_has_explicit_env_and_runs_isolated():
    (h,) = plan_on(INV, req(), ldconfig="/sbin/ldconfig").edits.hooks
    assert h.hook_name == "createContainer" and h.kind == hook.LDCACHE
    assert h.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)  # never the container's env
    # the isolated helper (gpuhook/hook/), never ldconfig or sh over the rootfs directly
    assert h.path == hook.package_helper()
    assert h.args == ("gpuhook-hook", "ldcache", "/run/b/rootfs", "/sbin/ldconfig", "/usr/lib/x86_64-linux-gnu")
    assert h.timeout == 30


def test_no_hook_when_the_helper_is_missing(monkeypatch):
    """An unbuilt helper: no hook at all (runc would fail the container on a missing hook
    binary), and the warning says so; never the bare ldconfig."""
    monkeypatch.setattr(hook, "package_helper", lambda: "/nonexistent/gpuhook-hook")
    p = plan_on(INV, req(), ldconfig="/sbin/ldconfig")
    assert p.edits.hooks == () and p.edits.mounts and any("gpuhook-hook is missing" in w for w in p.warnings)


def test_no_hook_without_libraries_or_rootfs():
    assert plan_on(Inventory("/", (INTEL,)), req()).edits.hooks == ()
    assert plan_on(INV, req(rootfs=None)).edits.hooks == ()


def test_host_root_prefixes_mount_sources_only():
    e = plan_on(Inventory("/tmp/fake", (NV,)), req(), ldconfig="/sbin/ldconfig").edits
    m = e.mounts[0]
    assert m.host_path == "/tmp/fake/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"
    assert m.container_path == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"


def test_nothing_for_cpu_nodes_sandboxes_and_opt_outs():
    assert not plan_on(Inventory("/", ()), req()).edits
    assert not plan_on(INV, req(annotations={"io.kubernetes.cri.container-type": "sandbox"})).edits
    assert not plan_on(INV, req(annotations={"io.kubernetes.cri-o.ContainerType": "sandbox"})).edits
    assert not plan_on(INV, req(annotations={"gpuhook.dev/inject": "false"})).edits
    assert plan_on(INV, req(annotations={"io.kubernetes.cri.container-type": "container"})).edits


def test_request_from_spec():
    spec = {"process": {"env": ["A=1", "B=x=y", 3]}, "root": {"path": "rootfs"},
            "annotations": {"k": "v", "n": 1}, "linux": {"devices": [{"path": "/dev/fuse"}, "junk"]}}
    r = request_from_spec(spec, "/run/bundle")
    assert r.env == {"A": "1", "B": "x=y"}
    assert r.annotations == {"k": "v"}
    assert r.rootfs == "/run/bundle/rootfs"
    assert r.spec_devices == {"/dev/fuse": None}  # in the spec, without numbers
    assert request_from_spec({"root": {"path": "rootfs"}}).rootfs is None
    assert request_from_spec({"root": "x", "process": "y", "linux": 3}).rootfs is None


def test_user_namespace_leaves_out_nodes_the_host_has_not_created():
    """runc bind-mounts device nodes into a user namespace: a missing host node fails the create."""
    lazy = VendorInventory("nvidia", NV.devices, (Node("/dev/nvidiactl", "c", 195, 255),
                                                  Node("/dev/nvidia-uvm-tools", "c", 510, 1, present=False)),
                           NV.libraries, NV.binaries, NV.driver_version)
    inv = Inventory("/", (lazy,))
    p = plan_on(inv, req(userns=True), ldconfig="/sbin/ldconfig")
    e, warnings = p.edits, p.warnings
    assert "/dev/nvidia-uvm-tools" not in [n.path for n in e.device_nodes]
    assert "/dev/nvidiactl" in [n.path for n in e.device_nodes]
    assert any("nvidia-uvm-tools" in w for w in warnings)
    assert "/dev/nvidia-uvm-tools" in [n.path for n in plan_on(inv, req(), ldconfig="/sbin/ldconfig").edits.device_nodes]
    spec = {"linux": {"namespaces": [{"type": "pid"}, {"type": "user"}]}}
    assert request_from_spec(spec).userns and not request_from_spec({"linux": {"namespaces": [{"type": "pid"}]}}).userns


def test_the_hook_is_the_same_whatever_the_image_holds(tmp_path):
    """plan() looks at nothing in the rootfs (no lstat of its /etc either): whatever the image
    holds is the isolated helper's business, after its pivot_root."""
    plain, linked, bare = tmp_path / "plain", tmp_path / "linked", tmp_path / "bare"
    (plain / "etc").mkdir(parents=True)
    (linked).mkdir()
    (linked / "etc").symlink_to("/etc")
    bare.mkdir()
    for rootfs in (plain, linked, bare):
        (h,) = plan_on(INV, req(rootfs=str(rootfs)), ldconfig="/sbin/ldconfig").edits.hooks
        assert (h.path, h.args) == (hook.package_helper(), hook.argv(hook.LDCACHE, str(rootfs),
                                                                     ("/sbin/ldconfig", "/usr/lib/x86_64-linux-gnu")))


def _checkpoint(root, text: str) -> None:
    path = os.path.join(root, "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(text)


def test_what_was_held_back_says_why_by_name(tmp_path):
    """share = "unallocated": each device held back carries its reason by name, and the
    Plan's reason and warnings say it in words."""
    unreadable, unmapped = str(tmp_path / "a"), str(tmp_path / "b")
    _checkpoint(unreadable, "{not json")
    p = plan_on(Inventory(unreadable, INV.vendors), req(rootfs=None), config=Config(share="unallocated"))
    assert not p.edits and p.vendors == () and p.devices == ()
    assert [(h.device, h.reason) for h in p.held_back] == [("nvidia:GPU-0", UNREADABLE), ("nvidia:GPU-1", UNREADABLE),
                                                           ("intel:0000:00:02.0", UNREADABLE)]
    assert p.reason.endswith("which GPUs are free is unknown (share = unallocated)")
    assert any("no GPU is given" in w for w in p.warnings)
    entry = {"PodUID": "pod-x", "ContainerName": "c", "ResourceName": "nvidia.com/gpu", "DeviceIDs": ["weird"]}
    _checkpoint(unmapped, json.dumps({"Data": {"PodDeviceEntries": [entry]}, "Checksum": 0}))
    p = plan_on(Inventory(unmapped, INV.vendors), req(rootfs=None), config=Config(share="unallocated"))
    assert p.vendors == ("intel",) and p.devices == ("intel:0000:00:02.0",) and p.reason is None
    assert [(h.device, h.reason) for h in p.held_back] == [("nvidia:GPU-0", UNMAPPED), ("nvidia:GPU-1", UNMAPPED)]
    assert all("'weird'" in h.why and "cannot map" in h.why for h in p.held_back)


def test_the_plan_of_an_opted_out_pod_says_why_and_warns_of_bad_annotations():
    p = plan_on(INV, req(annotations={"gpuhook.dev/inject": "false", "gpuhook.dev/colour": "red"}))
    assert not p.edits and p.reason == 'the pod says gpuhook.dev/inject: "false"'
    (w,) = p.warnings
    assert "gpuhook.dev/colour" in w and "not a gpuhook annotation" in w
    assert plan_on(Inventory("/", ()), req()) == Plan(Edits())  # a CPU-only node: nothing to say


def test_the_rootfs_is_the_one_the_bundle_path_names_through_a_link_and_dotdot(tmp_path):
    """A bundle given as link/.. names, as runc resolves it, the link target's parent: the
    rootfs the ld-cache hook is given is that one's, never the rootfs beside the link."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "rootfs").mkdir()
    (tmp_path / "other" / "rootfs").mkdir(parents=True)
    (tmp_path / "other" / "link").symlink_to(tmp_path / "real" / "sub")
    bundle = str(tmp_path / "other" / "link" / "..")
    for path in ("rootfs", f"{bundle}/rootfs"):
        r = request_from_spec({"root": {"path": path}}, bundle)
        assert os.path.samefile(r.rootfs, tmp_path / "real" / "rootfs"), (path, r.rootfs)
