"""Intel: DRM devices with PCI vendor 0x8086 bound to i915 or xe (integrated and discrete GPUs).

One device per PCI function: kind "gpu", id = PCI address, nodes = its card and render nodes.
Intel has no control nodes.

SR-IOV: a physical function with virtual functions enabled (sysfs `sriov_numvfs` > 0, links
`virtfn<N>`) is the host's management function; its VFs are what workloads get. So the PF is
not reported, and each VF that has DRM nodes (bound to i915/xe on the host) is a device of kind
"partition" whose parent is the PF's address. VFs bound to vfio-pci (given to VMs) have no DRM
nodes: that GPU then gives containers nothing, and a warning says so.
"""

from .. import vendors
from ..inventory import Device, VendorInventory
from .common import char_majors, first_major, is_uint, numbered_names
from .drm import DRM_MAJOR, drm_devices, vram_bytes
from .host import Host

VENDOR = vendors.by_module(__name__).name  # this probe's vendor, as the registry names it

VENDOR_ID = 0x8086
DRIVERS = ("i915", "xe")


def _numvfs(host: Host, sysfs: str) -> int:
    text = (host.read_text(sysfs + "/sriov_numvfs", limit=64, quiet=True) or "").strip()
    return int(text) if is_uint(text) and len(text) < 6 else 0


def _virtfns(host: Host, sysfs: str) -> list[str]:
    """The PF's VFs, as node paths of their sysfs directories, in VF order."""
    return [host.realpath(f"{sysfs}/{name}") for _, name in numbered_names(host.listdir(sysfs), "virtfn")]


def probe(host: Host) -> VendorInventory | None:
    drm_major = first_major(char_majors(host), "drm") or DRM_MAJOR
    gpus = [d for d in drm_devices(host, drm_major) if d.vendor_id == VENDOR_ID and d.driver in DRIVERS]
    by_sysfs = {d.sysfs: d for d in gpus}
    vf_parent: dict[str, str] = {}  # VF sysfs -> PF address
    pfs = set()
    for d in gpus:
        if _numvfs(host, d.sysfs) > 0:
            pfs.add(d.sysfs)
            vfs = _virtfns(host, d.sysfs)
            for vf in vfs:
                vf_parent[vf] = d.pci or d.sysfs
            if not any(vf in by_sysfs for vf in vfs):
                host.warn(
                    f"intel: {d.pci or d.sysfs} has {len(vfs)} virtual function(s) enabled but none "
                    "with a DRM node (bound to vfio-pci?): this GPU is not given to containers"
                )
    devices: list[Device] = []
    for d in gpus:
        if d.sysfs in pfs:
            continue  # the PF of an SR-IOV GPU: its VFs are given instead
        model = "Intel GPU" if d.device_id is None else f"Intel GPU 0x{d.device_id:04x}"
        parent = vf_parent.get(d.sysfs)
        devices.append(
            Device(
                VENDOR,
                "partition" if parent else "gpu",
                len(devices),
                d.pci or d.sysfs,
                tuple(n for n in (d.card, d.render) if n is not None),
                d.pci,
                model,
                d.driver,
                parent,
                None if parent else vram_bytes(host, d),  # a VF's share of the GPU's memory is not in a file
            )
        )
    return VendorInventory(VENDOR, tuple(devices)) if devices else None
