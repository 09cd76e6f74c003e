"""gpuhook/nri: the checked-in protobuf modules are current, the framing (wire.py) over
socketpairs, and the plugin's answers to a runtime side written here from NRI's protocol
(the real containerd 2.x: tests/e2e/test_sid_nri.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest

from gpuhook.nri import nri_api_pb2 as pb
from gpuhook.nri import plugin as nri
from gpuhook.nri import regen, wire
from gpuhook.nri import nri_ttrpc_pb2 as tt
from fakes import fakehost


def test_the_checked_in_protobuf_modules_are_what_protoc_makes_of_the_protos(tmp_path):
    pytest.importorskip("grpc_tools")
    regen.generate(str(tmp_path))
    for name in regen.generated_names():
        with open(os.path.join(regen.HERE, name), "rb") as have, open(tmp_path / name, "rb") as made:
            assert have.read() == made.read(), f"gpuhook/nri/{name} is stale: run make nri-proto"


# -- wire --------------------------------------------------------------------------------------


def recv_messages(s: socket.socket, decoder: wire.Decoder, count: int) -> list[wire.Message]:
    out: list[wire.Message] = []
    while len(out) < count:
        data = s.recv(1 << 16)
        assert data, "closed early"
        out += decoder.feed(data)
    return out


def test_messages_cross_a_socketpair_whole_on_their_connection():
    a, b = socket.socketpair()
    with a, b:
        big = os.urandom(300_000)
        data = (wire.encode(wire.PLUGIN_CONN, 1, wire.REQUEST, wire.FLAG_REMOTE_CLOSED, b"hello")
                + wire.encode(wire.RUNTIME_CONN, 3, wire.RESPONSE, 0, big))
        t = threading.Thread(target=a.sendall, args=(data,))  # more than a socketpair buffers
        t.start()
        got = recv_messages(b, wire.Decoder(), 2)
        t.join()
        assert [(m.conn, m.stream, m.type, m.flags, m.payload) for m in got] == [
            (1, 1, wire.REQUEST, wire.FLAG_REMOTE_CLOSED, b"hello"), (2, 3, wire.RESPONSE, 0, big)]


def test_a_message_fed_a_byte_at_a_time_and_split_over_frames_comes_out_once():
    ttrpc = wire.TTRPC_HEADER.pack(6, 5, wire.RESPONSE, 0) + b"abcdef"
    # the multiplexer may cut one logical write anywhere (a ttrpc header over two frames)
    frames = b"".join(wire.MUX_HEADER.pack(wire.RUNTIME_CONN, len(c)) + c for c in (ttrpc[:4], ttrpc[4:12], ttrpc[12:]))
    d = wire.Decoder()
    out = []
    for i in range(len(frames)):
        out += d.feed(frames[i : i + 1])
    assert [(m.conn, m.stream, m.payload) for m in out] == [(2, 5, b"abcdef")]


def test_frames_of_a_connection_nobody_opened_are_dropped():
    d = wire.Decoder()
    stray = wire.encode(7, 1, wire.REQUEST, 0, b"x")
    assert d.feed(stray + wire.encode(1, 1, wire.REQUEST, 0, b"y"))[0].payload == b"y"


def test_oversized_frames_and_messages_are_protocol_errors():
    with pytest.raises(wire.WireError, match="multiplexer frame"):
        wire.Decoder().feed(wire.MUX_HEADER.pack(1, wire.MUX_MAX + 1))
    with pytest.raises(wire.WireError, match="ttrpc message"):
        wire.Decoder().feed(wire.MUX_HEADER.pack(1, 10) + wire.TTRPC_HEADER.pack(wire.TTRPC_MAX + 1, 1, 1, 0))
    with pytest.raises(wire.WireError):
        wire.encode(1, 1, wire.REQUEST, 0, bytes(wire.TTRPC_MAX + 1))


def test_the_largest_message_goes_in_one_frame_of_the_multiplexers_largest_size():
    data = wire.encode(1, 1, wire.REQUEST, 0, bytes(wire.TTRPC_MAX))
    assert wire.MUX_HEADER.unpack_from(data) == (1, wire.MUX_MAX) and len(data) == wire.MUX_HEADER.size + wire.MUX_MAX
    assert wire.Decoder().feed(data)[0].payload == bytes(wire.TTRPC_MAX)


# -- the plugin, against a runtime side over a socketpair ------------------------------------


class Runtime:
    """The runtime's end of the plugin's socket: answers RegisterPlugin, calls the plugin."""

    def __init__(self, s: socket.socket) -> None:
        self.s, self.d, self.stream = s, wire.Decoder(), 1

    def expect_registration(self) -> pb.RegisterPluginRequest:
        (msg,) = recv_messages(self.s, self.d, 1)
        assert (msg.conn, msg.type, msg.stream % 2, msg.flags) == (wire.RUNTIME_CONN, wire.REQUEST, 1,
                                                                   wire.FLAG_REMOTE_CLOSED)
        req = tt.Request.FromString(msg.payload)
        assert (req.service, req.method) == (nri.RUNTIME_SERVICE, "RegisterPlugin")
        self.s.sendall(wire.encode(wire.RUNTIME_CONN, msg.stream, wire.RESPONSE, 0,
                                   tt.Response(payload=pb.Empty().SerializeToString()).SerializeToString()))
        return pb.RegisterPluginRequest.FromString(req.payload)

    def call(self, method: str, request, reply_type):
        req = tt.Request(service=nri.SERVICE, method=method, payload=request.SerializeToString())
        self.s.sendall(wire.encode(wire.PLUGIN_CONN, self.stream, wire.REQUEST, wire.FLAG_REMOTE_CLOSED,
                                   req.SerializeToString()))
        (msg,) = recv_messages(self.s, self.d, 1)
        assert (msg.conn, msg.stream, msg.type) == (wire.PLUGIN_CONN, self.stream, wire.RESPONSE)
        self.stream += 2
        resp = tt.Response.FromString(msg.payload)
        assert resp.status.code == 0, resp.status
        return reply_type.FromString(resp.payload)

    def created(self, req: pb.CreateContainerRequest, adj: pb.ContainerAdjustment | None) -> pb.Container:
        """PostCreateContainer, as NRI 0.8 sends it (a StateChange): the container as the
        runtime made it, with `adj` applied (None: made without the plugin's adjustment)."""
        made = pb.Container()
        made.CopyFrom(req.container)
        if adj is not None:
            made.env.extend(f"{e.key}={e.value}" for e in adj.env)
            made.linux.devices.extend(adj.linux.devices)
            made.mounts.extend(adj.mounts)
        self.call("StateChange", pb.StateChangeEvent(event=pb.POST_CREATE_CONTAINER, pod=req.pod, container=made),
                  pb.Empty)
        return made

    def create(self, req: pb.CreateContainerRequest) -> pb.ContainerAdjustment:
        """CreateContainer, answered in time, then its PostCreateContainer."""
        adj = self.call("CreateContainer", req, pb.CreateContainerResponse).adjust
        self.created(req, adj)
        return adj


@pytest.fixture
def node(tmp_path, monkeypatch):
    host = str(tmp_path / "host")
    fakehost.build(host, "nvidia", mknod=False)
    log = tmp_path / "gpuhook.log"
    conf = tmp_path / "gpuhook.toml"
    conf.write_text(f'host_root = "{host}"\nlog_file = "{log}"\nldconfig = "/sbin/ldconfig"\n')
    monkeypatch.setenv("GPUHOOK_CONFIG", str(conf))
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "cache"))
    return conf, log


@pytest.fixture
def connected(node):
    """(Runtime, the plugin's thread, its messages): registered and configured."""
    a, b = socket.socketpair()
    said: list[str] = []
    plugin = nri.Plugin("unused", "gpuhook", "10", "/run/c/{id}/rootfs", log=said.append)
    def serve():
        with contextlib.suppress(OSError):  # the end of each test closes the socket
            plugin.serve(a)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    b.settimeout(10)  # a plugin that stops answering fails the test, never hangs it
    rt = Runtime(b)
    reg = rt.expect_registration()
    assert (reg.plugin_name, reg.plugin_idx) == ("gpuhook", "10")
    conf = rt.call("Configure", pb.ConfigureRequest(runtime_name="containerd", runtime_version="v2.1.9",
                                                    request_timeout=2000), pb.ConfigureResponse)
    # CreateContainer, and PostCreateContainer for the container as the runtime made it
    assert conf.events == (1 << (pb.CREATE_CONTAINER - 1)) | (1 << (pb.POST_CREATE_CONTAINER - 1)) == \
        nri.event_mask(nri.CREATE_CONTAINER, nri.POST_CREATE_CONTAINER)
    yield rt, t, said
    a.close()
    b.close()


def create_request(handler: str = "gpu-optional", **container) -> pb.CreateContainerRequest:
    ann = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "default",
           "io.kubernetes.cri.sandbox-name": "p", "io.kubernetes.cri.container-name": "app",
           "io.kubernetes.cri.sandbox-uid": "u-1"}
    return pb.CreateContainerRequest(pod=pb.PodSandbox(id="pod1", name="p", namespace="default",
                                                       runtime_handler=handler),
                                     container=pb.Container(id="c1", pod_sandbox_id="pod1", name="app",
                                                            annotations=ann, env=["PATH=/bin"], **container))


def planned(req: pb.CreateContainerRequest):
    """What the planner gives the container of `req` (the wrapper's edits for it)."""
    from gpuhook.config import load
    from gpuhook.plan import plan
    from gpuhook.probe import nodestate, probe

    config, _ = load()
    inv = probe(config.host_root)
    state = nodestate.read(inv, config, os.environ["GPUHOOK_CACHE_DIR"], "/sbin/ldconfig")
    return plan(inv, state, nri.request_from_nri(req.container, "/run/c/c1/rootfs"), config).edits


def records(log, at_least: int = 0) -> list[dict]:
    """The node log's lines; at_least: once that many are there (the plugin writes a line
    after its reply has gone)."""
    import json

    deadline = time.monotonic() + 10
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= at_least or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.01)


def test_registration_configure_and_synchronize(connected):
    rt, _t, said = connected
    sync = rt.call("Synchronize", pb.SynchronizeRequest(pods=[pb.PodSandbox(id="x")], more=True),
                   pb.SynchronizeResponse)
    assert sync.more and not sync.update
    sync = rt.call("Synchronize", pb.SynchronizeRequest(more=False), pb.SynchronizeResponse)
    assert not sync.more and not sync.update
    assert any("configured by containerd v2.1.9" in s for s in said), said


def test_a_gpu_optional_container_gets_the_planners_edits_as_its_adjustment(connected, node):
    rt, _t, _said = connected
    _conf, log = node
    req = create_request()
    adj = rt.create(req)
    edits = planned(req)
    assert [d.path for d in adj.linux.devices] == [n.path for n in edits.device_nodes] and len(adj.linux.devices) > 8
    assert [(d.major, d.minor) for d in adj.linux.devices] == [(n.major, n.minor) for n in edits.device_nodes]
    assert [f"{e.key}={e.value}" for e in adj.env] == list(edits.env)
    assert [m.destination for m in adj.mounts] == [m.container_path for m in edits.mounts]
    assert [(h.path, list(h.args)) for h in adj.hooks.create_container] == \
        [(h.path, list(h.args)) for h in edits.hooks] and "/run/c/c1/rootfs" in adj.hooks.create_container[0].args
    (rec,) = records(log, 1)
    assert (rec["front"], rec["decision"], rec["container_id"], rec["pod_name"]) == ("nri", "injected", "c1", "p")


def test_what_the_container_already_has_is_not_adjusted_again(connected):
    rt, _t, _said = connected
    full = rt.call("CreateContainer", create_request(), pb.CreateContainerResponse).adjust
    dev0 = full.linux.devices[0]
    mnt0 = full.mounts[0]
    env0 = f"{full.env[0].key}={full.env[0].value}"
    req = create_request(
        linux=pb.LinuxContainer(devices=[pb.LinuxDevice(path=dev0.path, type="c", major=dev0.major, minor=dev0.minor)]),
        mounts=[pb.Mount(destination=mnt0.destination, type="bind", source="/elsewhere")])
    req.container.env.append(env0)
    adj = rt.call("CreateContainer", req, pb.CreateContainerResponse).adjust
    edits = planned(req)
    assert dev0.path in [n.path for n in edits.device_nodes] and env0 in edits.env
    assert mnt0.destination in [m.container_path for m in edits.mounts]
    # the planner's edits, less what the container has
    assert [d.path for d in adj.linux.devices] == [n.path for n in edits.device_nodes if n.path != dev0.path]
    assert [m.destination for m in adj.mounts] == [m.container_path for m in edits.mounts
                                                   if m.container_path != mnt0.destination]
    assert [f"{e.key}={e.value}" for e in adj.env] == [e for e in edits.env if e != env0]


def test_other_handlers_and_sandboxes_get_an_empty_adjustment(connected, node):
    rt, _t, _said = connected
    _conf, log = node
    resp = rt.call("CreateContainer", create_request("runc"), pb.CreateContainerResponse)
    assert resp == pb.CreateContainerResponse()
    assert records(log) == []
    req = create_request()
    req.container.annotations["io.kubernetes.cri.container-type"] = "sandbox"
    assert rt.call("CreateContainer", req, pb.CreateContainerResponse).adjust == pb.ContainerAdjustment()
    assert [r["decision"] for r in records(log, 1)] == ["sandbox"]  # and none for the runc pod before it


def test_the_node_configs_handler_is_the_one_adjusted(connected, node):
    rt, _t, _said = connected
    conf, _log = node
    with open(conf, "a") as f:
        f.write('nri_runtime_handler = "gpu"\n')
    assert rt.call("CreateContainer", create_request(), pb.CreateContainerResponse) == pb.CreateContainerResponse()
    assert rt.call("CreateContainer", create_request("gpu"), pb.CreateContainerResponse).adjust.linux.devices


def test_any_fault_is_an_empty_adjustment_and_one_log_line_never_an_error_reply(connected, node, monkeypatch):
    import gpuhook.plan

    rt, _t, _said = connected
    _conf, log = node

    def broken(*a, **k):
        raise RuntimeError("the planner broke")

    monkeypatch.setattr(gpuhook.plan, "plan", broken)
    resp = rt.call("CreateContainer", create_request(), pb.CreateContainerResponse)  # status 0 (asserted by call)
    assert resp == pb.CreateContainerResponse()
    (rec,) = records(log, 1)
    assert (rec["front"], rec["decision"], rec["error"]) == ("nri", "error", "RuntimeError: the planner broke")
    # a request that does not even parse: still an empty answer, not an error
    req = tt.Request(service=nri.SERVICE, method="CreateContainer", payload=b"\xff\xff\xff")
    plugin = nri.Plugin(log=lambda m: None)
    out, done = plugin.dispatch(req.SerializeToString())
    assert tt.Response.FromString(out).status.code == 0 and not done
    plugin.write_log()
    assert [r["decision"] for r in records(log, 2)] == ["error", "error"]


def test_the_reply_goes_before_the_log_line_is_written(connected, node, monkeypatch):
    """The create waits for the plugin's answer, never for its log line: with the line's write
    held, the answer still comes; let go, the line is written."""
    from gpuhook import logline

    rt, _t, _said = connected
    _conf, log = node
    held, written = threading.Event(), []
    real = logline.append_line

    def slow_append(path, line, *a, **k):
        assert held.wait(10), "never let go"
        written.append(line)
        return real(path, line, *a, **k)

    monkeypatch.setattr(logline, "append_line", slow_append)
    req = create_request()
    adj = rt.call("CreateContainer", req, pb.CreateContainerResponse).adjust
    rt.created(req, adj)  # the runtime's word on it: the line is written after this answer too
    assert adj.linux.devices and written == [] and records(log) == []
    held.set()
    (rec,) = records(log, 1)
    assert rec["decision"] == "injected" and len(written) == 1


def test_shutdown_ends_the_session_and_a_closed_socket_ends_it_too(connected):
    rt, t, _said = connected
    rt.call("Shutdown", pb.Empty(), pb.Empty)
    t.join(5)
    assert not t.is_alive()


def test_the_plugin_connects_again_when_the_runtime_goes(tmp_path, node):
    path = str(tmp_path / "nri.sock")
    said: list[str] = []
    plugin = nri.Plugin(path, log=said.append)
    t = threading.Thread(target=plugin.run_forever, kwargs={"retry": 0.05}, daemon=True)
    t.start()
    for _round in range(2):  # a runtime, then the next one on the same path
        srv = socket.socket(socket.AF_UNIX)
        if os.path.exists(path):
            os.unlink(path)
        srv.bind(path)
        srv.listen(1)
        srv.settimeout(10)
        conn, _ = srv.accept()
        with conn:
            assert Runtime(conn).expect_registration().plugin_name == "gpuhook"
        srv.close()
    assert any("connection to" in s and "ended" in s for s in said), said


def test_the_cli_refuses_bad_arguments_in_one_line(capsys):
    from gpuhook.cli import main

    assert main(["nri", "--index", "1"]) == 2
    assert capsys.readouterr().err.strip() == "gpuhook: --index must be two digits, got '1'"
    assert main(["nri", "--rootfs-template", "relative/{id}"]) == 2
    assert "--rootfs-template" in capsys.readouterr().err


def test_what_an_adjustment_cannot_carry_is_said_and_hooks_keep_their_stage_and_timeout():
    from gpuhook.edits import DeviceNode, Edits, Hook

    edits = Edits(env=("A=1",), device_nodes=(DeviceNode("/dev/dri/renderD128", "c", 226, 128, file_mode=0o20660,
                                                         gid=44),),
                  hooks=(Hook("createContainer", "/h", ("h", "x"), ("PATH=/bin",), 30),), additional_gids=(44,))
    adj, left_out = nri.adjustment(edits, pb.Container(), pb)
    assert left_out == ["additional gids 44"]  # NRI 0.8 has no field for them
    (d,) = adj.linux.devices
    assert (d.path, d.major, d.minor, d.file_mode.value, d.gid.value) == ("/dev/dri/renderD128", 226, 128, 0o20660, 44)
    (h,) = adj.hooks.create_container
    assert (h.path, list(h.args), list(h.env), h.timeout.value) == ("/h", ["h", "x"], ["PATH=/bin"], 30)


def test_no_rootfs_template_means_no_hook_and_the_rest_all_the_same(node):
    req = create_request()
    with_hook = nri.Plugin(log=lambda m: None).create_container(req.SerializeToString()).adjust
    without = nri.Plugin(rootfs_template="", log=lambda m: None).create_container(req.SerializeToString()).adjust
    assert with_hook.hooks.create_container and not without.hooks.create_container
    assert without.linux.devices == with_hook.linux.devices and without.mounts == with_hook.mounts


# -- what the log says is what the container got (issue 36) ---------------------------------


def sync(rt: Runtime, *containers: pb.Container, handler: str = "gpu-optional") -> None:
    """The runtime's whole list in one Synchronize: each container's pod of `handler`."""
    pods = [pb.PodSandbox(id=c.pod_sandbox_id, name="p", namespace="default", runtime_handler=handler)
            for c in containers]
    rt.call("Synchronize", pb.SynchronizeRequest(pods=pods, containers=list(containers)), pb.SynchronizeResponse)


def test_an_answer_the_runtime_did_not_apply_is_logged_late_never_injected(connected, node):
    """The runtime made the container without the adjustment (the answer came after its
    deadline): the line says "late", names no GPU, and says why."""
    rt, _t, _said = connected
    _conf, log = node
    req = create_request()
    adj = rt.call("CreateContainer", req, pb.CreateContainerResponse).adjust
    assert adj.linux.devices
    rt.created(req, None)
    (rec,) = records(log, 1)
    assert (rec["decision"], rec["front"], rec["container_id"], rec["pod_name"]) == ("late", "nri", "c1", "p")
    assert "after NRI's request timeout" in rec["reason"] and rec["planned_devices"] == 8
    assert not {"vendors", "devices", "nodes", "env"} & set(rec), rec


def test_an_answer_confirmed_after_a_reconnect_by_the_runtimes_list(tmp_path, node):
    """The connection died between the answer and the runtime's word: the next Synchronize's
    list is the word (the container there without gpuhook's devices: late); one the runtime
    no longer lists is "unconfirmed"."""
    _conf, log = node
    path = str(tmp_path / "nri.sock")
    plugin = nri.Plugin(path, log=lambda m: None)
    srv = listening(path)
    threading.Thread(target=plugin.run_forever, daemon=True).start()
    rt = accept(srv)
    sync(rt)
    late, gone = create_request(), create_request()
    gone.container.id = "c2"
    for r in (late, gone):
        assert rt.call("CreateContainer", r, pb.CreateContainerResponse).adjust.linux.devices
    rt.s.close()  # NRI closed the plugin for its timeout
    rt = accept(srv)
    assert records(log) == []  # no word yet: no line
    sync(rt, late.container)
    recs = records(log, 2)
    assert sorted((r["container_id"], r["decision"]) for r in recs) == [("c1", "late"), ("c2", "unconfirmed")], recs
    assert "no longer lists it" in [r for r in recs if r["container_id"] == "c2"][0]["reason"]
    rt.s.close()
    srv.close()


def test_a_gpu_optional_container_created_while_the_plugin_was_away_gets_a_missed_line(connected, node):
    rt, _t, _said = connected
    _conf, log = node
    away = create_request().container  # no adjustment of gpuhook's: no device
    served_req = create_request()
    served_req.container.id = "c2"
    served = served_req.container  # had its GPUs: its line waits for the runtime's word, this list
    served.linux.devices.extend(rt.call("CreateContainer", served_req, pb.CreateContainerResponse).adjust.linux.devices)
    cdi = create_request().container
    cdi.id = "c3"
    cdi.linux.devices.add(path="/dev/nvidia0", type="c", major=195, minor=0)  # a device plugin's GPU
    sync(rt, away, served, cdi)
    recs = records(log, 2)
    assert sorted((r["container_id"], r["decision"]) for r in recs) == [("c1", "missed"), ("c2", "injected")], recs
    (missed,) = [r for r in recs if r["decision"] == "missed"]
    assert (missed["front"], missed["pod_name"], missed["container_name"]) == ("nri", "p", "app")
    assert "not registered" in missed["reason"] and "duration_ms" not in missed
    sync(rt, away)  # said once
    other = create_request().container
    other.id = "c4"
    sync(rt, other, handler="runc")  # another handler's: nothing
    time.sleep(0.2)
    assert len(records(log)) == 2


def test_a_missed_container_a_previous_plugin_logged_gets_no_second_line(connected, node):
    import json

    rt, _t, _said = connected
    _conf, log = node
    log.write_text(json.dumps({"time": "t", "event": "create", "front": "nri", "container_id": "c1",
                               "decision": "late"}) + "\n")
    sync(rt, create_request().container)
    time.sleep(0.2)
    assert len(records(log)) == 1


def listening(path: str) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX)
    if os.path.exists(path):
        os.unlink(path)
    srv.bind(path)
    srv.listen(4)
    srv.settimeout(10)
    return srv


def accept(srv: socket.socket, configure: bool = True) -> Runtime:
    conn, _ = srv.accept()
    conn.settimeout(10)
    rt = Runtime(conn)
    rt.expect_registration()
    if configure:
        rt.call("Configure", pb.ConfigureRequest(runtime_name="containerd", runtime_version="v2.1.9"),
                pb.ConfigureResponse)
    return rt


def test_the_plugin_connects_again_at_once_after_a_synchronized_connection(tmp_path, node):
    """No fixed sleep: a synchronized connection that ends is followed by a connect at once,
    and a missing socket is tried again every POLL."""
    path = str(tmp_path / "nri.sock")
    said: list[str] = []
    plugin = nri.Plugin(path, log=said.append)
    threading.Thread(target=plugin.run_forever, daemon=True).start()
    time.sleep(0.3)  # no socket yet: it waits, polling
    srv = listening(path)
    t0 = time.monotonic()
    rt = accept(srv)
    assert time.monotonic() - t0 < 0.9
    sync(rt)
    rt.s.close()
    t0 = time.monotonic()
    rt = accept(srv)
    assert time.monotonic() - t0 < 0.9, said  # today's main: a fixed 1 s
    rt.s.close()
    srv.close()
    assert any("waiting for the runtime's socket" in s for s in said), said


def test_a_synchronize_that_never_completes_is_said_on_the_node_log_once(tmp_path, node, monkeypatch):
    """NRI closes a plugin whose Synchronize it cannot send (a container over its 4 MiB
    message limit): configured, then closed. The node log says so once (not per attempt),
    the plugin backs off, and says when it is synchronized again."""
    monkeypatch.setattr(nri, "BACKOFF_FIRST", 0.01)
    _conf, log = node
    path = str(tmp_path / "nri.sock")
    said: list[str] = []
    plugin = nri.Plugin(path, log=said.append)
    srv = listening(path)
    threading.Thread(target=plugin.run_forever, daemon=True).start()
    for _ in range(3):
        accept(srv).s.close()
    rt = accept(srv)
    sync(rt)
    recs = records(log, 2)
    assert [(r["event"], r["state"]) for r in recs] == [("nri", "sync-failed"), ("nri", "synchronized")], recs
    assert "4 MiB" in recs[0]["error"] and recs[1]["failures"] == 3
    assert sum("before the runtime synchronized" in s for s in said) == 3, said
    rt.s.close()
    srv.close()


@pytest.mark.parametrize("what", ["request", "configure", "synchronize", "register-reply", "frame"])
def test_an_undecodable_message_is_one_line_and_a_new_connection_never_an_exit(tmp_path, node, what):
    path = str(tmp_path / "nri.sock")
    said: list[str] = []
    plugin = nri.Plugin(path, log=said.append)
    srv = listening(path)
    t = threading.Thread(target=plugin.run_forever, daemon=True)
    t.start()
    conn, _ = srv.accept()
    conn.settimeout(10)
    rt = Runtime(conn)
    if what == "register-reply":
        (msg,) = recv_messages(conn, rt.d, 1)
        conn.sendall(wire.encode(wire.RUNTIME_CONN, msg.stream, wire.RESPONSE, 0, b"\xff\xff\xff"))
    else:
        rt.expect_registration()
        if what == "request":
            conn.sendall(wire.encode(wire.PLUGIN_CONN, 1, wire.REQUEST, 1, b"\xff\xff\xff"))
        elif what == "frame":
            conn.sendall(wire.MUX_HEADER.pack(1, wire.MUX_MAX + 1))
        else:
            method = what.capitalize()
            req = tt.Request(service=nri.SERVICE, method=method, payload=b"\xff\xff\xff")
            conn.sendall(wire.encode(wire.PLUGIN_CONN, 1, wire.REQUEST, 1, req.SerializeToString()))
    rt = accept(srv)  # it came back, by itself
    sync(rt)
    assert t.is_alive()
    ended = [s for s in said if "ended" in s]
    assert len(ended) == 1 and "Traceback" not in "".join(said), said
    if what != "frame":
        assert "does not decode" in ended[0], ended
    rt.s.close()
    srv.close()


def test_a_state_change_that_does_not_decode_gets_an_empty_answer(connected):
    rt, t, said = connected
    req = tt.Request(service=nri.SERVICE, method="StateChange", payload=b"\xff\xff\xff")
    rt.s.sendall(wire.encode(wire.PLUGIN_CONN, rt.stream, wire.REQUEST, 1, req.SerializeToString()))
    (msg,) = recv_messages(rt.s, rt.d, 1)
    assert tt.Response.FromString(msg.payload).status.code == 0
    assert t.is_alive() and sum("does not decode" in s for s in said) == 1, said


def test_ready_is_told_to_systemd_once_synchronized(tmp_path, node, monkeypatch):
    path = str(tmp_path / "nri.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    srv = listening(path)
    threading.Thread(target=nri.Plugin(path, log=lambda m: None).run_forever, daemon=True).start()
    rt = accept(srv)
    notify.settimeout(0.3)
    with pytest.raises(TimeoutError):  # configured is not registered: NRI adds it once synchronized
        notify.recv(64)
    notify.settimeout(10)
    sync(rt)
    assert notify.recv(64) == b"READY=1"
    rt.s.close()
    srv.close()
    notify.close()


def test_checking_a_container_of_the_list_gives_out_no_gpu(connected, node):
    """The check of a listed container plans with no round-robin memory: a max-gpus pod's
    check leaves the node's record of what was given as it was (none here)."""
    from gpuhook.probe import nodestate

    rt, _t, _said = connected
    _conf, log = node
    away = create_request().container
    away.annotations["gpuhook.dev/max-gpus"] = "2"
    sync(rt, away)
    (rec,) = records(log, 1)
    assert rec["decision"] == "missed"
    assert not os.path.exists(os.path.join(os.environ["GPUHOOK_CACHE_DIR"], nodestate.STATE_FILE))
    rt.call("CreateContainer", create_request(), pb.CreateContainerResponse)  # a real create: remembered
    served = create_request()
    served.container.annotations["gpuhook.dev/max-gpus"] = "2"
    served.container.id = "c9"
    rt.create(served)
    assert os.path.exists(os.path.join(os.environ["GPUHOOK_CACHE_DIR"], nodestate.STATE_FILE))
