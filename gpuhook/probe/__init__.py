"""Probe: what GPUs the node has. One module per vendor, each `probe(host) -> VendorInventory | None`.

Probing never decides what a container gets (that is gpuhook.plan); it only reports.
A vendor module that fails is reported as a warning: the probe itself never raises.
"""

from ..inventory import Inventory

# .host (Host) is imported by probe() itself: a create whose probe result is cached never needs it
TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from .host import Host

# Where a GPU can show up: for each vendor, the signs (paths under the host root, a name may
# end in `*` or `[0-9]*` as in sh) that it may be present. This one list gates both the C
# front (gpuhook/runtime/gpuhook-runtime.c, which starts Python only when a sign is there;
# its header is generated from this: runtime/gen_header.py) and probe(), which imports and runs a
# vendor module only when one of its signs is there (this runs on every GPU container start).
# probe/cache.py watches the directories they are in. Order matters only for display; a new
# vendor is one new module and one line here.
SIGNS = {
    "nvidia": ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*"),
    "amd": ("/dev/kfd", "/sys/class/kfd/kfd/topology/nodes", "/dev/dri/renderD*", "/sys/class/drm/renderD*"),
    "intel": ("/dev/dri/renderD*", "/sys/class/drm/renderD*"),
    "accel": ("/dev/accel/accel*", "/sys/class/accel/accel*"),
    "wsl": ("/dev/dxg",),
}
VENDORS = tuple(SIGNS)


def sign_dirs() -> set[str]:
    """The directories the signs are in (what a new GPU changes)."""
    return {p.rpartition("/")[0] for signs in SIGNS.values() for p in signs}


def _sign_there(host: "Host", sign: str) -> bool:
    if not sign.endswith("*"):
        return host.lstat(sign) is not None
    parent, _, name = sign.rpartition("/")
    digit = name.endswith("[0-9]*")
    prefix = name[:-6] if digit else name[:-1]
    return any(
        n.startswith(prefix) and (not digit or n[len(prefix) : len(prefix) + 1].isdigit()) for n in host.listdir(parent)
    )


def present(host: "Host", vendors: tuple[str, ...] | None = None) -> list[str]:
    """The vendors (of `vendors`, default all) whose signs are there."""
    return [name for name in vendors or VENDORS if any(_sign_there(host, s) for s in SIGNS[name])]


def probe(
    root: str = "/",
    vendors: tuple[str, ...] | None = None,
    *,
    nvidia_driver_root: str | None = None,
    signs: bool = True,
) -> Inventory:
    """nvidia_driver_root: the node config's setting (None: "auto", see driverroot.py).
    signs=False runs every vendor module, signs or not (a sysfs capture with no device node:
    a report of what is there, though no container could be given any of it)."""
    from .host import Host

    host = Host(root, {"nvidia_driver_root": nvidia_driver_root} if nvidia_driver_root else None)
    found = []
    for name in present(host, vendors) if signs else vendors or VENDORS:
        try:
            module = __import__(f"{__name__}.{name}", fromlist=["probe"])
            inv = module.probe(host)
        except Exception as e:  # a broken vendor probe must not hide the others
            host.warn(f"{name} probe failed: {type(e).__name__}: {e}")
            continue
        if inv is not None and inv.devices:
            found.append(inv)
    return Inventory(host.root, tuple(found), tuple(host.warnings))
