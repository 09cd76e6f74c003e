"""What plan() decides for a container, read as a user reads it: the edits (env, device nodes,
mounts, hooks, groups), the vendors and devices given, the devices held back, the one-line
reason when a GPU node gives nothing, and the warnings. Inputs are what a pod author, an
image or a node brings: the env, the annotations, the devices a device plugin already put in
the spec, the node's inventory and config.

outcome() is the one place that reads plan()'s result: when plan() returns another shape,
only it changes."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from conftest import request
from conftest import plan_on
from gpuhook.config import Config
from gpuhook.edits import Edits
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.plan import unusable

V = "550.54.14"
LIB = "/usr/lib/x86_64-linux-gnu"
CUDA = Library(f"{LIB}/libcuda.so.{V}", "libcuda.so.1", "compute")
NVML = Library(f"{LIB}/libnvidia-ml.so.{V}", "libnvidia-ml.so.1", "utility")


class Outcome(NamedTuple):
    edits: Edits
    vendors: tuple
    devices: tuple
    held_back: tuple  # ((device, why), ...)
    reason: "str | None"
    warnings: tuple

    def env(self, key: str) -> "str | None":
        return next((e.split("=", 1)[1] for e in self.edits.env if e.startswith(key + "=")), None)

    @property
    def nodes(self) -> list:
        return [n.path for n in self.edits.device_nodes]

    @property
    def mounts(self) -> dict:
        return {m.container_path: m.host_path for m in self.edits.mounts}


def outcome(inv: Inventory, req=None, **kw) -> Outcome:
    p = plan_on(inv, req if req is not None else request(rootfs=None), **kw)
    return Outcome(p.edits, tuple(p.vendors), tuple(p.devices), tuple((h.device, h.why) for h in p.held_back),
                   p.reason, tuple(p.warnings))


def nvidia(n=2, libs=(CUDA, NVML), version=V, binaries=()) -> VendorInventory:
    return VendorInventory("nvidia", tuple(
        Device("nvidia", "gpu", i, f"GPU-{i:04d}", (Node(f"/dev/nvidia{i}", "c", 195, i),), f"0000:{0x18 + i:02x}:00.0")
        for i in range(n)), (Node("/dev/nvidiactl", "c", 195, 255),), tuple(libs), tuple(binaries), version)


def amd(n=1) -> VendorInventory:
    return VendorInventory("amd", tuple(
        Device("amd", "gpu", i, f"0000:{0x43 + i:02x}:00.0", (Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i),),
               f"0000:{0x43 + i:02x}:00.0") for i in range(n)), (Node("/dev/kfd", "c", 235, 0),))


def dxg(libs=("libdxcore.so",)) -> VendorInventory:
    return VendorInventory("dxg", (Device("dxg", "gpu", 0, "dxg0", (Node("/dev/dxg", "c", 10, 63),)),), (),
                           tuple(Library(f"/usr/lib/wsl/lib/{n}", n, "compute") for n in libs))


# -- a vendor whose userspace is missing -----------------------------------------------------------


def test_nvidia_without_libcuda_is_left_out_whole_with_why():
    o = outcome(Inventory("/", (nvidia(libs=(NVML,)), amd())))
    assert o.vendors == ("amd",) and o.env("GPUHOOK_ACCELERATOR") == "amd"
    assert not any(p.startswith("/dev/nvidia") for p in o.nodes) and not any("nvidia" in p for p in o.mounts)
    assert o.warnings == (f"nvidia: 2 device(s) not given: no libcuda.so.1 of driver {V} on this node "
                          "(capability compute); the container runs without them",)


def test_what_a_container_of_nvidia_needs_follows_its_capabilities():
    only_nvml = Inventory("/", (nvidia(libs=(NVML,)),))
    only_cuda = Inventory("/", (nvidia(libs=(CUDA,)),))
    utility = request(env={"NVIDIA_DRIVER_CAPABILITIES": "utility"}, rootfs=None)
    assert outcome(only_nvml, utility).vendors == ("nvidia",)  # utility needs NVML only
    o = outcome(only_cuda, utility)
    assert o.vendors == () and o.warnings == (
        f"nvidia: 2 device(s) not given: no libnvidia-ml.so.1 of driver {V} on this node (capability utility); "
        "the container runs without them",)
    video = request(env={"NVIDIA_DRIVER_CAPABILITIES": "video"}, rootfs=None)
    assert outcome(Inventory("/", (nvidia(libs=()),)), video).vendors == ("nvidia",)  # needs neither
    assert outcome(only_cuda, request(env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}, rootfs=None)).vendors \
        == ("nvidia",)  # compute first: libcuda is what it cannot work without


def test_the_missing_library_names_the_driver_or_says_it_is_unknown():
    assert unusable(nvidia(libs=(NVML,))) == (
        "no-libcuda", f"no libcuda.so.1 of driver {V} on this node (capability compute)")
    assert unusable(nvidia(libs=(NVML,), version=None)) == (
        "no-libcuda", "no libcuda.so.1 of driver (unknown version) on this node (capability compute)")
    assert unusable(nvidia(libs=(CUDA,)), frozenset({"utility"})) == (
        "no-libnvidia-ml", f"no libnvidia-ml.so.1 of driver {V} on this node (capability utility)")
    assert unusable(nvidia(libs=(CUDA,)), frozenset({"utility", "compute"})) is None
    assert unusable(nvidia(libs=()), frozenset({"graphics"})) is None
    assert unusable(nvidia()) is None and unusable(amd()) is None


def test_wsl_without_libdxcore_is_left_out():
    assert unusable(dxg()) is None
    assert unusable(dxg(libs=("libd3d12.so",))) == ("no-libdxcore", "no libdxcore.so in /usr/lib/wsl/lib")
    assert unusable(dxg(libs=("libdxcore.so.1",))) is not None  # the exact file the runtime loads
    o = outcome(Inventory("/", (dxg(libs=("libd3d12.so",)),)))
    assert o.edits == Edits() and o.warnings == (
        "dxg: 1 device(s) not given: no libdxcore.so in /usr/lib/wsl/lib; the container runs without them",)
    assert o.reason is not None and o.reason.startswith("no usable GPU for this container")


# -- why a GPU node gave nothing ------------------------------------------------------------------


def test_each_reason_for_nothing():
    inv = Inventory("/", (nvidia(), amd()))
    assert outcome(inv, request(annotations={"gpuhook.dev/max-gpus": "0"}, rootfs=None)).reason == \
        'the pod says gpuhook.dev/max-gpus: "0"'
    assert outcome(Inventory("/", (nvidia(),)), request(annotations={"gpuhook.dev/vendors": "amd"}, rootfs=None)).reason \
        == "the pod's gpuhook.dev/vendors names no vendor of this node"
    o = outcome(inv, request(annotations={"gpuhook.dev/inject": "false"}, rootfs=None))
    assert o.edits == Edits() and o.reason == 'the pod says gpuhook.dev/inject: "false"'
    o = outcome(Inventory("/", (nvidia(),)), request(env={"NVIDIA_VISIBLE_DEVICES": "7"}, rootfs=None))
    assert o.edits == Edits() and o.reason == ("no usable GPU for this container (its NVIDIA_VISIBLE_DEVICES, or a "
                                               "vendor's userspace missing: see warnings)")
    given = outcome(inv)
    assert given.reason is None and given.vendors == ("nvidia", "amd")
    assert given.devices == ("nvidia:GPU-0000", "nvidia:GPU-0001", "amd:0000:43:00.0")


def test_a_vendor_named_by_the_pod_but_without_devices_is_no_vendor_of_the_node():
    empty_amd = VendorInventory("amd", (), (Node("/dev/kfd", "c", 235, 0),))
    o = outcome(Inventory("/", (nvidia(), empty_amd)), request(annotations={"gpuhook.dev/vendors": "amd"}, rootfs=None))
    assert o.edits == Edits() and o.reason == "the pod's gpuhook.dev/vendors names no vendor of this node"


def test_nothing_at_all_for_a_sandbox_or_a_node_without_gpus():
    for key in ("io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType"):
        o = outcome(Inventory("/", (nvidia(),)), request(annotations={key: "sandbox"}, rootfs=None))
        assert o == Outcome(Edits(), (), (), (), None, ())
    assert outcome(Inventory("/", ())) == Outcome(Edits(), (), (), (), None, ())


# -- NVIDIA_VISIBLE_DEVICES=none: the driver, no GPU -------------------------------------------------


def test_visible_none_gives_the_driver_files_and_no_device():
    o = outcome(Inventory("/", (nvidia(),)), request(env={"NVIDIA_VISIBLE_DEVICES": "none"}, rootfs=None))
    assert o.nodes == ["/dev/nvidiactl"] and f"{LIB}/libcuda.so.{V}" in o.mounts
    assert o.vendors == () and o.devices == () and o.env("GPUHOOK_ACCELERATOR") is None


@pytest.mark.parametrize("value", ["void", ""])
def test_visible_void_gives_nothing_of_nvidia(value):
    o = outcome(Inventory("/", (nvidia(), amd())), request(env={"NVIDIA_VISIBLE_DEVICES": value}, rootfs=None))
    assert o.vendors == ("amd",) and not any("nvidia" in p for p in o.nodes)


# -- share = "unallocated" is the default --------------------------------------------------------------


def test_without_a_node_config_the_kubelets_allocations_are_held_back(tmp_path):
    import json
    import os

    path = tmp_path / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    os.makedirs(path.parent)
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": "other", "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"0": ["GPU-0001"]}}]}}))
    inv = Inventory(str(tmp_path), (nvidia(),))
    o = outcome(inv)
    assert o.devices == ("nvidia:GPU-0000",)
    assert o.held_back == (("nvidia:GPU-0001", "allocated by the kubelet to pod 'other' (nvidia.com/gpu 'GPU-0001')"),)
    assert outcome(inv, config=Config(share="all")).devices == ("nvidia:GPU-0000", "nvidia:GPU-0001")
    assert outcome(inv, config=Config()).devices == ("nvidia:GPU-0000",)
    path.write_text("{not json")
    o = outcome(inv)
    assert o.edits == Edits() and o.held_back == (("nvidia:GPU-0000", "the kubelet's checkpoint is unreadable"),
                                                  ("nvidia:GPU-0001", "the kubelet's checkpoint is unreadable"))
    assert o.reason == (f"/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint: not a device manager checkpoint "
                        "(JSONDecodeError): which GPUs are free is unknown (share = unallocated)")
    assert o.warnings == ("share = unallocated: /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint: not a "
                          "device manager checkpoint (JSONDecodeError); no GPU is given (which are free is unknown)",)


# -- the MPS pipe directory and NVIDIA tools ------------------------------------------------------


@pytest.fixture
def mps_node(tmp_path):
    """A node root with the MPS daemon's pipe directory at /run/mps (root's, 0755, control in it)."""
    import os

    (tmp_path / "run" / "mps").mkdir(parents=True)
    (tmp_path / "run" / "mps" / "control").write_text("")
    for d in (tmp_path, tmp_path / "run", tmp_path / "run" / "mps"):
        os.chmod(d, 0o755)
    return Inventory(str(tmp_path), (nvidia(),)), Config(mps_pipe_dir="/run/mps", share="all")


@pytest.mark.parametrize("env, dest", [
    ({}, "/tmp/nvidia-mps"),
    ({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps-pipes"}, "/run/mps-pipes"),
    ({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps-pipes/"}, "/run/mps-pipes"),
    ({"CUDA_MPS_PIPE_DIRECTORY": "/run/mpsX"}, "/run/mpsX"),
])
def test_the_mps_pipes_are_mounted_read_write_where_the_container_looks(mps_node, env, dest):
    inv, config = mps_node
    o = outcome(inv, request(env=env, rootfs=None), config=config)
    (m,) = [m for m in o.edits.mounts if m.host_path == f"{inv.root}/run/mps"]
    assert (m.container_path, m.type, m.options) == (dest, "bind", ("nosuid", "nodev", "noexec", "rbind", "rprivate"))
    assert o.warnings == ()


def test_a_pipe_directory_the_container_cannot_use_is_replaced_by_the_default(mps_node):
    inv, config = mps_node
    o = outcome(inv, request(env={"CUDA_MPS_PIPE_DIRECTORY": "/proc/x"}, rootfs=None), config=config)
    assert o.mounts["/tmp/nvidia-mps"] == f"{inv.root}/run/mps"
    assert o.warnings == ("CUDA_MPS_PIPE_DIRECTORY: '/proc/x' is not a usable directory; the MPS pipes are at "
                          "/tmp/nvidia-mps",)


def test_a_tool_the_table_does_not_know_comes_with_utility():
    inv = Inventory("/", (nvidia(binaries=("/usr/bin/nvidia-smi", "/usr/bin/nvidia-newtool")),))
    assert "/usr/bin/nvidia-newtool" in outcome(inv).mounts
    compute = request(env={"NVIDIA_DRIVER_CAPABILITIES": "compute"}, rootfs=None)
    assert "/usr/bin/nvidia-newtool" not in outcome(inv, compute).mounts


def test_visible_devices_by_volume_mounts_with_a_trailing_slash():
    vol = "/var/run/nvidia-container-devices"
    req = request(env={"NVIDIA_VISIBLE_DEVICES": vol + "/"}, mounts=(f"{vol}/GPU-0001",), rootfs=None)
    assert outcome(Inventory("/", (nvidia(),)), req).devices == ("nvidia:GPU-0001",)


def test_the_hooks_log_where_the_node_config_says(tmp_path):
    from gpuhook import hook

    inv = Inventory("/", (nvidia(),))
    req = request(rootfs="/run/b/rootfs")
    kw = dict(ldconfig="/sbin/ldconfig", helper="/usr/lib/gpuhook/gpuhook-hook")
    (h,) = outcome(inv, req, config=Config(log_file="/var/log/gpuhook-x.log", share="all"), **kw).edits.hooks
    assert f"{hook.LOG_ENV}=/var/log/gpuhook-x.log" in h.env and h.path == "/usr/lib/gpuhook/gpuhook-hook"
    (h,) = outcome(inv, req, config=Config(log_file="", share="all"), **kw).edits.hooks
    assert not any(e.startswith(hook.LOG_ENV + "=") for e in h.env)


def test_a_mig_capability_node_in_the_spec_names_no_gpu():
    """/dev/nvidia-caps/* come with a GPU's MIG instances; a spec holding one (and not the GPU's
    own node) is not a device plugin's choice of that GPU."""
    gpus = tuple(Device("nvidia", "gpu", i, f"GPU-{i:04d}", (Node(f"/dev/nvidia{i}", "c", 195, i),
                                                               Node(f"/dev/nvidia-caps/nvidia-cap{21 + i}", "c", 511, 21 + i)))
                 for i in range(2))
    inv = Inventory("/", (VendorInventory("nvidia", gpus, (), (CUDA, NVML), (), V),))
    req = request(spec_devices={"/dev/nvidia-caps/nvidia-cap22": ("c", 511, 22)}, rootfs=None)
    assert outcome(inv, req).devices == ("nvidia:GPU-0000", "nvidia:GPU-0001")
    req = request(spec_devices={"/dev/nvidia1": ("c", 195, 1)}, rootfs=None)
    assert outcome(inv, req).devices == ("nvidia:GPU-0001",)


def test_an_unknown_capability_is_warned_about_once():
    o = outcome(Inventory("/", (nvidia(),)), request(env={"NVIDIA_DRIVER_CAPABILITIES": "compute,bogus"}, rootfs=None))
    assert o.vendors == ("nvidia",) and o.warnings == ("NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus' ignored",)


@pytest.mark.parametrize("caps, drm", [("display", True), ("graphics", True), ("compute,utility", False),
                                       ("display,compute", True)])
def test_a_gpus_drm_nodes_come_with_graphics_or_display(caps, drm):
    gpu = Device("nvidia", "gpu", 0, "GPU-0000", (Node("/dev/nvidia0", "c", 195, 0), Node("/dev/dri/card1", "c", 226, 1),
                                                  Node("/dev/dri/renderD128", "c", 226, 128)))
    inv = Inventory("/", (VendorInventory("nvidia", (gpu,), (Node("/dev/nvidiactl", "c", 195, 255),), (CUDA, NVML), (), V),))
    o = outcome(inv, request(env={"NVIDIA_DRIVER_CAPABILITIES": caps}, rootfs=None))
    assert o.devices == ("nvidia:GPU-0000",)
    assert ("/dev/dri/card1" in o.nodes, "/dev/dri/renderD128" in o.nodes) == (drm, drm)


def test_each_tool_comes_with_its_capability():
    tools = ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-ngx-updater")
    inv = Inventory("/", (nvidia(binaries=tools),))
    got = {c: {p for p in tools if p in outcome(inv, request(env={"NVIDIA_DRIVER_CAPABILITIES": c}, rootfs=None)).mounts}
           for c in ("compute", "utility", "ngx")}
    assert got == {"compute": {"/usr/bin/nvidia-cuda-mps-control"}, "utility": {"/usr/bin/nvidia-smi"},
                   "ngx": {"/usr/bin/nvidia-ngx-updater"}}


def test_volume_mount_ids_are_the_names_right_under_the_directory():
    vol = "/var/run/nvidia-container-devices"
    req = request(env={"NVIDIA_VISIBLE_DEVICES": vol}, rootfs=None,
                  mounts=("/proc", "/dev/shm", f"{vol}/GPU-0001", f"{vol}/GPU-0000/extra", "/etc/hosts"))
    o = outcome(Inventory("/", (nvidia(),)), req)
    assert o.devices == ("nvidia:GPU-0001",) and o.warnings == ()


def test_a_mig_capability_node_listed_first_does_not_hide_the_gpus_own():
    gpu = Device("nvidia", "gpu", 1, "GPU-0001", (Node("/dev/nvidia-caps/nvidia-cap22", "c", 511, 22),
                                                  Node("/dev/nvidia1", "c", 195, 1)))
    other = Device("nvidia", "gpu", 0, "GPU-0000", (Node("/dev/nvidia0", "c", 195, 0),))
    inv = Inventory("/", (VendorInventory("nvidia", (other, gpu), (), (CUDA, NVML), (), V),))
    req = request(spec_devices={"/dev/nvidia1": ("c", 195, 1)}, rootfs=None)
    assert outcome(inv, req).devices == ("nvidia:GPU-0001",)


def test_in_a_user_namespace_the_libraries_come_even_when_no_node_is_there_yet():
    absent = Node("/dev/nvidia0", "c", 195, 0, present=False)
    gpu = Device("nvidia", "gpu", 0, "GPU-0000", (absent,))
    inv = Inventory("/", (VendorInventory("nvidia", (gpu,), (Node("/dev/nvidiactl", "c", 195, 255, present=False),),
                                          (CUDA, NVML), (), V),))
    o = outcome(inv, request(userns=True, rootfs=None))
    assert o.nodes == [] and f"{LIB}/libcuda.so.{V}" in o.mounts and o.env("GPUHOOK_ACCELERATOR") == "nvidia"
    assert o.warnings == ("user namespace: /dev/nvidia0, /dev/nvidiactl not created on the host yet, left out",)


def test_a_value_that_only_looks_like_the_volume_mounts_directory_is_a_list():
    req = request(env={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devicesX"}, rootfs=None,
                  mounts=("/var/run/nvidia-container-devices/GPU-0001",))
    o = outcome(Inventory("/", (nvidia(),)), req)
    assert o.devices == () and len(o.warnings) == 1


def test_a_device_plugins_gpu_in_the_spec_is_not_held_back_nor_warned_about(tmp_path):
    """The spec already holds the GPU a device plugin gave (none other of that vendor is
    added), and the checkpoint holds an id gpuhook cannot map: nothing to hold back, no warning."""
    import json
    import os

    path = tmp_path / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    os.makedirs(path.parent)
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": "other", "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"0": ["GPU-ffff"]}}]}}))
    req = request(spec_devices={"/dev/nvidia1": ("c", 195, 1)}, rootfs=None)
    o = outcome(Inventory(str(tmp_path), (nvidia(),)), req)
    assert o.devices == ("nvidia:GPU-0001",) and o.held_back == () and o.warnings == ()


def test_each_nvidia_visible_devices_token_not_taken_is_named_with_why():
    """A pod author's NVIDIA_VISIBLE_DEVICES: each id that gives no GPU is one warning, saying
    which id and why (not a GPU's id at all, no GPU of this node, several); the others are given."""
    env = {"NVIDIA_VISIBLE_DEVICES": "MIG-0,GPU-9999,GPU-000,1"}
    o = outcome(Inventory("/", (nvidia(),)), request(env=env, rootfs=None))
    assert o.devices == ("nvidia:GPU-0001",) and o.nodes[0] == "/dev/nvidia1"
    assert o.warnings == (
        "NVIDIA_VISIBLE_DEVICES: 'MIG-0' is not a GPU index or UUID (MIG devices are not supported), ignored",
        "NVIDIA_VISIBLE_DEVICES: 'GPU-9999' matches no GPU of this node, ignored",
        "NVIDIA_VISIBLE_DEVICES: 'GPU-000' matches 2 GPUs, ignored",
    )


def test_a_plan_that_fails_raises_as_it_is_with_the_warnings_given_before():
    """What the runtime logs with the error (runtime/create.py): the exception itself, unchanged,
    and the warnings plan() had given by then (here a broken inventory: a GPU without a list of
    nodes, after an unknown capability word)."""
    from gpuhook.plan import WARNINGS_SO_FAR

    gpu = Device("nvidia", "gpu", 0, "GPU-0000", None, "0000:18:00.0")
    inv = Inventory("/", (nvidia()._replace(devices=(gpu,)),))
    with pytest.raises(TypeError) as e:
        plan_on(inv, request(env={"NVIDIA_DRIVER_CAPABILITIES": "compute,bogus"}, rootfs=None))
    assert getattr(e.value, WARNINGS_SO_FAR) == ("NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus' ignored",)


def test_the_mps_directory_of_the_node_itself_is_mounted_by_its_own_path():
    """On a node (host root "/", not a test's root) the pipe directory is mounted from its own
    path, the one checked."""
    import os
    import shutil
    import tempfile

    if os.geteuid() != 0 or not os.access("/run", os.W_OK):
        pytest.skip("needs root and /run: a root-owned directory on the node itself")
    d = tempfile.mkdtemp(dir="/run", prefix="gpuhook-test-mps-")
    try:
        os.chmod(d, 0o755)
        open(os.path.join(d, "control"), "w").close()
        o = outcome(Inventory("/", (nvidia(),)), config=Config(mps_pipe_dir=d, share="all"))
        assert o.mounts["/tmp/nvidia-mps"] == d and o.warnings == ()
    finally:
        shutil.rmtree(d)
