"""Intel: DRM devices with PCI vendor 0x8086 bound to i915 or xe (integrated and discrete GPUs).

One device per PCI function: kind "gpu", id = PCI address, nodes = its card and render nodes.
Intel has no control nodes.
"""


from ..inventory import Device, VendorInventory
from .common import char_majors, first_major
from .drm import DRM_MAJOR, drm_devices
from .host import Host

VENDOR_ID = 0x8086
DRIVERS = ("i915", "xe")


def probe(host: Host) -> VendorInventory | None:
    drm_major = first_major(char_majors(host), "drm") or DRM_MAJOR
    devices = []
    for d in drm_devices(host, drm_major):
        if d.vendor_id != VENDOR_ID or d.driver not in DRIVERS:
            continue
        model = "Intel GPU" if d.device_id is None else f"Intel GPU 0x{d.device_id:04x}"
        devices.append(Device("intel", "gpu", len(devices), d.pci or d.sysfs,
                              tuple(n for n in (d.card, d.render) if n is not None),
                              d.pci, model, d.driver))
    return VendorInventory("intel", tuple(devices)) if devices else None
