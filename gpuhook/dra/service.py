"""`gpuhook dra` running: the kubelet plugin served, and every `interval` the node probed
again, its CDI specs and ResourceSlices kept current, and the pods whose prepared claim holds a
GPU the node no longer has told so in an Event (reason GPULost, on each pod the claim is
reserved for). A failure of one round (the API unreachable) is logged and tried again the next.
"""

from __future__ import annotations

import threading

from . import DRIVER, publish
from .driver import PREPARED, Driver

LOST_REASON = "GPULost"  # the Pod Event's reason (agent/kube.py's EVENT_REASONS, the admission policy)


def lost(prepared: dict[str, dict], table: dict[str, str]) -> list[tuple[str, dict]]:
    """(claim UID, checkpoint entry) of each prepared claim that holds a device the node does
    not publish any more, with the devices gone in entry["gone"]."""
    out = []
    for uid, entry in sorted(prepared.items()):
        if entry.get("state") != PREPARED:
            continue
        gone = [d["device"] for d in entry["devices"] if d["device"] not in table]
        if gone:
            out.append((uid, dict(entry, gone=gone)))
    return out


class Service:
    def __init__(self, node: str, devices: publish.NodeDevices, driver: Driver, api, log, interval: float):
        self.node = node
        self.devices = devices
        self.driver = driver
        self.api = api
        self.log = log
        self.interval = interval
        self.slices = publish.SlicePublisher(api, node, DRIVER)
        self.reported: set[tuple[str, str]] = set()  # (claim UID, device) told once per process
        self.stop = threading.Event()
        self.left_out: dict[str, list[str]] = {}  # what --max-cdi-version left out, last said

    def round(self) -> None:
        """Probe, write the CDI specs and the slices, report claims that lost their GPU."""
        try:
            published = self.devices.refresh()
        except Exception as e:  # a probe or CDI failure: keep what was published, say why
            self.log.error("dra.probe.error", error=f"{type(e).__name__}: {e}")
            return
        left_out = dict(self.devices.dropped)
        if left_out and left_out != self.left_out:  # as the agent's cdi.capped, once per change
            self.log.warning("dra.cdi.capped", max_version=self.devices.max_cdi_version, left_out=left_out)
        self.left_out = left_out
        try:
            for line in self.slices.sync(published):
                self.log.info("dra.slices", change=line, devices=len(published))
        except Exception as e:  # KubeError: unreachable, forbidden...
            self.log.error("dra.slices.error", error=str(e))
        try:
            self.report_lost()
        except Exception as e:
            self.log.error("dra.lost.error", error=str(e))

    def report_lost(self) -> None:
        for uid, entry in lost(self.driver.prepared(), self.devices.table()):
            new = [d for d in entry["gone"] if (uid, d) not in self.reported]
            if not new:
                continue
            ns, name = entry["namespace"], entry["name"]
            message = f"{', '.join(new)} left node {self.node}: ResourceClaim {ns}/{name} holds it"
            self.log.warning("dra.gpu.lost", claim=f"{ns}/{name}", uid=uid, devices=new)
            claim = self.api.get_resource_claim(ns, name)
            for ref in (claim.get("status") or {}).get("reservedFor") or ():
                if ref.get("resource") == "pods" and not ref.get("apiGroup"):
                    self.api.post_pod_event(ns, ref["name"], ref["uid"], None, LOST_REASON, message, "Warning")
            self.reported.update((uid, d) for d in new)

    def run(self) -> None:
        while not self.stop.is_set():
            self.round()
            self.stop.wait(self.interval)
