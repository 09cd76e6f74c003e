"""What a node has: small immutable types that the probe returns and the planner reads.

Records (record.py), not dataclasses or namedtuples: these sit on the per-container path.
"""

from .record import Record


def node_number(name: str) -> "tuple[str, int] | None":
    """ "card0" -> ("card", 0), "renderD128" -> ("render", 128); None for connectors and the rest."""
    for prefix, kind in (("renderD", "render"), ("card", "card")):
        num = name[len(prefix) :]
        if name.startswith(prefix) and num.isascii() and num.isdigit():
            return kind, int(num)
    return None


class Node(Record):
    """A device node as the node sees it; the container gets the same path.

    type is "c" or "b"; file_mode/uid/gid come from the host node when it exists;
    present is False for a node the driver knows but the host has not created yet
    (NVIDIA creates its control nodes lazily): runc makes it from type/major/minor.
    """

    path: str
    type: str
    major: int
    minor: int
    file_mode: "int | None" = None
    uid: "int | None" = None
    gid: "int | None" = None
    present: bool = True

    __slots__ = ()


class Device(Record):
    """One GPU, GPU partition or accelerator that a container may be given.

    vendor: its name in gpuhook/vendors.py (nvidia, amd, intel, accel, dxg). kind: gpu,
    partition, accel, dxg.
    index: position among this vendor's devices. id: stable id (NVIDIA UUID, PCI
    address, or node name). parent: a partition's physical GPU (PCI address).
    memory: the GPU's own memory in bytes, as its kernel driver states it in sysfs
    (probe/drm.py vram_bytes: AMD, Intel xe); None where no file says it (NVIDIA without
    NVML, i915, integrated GPUs, partitions): never guessed.
    """

    vendor: str
    kind: str
    index: int  # type: ignore[assignment]  # a field, over tuple.index
    id: str
    nodes: "tuple[Node, ...]"
    pci: "str | None" = None
    model: "str | None" = None
    driver: "str | None" = None
    parent: "str | None" = None
    memory: "int | None" = None

    __slots__ = ()


class Library(Record):
    """A driver library: the real (versioned) file on the node, mounted at the same path.

    capability: the NVIDIA driver capability it serves (compute, utility, video, graphics...).
    """

    path: str
    soname: "str | None"
    capability: str

    __slots__ = ()


class VendorInventory(Record):
    """One vendor's share of the node. control_nodes go with any of its devices.

    driver_root: the node directory the driver's userspace was taken from ("/": the host;
    "/run/nvidia/driver": the GPU Operator's...), None when none was found. mount_map:
    (node directory, container directory) pairs for files from a driver root that are not
    mounted at their own path (see container_path)."""

    vendor: str
    devices: "tuple[Device, ...]"
    control_nodes: "tuple[Node, ...]" = ()
    libraries: "tuple[Library, ...]" = ()
    binaries: "tuple[str, ...]" = ()
    driver_version: "str | None" = None
    driver_root: "str | None" = None
    mount_map: "tuple[tuple[str, str], ...]" = ()

    __slots__ = ()

    def container_path(self, path: str) -> str:
        """Where a library, tool or file of this vendor goes in the container: its node path,
        except under a mount_map directory (the first that holds it)."""
        for src, dst in self.mount_map:
            if path.startswith(src) and path[len(src) : len(src) + 1] in ("", "/"):
                return (dst.rstrip("/") + path[len(src) :]) or "/"
        return path


class Inventory(Record):
    """Everything the probe found under one host root."""

    root: str
    vendors: "tuple[VendorInventory, ...]"
    warnings: "tuple[str, ...]" = ()

    __slots__ = ()

    @property
    def devices(self) -> "tuple[Device, ...]":
        return tuple(d for v in self.vendors for d in v.devices)

    def vendor(self, name: str) -> "VendorInventory | None":
        for v in self.vendors:
            if v.vendor == name:
                return v
        return None


# -- what else plan() needs of the node: read before it runs (probe/nodestate.py) ----------

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable


class Allocation(Record):
    """One device id the kubelet's device manager allocated to a pod: the resource it is of,
    the id as the device plugin wrote it, the pod's uid, and the plugin's answer for that
    container (AllocResp: a ContainerAllocateResponse, protobuf, base64), read only when an
    id does not name its GPU (plan.policy.alloc_device_paths)."""

    resource: str
    id: str
    pod: str
    alloc_resp: str = ""

    __slots__ = ()


class NodeState(Record):
    """What plan() needs of the node besides the Inventory, read before it runs
    (probe/nodestate.py: read), so that plan() itself reads no file. Never cached: read for
    every create, and only what the node config makes plan() ask for.

    allocations: every pod's device allocations from the kubelet's checkpoint (share =
    "unallocated" only); allocations_unknown: why the checkpoint could not be read (None: it
    was, or it was not needed). partitions: amdgpu_xcp_<n> (ROCm's id of an AMD partition) ->
    the /dev paths of its render nodes, read only when the checkpoint names one.
    mps_dir: the node config's MPS pipe directory, resolved, when only root can change it;
    mps_refused: why it is not mounted (both None: the node names none). ldconfig: the
    node's, for the ld-cache hook (None: no ld-cache hook). helper: gpuhook-hook as the node
    sees it (None: not there to run, so no hook). round_robin: max-gpus's memory of what it
    gave, choose(keys, n, warn) -> the n of keys given out least (probe/nodestate.py
    RoundRobin; None: no memory, the first n)."""

    allocations: "tuple[Allocation, ...]" = ()
    allocations_unknown: "str | None" = None
    partitions: "dict[str, frozenset[str]]" = {}
    mps_dir: "str | None" = None
    mps_refused: "str | None" = None
    ldconfig: "str | None" = None
    helper: "str | None" = None
    round_robin: "Callable[[list[str], int, Callable[[str], None]], list[str]] | None" = None

    __slots__ = ()
