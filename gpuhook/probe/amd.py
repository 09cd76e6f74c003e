"""AMD: GPUs from the KFD topology (compute) and from DRM (amdgpu), plus the /dev/kfd control node.

- KFD topology, /sys/class/kfd/kfd/topology/nodes/<n>/properties, in node order (ROCm's order):
  a node with simd_count 0 or drm_render_minor 0 is a CPU and is skipped; a node repeating an
  earlier one's render minor or gpu_id is a duplicate and is skipped. Its PCI address comes
  from location_id (bus = id>>8, device = (id>>3)&0x1f, function = id&7) and domain.
  Several KFD nodes on one PCI device (only the function bits differ) are compute partitions:
  kind "partition", id = their decoded address, parent = the device's address (function 0),
  nodes = their render node only. A lone node is kind "gpu" with the card node as well.
  The render node is the DRM one with that minor (on the PCI device for partition 0, on an
  amdgpu_xcp.<N> platform device for the others: MI300 CPX/DPX/QPX modes), else
  /dev/dri/renderD<minor> (present=False when /dev lacks it: a capture, or a host root
  without /dev). An amdgpu_xcp render node that no KFD node names is skipped with a warning.
- DRM devices with vendor 0x1002 and driver amdgpu that no KFD node names: kind "gpu"
  (graphics use; no KFD when amdgpu runs without compute or the topology is unreadable).
- /dev/kfd (major: /proc/devices "kfd", else /sys/class/kfd/kfd/dev, else the node's own) goes
  with every device; without it the GPUs are still reported, with a warning, and no control node.
"""

from .. import vendors
from ..inventory import Device, Node, VendorInventory
from .common import char_majors, device_node, first_major, parse_dev
from .drm import DRM_MAJOR, DrmDevice, drm_devices, vram_bytes
from .host import Host

VENDOR = vendors.by_module(__name__).name  # this probe's vendor, as the registry names it

VENDOR_ID = 0x1002
KFD = "/sys/class/kfd/kfd"
NODES = KFD + "/topology/nodes"

MODELS = {
    0x6860: "AMD Vega 10",
    0x687F: "AMD Vega 10",
    0x738C: "AMD Instinct MI100",
    0x7408: "AMD Instinct MI250X",
    0x740C: "AMD Instinct MI250X/MI250",
    0x740F: "AMD Instinct MI210",
    0x74A1: "AMD Instinct MI300X",
    0x74A2: "AMD Instinct MI308X",
    0x74A5: "AMD Instinct MI325X",
}


def is_xcp(sysfs: str) -> bool:
    """A compute partition's platform device (/sys/devices/platform/amdgpu_xcp.<N>): the
    amdxcp driver registers one per partition beyond the first, each with its own render
    node (ioctls are redirected to the GPU); it has no PCI address, vendor or driver."""
    base = sysfs.rstrip("/").rpartition("/")[2]
    return base.startswith("amdgpu_xcp") and base[10:11] in (".", "_") and base[11:].isdigit()


def model(device_id: int | None) -> str:
    if device_id is None:
        return "AMD GPU"
    return MODELS.get(device_id, f"AMD GPU 0x{device_id:04x}")


def parse_properties(text: str) -> dict[str, int]:
    """A KFD `properties` file: "name value" lines with integer values; others are dropped."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


def pci_address(domain: int, location_id: int) -> str:
    return (
        f"{domain & 0xFFFFFFFF:04x}:{(location_id >> 8) & 0xFF:02x}:{(location_id >> 3) & 0x1F:02x}.{location_id & 7:x}"
    )


def kfd_gpus(host: Host) -> list[dict[str, int]]:
    """The KFD topology's GPU nodes, in node order, duplicates dropped."""
    names = [n for n in host.listdir(NODES) if n.isascii() and n.isdigit()]
    gpus: list[dict[str, int]] = []
    seen: set[tuple] = set()
    for name in sorted(names, key=int):
        path = f"{NODES}/{name}/properties"
        text = host.read_text(path)
        if text is None:
            host.warn(f"{path}: missing or unreadable, KFD node {name} skipped")
            continue
        props = parse_properties(text)
        if "simd_count" not in props or "drm_render_minor" not in props:
            host.warn(f"{path}: no simd_count/drm_render_minor, KFD node {name} skipped")
            continue
        minor = props["drm_render_minor"]
        if props["simd_count"] <= 0 or minor <= 0:
            continue  # a CPU node
        gpu_id = (host.read_text(f"{NODES}/{name}/gpu_id", quiet=True) or "").strip()
        keys = {("minor", minor)} | ({("gpu_id", gpu_id)} if gpu_id not in ("", "0") else set())
        if keys & seen:
            host.warn(f"KFD node {name} repeats an earlier node's render minor {minor} or gpu_id {gpu_id!r}, skipped")
            continue
        seen |= keys
        gpus.append(props)
    return gpus


def kfd_node(host: Host, majors: dict[str, list[int]]) -> Node | None:
    major = first_major(majors, "kfd")
    if major is None:
        major = (parse_dev(host.read_text(KFD + "/dev", quiet=True) or "") or (None,))[0]
    return device_node(host, "/dev/kfd", major, 0, lazy=major is not None)


def probe(host: Host) -> VendorInventory | None:
    majors = char_majors(host)
    drm_major = first_major(majors, "drm") or DRM_MAJOR
    every = drm_devices(host, drm_major)
    drm = [d for d in every if d.vendor_id == VENDOR_ID and d.driver == "amdgpu"]
    xcp = [d for d in every if is_xcp(d.sysfs) and d.render is not None]
    kfd = kfd_gpus(host)
    devices, used = _kfd_devices(host, kfd, drm, xcp, drm_major)
    for d in xcp:
        if d not in used:
            host.warn(
                f"{d.sysfs}: compute partition render node {d.render.path if d.render else '?'} that no KFD node "
                "names, skipped (no compute without KFD)"
            )
    for d in drm:
        if d not in used:
            devices.append(
                Device(
                    VENDOR,
                    "gpu",
                    len(devices),
                    d.pci or d.sysfs,
                    tuple(n for n in (d.card, d.render) if n is not None),
                    d.pci,
                    model(d.device_id),
                    "amdgpu",
                    memory=vram_bytes(host, d),
                )
            )
    if not devices:
        return None
    kfd_dev = kfd_node(host, majors)
    if kfd_dev is None and kfd:
        host.warn(
            "KFD topology lists GPUs but /dev/kfd is missing and no kfd major is known: "
            "AMD GPUs reported without the kfd control node (no compute)"
        )
    return VendorInventory(VENDOR, tuple(devices), (kfd_dev,) if kfd_dev else ())


def _kfd_devices(host: Host, kfd: list, drm: list, xcp: list, drm_major: int) -> "tuple[list[Device], set[DrmDevice]]":
    """A Device for each GPU or partition the KFD topology lists, with its render node (and a
    whole GPU's card); the DRM devices they took."""
    by_minor = {d.render.minor: d for d in drm + xcp if d.render is not None}
    by_pci = {d.pci: d for d in drm if d.pci}
    addrs = [pci_address(p.get("domain", 0), p.get("location_id", 0)) for p in kfd]
    physical = [a[:-1] + "0" for a in addrs]  # the function bits masked
    devices: list[Device] = []
    used: set[DrmDevice] = set()
    ids: set[str] = set()
    for props, addr, parent in zip(kfd, addrs, physical):
        minor = props["drm_render_minor"]
        partition = physical.count(parent) > 1
        d = by_minor.get(minor) or (None if partition else by_pci.get(addr))
        used.update(x for x in (d, by_pci.get(addr), by_pci.get(parent)) if x is not None)
        render = d.render if d is not None and d.render is not None and d.render.minor == minor else None
        if render is None:
            render = device_node(host, f"/dev/dri/renderD{minor}", drm_major, minor, lazy=True)
        card = d.card if d is not None and not partition else None
        dev_id = addr if addr not in ids else f"{addr}/renderD{minor}"
        ids.add(dev_id)
        devices.append(
            Device(
                VENDOR,
                "partition" if partition else "gpu",
                len(devices),
                dev_id,
                tuple(n for n in (card, render) if n is not None),
                parent if partition else addr,
                model(props.get("device_id")),
                "amdgpu",
                parent if partition else None,
                # the GPU's memory: a partition's share of it is not in a file
                vram_bytes(host, d) if d is not None and not partition else None,
            )
        )
    return devices, used
