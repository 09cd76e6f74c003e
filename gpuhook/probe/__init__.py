"""Probe: what GPUs the node has. One module per vendor, each `probe(host) -> VendorInventory | None`.

Probing never decides what a container gets (that is gpuhook.plan); it only reports.
A vendor module that fails is reported as a warning: the probe itself never raises.
"""


from ..inventory import Inventory
from .host import Host

# Order matters only for display; a new vendor is one new module and one line here.
# The paths are cheap signs that a vendor may be present: a vendor module is imported and
# run only when one exists (this runs on every GPU container start).
VENDORS = {
    "nvidia": ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/nvidia0"),
    "amd": ("/dev/kfd", "/sys/class/kfd/kfd/topology/nodes", "/sys/class/drm"),
    "intel": ("/sys/class/drm",),
    "accel": ("/dev/accel", "/sys/class/accel"),
    "wsl": ("/dev/dxg",),
}


def probe(root: str = "/", vendors: tuple[str, ...] | None = None, *,
          nvidia_driver_root: str | None = None) -> Inventory:
    """nvidia_driver_root: the node config's setting (None: "auto", see driverroot.py)."""
    host = Host(root, {"nvidia_driver_root": nvidia_driver_root} if nvidia_driver_root else None)
    found = []
    for name in vendors or VENDORS:
        if not any(host.lstat(p) is not None for p in VENDORS[name]) and not _nvidia_dev(host, name):
            continue
        try:
            module = __import__(f"{__name__}.{name}", fromlist=["probe"])
            inv = module.probe(host)
        except Exception as e:  # a broken vendor probe must not hide the others
            host.warn(f"{name} probe failed: {type(e).__name__}: {e}")
            continue
        if inv is not None and inv.devices:
            found.append(inv)
    return Inventory(host.root, tuple(found), tuple(host.warnings))


def _nvidia_dev(host: Host, name: str) -> bool:
    """NVIDIA GPUs can show only as /dev/nvidia<N> (a host root without procfs)."""
    return name == "nvidia" and any(n[6:].isdigit() for n in host.listdir("/dev") if n.startswith("nvidia"))
