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
