"""The planner: what a container gets from what the node has."""

from __future__ import annotations

from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.plan import Request, plan, request_from_spec

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


def req(**kw) -> Request:
    base = {"env": {}, "annotations": {}, "rootfs": "/run/b/rootfs", "device_paths": frozenset()}
    base.update(kw)
    return Request(**base)


def test_all_vendors_and_the_env_contract():
    e = plan(INV, req(), ldconfig="/sbin/ldconfig")
    assert "GPUHOOK_ACCELERATOR=nvidia,intel" in e.env
    assert "GPUHOOK_DEVICES=nvidia:GPU-0,nvidia:GPU-1,intel:0000:00:02.0" in e.env
    assert [n.path for n in e.device_nodes] == ["/dev/nvidia7", "/dev/nvidia6", "/dev/nvidiactl",
                                                "/dev/dri/card0", "/dev/dri/renderD128"]
    assert all(n.permissions == "rwm" for n in e.device_nodes)
    assert [m.container_path for m in e.mounts] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.1", "/usr/bin/nvidia-smi"]
    assert all("ro" in m.options for m in e.mounts)


def test_ldcache_hook_has_explicit_env_and_chroots():
    (hook,) = plan(INV, req(), ldconfig="/sbin/ldconfig").hooks
    assert hook.hook_name == "createContainer"
    assert hook.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)  # never the container's env
    assert hook.args[4:] == ("/sbin/ldconfig", "/run/b/rootfs", "/usr/lib/x86_64-linux-gnu")
    assert '"$l" -r "$r"' in hook.args[2]  # ldconfig -r: chroot into the rootfs first


def test_no_hook_without_libraries_or_rootfs():
    assert plan(Inventory("/", (INTEL,)), req()).hooks == ()
    assert plan(INV, req(rootfs=None)).hooks == ()


def test_host_root_prefixes_mount_sources_only():
    e = plan(Inventory("/tmp/fake", (NV,)), req(), ldconfig="/sbin/ldconfig")
    m = e.mounts[0]
    assert m.host_path == "/tmp/fake/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"
    assert m.container_path == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"


def test_nothing_for_cpu_nodes_sandboxes_and_opt_outs():
    assert not plan(Inventory("/", ()), req())
    assert not plan(INV, req(annotations={"io.kubernetes.cri.container-type": "sandbox"}))
    assert not plan(INV, req(annotations={"io.kubernetes.cri-o.ContainerType": "sandbox"}))
    assert not plan(INV, req(annotations={"gpuhook.dev/inject": "false"}))
    assert plan(INV, req(annotations={"io.kubernetes.cri.container-type": "container"}))


def test_request_from_spec():
    spec = {"process": {"env": ["A=1", "B=x=y", 3]}, "root": {"path": "rootfs"},
            "annotations": {"k": "v", "n": 1}, "linux": {"devices": [{"path": "/dev/fuse"}, "junk"]}}
    r = request_from_spec(spec, "/run/bundle")
    assert r.env == {"A": "1", "B": "x=y"}
    assert r.annotations == {"k": "v"}
    assert r.rootfs == "/run/bundle/rootfs"
    assert r.device_paths == frozenset({"/dev/fuse"})
    assert request_from_spec({"root": {"path": "rootfs"}}).rootfs is None
    assert request_from_spec({"root": "x", "process": "y", "linux": 3}).rootfs is None


def test_user_namespace_leaves_out_nodes_the_host_has_not_created():
    """runc bind-mounts device nodes into a user namespace: a missing host node fails the create."""
    lazy = VendorInventory("nvidia", NV.devices, (Node("/dev/nvidiactl", "c", 195, 255),
                                                  Node("/dev/nvidia-uvm-tools", "c", 510, 1, present=False)),
                           NV.libraries, NV.binaries, NV.driver_version)
    inv = Inventory("/", (lazy,))
    warnings = []
    e = plan(inv, req(userns=True), ldconfig="/sbin/ldconfig", warnings=warnings)
    assert "/dev/nvidia-uvm-tools" not in [n.path for n in e.device_nodes]
    assert "/dev/nvidiactl" in [n.path for n in e.device_nodes]
    assert any("nvidia-uvm-tools" in w for w in warnings)
    assert "/dev/nvidia-uvm-tools" in [n.path for n in plan(inv, req(), ldconfig="/sbin/ldconfig").device_nodes]
    spec = {"linux": {"namespaces": [{"type": "pid"}, {"type": "user"}]}}
    assert request_from_spec(spec).userns and not request_from_spec({"linux": {"namespaces": [{"type": "pid"}]}}).userns


def test_ldconfig_runs_directly_only_when_the_image_has_a_real_etc(tmp_path):
    """sh costs ~2 ms a create: it is there only to keep ldconfig's failure (no /etc to write
    the cache in) from failing the container."""
    plain, linked, bare = tmp_path / "plain", tmp_path / "linked", tmp_path / "bare"
    (plain / "etc").mkdir(parents=True)
    (linked).mkdir()
    (linked / "etc").symlink_to("/etc")
    bare.mkdir()
    (hook,) = plan(INV, req(rootfs=str(plain)), ldconfig="/sbin/ldconfig").hooks
    assert (hook.path, hook.args) == ("/sbin/ldconfig", ("ldconfig", "-r", str(plain), "/usr/lib/x86_64-linux-gnu"))
    assert hook.env == ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
    for rootfs in (linked, bare):
        (hook,) = plan(INV, req(rootfs=str(rootfs)), ldconfig="/sbin/ldconfig").hooks
        assert hook.path == "/bin/sh" and hook.args[4:] == ("/sbin/ldconfig", str(rootfs), "/usr/lib/x86_64-linux-gnu")
