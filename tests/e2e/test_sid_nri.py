"""`gpuhook nri` against the real containerd 2.x of the Debian sid root (NRI on by default
there): the gpu-optional handler a plain runc handler (no BinaryName, no wrapper anywhere),
the plugin the only thing that gives its pods their GPUs.

The plugin runs on this machine from the checkout; containerd's NRI socket is put in the
test's tmp dir (visible at the same path inside the root), so that the plugin reaches the
containerd of a restart too (each start of the root's containerd has a mount namespace, and
a /run, of its own). Its ld-cache hook and the fake GPU host are under paths visible inside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import debroot
from conftest import REPO, assert_8_nvidia_gpus, gpuhook, is_root, nodes_of, requires
from gpuhook import hook
from containerd_harness import IMAGE_NAME, Containerd, leftovers
from sid_node import nri_config, operator_config

pytestmark = requires(is_root(), "needs root (debootstrap, mounts, pivot_root)")


class NRIPlugin:
    """`python -m gpuhook nri` from the checkout, with the test's node config."""

    def __init__(self, env: dict, socket_path: str, rootfs_template: str, log: str) -> None:
        self.argv = [sys.executable, "-m", "gpuhook", "nri", "--socket", socket_path,
                     "--rootfs-template", rootfs_template]
        self.env = {**env, "PYTHONPATH": REPO}
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.out = open(self.log, "ab")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, cwd=REPO)

    def said(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_registered(self, count: int = 1, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.said().count("configured by containerd") < count:
            assert self.proc and self.proc.poll() is None, self.said()
            assert time.monotonic() < deadline, "the plugin was not configured:\n" + self.said()
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def nri_node(nri_containerd):
    """(ctd, client, kubelet, rt, plugin, host): containerd 2.x on the NRI config, the plugin
    connected."""
    plugin = nri_containerd[4]
    plugin.start()
    plugin.wait_registered()
    return nri_containerd


@pytest.fixture
def nri_containerd(request, node, tmp_path,  # noqa: F811 (test_sid_runtimes' fixture)
                   busybox_image_tar, cri_stubs, make_host, runtime):
    """(ctd, client, kubelet, rt, plugin, host): containerd 2.x on the NRI config, the plugin
    not started. A test that asks for real_bundle also gets gpuhook's CDI specs in the root."""
    import cri_client
    from kubelet import Kubelet
    from sid_node import cdi_spec_for

    ctd = Containerd(str(tmp_path / "ctd"), cri=True, debian_root=node, visible=(str(tmp_path), REPO),
                     config_path=os.path.join(node, "etc/containerd/config.toml"))
    sock = str(tmp_path / "nri" / "nri.sock")
    os.makedirs(os.path.dirname(ctd.config_path), exist_ok=True)
    with open(ctd.config_path, "wb") as f:
        f.write(nri_config(node, ctd, sock))
    host = make_host("nvidia", mknod=True)
    if "real_bundle" in request.fixturenames:
        bundle = request.getfixturevalue("real_bundle")
        cdi_spec_for(node, host, bundle)
        ctd.visible += (bundle,)  # the spec's hook
    rt = runtime(host, ldconfig="/sbin/ldconfig")
    # the hook finds each container's rootfs in the bundle containerd wrote (the default)
    plugin = NRIPlugin({k: v for k, v in rt.env.items()}, sock, hook.ROOTFS_FROM_STATE, str(tmp_path / "plugin.out"))
    ctd.start(write_config=False)
    try:
        ctd.import_image(busybox_image_tar, "k8s.io")
        client = cri_client.CRIClient(ctd.address, cri_stubs)
        ctd.before_stop(client.close)
        ctd.before_stop(client.remove_all)
        client.wait_image(IMAGE_NAME)
        yield ctd, client, Kubelet(ctd, client, tmp_path), rt, plugin, host
    finally:
        plugin.kill()
        forced = ctd.cleanup()
        assert not leftovers(ctd), leftovers(ctd)
        assert not [f for f in forced if not f.startswith("shim ")], forced


def nri_records(rt, cid: str) -> list[dict]:
    return [r for r in rt.log_records() if r.get("container_id") == cid]


def test_a_gpu_optional_pod_gets_its_gpus_through_nri_and_a_runc_pod_nothing(nri_node):
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    assert client.version().runtime_version.lstrip("v").startswith("2."), client.version()
    pod_id, pod_config = k.run_pod("nri-gpu")
    status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert_8_nvidia_gpus(out)
    assert nodes_of(out)["/dev/nvidiactl"] == (195, 255)
    rec = nri_records(rt, status.id)
    assert [(r["decision"], r["front"]) for r in rec] == [("injected", "nri")], rec
    assert nri_records(rt, pod_id) == []  # NRI never creates the pause container through CreateContainer

    # ExecSync: NRI edited the spec containerd keeps, so exec sees the env with no record
    sleeper = client.create_container(pod_id, pod_config, "sleeper", IMAGE_NAME, command=["sleep", "600"],
                                      log_path="sleeper/0.log")
    client.start_container(sleeper)
    r = client.exec_sync(sleeper, ["sh", "-c", "env | grep ^GPUHOOK_ | sort"])
    assert r.exit_code == 0, r
    env = r.stdout.decode().split()
    assert "GPUHOOK_ACCELERATOR=nvidia" in env and any(e.startswith("GPUHOOK_DEVICES=nvidia:GPU-") for e in env), env

    # a plain runc pod on the same containerd is left alone
    plain_id, plain_config = k.run_pod("nri-plain", handler="runc")
    status, out = k.run_to_completion(plain_id, plain_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out) == {} and "accel=none" in out and "GPUHOOK_" not in out, out
    assert nri_records(rt, status.id) == []


def test_a_cpu_only_node_gives_nothing_through_nri(nri_node, make_host, tmp_path):
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    cpu = make_host("cpu", mknod=True)  # the node config now points at a host without GPUs
    text = open(rt.config).read().replace(_host, cpu)
    with open(rt.config, "w") as f:
        f.write(text)
    pod_id, pod_config = k.run_pod("nri-cpu")
    status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out) == {} and "accel=none" in out and "GPUHOOK_" not in out, out
    assert [(r["decision"], r["front"]) for r in nri_records(rt, status.id)] == [("no-gpu", "nri")]


def test_pods_start_without_the_plugin_and_it_serves_again_after_restarts(nri_node):
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    pod_id, pod_config = k.run_pod("nri-restarts")
    plugin.kill()
    status, out = k.run_to_completion(pod_id, pod_config, "down", SHOW)
    assert status.exit_code == 0, out  # the plugin down: the pod starts, without its GPUs
    assert nodes_of(out) == {} and "accel=none" in out, out

    plugin.start()  # restarted: it serves again
    plugin.wait_registered(2)
    status, out = k.run_to_completion(pod_id, pod_config, "again", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out)["/dev/nvidia7"] == (195, 7) and "accel=nvidia" in out, out

    pid = plugin.proc.pid if plugin.proc else None
    ctd.restart()  # containerd restarted: the same plugin process connects to the new one by itself
    client.wait_image(IMAGE_NAME)
    plugin.wait_registered(3, timeout=30)
    assert plugin.proc is not None and plugin.proc.poll() is None and plugin.proc.pid == pid
    assert "ended: closed by the runtime; connecting again" in plugin.said()
    # the pod's sandbox died with the old containerd's PID namespace (the harness's): a new pod
    pod_id, pod_config = k.run_pod("nri-after-restart")
    status, out = k.run_to_completion(pod_id, pod_config, "reconnected", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out)["/dev/nvidia7"] == (195, 7) and "accel=nvidia" in out, out
    assert [r["front"] for r in nri_records(rt, status.id)] == ["nri"]


# a second NRI plugin: it adds an env variable and an annotation of its own to every container
OTHER_PLUGIN = """
import sys
from gpuhook.nri import plugin

class Other(plugin.Plugin):
    def create_container(self, payload):
        pb = self.pb
        adj = pb.ContainerAdjustment(env=[pb.KeyValue(key="OTHER_PLUGIN", value="was-here")])
        return pb.CreateContainerResponse(adjust=adj)

Other(sys.argv[1], "other", "20", "").run_forever(retry=0.2)
"""


def test_a_cdi_pod_and_a_second_plugin_coexist_with_gpuhooks(nri_node, real_bundle, tmp_path):
    """A container that already has the GPUs from CDI (a device plugin's way) is not adjusted
    again and starts; another NRI plugin's adjustment lands beside gpuhook's."""
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    other = NRIPlugin(plugin.env, plugin.argv[plugin.argv.index("--socket") + 1], "", str(tmp_path / "other.out"))
    other.argv = [sys.executable, "-c", OTHER_PLUGIN, other.argv[other.argv.index("--socket") + 1]]
    other.start()
    try:
        other.wait_registered()
        pod_id, pod_config = k.run_pod("nri-cdi")
        cid = client.create_container(pod_id, pod_config, "app", IMAGE_NAME,
                                      command=["sh", "-c", SHOW + "; echo other=$OTHER_PLUGIN"],
                                      log_path="app/0.log", annotations={"cdi.k8s.io/gpuhook": "gpuhook.dev/gpu=all"})
        client.start_container(cid)
        status = client.wait_exited(cid, 30)
        out = k.read_log(status.log_path)
        assert status.exit_code == 0, out
        nodes = nodes_of(out)
        assert {p: nodes[p] for p in nodes if p[len("/dev/nvidia"):].isdigit()} == \
            {f"/dev/nvidia{m}": (195, m) for m in range(8)}, out
        assert "accel=nvidia" in out and "other=was-here" in out, out
        (rec,) = nri_records(rt, cid)
        assert rec["front"] == "nri" and not [n for n in rec.get("nodes", []) if n[len("/dev/nvidia"):].isdigit()], rec
        # a pod with no CDI: both plugins' adjustments
        status, out = k.run_to_completion(pod_id, pod_config, "both", SHOW + "; echo other=$OTHER_PLUGIN")
        assert status.exit_code == 0, out
        assert nodes_of(out)["/dev/nvidia7"] == (195, 7) and "accel=nvidia" in out and "other=was-here" in out, out
    finally:
        other.kill()


# -- the agent's NRI front: `gpuhook agent --front nri` runs the plugin, supervised -------------

def agent_process(plugin: NRIPlugin, tmp_path) -> NRIPlugin:
    """`gpuhook agent --front nri` on this machine (its / the node's: nothing installed, no
    files written), its plugin child given the test's socket and rootfs template."""
    sock = plugin.argv[plugin.argv.index("--socket") + 1]
    template = plugin.argv[plugin.argv.index("--rootfs-template") + 1]
    env = {k: v for k, v in plugin.env.items() if not k.startswith("KUBERNETES_")}
    agent = NRIPlugin(env, sock, template, str(tmp_path / "agent.out"))
    agent.argv = [sys.executable, "-m", "gpuhook", "agent", "--root", "/", "--front", "nri", "--nri-socket", sock,
                  "--nri-rootfs-template", template, "--no-install", "--no-udev", "--cdi-dir", "", "--nfd-dir", "",
                  "--ready-file", str(tmp_path / "ready"), "--runtime-log", "", "--log-format", "json"]
    return agent


def agent_records(agent: NRIPlugin) -> list[dict]:
    import json

    return [json.loads(line) for line in agent.said().splitlines() if line.startswith("{")]


def test_the_agent_with_front_nri_serves_and_restarts_its_killed_plugin(nri_containerd, tmp_path):
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_containerd
    agent = agent_process(plugin, tmp_path)
    agent.start()
    try:
        agent.wait_registered()  # the plugin child's "configured by containerd", as the agent's log line
        (first,) = [r["pid"] for r in agent_records(agent) if r["event"] == "nri.started"]
        assert first != agent.proc.pid
        pod_id, pod_config = k.run_pod("nri-agent")
        status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
        assert status.exit_code == 0, out
        assert_8_nvidia_gpus(out)
        assert [(r["decision"], r["front"]) for r in nri_records(rt, status.id)] == [("injected", "nri")]

        os.kill(first, signal.SIGKILL)  # the plugin child dies: the agent starts another, which serves
        agent.wait_registered(2)
        exited = [r for r in agent_records(agent) if r["event"] == "nri.exited"]
        assert [(r["pid"], r["code"]) for r in exited] == [(first, -signal.SIGKILL)], exited
        second = [r["pid"] for r in agent_records(agent) if r["event"] == "nri.started"][-1]
        assert second != first
        status, out = k.run_to_completion(pod_id, pod_config, "again", SHOW)
        assert status.exit_code == 0, out
        assert_8_nvidia_gpus(out)
        assert [r["front"] for r in nri_records(rt, status.id)] == ["nri"]

        agent.proc.send_signal(signal.SIGTERM)  # the agent stops: its plugin with it
        assert agent.proc.wait(timeout=15) == 0, agent.said()
        assert not os.path.exists(f"/proc/{second}"), agent.said()
    finally:
        agent.kill()


def test_install_front_nri_into_containerd_2_and_the_plugin_its_unit_runs(
        node, tmp_path, busybox_image_tar, cri_stubs, make_host, runtime, real_bundle):
    """`gpuhook install --front nri` into the operator's containerd 2.1 config (NRI's socket
    moved, the harness's state dir): the handler plain runc, NRI left on, gpuhook-nri.service
    naming that socket and state. The unit's command line runs in containerd's mount namespace
    (the node's /, as systemd would run it there), so the installed bundle's gpuhook serves:
    a gpu-optional pod gets its GPUs, a runc pod nothing; uninstall gives the config back."""
    import cri_client
    import tomlkit
    from kubelet import HANDLER, SHOW, Kubelet

    ctd = Containerd(str(tmp_path / "ctd"), cri=True, debian_root=node, visible=(str(tmp_path), REPO),
                     config_path=os.path.join(node, "etc/containerd/config.toml"))
    sock = str(tmp_path / "nri" / "nri.sock")
    doc = tomlkit.parse(operator_config(node, ctd).decode())
    doc["plugins"]["io.containerd.nri.v1.nri"]["socket_path"] = sock
    original = tomlkit.dumps(doc).encode()
    assert HANDLER not in doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    os.makedirs(os.path.dirname(ctd.config_path), exist_ok=True)
    os.makedirs(os.path.join(node, "etc/systemd/system"), exist_ok=True)
    with open(ctd.config_path, "wb") as f:
        f.write(original)
    r = gpuhook("install", "--host-root", node, "--runtime", "containerd", "--front", "nri", "--bundle-dir",
                real_bundle, check=True, timeout=300)
    assert "handler gpu-optional (plain runc, for gpuhook's NRI plugin) added (config version 3" in r.stdout, r.stdout
    assert "NRI turned on" not in r.stdout  # on by default in 2.x
    with open(os.path.join(node, "etc/systemd/system/gpuhook-nri.service")) as f:
        (exec_start,) = [ln.split("=", 1)[1].split() for ln in f if ln.startswith("ExecStart=")]
    assert exec_start == ["/opt/gpuhook/bin/gpuhook", "nri", "--socket", sock]  # the rootfs: from each bundle

    host = make_host("nvidia", mknod=True)
    rt = runtime(host, ldconfig="/sbin/ldconfig")
    plugin = NRIPlugin({"PATH": debroot.PATH, **{k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}},
                       sock, hook.ROOTFS_FROM_STATE, str(tmp_path / "plugin.out"))
    ctd.start(write_config=False)
    try:
        # the unit's command line, run where containerd runs (the node's /): the installed bundle's gpuhook
        plugin.argv = [*ctd.enter(), *exec_start]
        ctd.import_image(busybox_image_tar, "k8s.io")
        client = cri_client.CRIClient(ctd.address, cri_stubs)
        ctd.before_stop(client.close)
        ctd.before_stop(client.remove_all)
        client.wait_image(IMAGE_NAME)
        plugin.start()
        plugin.wait_registered()
        k = Kubelet(ctd, client, tmp_path)
        pod_id, pod_config = k.run_pod("installed-nri")
        status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
        assert status.exit_code == 0, out
        assert_8_nvidia_gpus(out)
        assert [(r["decision"], r["front"]) for r in nri_records(rt, status.id)] == [("injected", "nri")]
        plain_id, plain_config = k.run_pod("installed-plain", handler="runc")
        status, out = k.run_to_completion(plain_id, plain_config, "app", SHOW)
        assert status.exit_code == 0, out
        assert nodes_of(out) == {} and "accel=none" in out and "GPUHOOK_" not in out, out
        assert nri_records(rt, status.id) == []
        client.remove_all()
    finally:
        plugin.kill()
        forced = ctd.cleanup()
        assert not leftovers(ctd), leftovers(ctd)
        assert not [f for f in forced if not f.startswith("shim ")], forced
    gpuhook("uninstall", "--host-root", node, check=True, timeout=300)
    with open(ctd.config_path, "rb") as f:
        assert f.read() == original  # byte for byte
    assert not os.path.exists(os.path.join(node, "etc/systemd/system/gpuhook-nri.service"))


# -- what the operator is told is what the container got (issue 36) ----------------------------

def wait_records(rt, cid: str, timeout: float = 20) -> list[dict]:
    """The node log's lines of container `cid`, once there is one (the plugin writes a create's
    line once the runtime said what it made)."""
    deadline = time.monotonic() + timeout
    while not (recs := nri_records(rt, cid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return recs


def test_an_answer_after_the_runtimes_deadline_is_logged_late_never_injected(nri_node):
    """The plugin stalls past NRI's 2 s request timeout (SIGSTOP 3 s) during a create:
    containerd makes the container without the adjustment and closes the plugin. The stale
    request is answered all the same, but the line says "late" (the container as containerd
    lists it to the reconnected plugin), names no GPU, and the agent's Event claims none."""
    import threading

    from gpuhook.agent import events
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    pod_id, pod_config = k.run_pod("nri-stalled")
    made: dict = {}

    def create():
        made["id"] = client.create_container(pod_id, pod_config, "stalled", IMAGE_NAME, command=["sh", "-c", SHOW],
                                             log_path="stalled/0.log")

    plugin.proc.send_signal(signal.SIGSTOP)
    try:
        t = threading.Thread(target=create)
        t.start()
        time.sleep(3)
    finally:
        plugin.proc.send_signal(signal.SIGCONT)
    t.join(30)
    client.start_container(made["id"])
    status = client.wait_exited(made["id"], 30)
    out = k.read_log(status.log_path)
    assert status.exit_code == 0 and nodes_of(out) == {} and "accel=none" in out, out  # it got nothing
    plugin.wait_registered(2)
    (rec,) = wait_records(rt, made["id"])
    assert (rec["decision"], rec["front"]) == ("late", "nri"), rec  # today's main: "injected", 8 GPUs
    assert not {"vendors", "devices", "nodes"} & set(rec) and rec["planned_devices"] == 8, rec
    reason, type_, msg, label = events.event_for(rec)
    assert (reason, type_, label) == ("RanOnCPU", "Warning", "cpu") and "after NRI's request timeout" in msg
    # and it serves again: the next container gets its GPUs, confirmed by the runtime
    status, out = k.run_to_completion(pod_id, pod_config, "after", SHOW)
    assert_8_nvidia_gpus(out)
    assert [r["decision"] for r in wait_records(rt, status.id)] == ["injected"]


def test_a_pod_created_before_the_plugin_registers_after_a_containerd_restart_is_said(nri_node):
    """containerd restarts and a gpu-optional pod is created before the plugin is registered
    with the new one (held here with SIGSTOP, as a slow start would): the pod starts without
    GPUs, and once the plugin is registered its Synchronize list gives the container a
    "missed" line (today's main: no line at all). A runc pod's container gets none."""
    from gpuhook.agent import events
    from kubelet import SHOW

    ctd, client, k, rt, plugin, _host = nri_node
    plugin.proc.send_signal(signal.SIGSTOP)
    try:
        ctd.restart()
        client.wait_image(IMAGE_NAME)
        pod_id, pod_config = k.run_pod("nri-early")
        # running (NRI lists no exited container to a plugin: docs/runtime.md)
        early = client.create_container(pod_id, pod_config, "early", IMAGE_NAME, log_path="early/0.log",
                                        command=["sh", "-c", SHOW + "; echo shown; exec sleep 600"])
        client.start_container(early)
        plain_id, plain_config = k.run_pod("nri-early-plain", handler="runc")
        plain = client.create_container(plain_id, plain_config, "plain", IMAGE_NAME, command=["sleep", "600"],
                                        log_path="plain/0.log")
        client.start_container(plain)
    finally:
        plugin.proc.send_signal(signal.SIGCONT)
    log_path = client.container_status(early).status.log_path
    deadline = time.monotonic() + 20
    while "shown" not in (out := k.read_log(log_path)):
        assert time.monotonic() < deadline, out
        time.sleep(0.1)
    assert nodes_of(out) == {} and "accel=none" in out, out  # it got nothing
    plugin.wait_registered(2, timeout=30)
    (rec,) = wait_records(rt, early)  # today's main: no line
    assert (rec["decision"], rec["front"], rec["pod_name"], rec["container_name"]) == \
        ("missed", "nri", "nri-early", "early"), rec
    assert "not registered" in rec["reason"]
    assert events.event_for(rec)[:2] == ("RanOnCPU", "Warning")
    assert nri_records(rt, plain) == []
    # said once: a new plugin process (an upgrade) is given the same list, and finds the line there
    plugin.kill()
    plugin.start()
    plugin.wait_registered(3, timeout=30)
    deadline = time.monotonic() + 10
    while plugin.said().count("synchronized:") < 3:
        assert time.monotonic() < deadline, plugin.said()
        time.sleep(0.1)
    assert len(nri_records(rt, early)) == 1


def test_a_container_over_nris_message_limit_is_said_on_the_node_not_a_silent_loop(nri_containerd):
    """A runc pod's container with 4.6 MB of env (over NRI's 4 MiB message), created while the
    plugin is away: NRI cannot send it the Synchronize, so it never registers. The node log
    says so once (an "nri" line naming the 4 MiB limit), the plugin backs off instead of
    looping, and once the container is removed it registers and says so."""
    import json

    ctd, client, k, rt, plugin, _host = nri_containerd
    plain_id, plain_config = k.run_pod("nri-huge", handler="runc")
    huge = client.create_container(plain_id, plain_config, "huge", IMAGE_NAME, command=["true"],
                                   log_path="huge/0.log", env={f"BIG_{i}": "x" * 1000 for i in range(4600)})
    plugin.start()
    deadline = time.monotonic() + 30
    while not [r for r in rt.log_records() if r.get("event") == "nri"]:
        assert time.monotonic() < deadline, plugin.said()
        time.sleep(0.2)
    time.sleep(8)  # today's main: about 15 connections in this time, no node line
    said = plugin.said()
    lines = [r for r in rt.log_records() if r.get("event") == "nri"]
    assert [(r["state"], r["front"]) for r in lines] == [("sync-failed", "nri")], lines
    assert "4 MiB" in lines[0]["error"] and "configured by containerd" in said
    attempts = said.count("ended before the runtime synchronized the plugin")
    assert 2 <= attempts <= 8, said  # backoff: 0.1 s doubling to 5 s
    assert "failed to synchronize plugin with split messages" in ctd.log_tail(400)
    client.remove_container(huge)
    deadline = time.monotonic() + 30
    while [r["state"] for r in rt.log_records() if r.get("event") == "nri"] != ["sync-failed", "synchronized"]:
        assert time.monotonic() < deadline, json.dumps(rt.log_records()) + plugin.said()
        time.sleep(0.2)
