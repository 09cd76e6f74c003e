"""The node's side of the DRA driver: its CDI specs written, its ResourceSlices kept equal to
what it has.

NodeDevices probes the node, writes gpuhook's CDI specs (the same cdi.specs as `gpuhook cdi
generate` and the agent, and gpuhook.dev/none) and keeps the published devices (slices.py),
whose names prepare turns into CDI ids. sync_slices makes the API's ResourceSlices of this
node and driver what slices.resource_slices says: a slice someone else edited is put back
(server-side apply, forced), one too many is deleted; the pool's generation goes up when the
devices change.
"""

from __future__ import annotations

import threading

from .. import cdi
from . import DRIVER, slices

MANAGER = "gpuhook-dra"  # the field manager of the driver's ResourceSlices


class NodeDevices:
    """What the node has now, as published; refresh() probes again."""

    def __init__(
        self,
        root: str,
        cdi_dir: str | None,
        spec_root: str = "/",
        ldconfig=None,
        helper=None,
        nvidia_driver_root: str = "auto",
    ):
        self.root = root
        self.nvidia_driver_root = nvidia_driver_root
        self.cdi_dir = cdi_dir
        self.spec_root = spec_root
        self.ldconfig = ldconfig
        self.helper = helper
        self.lock = threading.Lock()
        self.devices: tuple[slices.Published, ...] = ()
        self.warnings: tuple[str, ...] = ()

    def refresh(self) -> tuple[slices.Published, ...]:
        from ..probe import probe

        inv = probe(self.root, nvidia_driver_root=self.nvidia_driver_root)
        all_specs = cdi.specs(inv, self.spec_root, self.ldconfig, helper=self.helper) + [cdi.none_spec()]
        if self.cdi_dir:
            cdi.write_dir(all_specs, self.cdi_dir)
        devices = slices.published(inv, cdi.device_ids(all_specs))
        with self.lock:
            self.devices, self.warnings = devices, inv.warnings
        return devices

    def table(self) -> dict[str, str]:
        """{device name: CDI id} of what is published now."""
        with self.lock:
            return {p.name: p.cdi_id for p in self.devices}


def _same(have: dict, want: dict) -> bool:
    """The parts of a ResourceSlice the driver sets, equal (the API adds defaults and metadata)."""
    hs, ws = have.get("spec") or {}, want["spec"]
    return (
        hs.get("driver") == ws["driver"]
        and hs.get("nodeName") == ws["nodeName"]
        and hs.get("pool") == ws["pool"]
        and hs.get("devices") == ws["devices"]
    )


def sync_slices(api, node: str, devices: tuple[slices.Published, ...], driver: str = DRIVER) -> list[str]:
    """Make this node's ResourceSlices of `driver` in the API the published ones. Returns
    what it did, one line each ("applied NAME", "deleted NAME")."""
    have = {s["metadata"]["name"]: s for s in api.list_resource_slices(driver)}
    generation = max(
        (int((s.get("spec") or {}).get("pool", {}).get("generation") or 0) for s in have.values()), default=0
    )
    want = slices.resource_slices(node, devices, max(generation, 1))
    if have and not all(
        (have.get(w["metadata"]["name"]) or {}).get("spec", {}).get("devices") == w["spec"]["devices"] for w in want
    ):
        want = slices.resource_slices(node, devices, generation + 1)  # the devices changed: a new generation
    done = []
    for w in want:
        name = w["metadata"]["name"]
        if name in have and _same(have[name], w):
            continue
        api.apply_resource_slice(w, MANAGER)
        done.append(f"applied {name}")
    wanted = {w["metadata"]["name"] for w in want}
    for name in sorted(set(have) - wanted):
        api.delete_resource_slice(name)
        done.append(f"deleted {name}")
    return done
