"""What one vendor's choice adds to a container: its nodes, mounts and libraries.

plan() chooses, per vendor, the devices a container gets (a Choice); this module turns a
choice into a Part, the same way for every vendor but NVIDIA (plan/nvidia.py: what its
driver capabilities ask for): the chosen devices' nodes, the vendor's control nodes,
libraries and tools, and for Intel the /dev/dri/by-path links (made here from sysfs data and
checked, never taken from the container).
"""

from ..edits import DeviceNode, Mount
from ..inventory import Device, Node, VendorInventory, node_number
from ..record import Record

BYPATH_CHARS = frozenset("0123456789abcdef:.")
DRI_DIR = "/dev/dri/"


class Choice(Record):
    """One vendor's share of the container: its inventory, the devices given (fixed ones
    from the spec first), whether it gives driver files without any device, and (NVIDIA)
    the driver capabilities the container asks for."""

    vendor: "VendorInventory"
    devices: "list[Device]"
    driver_only: bool
    caps: "frozenset[str] | None" = None

    __slots__ = ()


class Part(Record):
    """What one vendor's choice adds to a container: device nodes, mounts, the library
    paths (in the container) whose directories the ld-cache hook covers, and the
    /dev/dri/by-path links to make (name, target, name, target...)."""

    nodes: "list[DeviceNode]"
    mounts: "list[Mount]"
    lib_paths: "list[str]"
    bypath: "list[str]"

    __slots__ = ()


def device_node(n: "Node") -> "DeviceNode":
    return DeviceNode(n.path, n.type, n.major, n.minor, "rwm", n.file_mode, n.uid, n.gid)


def on_host(root: str, path: str) -> str:
    """A node path as the runtime sees it: under the host root (tests, dry runs) or as is."""
    return path if root == "/" else root.rstrip("/") + path


def dri_name(path: str) -> "str | None":
    """card1 of /dev/dri/card1; None for a node elsewhere."""
    return path[len(DRI_DIR) :] if path.startswith(DRI_DIR) else None


def vendor_part(root: str, c: "Choice") -> "Part":
    """Any vendor but NVIDIA: every node of the chosen devices, the control nodes, every
    library and tool."""
    v = c.vendor
    nodes: list[DeviceNode] = []
    bypath: list[str] = []
    for d in c.devices:
        nodes.extend(device_node(n) for n in d.nodes)
        if v.vendor == "intel" and d.pci and set(d.pci) <= BYPATH_CHARS:
            bypath += _bypath(d)
    nodes.extend(device_node(n) for n in v.control_nodes)
    lib_paths = [v.container_path(lib.path) for lib in v.libraries]
    mounts = [Mount(on_host(root, lib.path), v.container_path(lib.path)) for lib in v.libraries]
    mounts.extend(Mount(on_host(root, b), v.container_path(b)) for b in v.binaries)
    return Part(nodes, mounts, lib_paths, bypath)


def _bypath(d: "Device") -> "list[str]":
    """pci-<address>-card, ../card1 and pci-<address>-render, ../renderD128 of an Intel GPU."""
    out: list[str] = []
    for n in d.nodes:
        name = dri_name(n.path)
        numbered = node_number(name) if name else None
        if numbered is not None:  # (kind, N): a card or render node
            out += [f"pci-{d.pci}-{numbered[0]}", f"../{name}"]
    return out
