"""DRM: the GPUs behind /sys/class/drm/card<N> and renderD<N>, shared by the AMD and Intel probes.

Each card/render entry's `device` link leads to the device directory (a PCI function, or a
platform device for simpledrm and partitions); entries with the same device are one DrmDevice.
Read per device: PCI address (uevent PCI_SLOT_NAME, else the directory name), vendor/device
(the hex files, else uevent PCI_ID), driver (the `driver` link's basename, else uevent DRIVER).
Per node: MAJOR:MINOR from the sysfs `dev` file, else 226 and the number in the name; the node
is /dev/dri/<name>, where a real device node wins. A node the kernel lists but /dev lacks is
reported with present=False (runc creates it in the container).
Connectors (card0-DP-1) and anything else in /sys/class/drm are ignored.

A GPU's own memory (vram_bytes), where its driver states it in the device directory: amdgpu's
mem_info_vram_total, xe's tile<N>/physical_vram_size_bytes (one per tile of a discrete GPU,
summed). i915 has no such file (its local memory is told only through an ioctl), nor has an
integrated GPU: None there.
"""

from ..record import Record

from ..inventory import Node, node_number
from .common import device_node, parse_dev, read_hex, uevent
from .host import Host

DRM_MAJOR = 226
CLASS_DIR = "/sys/class/drm"


class DrmDevice(Record):
    """One DRM device: pci address or None, ids or None, driver or None, the node path of its
    device directory, and its card / render Node (None when it has none)."""

    pci: "str | None"
    vendor_id: "int | None"
    device_id: "int | None"
    driver: "str | None"
    sysfs: str
    card: "Node | None"
    render: "Node | None"

    __slots__ = ()


def _pci_ids(host: "Host", sysfs: str, ev: "dict[str, str]") -> "tuple[int | None, int | None]":
    """vendor/device from the hex files, else from uevent PCI_ID ("1002:687F")."""
    ids = [read_hex(host, sysfs + "/vendor"), read_hex(host, sysfs + "/device")]
    for i, text in enumerate(ev.get("PCI_ID", "").partition(":")[::2]):
        if ids[i] is None and text:
            try:
                ids[i] = int(text, 16)
            except ValueError:
                host.warn(f"{sysfs}/uevent: malformed PCI_ID {ev['PCI_ID'][:40]!r}")
    return ids[0], ids[1]


def _node(host: "Host", name: str, number: int, drm_major: int) -> "Node | None":
    dev = None
    text = host.read_text(f"{CLASS_DIR}/{name}/dev", quiet=True)
    if text is not None:
        dev = parse_dev(text)
        if dev is None:
            host.warn(f"{CLASS_DIR}/{name}/dev: malformed {text.strip()[:40]!r}, using {drm_major}:{number}")
    major, minor = dev or (drm_major, number)
    return device_node(host, f"/dev/dri/{name}", major, minor, lazy=True)


def drm_devices(host: "Host", drm_major: int = DRM_MAJOR) -> "list[DrmDevice]":
    """Every DRM device, in card-number order (render-only devices after)."""
    entries = []
    for name in host.listdir(CLASS_DIR):
        num = node_number(name)
        if num is not None:
            entries.append((num[0] == "render", num[1], name, num[0]))
    found: dict[str, dict] = {}
    for _, number, name, kind in sorted(entries):
        link = f"{CLASS_DIR}/{name}/device"
        if not host.is_dir(link):
            host.warn(f"{link}: missing, {name} skipped")
            continue
        sysfs = host.realpath(link)
        dev = found.setdefault(sysfs, {"card": None, "render": None})
        if dev[kind] is not None:
            host.warn(f"{name}: a second {kind} node of {sysfs}, ignored")
            continue
        dev[kind] = _node(host, name, number, drm_major)
    out = []
    for sysfs, nodes in found.items():
        ev = uevent(host, sysfs + "/uevent")
        base = sysfs.rpartition("/")[2]
        pci = ev.get("PCI_SLOT_NAME") or (base if base.count(":") == 2 and "." in base else None)
        vendor, device = _pci_ids(host, sysfs, ev)
        target = host.readlink(sysfs + "/driver")
        driver = target.rstrip("/").rpartition("/")[2] if target else ev.get("DRIVER")
        out.append(DrmDevice(pci, vendor, device, driver or None, sysfs, nodes["card"], nodes["render"]))
    return out


def _bytes(host: "Host", path: str) -> "int | None":
    text = host.read_text(path, quiet=True)
    if text is None:
        return None
    value = text.strip()
    if not value.isascii() or not value.isdigit() or int(value) == 0:
        host.warn(f"{path}: not a size in bytes ({value[:40]!r}), memory not reported")
        return None
    return int(value)


def vram_bytes(host: "Host", d: DrmDevice) -> "int | None":
    """The memory of the GPU whose device directory is d.sysfs, in bytes, as its driver says
    it; None when it says nothing (see the module's docstring)."""
    if d.driver == "amdgpu":
        return _bytes(host, d.sysfs + "/mem_info_vram_total")
    if d.driver == "xe":
        tiles = sorted(n for n in host.listdir(d.sysfs) if n.startswith("tile") and n[4:].isdigit())
        sizes = [_bytes(host, f"{d.sysfs}/{t}/physical_vram_size_bytes") for t in tiles]
        known = [n for n in sizes if n is not None]
        return sum(known) if known and len(known) == len(sizes) else None
    return None
