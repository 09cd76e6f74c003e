"""The node's side of the DRA driver: its CDI specs written, its ResourceSlices kept equal to
what it has.

NodeDevices probes the node, writes gpuhook's CDI specs (the same cdi.specs as `gpuhook cdi
generate` and the agent, and gpuhook.dev/none) and keeps the published devices (slices.py),
whose names prepare turns into CDI ids. SlicePublisher makes the API's ResourceSlices of this
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
        *,
        cdi_format: str = "yaml",
        max_cdi_version: str | None = None,
    ):
        self.root = root
        self.cdi_format = cdi_format  # the agent's --cdi-format and --max-cdi-version: the same files
        self.max_cdi_version = max_cdi_version
        self.nvidia_driver_root = nvidia_driver_root
        self.cdi_dir = cdi_dir
        self.spec_root = spec_root
        self.ldconfig = ldconfig
        self.helper = helper
        self.lock = threading.Lock()
        self.devices: tuple[slices.Published, ...] = ()
        self.warnings: tuple[str, ...] = ()
        self.dropped: list[tuple[str, list[str]]] = []  # (kind, fields) left out for max_cdi_version

    def refresh(self) -> tuple[slices.Published, ...]:
        from ..probe import probe

        inv = probe(self.root, nvidia_driver_root=self.nvidia_driver_root)
        dropped: list = []
        all_specs = cdi.specs(inv, self.spec_root, self.ldconfig, self.max_cdi_version, dropped, self.helper)
        all_specs.append(cdi.none_spec())
        if self.cdi_dir:
            cdi.write_dir(all_specs, self.cdi_dir, self.cdi_format)
        devices = slices.published(inv, cdi.device_ids(all_specs))
        with self.lock:
            self.devices, self.warnings, self.dropped = devices, inv.warnings, dropped
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


class SlicePublisher:
    """This node's ResourceSlices of `driver` in the API kept the published ones.

    The pool's generation goes up when the devices the driver publishes change, measured
    against what it applied last (at start: against what the API has). A slice that differs
    from what was applied (someone edited it, or the API left out a field: allowMultipleAllocations
    where the DRAConsumableCapacity gate is off) is applied again at the same generation, so a
    field the API never keeps costs a write per round, never a new generation."""

    def __init__(self, api, node: str, driver: str = DRIVER):
        self.api = api
        self.node = node
        self.driver = driver
        self.generation: int | None = None
        self.applied: list[dict] | None = None  # the devices of the last apply

    def sync(self, devices: tuple[slices.Published, ...]) -> list[str]:
        """One round; what it did, one line each ("applied NAME", "deleted NAME")."""
        have = {s["metadata"]["name"]: s for s in self.api.list_resource_slices(self.driver)}
        wanted_devices = [p.device for p in devices]
        if self.generation is None:  # first round: take the API's pool as what was applied
            self.generation = max(
                (int((s.get("spec") or {}).get("pool", {}).get("generation") or 0) for s in have.values()), default=0
            )
            self.applied = [
                d for s in sorted(have.values(), key=_order) for d in (s.get("spec") or {}).get("devices") or ()
            ]
        if self.generation == 0 or wanted_devices != self.applied:
            self.generation += 1
        want = slices.resource_slices(self.node, devices, self.generation)
        done = []
        for w in want:
            name = w["metadata"]["name"]
            if name in have and _same(have[name], w):
                continue
            self.api.apply_resource_slice(w, MANAGER)
            done.append(f"applied {name}")
        self.applied = wanted_devices
        for name in sorted(set(have) - {w["metadata"]["name"] for w in want}):
            self.api.delete_resource_slice(name)
            done.append(f"deleted {name}")
        return done


def _order(s: dict) -> tuple[int, str]:
    """The driver's slices in the order it cut them (<node>-<driver>-<i>)."""
    name = s["metadata"]["name"]
    tail = name.rpartition("-")[2]
    return (int(tail) if tail.isdigit() else 1 << 30, name)
