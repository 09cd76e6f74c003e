"""Probe: what GPUs the node has. One module per vendor, each `probe(host) -> VendorInventory | None`.

Probing never decides what a container gets (that is gpuhook.plan); it only reports.
A vendor module that fails is reported as a warning: the probe itself never raises.
"""

from .. import vendors as _vendors
from ..inventory import Inventory

# .host (Host) is imported by probe() itself: a create whose probe result is cached never needs it
TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from .host import Host

# Where a GPU can show up: each vendor's signs (gpuhook/vendors.py, the one list). They gate
# both the C front (its header is generated from SIGNS: it starts Python only when a sign is
# there) and probe(), which imports and runs a vendor module only when one of its signs is
# there (this runs on every GPU container start). probe/cache.py watches the directories they
# are in.
SIGNS = {v.name: v.signs for v in _vendors.VENDORS}
VENDORS = _vendors.NAMES


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
            module = __import__(_vendors.BY_NAME[name].probe, fromlist=["probe"])
            inv = module.probe(host)
        except Exception as e:  # a broken vendor probe must not hide the others
            host.warn(f"{name} probe failed: {type(e).__name__}: {e}")
            continue
        other = inv and ({inv.vendor} | {d.vendor for d in inv.devices}) - {name}
        if other:  # the registry's name is the one name (vendors.py): another is a module's slip
            host.warn(f"{name} probe named its vendor {', '.join(sorted(other))}: its devices are not given")
        elif inv is not None and inv.devices:
            found.append(inv)
    return Inventory(host.root, tuple(found), tuple(host.warnings))
