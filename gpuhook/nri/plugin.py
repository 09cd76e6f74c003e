"""`gpuhook nri`: gpuhook as an NRI plugin (containerd 2.x, CRI-O), beside the runtime wrapper.

It connects to the runtime's NRI socket, registers (RegisterPlugin), subscribes to
CreateContainer and PostCreateContainer (Configure), answers Synchronize with no updates,
and for each container of a pod whose runtime handler is the node config's
`nri_runtime_handler` returns the adjustment of exactly the edits the wrapper would write
into config.json: the same request (request_from_nri, as request_from_spec reads a spec),
the same create core (inject.py: the Decision and the log record the wrapper's are), one
conversion (adjustment). Other pods get an empty adjustment. It never answers a
CreateContainer with an error (an error reply fails the create): any fault is an empty
adjustment and one node log line with "front": "nri". Its command line is cli/nri.py's.

The node log says what the container got, in the runtime's word, never the plugin's memory
of what it sent (confirm): an "injected" decision waits for the container as the runtime
made it (PostCreateContainer, or the next Synchronize's list) and is logged as "injected"
with the devices really there, or as "late" when none of them are (the reply came after
the runtime's deadline: NRI went on without it), or "unconfirmed" when the runtime never
says. Each Synchronize also finds the gpu-optional containers created while the plugin was
not registered (restart, stall, a registration that failed) that lack the GPUs gpuhook
would give: one "missed" line each (check_missed; NRI lists no exited container). A
Synchronize that never completes (NRI's 4 MiB message limit, see docs/runtime.md) is an
"nri" line on the node log.

When the connection ends it connects again at once, then as soon as the socket answers
(polled), with a short backoff only after a connection that failed before it was
synchronized. Nothing the runtime sends stops it: an undecodable message is one line and a
new connection. Under systemd (NOTIFY_SOCKET) it says READY=1 once first synchronized.

Protobuf modules nri_api_pb2 and nri_ttrpc_pb2 are generated from nri_api.proto (NRI 0.8's
api.proto) and nri_ttrpc.proto beside this file (regen.py); wire.py is the framing.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections import OrderedDict
from typing import Any

from ..hook import ROOTFS_FROM_STATE
from ..inject import INJECTED
from ..logline import LATE, MISSED, NRI, POD_KEYS, UNCONFIRMED, bounded_warnings
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
POST_CREATE_CONTAINER = 5  # api.Event POST_CREATE_CONTAINER: the container as the runtime made it
UNIMPLEMENTED = 12  # gRPC code
FRONT = NRI  # the node log's "front" of a create made here
NRI_EVENT = "nri"  # the node log's event of the plugin's own state (a Synchronize that failed...)
# decisions of create lines that only the runtime's word makes (logline's LATE, MISSED, UNCONFIRMED)
WHY_LATE = (
    "the runtime created it without gpuhook's adjustment (the plugin's answer came after NRI's "
    "request timeout, or never)"
)
WHY_MISSED = "created while gpuhook's NRI plugin was not registered with the runtime"
WHY_GONE = "the runtime no longer lists it after the plugin reconnected (its create failed, or it was removed)"
WHY_SILENT = "the runtime never reported it as created"
CONFIRM_WAIT = 60.0  # s: a decision the runtime says nothing more of is logged "unconfirmed" after this
MAX_PENDING = 4096  # decisions awaiting the runtime's word (the oldest logged "unconfirmed" first)
MAX_LOGGED = 16384  # container ids with a line (none gets a "missed" line too)
LOGGED_TAIL = 8 << 20  # the node log's last bytes read once, for the ids a previous plugin logged
POLL = 0.05  # s between connects while the runtime's socket does not answer
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 5.0  # after a connection that failed before it was synchronized
SWEEP_EVERY = 5.0  # s: how often a connected plugin looks for decisions past CONFIRM_WAIT
SYNC_SAY_EVERY = 300.0  # s: a Synchronize that keeps failing is said again after this


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
        self.unlogged: list[tuple] = []  # (config, record, own ms): written once the reply is sent
        self.lines: list[tuple] = []  # (config, event, record, own ms or None): lines to write as they are
        # container id -> (config, record, own ms, since): "injected" decisions awaiting the runtime's word
        self.pending: OrderedDict[str, tuple] = OrderedDict()
        self.logged: OrderedDict[str, None] = OrderedDict()  # container ids with a create line
        self.read_logged = False  # the node log's ids of earlier plugins read (once, at the first sync)
        self.configured = False  # this connection: Configure answered
        self.synced = False  # this connection: the last Synchronize answered (the runtime now calls it)
        self.sync_pods: dict[str, Any] = {}  # the Synchronize being received (split: more=True)
        self.sync_containers: list = []
        self.after_reply: list = []  # work for after the reply has gone (the runtime waits for none of it)
        self.notified = False  # READY=1 sent
        self.sync_failures = 0  # connections in a row closed before they were synchronized
        self.sync_said_at: float | None = None

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
    def run_forever(self, retry: float = BACKOFF_MAX) -> None:
        """Connect, serve until the connection ends, connect again: at once after a connection
        that was synchronized, after a backoff (up to `retry` s) after one that failed before,
        every POLL s while the socket does not answer. Nothing ends it but a signal."""
        self.warm()
        backoff, waiting = 0.0, False
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                s.connect(self.socket_path)
            except OSError as e:
                s.close()
                if not waiting:
                    self.say(f"waiting for the runtime's socket {self.socket_path}: {e.strerror or e}")
                    waiting = True
                self.settle(time.monotonic())
                time.sleep(POLL)
                continue
            waiting = False
            why = self.serve_connected(s)
            if self.synced:
                backoff = 0.0
                self.say(f"connection to {self.socket_path} ended: {why}; connecting again")
            else:
                backoff = min(max(backoff * 2, BACKOFF_FIRST), retry)
                self.say(
                    f"connection to {self.socket_path} ended before the runtime synchronized the plugin: "
                    f"{why}; connecting again in {backoff:g}s"
                )
                if self.configured:
                    self.sync_failed(why)
            self.settle(time.monotonic())
            time.sleep(backoff)

    def serve_connected(self, s: socket.socket) -> str:
        """Serve one connection to its end; why it ended, in words. Never raises: whatever the
        runtime sent (a broken frame, a message that does not decode) ends this connection
        only."""
        from google.protobuf.message import DecodeError

        self.sock = s
        try:
            self.serve(s)
            return "shut down by the runtime"
        except (OSError, wire.WireError) as e:
            return str(e) or type(e).__name__
        except DecodeError as e:
            return f"a message from the runtime does not decode ({e or 'DecodeError'})"
        except Exception as e:  # a fault here must not end the plugin: the next connection may do
            return f"{type(e).__name__}: {e}"
        finally:
            self.sock = None
            s.close()
            self.after_reply.clear()
            self.write_log()

    def serve(self, s: socket.socket) -> None:
        """Register, then answer the runtime's requests until it closes the connection."""
        self.configured = self.synced = False
        self.sync_pods, self.sync_containers = {}, []
        register = self.pb.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        req = self.tt.Request(service=RUNTIME_SERVICE, method="RegisterPlugin", payload=register.SerializeToString())
        s.settimeout(SWEEP_EVERY)
        s.sendall(wire.encode(wire.RUNTIME_CONN, 1, wire.REQUEST, wire.FLAG_REMOTE_CLOSED, req.SerializeToString()))
        decoder = wire.Decoder()
        while True:
            try:
                data = s.recv(1 << 16)
            except TimeoutError:
                self.settle(time.monotonic())
                continue
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
                    while self.after_reply:  # after the reply: the runtime waits for none of it
                        self.after_reply.pop(0)()
                    self.write_log()  # after the reply: the create waits for no log line
                    if done:
                        return

    def dispatch(self, payload: bytes) -> tuple[bytes, bool]:
        """One request of the runtime's: (the serialized ttrpc.Response, whether to close). A
        Configure or Synchronize that does not decode raises (DecodeError: a new connection);
        a CreateContainer that does not decode is an empty adjustment, an event an empty answer."""
        pb, tt = self.pb, self.tt
        req = tt.Request.FromString(payload)
        done = False
        if req.service != SERVICE:
            out = tt.Response(status=tt.Status(code=UNIMPLEMENTED, message=f"no service {req.service}"))
        elif req.method == "Configure":
            conf = pb.ConfigureRequest.FromString(req.payload)
            self.runtime = conf.runtime_name
            self.configured = True
            self.say(f"configured by {conf.runtime_name} {conf.runtime_version}")
            events = event_mask(CREATE_CONTAINER, POST_CREATE_CONTAINER)
            out = tt.Response(payload=pb.ConfigureResponse(events=events).SerializeToString())
        elif req.method == "Synchronize":
            sync = pb.SynchronizeRequest.FromString(req.payload)
            self.sync_pods.update((p.id, p) for p in sync.pods)
            self.sync_containers.extend(sync.containers)
            if not sync.more:  # the whole list: the runtime adds the plugin once this is answered
                pods, containers = self.sync_pods, self.sync_containers
                self.sync_pods, self.sync_containers = {}, []
                self.after_reply.append(lambda: self.synchronized(pods, containers))
            out = tt.Response(payload=pb.SynchronizeResponse(more=sync.more).SerializeToString())
        elif req.method == "CreateContainer":
            out = tt.Response(payload=self.create_container(req.payload).SerializeToString())
        elif req.method == "StateChange":
            try:
                evt = pb.StateChangeEvent.FromString(req.payload)
            except Exception as e:  # an event: an empty answer all the same
                self.say(f"a StateChange from the runtime does not decode: {type(e).__name__}: {e}")
            else:
                if evt.event == POST_CREATE_CONTAINER and evt.container.id in self.pending:
                    self.after_reply.append(lambda: self.confirm(evt.container))
            out = tt.Response(payload=pb.Empty().SerializeToString())
        elif req.method == "Shutdown":
            out = tt.Response(payload=pb.Empty().SerializeToString())
            done = True
        else:  # not subscribed to: never sent
            out = tt.Response(status=tt.Status(code=UNIMPLEMENTED, message=f"{req.method} not handled"))
        return out.SerializeToString(), done

    # -- what the runtime says of the containers ------------------------------------------------
    def synchronized(self, pods: dict, containers: list) -> None:
        """The runtime's whole list, answered: the plugin is registered. Pending decisions get
        the runtime's word; gpu-optional containers without gpuhook's GPUs and with no line get
        a "missed" one."""
        self.synced = True
        self.say(f"synchronized: {len(pods)} pod(s), {len(containers)} container(s)")
        if self.sync_failures:
            self.say(f"synchronized after {self.sync_failures} failed connection(s)")
            self.node_line({"state": "synchronized", "failures": self.sync_failures})
        self.sync_failures, self.sync_said_at = 0, None
        self.notify_ready()
        config = self.config()
        if config is None:
            return
        if not self.read_logged:
            self.read_logged = True
            for cid in logged_ids(config.log_file):
                self.mark_logged(cid)
        listed = set()
        for c in containers:
            listed.add(c.id)
            if c.id in self.pending:
                self.confirm(c)
                continue
            pod = pods.get(c.pod_sandbox_id)
            if pod is None or pod.runtime_handler != config.nri_runtime_handler or c.id in self.logged:
                continue
            self.check_missed(config, pod, c)
        for cid in [cid for cid in self.pending if cid not in listed]:
            self.unconfirmed(cid, WHY_GONE)

    def check_missed(self, config, pod, container) -> None:
        """A "missed" line for a gpu-optional container that has none of the device nodes the
        planner would give it now (it was created with no adjustment of gpuhook's). The plan
        is made with no round-robin memory (the create core's remember=False): a check gives out
        no GPU."""
        from .. import inject

        decision = inject.decide(request_from_nri(container, None), config, remember=False)
        if decision.decision == inject.ERROR:
            self.say(f"cannot check container {container.id}: {decision.error}")
            return
        planned = decision.plan
        if planned is None:
            return
        nodes = {n.path for n in planned.edits.device_nodes}
        if not planned.devices or nodes.intersection(d.path for d in container.linux.devices):
            return
        line = {"front": FRONT, "container_id": container.id, **decision.pod}
        line.update(decision=MISSED, reason=WHY_MISSED)
        self.lines.append((config, "create", line, None))

    def confirm(self, container) -> None:
        """The line of a pending "injected" decision, from the container as the runtime made it:
        "injected" with the device nodes and env it really has, "late" when it has none."""
        entry = self.pending.pop(container.id, None)
        if entry is None:
            return
        config, record, own_ms, _since = entry
        have_dev = {d.path for d in container.linux.devices}
        have_env = set(container.env)
        sent_nodes, sent_env = record.get("nodes") or [], record.get("env") or []
        got_nodes = [n for n in sent_nodes if n in have_dev]
        got_env = [e for e in sent_env if e in have_env]
        if (sent_nodes or sent_env) and not got_nodes and not got_env:
            self.lines.append((config, "create", not_injected(record, LATE, WHY_LATE), own_ms))
            return
        missing = [*(n for n in sent_nodes if n not in have_dev), *(e for e in sent_env if e not in have_env)]
        if missing:
            record = {**record, "nodes": got_nodes, "env": got_env}
            record["warnings"] = list(
                bounded_warnings(
                    [*record.get("warnings", []), f"not in the container as the runtime made it: {', '.join(missing)}"]
                )
            )
        self.lines.append((config, "create", record, own_ms))

    def unconfirmed(self, cid: str, why: str) -> None:
        entry = self.pending.pop(cid, None)
        if entry is not None:
            config, record, own_ms, _since = entry
            self.lines.append((config, "create", not_injected(record, UNCONFIRMED, why), own_ms))

    def settle(self, now: float) -> None:
        """Decisions the runtime said nothing of for CONFIRM_WAIT: "unconfirmed" lines."""
        for cid in [cid for cid, e in self.pending.items() if now - e[3] >= CONFIRM_WAIT]:
            self.unconfirmed(cid, WHY_SILENT)
        self.write_log()

    def sync_failed(self, why: str) -> None:
        """A connection the runtime closed after Configure and before its Synchronize was whole:
        NRI did not add the plugin. Said on the node log at the first failure and then every
        SYNC_SAY_EVERY s while it goes on."""
        self.sync_failures += 1
        now = time.monotonic()
        if self.sync_said_at is not None and now - self.sync_said_at < SYNC_SAY_EVERY:
            return
        self.sync_said_at = now
        self.node_line(
            {
                "state": "sync-failed",
                "failures": self.sync_failures,
                "error": f"the runtime closed the connection before it synchronized the plugin ({why[:200]}); until it "
                'does, gpu-optional containers start without GPUs (each gets a "missed" line once the plugin is '
                "synchronized). A container whose spec is over NRI's 4 MiB message limit makes every plugin's "
                "Synchronize fail: see the runtime's log",
            }
        )

    def node_line(self, fields: dict) -> None:
        """An "nri" line on the node log: the plugin's own state, best effort."""
        config = self.config()
        if config is not None:
            self.lines.append((config, NRI_EVENT, {"front": FRONT, **fields}, None))
            self.write_log()

    def config(self):
        try:
            from ..config import load

            return load()[0]
        except Exception as e:
            self.say(f"cannot read the node config: {type(e).__name__}: {e}")
            return None

    def mark_logged(self, cid: str) -> None:
        self.logged[cid] = None
        self.logged.move_to_end(cid)
        while len(self.logged) > MAX_LOGGED:
            self.logged.popitem(last=False)

    def notify_ready(self) -> None:
        """READY=1 to systemd (Type=notify), once: the runtime has the plugin."""
        if self.notified:
            return
        self.notified = True
        sd_notify(b"READY=1", self.say)

    # -- CreateContainer -----------------------------------------------------------------------
    def create_container(self, payload: bytes):
        """The CreateContainerResponse: never an error, whatever happens."""
        from .. import inject

        pb = self.pb
        started = time.monotonic()
        config = decision = container_id = None
        errors: list[str] = []
        sent_env: list[str] = []
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
            sent_env = [f"{kv.key}={kv.value}" for kv in adj.env]
            return pb.CreateContainerResponse(adjust=adj)
        except Exception as e:  # fail open, always: an error reply would fail the create
            decision = inject.failed(e, decision, errors)
            return pb.CreateContainerResponse()
        finally:
            if decision is not None:
                ms = (time.monotonic() - started) * 1000
                record = inject.record(decision, FRONT, container_id, ms).to_line()
                del record["time"], record["event"]  # the line's, when it is written (write_log)
                own_ms = record.pop("duration_ms")
                if sent_env:  # what the adjustment sent, for the runtime's word on it (confirm)
                    record["env"] = sent_env
                self.unlogged.append((config, record, own_ms))

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
        core's record, naming this front), but an "injected" one, which waits for the runtime's word
        (confirm); then every line made since (self.lines): best effort, never raises."""
        now = time.monotonic()
        while self.unlogged:
            config, record, own_ms = self.unlogged.pop(0)
            cid = record.get("container_id")
            if record.get("decision") == INJECTED and cid:
                self.pending.pop(cid, None)
                self.pending[cid] = (config, record, own_ms, now)
                while len(self.pending) > MAX_PENDING:
                    self.unconfirmed(next(iter(self.pending)), WHY_SILENT)
            else:
                self.lines.append((config, "create", record, own_ms))
        while self.lines:
            config, event, record, own_ms = self.lines.pop(0)
            if event == "create" and record.get("container_id"):
                self.mark_logged(record["container_id"])
            try:
                from .. import fastjson
                from ..logline import append_node_log, utc_now

                log_file = config.log_file if config is not None else None
                if config is None:
                    from ..config import Config

                    log_file = Config().log_file
                line = {"time": utc_now(), "event": event, **record}
                if own_ms is not None:
                    line["duration_ms"] = own_ms
                if log_file:
                    append_node_log(log_file, fastjson.dumps(line), say=self.say)
            except Exception as e:  # the log is best effort; the answer is not
                self.say(f"cannot write the node log: {type(e).__name__}: {e}")


def not_injected(record: dict, decision: str, why: str) -> dict:
    """A pending "injected" record as a line that claims no GPU: what the create was, the
    decision the runtime's word made of it, and why."""
    keep = {k: v for k, v in record.items() if k in ("front", "container_id", *POD_KEYS)}
    return {**keep, "decision": decision, "reason": why, "planned_devices": len(record.get("devices") or [])}


# a line's container id (create lines; a hook line names a container its create line named
# before it): a regular expression, not a JSON parse of each line, so that the first
# Synchronize's read of a big log costs little
_LOGGED_ID = re.compile(rb'"container_id": ?"([0-9A-Za-z_.-]{1,256})"')


def logged_ids(log_file: str | None) -> list[str]:
    """The container ids of the lines in the node log's last LOGGED_TAIL bytes."""
    if not log_file:
        return []
    try:
        with open(log_file, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - LOGGED_TAIL))
            data = f.read(LOGGED_TAIL)
    except OSError:
        return []
    return [m.decode() for m in _LOGGED_ID.findall(data)]


def sd_notify(state: bytes, say) -> None:
    """One datagram to systemd's NOTIFY_SOCKET (sd_notify(3)), when there is one."""
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr or addr[0] not in "/@":
        return
    target = "\0" + addr[1:] if addr[0] == "@" else addr
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state, target)
    except OSError as e:
        say(f"cannot notify systemd at {addr}: {e.strerror or e}")
