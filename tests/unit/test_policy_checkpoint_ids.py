"""share = "unallocated": the kubelet checkpoint's device ids in every format the real device
plugins write, each mapped to the GPU it takes, and an id gpuhook cannot map holding that
vendor's GPUs back (issues 20.2, 26.2).

The checkpoint is written as the kubelet's device manager writes it (checkpoint v2:
Data.PodDeviceEntries[].DeviceIDs keyed by NUMA node, "-1" without topology; AllocResp the
plugin's ContainerAllocateResponse, base64). The id formats, from the plugins' sources:
NVIDIA k8s-device-plugin (AnnotatedID `<id>::<replica>` for time-slicing and MPS; deviceIDStrategy
uuid and index; MIG `MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>` before R470, `<gpu>:<mig>` by
index), GKE's container-engine-accelerators (`nvidia<minor>`, `nvidia<minor>/gi<n>`, either with
`/vgpu<n>` when shared), ROCm/k8s-device-plugin (the PCI address, `amdgpu_xcp_<n>` for a
partition, `<id>-slice-<n>` when time-sliced), Intel's GPU plugin (`card<N>-<i>`; "all" under
`gpu.intel.com/i915_monitoring`)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import request
from conftest import plan_on
from gpuhook.config import Config
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory


CHECKPOINT = "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
CUDA = Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "libcuda.so.1", "compute")
UUIDS = [f"GPU-{i:08x}-3e5a-4b17-9c2e-5da9abb6f8{i:02x}" for i in range(4)]  # every hex digit, as real ones
ME = "6f1c2a9e-0d3b-4c55-9a1e-7b2d8c4f0a11"
OTHER = "b4e7d1f0-8c2a-4e9b-a3d5-1f6e0c9b7a22"


def nvidia() -> VendorInventory:
    # minors deliberately differ from indices (a GPU's /dev/nvidia<minor> need not be its index)
    return VendorInventory("nvidia", tuple(
        Device("nvidia", "gpu", i, UUIDS[i], (Node(f"/dev/nvidia{i + 4}", "c", 195, i + 4),), f"0000:{0x18 + i:02x}:00.0")
        for i in range(4)), (Node("/dev/nvidiactl", "c", 195, 255),), (CUDA,), (), "550.54.14")


def amd() -> VendorInventory:
    """One MI300X split in four (partition 0 on the PCI device, 1..3 on amdgpu_xcp platform
    devices) and one whole GPU."""
    parts = tuple(Device("amd", "partition", i, f"0000:05:00.{i}", (Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i),),
                         "0000:05:00.0", None, None, "0000:05:00.0") for i in range(4))
    whole = Device("amd", "gpu", 4, "0000:85:00.0",
                   (Node("/dev/dri/card9", "c", 226, 9), Node("/dev/dri/renderD140", "c", 226, 140)), "0000:85:00.0")
    return VendorInventory("amd", (*parts, whole), (Node("/dev/kfd", "c", 235, 0),))


def intel() -> VendorInventory:
    return VendorInventory("intel", tuple(
        Device("intel", "gpu", i, f"0000:{3 + i:02x}:00.0",
               (Node(f"/dev/dri/card{i}", "c", 226, i), Node(f"/dev/dri/renderD{150 + i}", "c", 226, 150 + i)),
               f"0000:{3 + i:02x}:00.0") for i in range(2)))


def write_checkpoint(root: str, entries: list) -> None:
    """As the kubelet writes it: one entry per (pod, container, resource)."""
    path = os.path.join(root, CHECKPOINT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = {"Data": {"PodDeviceEntries": [
        {"PodUID": pod, "ContainerName": "main", "ResourceName": resource, "DeviceIDs": {"-1": ids},
         "AllocResp": "CjYKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSHEdQVS0wMDAwMDAwMC0zZTVhLTRiMTctOWMyZQ=="}
        for pod, resource, ids in entries],
        "RegisteredDevices": {"nvidia.com/gpu": [f"{u}::{r}" for u in UUIDS for r in range(4)]}},
        "Checksum": 2837465911}
    with open(path, "w") as f:
        json.dump(data, f)


def given(root: str, entries: list, vendors=(nvidia, amd, intel)):
    write_checkpoint(root, entries)
    p = plan_on(Inventory(root, tuple(v() for v in vendors)),
             request(annotations={"io.kubernetes.cri.sandbox-uid": ME}, rootfs=None),
             config=Config(share="unallocated"))
    return set(p.devices) if p.edits else set(), list(p.held_back), list(p.warnings)


ALL_NV = {f"nvidia:{u}" for u in UUIDS}
ALL_AMD = {f"amd:0000:05:00.{i}" for i in range(4)} | {"amd:0000:85:00.0"}
ALL_INTEL = {"intel:0000:03:00.0", "intel:0000:04:00.0"}
EVERYTHING = ALL_NV | ALL_AMD | ALL_INTEL


@pytest.mark.parametrize("resource,ident,taken", [
    # NVIDIA: time-slicing / MPS replicas of a UUID and of an index (deviceIDStrategy=index)
    ("nvidia.com/gpu", f"{UUIDS[1]}::0", {f"nvidia:{UUIDS[1]}"}),
    ("nvidia.com/gpu", f"{UUIDS[1]}::3", {f"nvidia:{UUIDS[1]}"}),
    ("nvidia.com/gpu.shared", f"{UUIDS[2]}::1", {f"nvidia:{UUIDS[2]}"}),  # renameByDefault
    ("nvidia.com/gpu", "2", {f"nvidia:{UUIDS[2]}"}),
    ("nvidia.com/gpu", "0::1", {f"nvidia:{UUIDS[0]}"}),
    ("nvidia.com/gpu", f"{UUIDS[1]}::123456789", {f"nvidia:{UUIDS[1]}"}),  # a replica number of up to 9 digits
    ("nvidia.com/gpu", UUIDS[3].lower(), {f"nvidia:{UUIDS[3]}"}),
    # NVIDIA MIG, mapped to the parent GPU: the old UUID form, and the index form <gpu>:<mig>
    ("nvidia.com/mig-1g.10gb", f"MIG-{UUIDS[1]}/7/0", {f"nvidia:{UUIDS[1]}"}),
    ("nvidia.com/gpu", "3:0", {f"nvidia:{UUIDS[3]}"}),
    ("nvidia.com/mig-3g.40gb", "3:1::2", {f"nvidia:{UUIDS[3]}"}),
    # GKE: /dev names (minor 5 is index 1), MIG instances and shared GPUs
    ("nvidia.com/gpu", "nvidia5", {f"nvidia:{UUIDS[1]}"}),
    ("nvidia.com/gpu", "nvidia6/vgpu3", {f"nvidia:{UUIDS[2]}"}),
    ("nvidia.com/gpu", "nvidia7/gi2", {f"nvidia:{UUIDS[3]}"}),
    ("nvidia.com/gpu", "nvidia4/gi1/vgpu0", {f"nvidia:{UUIDS[0]}"}),
    # ROCm: PCI address (a partitioned GPU's address takes all its partitions), time slices
    ("amd.com/gpu", "0000:85:00.0", {"amd:0000:85:00.0"}),
    ("amd.com/gpu", "0000:85:00.0-slice-2", {"amd:0000:85:00.0"}),
    ("amd.com/cpx_nps4", "0000:05:00.0", {f"amd:0000:05:00.{i}" for i in range(4)}),
    # Intel: card name with the shared-device number; the monitoring resource takes none
    ("gpu.intel.com/i915", "card1-0", {"intel:0000:04:00.0"}),
    ("gpu.intel.com/xe", "card0-3", {"intel:0000:03:00.0"}),
    ("gpu.intel.com/i915", "card1", {"intel:0000:04:00.0"}),
    ("gpu.intel.com/i915_monitoring", "all", set()),
    # another vendor's resource takes no GPU of these, unless its id is one of a GPU's own
    ("example.com/fpga", "fpga0", set()),
    ("example.com/vgpu", UUIDS[1], {f"nvidia:{UUIDS[1]}"}),
    ("example.com/vgpu", "0000:85:00.0", {"amd:0000:85:00.0"}),
    ("example.com/display", "card1-0", {"intel:0000:04:00.0"}),
    ("example.com/display", "card1", {"intel:0000:04:00.0"}),
])
def test_each_device_plugin_id_takes_its_gpu(tmp_path, resource, ident, taken):
    got, held, warnings = given(str(tmp_path), [(OTHER, resource, [ident]), (ME, "nvidia.com/gpu", [f"{UUIDS[0]}::1"])])
    assert got == EVERYTHING - taken
    assert {h.device for h in held} == taken
    assert all(OTHER in h.why for h in held)
    assert not [w for w in warnings if "cannot map" in w]


@pytest.mark.parametrize("name", ["amdgpu_xcp_2", "amdgpu_xcp.2"])
def test_an_amd_partition_on_an_xcp_platform_device(tmp_path, name):
    """ROCm names partitions 1.. by their platform device (the kernel's amdgpu_xcp.<n>, or
    amdgpu_xcp_<n>): its render node says which."""
    root = str(tmp_path)
    os.makedirs(os.path.join(root, f"sys/devices/platform/{name}/drm/renderD130"))
    os.makedirs(os.path.join(root, f"sys/devices/platform/{name}/drm/card12"))
    got, held, warnings = given(root, [(OTHER, "amd.com/cpx_nps4", [f"{name}-slice-0"])], vendors=(amd,))
    assert {h.device for h in held} == {"amd:0000:05:00.2"}
    assert got == ALL_AMD - {"amd:0000:05:00.2"} and warnings == []


@pytest.mark.parametrize("resource,ident,vendor", [
    ("nvidia.com/mig-1g.10gb", "MIG-8f2c1d90-3e5a-5b17-9c2e-5da9abb51763", "nvidia"),  # R470+: no parent in the id
    ("nvidia.com/gpu", "GPU-ffffffff-3e5a-4b17-9c2e-5da9abb517ff", "nvidia"),  # a GPU this node's probe did not see
    ("nvidia.com/gpu", "9", "nvidia"),
    ("nvidia.com/gpu", "nvidia0", "nvidia"),
    ("nvidia.com/gpu", f"{UUIDS[0]}::x", "nvidia"),
    ("nvidia.com/gpu", f"{UUIDS[0]}::1234567890", "nvidia"),  # 10 digits: no replica number gpuhook reads
    ("nvidia.com/gpu", f"{UUIDS[0]}::", "nvidia"),
    ("amd.com/gpu", "000:85:00.0", "amd"),  # a PCI address with a short domain
    ("amd.com/gpu", "0000:85:00.0-slice-x", "amd"),
    ("gpu.intel.com/i915", "all", "intel"),  # "all" takes nothing only under the monitoring resource
    ("gpu.intel.com/i915", "card1-x", "intel"),
    ("nvidia.com/gpu", "nvidia5/foo", "nvidia"),  # GKE's names: /gi<n> and /vgpu<n> only, at most two
    ("nvidia.com/gpu", "nvidia5/xx3", "nvidia"),
    ("nvidia.com/gpu", "nvidia5/vgpux", "nvidia"),
    ("nvidia.com/gpu", "nvidia4/gi1/vgpu0/vgpu1", "nvidia"),
    ("nvidia.com/mig-1g.10gb", f"MIG-{UUIDS[1]}/7", "nvidia"),  # MIG-GPU-<uuid>/<gi>/<ci>: both numbers
    ("nvidia.com/mig-1g.10gb", f"MIG-{UUIDS[1]}/7/0/1", "nvidia"),
    ("amd.com/gpu", "0000:85:0.0", "amd"),
    ("nvidia.com/gpu", "vgpu-7", "nvidia"),
    ("amd.com/gpu", "amdgpu_xcp_9", "amd"),  # no such platform device
    ("amd.com/gpu", "gpu-0", "amd"),
    ("gpu.intel.com/i915", "renderD128", "intel"),
    ("gpu.intel.com/xe", "card7-0", "intel"),
])
def test_an_id_gpuhook_cannot_map_holds_that_vendors_gpus_back(tmp_path, resource, ident, vendor):
    got, held, warnings = given(str(tmp_path), [(OTHER, resource, [ident])])
    mine = {"nvidia": ALL_NV, "amd": ALL_AMD, "intel": ALL_INTEL}[vendor]
    assert got == EVERYTHING - mine  # the other vendors' GPUs are still given
    assert {h.device for h in held} == mine
    assert all("cannot map" in h.why and resource in h.why for h in held)
    assert [w for w in warnings if "cannot map" in w and f"no {vendor} GPU is given" in w]
    only = Inventory(str(tmp_path), tuple(v() for v in (nvidia, amd, intel) if v().vendor == vendor))
    p = plan_on(only, request(rootfs=None), config=Config(share="unallocated"))
    assert not p.edits
    assert p.reason == (f'all {len(mine)} GPU(s) held back: the kubelet allocated {resource} '
                                 f"{ident!r} to pod {OTHER!r}, which gpuhook cannot map to a GPU of this node "
                                 '(share = "unallocated")')


def test_a_pods_own_replicas_are_not_someone_elses(tmp_path):
    got, held, _ = given(str(tmp_path), [(ME, "nvidia.com/gpu", [f"{UUIDS[2]}::0", "MIG-8f2c1d90-3e5a-5b17-9c2e-5da9abb51763"])])
    assert got == EVERYTHING and held == []


def alloc_resp(devices: list[str], envs: dict) -> str:
    """A ContainerAllocateResponse as the device plugin sends it and the kubelet keeps it
    (k8s.io/kubelet deviceplugin/v1beta1: envs = 1, devices = 3 {container_path = 1,
    host_path = 2, permissions = 3}), encoded by the protobuf library, base64 as in the JSON."""
    import base64

    pb = pytest.importorskip("google.protobuf", reason="protobuf (the CRI tests' grpcio-tools bring it)")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FileDescriptorProto(name="deviceplugin_test.proto", package="v1beta1", syntax="proto3")
    spec = f.message_type.add(name="DeviceSpec")
    for i, n in enumerate(("container_path", "host_path", "permissions"), 1):
        spec.field.add(name=n, number=i, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    resp = f.message_type.add(name="ContainerAllocateResponse")
    entry = resp.nested_type.add(name="EnvsEntry")
    entry.options.map_entry = True
    for i, n in enumerate(("key", "value"), 1):
        entry.field.add(name=n, number=i, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    resp.field.add(name="envs", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                   type_name=".v1beta1.ContainerAllocateResponse.EnvsEntry",
                   label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    resp.field.add(name="devices", number=3, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                   type_name=".v1beta1.DeviceSpec", label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("v1beta1.ContainerAllocateResponse"))
    msg = cls()
    msg.envs.update(envs)
    for d in devices:
        msg.devices.add(container_path=d, host_path=d, permissions="rw")
    assert pb  # the library that encoded it
    return base64.b64encode(msg.SerializeToString()).decode()

def plan_with_answer(root: str, resp: str):
    """The plan for a container of pod ME under share = unallocated, the checkpoint's first
    entry carrying the device plugin's answer `resp` (AllocResp) as the kubelet keeps it."""
    path = os.path.join(root, CHECKPOINT)
    with open(path) as f:
        data = json.load(f)
    data["Data"]["PodDeviceEntries"][0]["AllocResp"] = resp
    with open(path, "w") as f:
        json.dump(data, f)
    return plan_on(Inventory(root, (nvidia(),)), request(annotations={"io.kubernetes.cri.sandbox-uid": ME}, rootfs=None),
                config=Config(share="unallocated"))



MIG_UUID = "MIG-8f2c1d90-3e5a-5b17-9c2e-5da9abb51763"


def test_a_mig_uuid_is_mapped_to_its_parent_by_the_plugins_device_nodes(tmp_path):
    """deviceIDStrategy uuid and passDeviceSpecs: the id is MIG-<uuid> (no parent in it), the
    plugin's answer in the checkpoint holds the parent /dev/nvidia<minor> (minor 6: index 2)."""
    root = str(tmp_path)
    resp = alloc_resp(["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia6", "/dev/nvidia-caps/nvidia-cap21",
                       "/dev/nvidia-caps/nvidia-cap22"], {"NVIDIA_VISIBLE_DEVICES": MIG_UUID})
    write_checkpoint(root, [(OTHER, "nvidia.com/mig-1g.10gb", [MIG_UUID])])
    p = plan_with_answer(root, resp)
    assert [h.device for h in p.held_back] == [f"nvidia:{UUIDS[2]}"]
    assert set(p.devices) == ALL_NV - {f"nvidia:{UUIDS[2]}"} and p.warnings == ()
    # without device nodes in the answer (the default, passDeviceSpecs=false): every NVIDIA GPU held back
    got, held, warnings = given(str(tmp_path / "b"), [(OTHER, "nvidia.com/mig-1g.10gb", [MIG_UUID])], vendors=(nvidia,))
    assert got == set() and {h.device for h in held} == ALL_NV and any("cannot map" in w for w in warnings)


def test_mig_instances_on_two_gpus_hold_back_both_parents(tmp_path):
    """One container given MIG instances of two GPUs: the plugin's answer names both parents
    (/dev/nvidia5 and /dev/nvidia7: indices 1 and 3); both are held back, the others given."""
    root = str(tmp_path)
    other = "MIG-1f2c1d90-3e5a-5b17-9c2e-5da9abb51764"
    resp = alloc_resp(["/dev/nvidiactl", "/dev/nvidia5", "/dev/nvidia7"], {"NVIDIA_VISIBLE_DEVICES": f"{MIG_UUID},{other}"})
    write_checkpoint(root, [(OTHER, "nvidia.com/mig-1g.10gb", [MIG_UUID, other])])
    p = plan_with_answer(root, resp)
    assert sorted(h.device for h in p.held_back) == sorted([f"nvidia:{UUIDS[1]}", f"nvidia:{UUIDS[3]}"])
    assert set(p.devices) == {f"nvidia:{UUIDS[0]}", f"nvidia:{UUIDS[2]}"}


@pytest.mark.parametrize("raw,paths", [("", ()), ("CgA=", ()), ("not base64!", ()), ("////", ()),
                                       ("GgQSAi9k", ("/d",)),  # devices { host_path: "/d" }
                                       ("Gv////8P", ()),  # a length past the end
                                       ("GgQSAi9kGg==", ("/d",))])  # torn after a whole field
def test_an_answer_gpuhook_cannot_read_names_no_device(raw, paths):
    from gpuhook.plan import policy

    assert policy.alloc_device_paths(raw) == paths


# -- hostile or broken checkpoint text: the parsers never raise ------------------------------------

from hypothesis import given as for_all, settings, strategies as st  # noqa: E402

RESOURCES = st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "gpu.intel.com/i915",
                             "gpu.intel.com/i915_monitoring", "example.com/x", ""])


@settings(max_examples=400, deadline=None)
@for_all(RESOURCES, st.text(max_size=80) | st.from_regex(r"(GPU-[0-9a-f-]{1,40}|MIG-|nvidia|amdgpu_xcp_|card)[0-9/:a-z_.-]{0,20}(::[0-9x]{0,3})?", fullmatch=True))
def test_any_id_is_a_ref_never_an_exception(resource, ident):
    from gpuhook.plan import policy

    ref = policy.device_ref(resource, ident)
    assert ref.kind in ("uuid", "index", "minor", "mig", "pci", "xcp", "card", "none", "any", "unknown")
    if ref.kind in ("index", "minor"):
        int(ref.value)


@settings(max_examples=300, deadline=None)
@for_all(st.binary(max_size=200))
def test_any_answer_bytes_give_paths_never_an_exception(data):
    import base64

    from gpuhook.plan import policy

    paths = policy.alloc_device_paths(base64.b64encode(data).decode())
    assert isinstance(paths, tuple) and all(isinstance(p, str) for p in paths)
