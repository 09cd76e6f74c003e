"""`gpuhook nri`: gpuhook as an NRI plugin (containerd 2.x, CRI-O), beside the runtime wrapper.

It connects to the runtime's NRI socket, registers (RegisterPlugin), subscribes to
CreateContainer alone (Configure), answers Synchronize with no updates, and for each
container of a pod whose runtime handler is the node config's `nri_runtime_handler` returns
the adjustment of exactly the edits the wrapper would write into config.json: the same
request (request_from_nri, as request_from_spec reads a spec), the same create core
(inject.py: the Decision and the log record the wrapper's are), one conversion
(adjustment). Other pods get an empty adjustment. It never answers a CreateContainer with an
error (an error reply fails the create): any fault is an empty adjustment and one node log
line with "front": "nri". Its command line is cli/nri.py's. When the connection ends (the
runtime restarted, or closed the plugin after a timeout) it connects again.

Protobuf modules nri_api_pb2 and nri_ttrpc_pb2 are generated from nri_api.proto (NRI 0.8's
api.proto) and nri_ttrpc.proto beside this file (regen.py); wire.py is the framing.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

from ..hook import ROOTFS_FROM_STATE
from ..logline import NRI
from . import wire

DEFAULT_SOCKET = "/var/run/nri/nri.sock"  # NRI's api.DefaultSocketPath
DEFAULT_NAME = "gpuhook"
DEFAULT_INDEX = "10"  # plugins run in index order; two digits (api.CheckPluginIndex)
# Where the ld-cache hook finds the container's rootfs, which NRI does not say: by default
# from what the runtime wrote when the hook runs (the OCI state's bundle, its config.json's
# root.path: hook.ROOTFS_FROM_STATE), on containerd and CRI-O alike; else a path with {id},
# the container's id, in it; '' for no hook.
ROOTFS_TEMPLATE = ROOTFS_FROM_STATE
SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
CREATE_CONTAINER = 4  # api.Event CREATE_CONTAINER
UNIMPLEMENTED = 12  # gRPC code
FRONT = NRI  # the node log's "front" of a create made here


def event_mask(*events: int) -> int:
    """NRI's EventMask: bit (event - 1) for each event (api/event.go)."""
    mask = 0
    for e in events:
        mask |= 1 << (e - 1)
    return mask


# -- from NRI's messages to gpuhook's ------------------------------------------------------


def request_from_nri(container, rootfs: str | None):
    """The planner's Request for an NRI Container, field for field as request_from_spec
    reads config.json: env, annotations, the device nodes and mount destinations it already
    has, whether it has a user namespace of its own."""
    from ..plan import Request

    env = {}
    for item in container.env:
        k, _, v = item.partition("=")
        env[k] = v
    devices = {}
    for d in container.linux.devices:
        devices[d.path] = (d.type if d.type in ("c", "b", "u") else "c", d.major, d.minor)
    mounts = tuple(m.destination for m in container.mounts)
    userns = any(n.type == "user" for n in container.linux.namespaces)
    return Request(env, dict(container.annotations), rootfs, devices, mounts, userns)


def adjustment(edits, container, pb):
    """The ContainerAdjustment of `edits`, less what `container` already has (a device path,
    a mount destination, the same KEY=value): NRI fails a create when two plugins adjust the
    same thing, and a device plugin's CDI devices come as the container's own. Returns
    (adjustment, what was left out for lack of an NRI field)."""
    adj = pb.ContainerAdjustment()
    have_env = set(container.env)
    for item in edits.env:
        if item not in have_env:
            key, _, value = item.partition("=")
            adj.env.append(pb.KeyValue(key=key, value=value))
    have_dev = {d.path for d in container.linux.devices}
    for n in edits.device_nodes:
        if n.path in have_dev:
            continue
        dev = adj.linux.devices.add(path=n.path, type=n.type, major=n.major, minor=n.minor)
        if n.file_mode is not None:
            dev.file_mode.value = n.file_mode
        if n.uid is not None:
            dev.uid.value = n.uid
        if n.gid is not None:
            dev.gid.value = n.gid
    have_mnt = {m.destination for m in container.mounts}
    for m in edits.mounts:
        if m.container_path not in have_mnt:
            adj.mounts.add(destination=m.container_path, type=m.type, source=m.host_path, options=list(m.options))
            have_mnt.add(m.container_path)
    stages = {
        "createContainer": adj.hooks.create_container,
        "prestart": adj.hooks.prestart,
        "createRuntime": adj.hooks.create_runtime,
        "startContainer": adj.hooks.start_container,
        "poststart": adj.hooks.poststart,
        "poststop": adj.hooks.poststop,
    }
    left_out = []
    for h in edits.hooks:
        stage = stages.get(h.hook_name)
        if stage is None:
            left_out.append(f"hook {h.hook_name}")
            continue
        hook = stage.add(path=h.path, args=list(h.args), env=list(h.env))
        if h.timeout is not None:
            hook.timeout.value = h.timeout
    if edits.additional_gids:  # NRI 0.8's adjustment has no additionalGids
        left_out.append("additional gids " + ",".join(map(str, edits.additional_gids)))
    return adj, left_out


# -- the plugin -----------------------------------------------------------------------------


class Plugin:
    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        name: str = DEFAULT_NAME,
        index: str = DEFAULT_INDEX,
        rootfs_template: str = ROOTFS_TEMPLATE,
        log=None,
    ) -> None:
        from . import nri_api_pb2, nri_ttrpc_pb2

        self.pb: Any = nri_api_pb2  # protoc's modules: their classes are made at import
        self.tt: Any = nri_ttrpc_pb2
        self.socket_path, self.name, self.index = socket_path, name, index
        self.rootfs_template = rootfs_template
        self.say = log or (lambda msg: print(f"gpuhook nri: {msg}", file=sys.stderr, flush=True))
        self.runtime = ""
        self.sock: socket.socket | None = None
        self.unlogged: list[tuple] = []  # (config, logline.CreateRecord): written once the reply is sent

    def warm(self) -> None:
        """Import what a create needs and put everything made so far out of the cyclic
        collector's reach (gc.freeze): the first create pays no import, and no create pays
        a full collection over the interpreter's own objects."""
        import gc

        from .. import config, fastjson, inject, logline, plan  # noqa: F401
        from ..plan import policy  # noqa: F401
        from ..probe import cache  # noqa: F401

        gc.collect()
        gc.freeze()

    # -- the connection ----------------------------------------------------------------------
    def run_forever(self, retry: float = 1.0) -> None:
        """Connect, serve until the connection ends, connect again."""
        self.warm()
        while True:
            try:
                self.serve_once()
            except (OSError, wire.WireError) as e:
                self.say(f"connection to {self.socket_path} ended: {e}; connecting again in {retry:g}s")
            time.sleep(retry)

    def serve_once(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            s.connect(self.socket_path)
            self.sock = s
            self.serve(s)
        finally:
            self.sock = None
            s.close()

    def serve(self, s: socket.socket) -> None:
        """Register, then answer the runtime's requests until it closes the connection."""
        register = self.pb.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        req = self.tt.Request(service=RUNTIME_SERVICE, method="RegisterPlugin", payload=register.SerializeToString())
        s.sendall(wire.encode(wire.RUNTIME_CONN, 1, wire.REQUEST, wire.FLAG_REMOTE_CLOSED, req.SerializeToString()))
        decoder = wire.Decoder()
        while True:
            data = s.recv(1 << 16)
            if not data:
                raise OSError("closed by the runtime")
            for msg in decoder.feed(data):
                if msg.conn == wire.RUNTIME_CONN and msg.type == wire.RESPONSE:
                    resp = self.tt.Response.FromString(msg.payload)
                    if resp.status.code:
                        raise OSError(f"RegisterPlugin refused: {resp.status.message} (code {resp.status.code})")
                    self.say(f"registered as {self.index}-{self.name} on {self.socket_path}")
                elif msg.conn == wire.PLUGIN_CONN and msg.type == wire.REQUEST:
                    reply, done = self.dispatch(msg.payload)
                    s.sendall(wire.encode(wire.PLUGIN_CONN, msg.stream, wire.RESPONSE, 0, reply))
                    self.write_log()  # after the reply: the create waits for no log line
                    if done:
                        return

    def dispatch(self, payload: bytes) -> tuple[bytes, bool]:
        """One request of the runtime's: (the serialized ttrpc.Response, whether to close)."""
        pb, tt = self.pb, self.tt
        req = tt.Request.FromString(payload)
        done = False
        if req.service != SERVICE:
            out = tt.Response(status=tt.Status(code=UNIMPLEMENTED, message=f"no service {req.service}"))
        elif req.method == "Configure":
            conf = pb.ConfigureRequest.FromString(req.payload)
            self.runtime = conf.runtime_name
            self.say(f"configured by {conf.runtime_name} {conf.runtime_version}")
            out = tt.Response(payload=pb.ConfigureResponse(events=event_mask(CREATE_CONTAINER)).SerializeToString())
        elif req.method == "Synchronize":
            sync = pb.SynchronizeRequest.FromString(req.payload)
            out = tt.Response(payload=pb.SynchronizeResponse(more=sync.more).SerializeToString())
        elif req.method == "CreateContainer":
            out = tt.Response(payload=self.create_container(req.payload).SerializeToString())
        elif req.method in ("Shutdown", "StateChange"):
            out = tt.Response(payload=pb.Empty().SerializeToString())
            done = req.method == "Shutdown"
        else:  # not subscribed to: never sent
            out = tt.Response(status=tt.Status(code=UNIMPLEMENTED, message=f"{req.method} not handled"))
        return out.SerializeToString(), done

    # -- CreateContainer -----------------------------------------------------------------------
    def create_container(self, payload: bytes):
        """The CreateContainerResponse: never an error, whatever happens."""
        from .. import inject

        pb = self.pb
        started = time.monotonic()
        config = decision = container_id = None
        errors: list[str] = []
        try:
            from ..config import load

            config, errors = load()
            req = pb.CreateContainerRequest.FromString(payload)
            container_id = req.container.id
            if req.pod.runtime_handler != config.nri_runtime_handler:
                return pb.CreateContainerResponse()  # another handler's pod: no line, as no wrapper ran
            decision, adj = self.adjust(req, config, errors)
            if decision.decision == inject.ERROR:
                return pb.CreateContainerResponse()  # as after a fault of its own
            return pb.CreateContainerResponse(adjust=adj)
        except Exception as e:  # fail open, always: an error reply would fail the create
            decision = inject.failed(e, decision, errors)
            return pb.CreateContainerResponse()
        finally:
            if decision is not None:
                ms = (time.monotonic() - started) * 1000
                self.unlogged.append((config, inject.record(decision, FRONT, container_id, ms)))

    def rootfs(self, container_id: str) -> str | None:
        """The container's rootfs as the ld-cache hook is told it (rootfs_template)."""
        template = self.rootfs_template
        if not template or template == ROOTFS_FROM_STATE:
            return template or None  # no hook, or the hook reads the root from the runtime's files
        return template.format(id=container_id)

    def adjust(self, req, config, config_errors):
        """(the create core's Decision for req's container, its ContainerAdjustment)."""
        from .. import inject

        decision = inject.decide(request_from_nri(req.container, self.rootfs(req.container.id)), config, config_errors)
        edits = decision.edits
        if not edits:
            return decision, self.pb.ContainerAdjustment()
        adj, left_out = adjustment(edits, req.container, self.pb)
        return decision.warned(*(f"not adjustable through NRI: {x}" for x in left_out)), adj

    def write_log(self) -> None:
        """The node log's line for each create decided on since the last call (the create
        core's record, naming this front): best effort, never raises."""
        while self.unlogged:
            config, record = self.unlogged.pop(0)
            try:
                from .. import fastjson
                from ..logline import append_line

                log_file = config.log_file if config is not None else None
                if config is None:
                    from ..config import Config

                    log_file = Config().log_file
                if log_file:
                    append_line(log_file, fastjson.dumps(record.to_line()))
            except Exception as e:  # the log is best effort; the answer is not
                self.say(f"cannot write the node log: {type(e).__name__}: {e}")
