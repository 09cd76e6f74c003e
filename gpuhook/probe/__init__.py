"""Probe: what GPUs the node has. One module per vendor, each `probe(host) -> VendorInventory | None`.

Probing never decides what a container gets (that is plan.py); it only reports.
A vendor module that fails is reported as a warning: the probe itself never raises.
"""

from __future__ import annotations

from importlib import import_module

from ..inventory import Inventory
from .host import Host

# Order matters only for display; a new vendor is one new module and one name here.
VENDORS = ("nvidia", "amd", "intel", "accel", "wsl")


def probe(root: str = "/", vendors: tuple[str, ...] = VENDORS) -> Inventory:
    host = Host(root)
    found = []
    for name in vendors:
        try:
            inv = import_module(f"{__name__}.{name}").probe(host)
        except Exception as e:  # a broken vendor probe must not hide the others
            host.warn(f"{name} probe failed: {type(e).__name__}: {e}")
            continue
        if inv is not None and inv.devices:
            found.append(inv)
    return Inventory(host.root, tuple(found), tuple(host.warnings))
