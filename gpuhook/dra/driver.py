"""The DRA kubelet plugin: registration and the DRA gRPC service (NodePrepareResources,
NodeUnprepareResources), from the kubelet's own .proto files (regen.py).

The kubelet finds the plugin by its registration socket in PLUGINS_REGISTRY, asks it
(Registration.GetInfo) for its type ("DRAPlugin"), name (the driver, DRIVER), endpoint (the
DRA socket in PLUGINS_DIR/<driver>/) and the DRA services it serves ("v1.DRAPlugin"), then
calls NodePrepareResources with the claims of a pod before its containers start. A claim in
that call is its namespace, name and UID; which devices it got is in the ResourceClaim's
status.allocation, read from the API (`claims`). Prepare answers each device of this driver
with the CDI ids of gpuhook's CDI specs (`devices`: the node's published devices, slices.py),
which containerd injects: a GPU's id names that GPU exactly (gpuhook.dev/<vendor>=<id>, the
vendor's spec-wide edits with it), `none` names gpuhook.dev/none=none (only the env).

Prepared claims are kept in a checkpoint file (JSON, written whole with write_atomic, once per
prepare), by claim UID: the devices and their CDI ids, what the kubelet was answered. Preparing
does nothing on the node but that write (the CDI specs are the node's, not a claim's), so a
driver killed before it prepared nothing: the kubelet's retry reads the allocation again and
prepares it once. A prepare of a UID already prepared answers from the checkpoint (no API call,
nothing done again). A restart keeps every prepared claim: the kubelet asks again and gets the
same answer. Unprepare removes the UID; a UID that is not there is already unprepared (no
error). A record of another state (an earlier version's "preparing") is not an answer: that
claim is read from the API again.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Callable

from . import DRIVER, PLUGINS_DIR, PLUGINS_REGISTRY

PLUGIN_TYPE = "DRAPlugin"  # pluginregistration v1's constant for DRA drivers
SERVICES = ("v1.DRAPlugin",)  # the DRA services served (the kubelet's drapbv1.DRAPluginService)
DRA_SOCKET = "dra.sock"
CHECKPOINT = "checkpoint.json"
PREPARED = "prepared"
# what Driver.note is told (the driver's log events), and where an answer came from
PREPARE_CALLED, PREPARE_ANSWERED = "dra.prepare.called", "dra.prepare.answered"
SOURCE_CHECKPOINT, SOURCE_ALLOCATION = "checkpoint", "allocation"


def plugin_dir(driver: str = DRIVER, base: str = PLUGINS_DIR) -> str:
    return os.path.join(base, driver)


def registration_socket(driver: str = DRIVER, registry: str = PLUGINS_REGISTRY) -> str:
    return os.path.join(registry, f"{driver}-reg.sock")


def base_request(request: str) -> str:
    """The claim's request a result belongs to: "gpu" of a firstAvailable subrequest "gpu/none".
    The kubelet matches a container's claim request against these (resourceclaim.BaseRequestRef)."""
    return request.partition("/")[0]


class ClaimError(Exception):
    """Why one claim cannot be prepared: its answer's error, one line."""


class Checkpoint:
    """The prepared claims, by UID, in one JSON file written whole. locked() holds its lock
    file (flock) across a load and a save: two drivers on one node (a rolling update's old and
    new pod) never write over each other's claims."""

    VERSION = 1
    LOCK_WAIT = 10.0  # seconds

    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def locked(self):
        from ..fsutil import flock_within

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not flock_within(fd, self.LOCK_WAIT, 0.01):
                raise OSError(f"{self.path}.lock: held by another process for {self.LOCK_WAIT:g} s")
            yield
        finally:
            os.close(fd)

    def load(self) -> dict[str, dict]:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        if (
            not isinstance(data, dict)
            or data.get("version") != self.VERSION
            or not isinstance(data.get("claims"), dict)
        ):
            raise ValueError(f"{self.path}: not a gpuhook DRA checkpoint (version {self.VERSION})")
        return data["claims"]

    def save(self, claims: dict[str, dict]) -> None:
        from ..fsutil import write_atomic

        data = json.dumps({"version": self.VERSION, "claims": claims}, indent=1, sort_keys=True).encode()
        write_atomic(self.path, data + b"\n", 0o600)


def allocated(claim: dict, uid: str, node: str, driver: str = DRIVER) -> list[dict]:
    """This driver's devices in a ResourceClaim's allocation: [{request, pool, device, shareID?}].
    ClaimError when the claim is another one (a UID that is not the claim's: it was deleted
    and made again), has no allocation, or names a pool that is not this node's."""
    meta = claim.get("metadata") or {}
    what = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise ClaimError(f"{what}: its UID is {meta.get('uid')}, not {uid}")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{what}: not allocated")
    out = []
    for r in (allocation.get("devices") or {}).get("results") or ():
        if r.get("driver") != driver:
            continue
        if r.get("pool") != node:
            raise ClaimError(f"{what}: device {r.get('device')} is in pool {r.get('pool')}, not this node's ({node})")
        one = {"request": r.get("request"), "pool": r.get("pool"), "device": r.get("device")}
        if r.get("shareID"):
            one["shareID"] = r["shareID"]
        out.append(one)
    return out


class Driver:
    """Prepare and unprepare, by claim UID, over the checkpoint.

    claims(namespace, name) -> the ResourceClaim (the API); devices() -> {device name: CDI id}
    of the devices this node publishes now. note(event, **fields), when given, is told of each
    prepare call as it starts (PREPARE_CALLED) and of each answer (PREPARE_ANSWERED, with
    `source`: SOURCE_CHECKPOINT when answered from a prepared record, SOURCE_ALLOCATION when
    prepared from the allocation read from the API now)."""

    def __init__(
        self,
        node: str,
        checkpoint: Checkpoint,
        claims: Callable[[str, str], dict],
        devices: Callable[[], dict[str, str]],
        warn: Callable[[str], None] | None = None,
        note: Callable[..., None] | None = None,
    ):
        self.node = node
        self.checkpoint = checkpoint
        self.claims = claims
        self.devices = devices
        self.warn = warn or (lambda msg: None)
        self.note = note or (lambda event, **fields: None)
        self.lock = threading.Lock()  # one prepare or unprepare at a time in this process (the file lock: across them)

    def prepare(self, namespace: str, name: str, uid: str) -> list[dict]:
        """The devices of one claim: [{request, pool, device, cdi_ids, shareID?}]; ClaimError."""
        claim = f"{namespace}/{name}"
        self.note(PREPARE_CALLED, claim=claim, uid=uid)
        source, devices = self._prepare(namespace, name, uid)
        self.note(PREPARE_ANSWERED, claim=claim, uid=uid, source=source, devices=[d["device"] for d in devices])
        return devices

    def _prepare(self, namespace: str, name: str, uid: str) -> tuple[str, list[dict]]:
        with self.lock, self.checkpoint.locked():
            have = self.checkpoint.load()
            entry = have.get(uid)
            if entry and entry.get("state") == PREPARED:
                return SOURCE_CHECKPOINT, entry["devices"]
            try:
                claim = self.claims(namespace, name)
            except Exception as e:  # the API's one line (KubeError) or a lookup that failed
                raise ClaimError(f"ResourceClaim {namespace}/{name}: {e}") from None
            results = allocated(claim, uid, self.node)
            table = self.devices()
            devices = []
            for r in results:
                cdi_id = table.get(r["device"])
                if cdi_id is None:  # nothing prepared, nothing recorded
                    raise ClaimError(f"device {r['device']} is not on node {self.node} (any more)")
                devices.append(dict(r, cdi_ids=[cdi_id]))
            have[uid] = {"state": PREPARED, "namespace": namespace, "name": name, "devices": devices}
            self.checkpoint.save(have)
            return SOURCE_ALLOCATION, devices

    def unprepare(self, uid: str) -> None:
        with self.lock, self.checkpoint.locked():
            have = self.checkpoint.load()
            if have.pop(uid, None) is not None:
                self.checkpoint.save(have)

    def prepared(self) -> dict[str, dict]:
        with self.lock, self.checkpoint.locked():
            return self.checkpoint.load()


# -- gRPC ------------------------------------------------------------------------------


def _services(driver: Driver, endpoint: str, name: str = DRIVER, on_status: Callable | None = None):
    import grpc

    from . import dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

    class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
        def GetInfo(self, request, context):
            return pluginregistration_pb2.PluginInfo(
                type=PLUGIN_TYPE, name=name, endpoint=endpoint, supported_versions=list(SERVICES)
            )

        def NotifyRegistrationStatus(self, request, context):
            if on_status is not None:
                on_status(request.plugin_registered, request.error)
            return pluginregistration_pb2.RegistrationStatusResponse()

    class DRAPlugin(dra_pb2_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request, context):
            out = dra_pb2.NodePrepareResourcesResponse()
            for c in request.claims:
                answer = out.claims[c.uid]
                try:
                    for d in driver.prepare(c.namespace, c.name, c.uid):
                        dev = answer.devices.add(
                            request_names=[base_request(d["request"])],
                            pool_name=d["pool"],
                            device_name=d["device"],
                            cdi_device_ids=d["cdi_ids"],
                        )
                        if d.get("shareID"):
                            dev.share_id = d["shareID"]
                except ClaimError as e:
                    answer.error = str(e)
                    driver.warn(f"prepare {c.namespace}/{c.name} ({c.uid}): {e}")
                except (OSError, ValueError) as e:  # the checkpoint
                    answer.error = f"checkpoint: {e}"
                    driver.warn(f"prepare {c.namespace}/{c.name} ({c.uid}): checkpoint: {e}")
            return out

        def NodeUnprepareResources(self, request, context):
            out = dra_pb2.NodeUnprepareResourcesResponse()
            for c in request.claims:
                answer = out.claims[c.uid]
                try:
                    driver.unprepare(c.uid)
                except (OSError, ValueError) as e:
                    answer.error = f"checkpoint: {e}"
                    driver.warn(f"unprepare {c.namespace}/{c.name} ({c.uid}): checkpoint: {e}")
            return out

    return grpc, Registration(), DRAPlugin()


def serve(
    driver: Driver,
    dra_socket: str,
    reg_socket: str,
    name: str = DRIVER,
    on_status: Callable | None = None,
    workers: int = 4,
):
    """A started gRPC server with both services on both sockets (the kubelet asks the
    registration socket for the endpoint, then calls the DRA socket); stale sockets of a
    driver that died are replaced. Returns the server: .stop(grace) ends it."""
    from concurrent import futures

    grpc, registration, plugin = _services(driver, dra_socket, name, on_status)
    from . import dra_pb2_grpc, pluginregistration_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(registration, server)
    dra_pb2_grpc.add_DRAPluginServicer_to_server(plugin, server)
    for path in (dra_socket, reg_socket):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if not server.add_insecure_port(f"unix://{path}"):
            raise OSError(f"cannot listen on {path}")
    server.start()
    return server
