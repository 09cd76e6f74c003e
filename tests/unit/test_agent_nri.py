"""`gpuhook agent --front nri|auto|wrapper`: the NRI plugin in a supervised child process.

The child is the real `gpuhook nri`; the runtime's side is a listening Unix socket of the
test's (the plugin connects and sends RegisterPlugin: each accept is one plugin process that
reached the runtime). Which front is chosen comes from what is at the socket's path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, is_root, requires
from gpuhook import log
from gpuhook.agent import core as agent_mod, nri as nri_mod
from gpuhook.nri import plugin as nri_plugin
from gpuhook.probe import probe


class Runtime:
    """The runtime's end of the NRI socket: accepts, and counts who connected."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.peers: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.peers.append(conn)

    def close(self) -> None:
        # shut first: that ends the accept the thread waits in (a close alone leaves it waiting
        # on the closed socket for ever, a stray thread the rest of the suite runs beside)
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)
        assert not self.thread.is_alive(), "the runtime's accept did not end"
        self.sock.close()
        for p in self.peers:
            p.close()


def wait_for(cond, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.05)
    return value


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def agent(tmp_path, make_host, root: str, front: str, socket_path: str) -> agent_mod.Agent:
    cpu = make_host("cpu", mknod=False)  # what the probe reads: no device, so no /dev/char link anywhere
    opts = agent_mod.Options(root=root, spec_root=root, interval=60.0, cdi_dir=str(tmp_path / "cdi"),
                             nfd_dir=str(tmp_path / "nfd"), install=False, udev=False, ready_file="",
                             ldconfig="/sbin/ldconfig", front=front, nri_socket=socket_path)
    return agent_mod.Agent(opts, log=log.get(), kube=None, probe=lambda _root: probe(cpu))


class Running:
    def __init__(self, a: agent_mod.Agent) -> None:
        self.agent = a
        self.thread = threading.Thread(target=a.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop("test")
        self.thread.join(15)
        assert not self.thread.is_alive()


@pytest.fixture
def env(monkeypatch, tmp_path):
    """The child's node config: a log in tmp, the checkout on its path."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'log_file = "{tmp_path / "node.log"}"\n')
    monkeypatch.setenv("GPUHOOK_CONFIG", str(cfg))


@requires(is_root(), "the NRI socket must be root's")
def test_the_plugin_child_is_restarted_when_killed_and_gone_when_the_agent_stops(tmp_path, make_host, logs, env):
    sock = str(tmp_path / "nri" / "nri.sock")
    rt = Runtime(sock)
    a = agent(tmp_path, make_host, "/", "nri", sock)
    run = Running(a)
    try:
        wait_for(lambda: len(rt.peers) == 1)  # the plugin connected
        first = a.nri.proc.pid
        assert alive(first) and first != os.getpid()
        with open(f"/proc/{first}/cmdline", "rb") as f:
            assert b"\0nri\0" in f.read()  # its own process: `gpuhook nri`, not a fork of the agent
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: len(rt.peers) == 2)  # a new process connected
        second = a.nri.proc.pid
        assert second != first and alive(second) and not alive(first)
        (exited,) = [r for r in logs() if r["event"] == "nri.exited"]
        assert exited["pid"] == first and exited["code"] == -signal.SIGKILL and exited["restart_in_s"] == 1.0
        assert [r["restarts"] for r in logs() if r["event"] == "nri.started"] == [0, 1]
        assert a.nri.up and a.nri.starts == 2
    finally:
        run.stop()
        rt.close()
    assert not alive(second)  # the agent stopped: so did its plugin
    assert [r["event"] for r in logs()][-2:] == ["nri.stopped", "agent.stop"]


@requires(is_root(), "the NRI socket must be root's")
def test_the_metrics_show_the_front_and_the_plugins_restarts(tmp_path, make_host, env):
    import urllib.request

    sock = str(tmp_path / "nri.sock")
    rt = Runtime(sock)
    a = agent(tmp_path, make_host, "/", "nri", sock)
    a.opts.metrics_address = "127.0.0.1:0"
    run = Running(a)
    try:
        wait_for(lambda: len(rt.peers) == 1 and a.metrics is not None)
        os.kill(a.nri.proc.pid, signal.SIGKILL)
        wait_for(lambda: len(rt.peers) == 2)
        text = urllib.request.urlopen(f"http://{a.metrics.address}/metrics", timeout=10).read().decode()
    finally:
        run.stop()
        rt.close()
    assert 'gpuhook_front{front="nri"} 1.0' in text
    assert "gpuhook_nri_plugin_up 1.0" in text and "gpuhook_nri_plugin_restarts_total 1.0" in text


def test_auto_without_a_socket_runs_no_plugin(tmp_path, make_host, logs):
    a = agent(tmp_path, make_host, "/", "auto", str(tmp_path / "nri" / "nri.sock"))
    run = Running(a)
    wait_for(lambda: a.syncs)
    run.stop()
    assert a.front == "wrapper" and a.nri is None
    (front,) = [r for r in logs() if r["event"] == "front"]
    assert "level" not in front and front["front"] == "wrapper" and "no NRI socket" in front["reason"]
    assert not [r for r in logs() if r["event"].startswith("nri.")]


def plain_file(path: str) -> None:
    with open(path, "w") as f:
        f.write("not a socket\n")


def someone_elses_socket(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize("front", ["auto", "nri"])
@pytest.mark.parametrize("make, why", [(plain_file, "is not a socket"),
                                       (someone_elses_socket, "is owned by uid 65534, not root")])
def test_something_else_at_the_socket_path_runs_no_plugin_and_is_said_once(tmp_path, make_host, logs, front,
                                                                           make, why):
    """Read inside --root as if chrooted (/var/run a link to /run, as on a node)."""
    if make is someone_elses_socket and not is_root():
        pytest.skip("chown needs root")
    root = make_host("cpu", mknod=False)
    os.makedirs(os.path.join(root, "run", "nri"), exist_ok=True)
    if not os.path.lexists(os.path.join(root, "var", "run")):
        os.makedirs(os.path.join(root, "var"), exist_ok=True)
        os.symlink("../run", os.path.join(root, "var", "run"))
    make(os.path.join(root, "run", "nri", "nri.sock"))
    a = agent(tmp_path, make_host, root, front, "/var/run/nri/nri.sock")
    run = Running(a)
    wait_for(lambda: a.syncs)
    time.sleep(0.3)
    run.stop()
    assert a.nri is None or (a.nri.starts == 0 and a.nri.proc is None)
    said = [r for r in logs() if r.get("level") == "warning"]
    assert len(said) == 1 and said[0]["reason"] == f"/var/run/nri/nri.sock {why}", said
    assert said[0]["event"] == ("front" if front == "auto" else "nri.waiting")
    assert a.front == ("wrapper" if front == "auto" else "nri")


def test_the_supervisor_backs_off_and_stops_a_child_that_ignores_sigterm(logs):
    """A child that exits at once is restarted after 1 s, 2 s...; stop() kills one that
    ignores SIGTERM within the grace."""
    flap = nri_mod.Supervisor([sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"], log.get())
    flap.start()
    wait_for(lambda: flap.exits >= 2, 10)
    flap.stop()
    exited = [r for r in logs() if r["event"] == "nri.exited"]
    assert [r["restart_in_s"] for r in exited][:2] == [1.0, 2.0] and exited[0]["code"] == 3
    assert [r["message"] for r in logs() if r["event"] == "nri.said"][:1] == ["bye"]

    stubborn = nri_mod.Supervisor([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                   "signal.SIG_IGN); print('up', flush=True); time.sleep(60)"], log.get())
    stubborn.start()
    wait_for(lambda: any(r.get("message") == "up" for r in logs()), 10)
    pid = stubborn.proc.pid
    t0 = time.monotonic()
    stubborn.stop()
    assert time.monotonic() - t0 < nri_mod.STOP_GRACE + 2 and not alive(pid)


def test_the_child_dies_with_an_agent_killed_without_a_word(tmp_path):
    """PR_SET_PDEATHSIG: a SIGKILLed agent leaves no plugin behind."""
    code = ("import sys; from gpuhook import log; from gpuhook.agent import nri; "
            "s = nri.Supervisor([sys.executable, '-c', nri.BOOT, sys.argv[1], str(__import__('os').getpid()), "
            "'nri', '--socket', sys.argv[2]], log.get()); s.start(); "
            "import time\nwhile s.proc is None: time.sleep(0.05)\nprint(s.proc.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, REPO, str(tmp_path / "none.sock")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait()
        wait_for(lambda: not alive(child), 10)
    finally:
        parent.kill()
        parent.wait()


def test_gpuhook_nri_root_runs_the_nodes_bundle_chrooted(tmp_path):
    """`gpuhook nri --root DIR` (the agent's child in the DaemonSet): with no bundle there, one
    line and exit 1; the supervisor then logs the exit and starts it again."""
    r = subprocess.run([sys.executable, "-m", "gpuhook", "nri", "--root", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=30)
    if not is_root():
        assert r.returncode != 0 and "Traceback" not in r.stderr
        return
    assert r.returncode == 1 and r.stderr.strip() == \
        f"gpuhook nri: no gpuhook installed in {tmp_path}/opt/gpuhook (gpuhook install first)", r.stderr


@requires(is_root(), "chroot needs root")
def test_gpuhook_nri_root_execs_the_nodes_bundle_inside_the_root(tmp_path):
    """The node's bundle, started by its own loader inside the root (no shell of the node's):
    a loader of the test's (a busybox script) writes down how it was run."""
    import shutil

    from fakes.bundle import find_busybox

    busybox = find_busybox()
    if busybox is None:
        pytest.skip("needs busybox-static")
    root = tmp_path / "node"
    for d in ("bin", "opt/gpuhook/libexec", "opt/gpuhook/lib/python3.99/site-packages"):
        (root / d).mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    loader = root / "opt/gpuhook/libexec/ld.so"
    loader.write_text('#!/bin/busybox sh\nfor a; do echo "$a"; done > /ran\necho "in $(/bin/busybox pwd)" >> /ran\n')
    loader.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "gpuhook", "nri", "--root", str(root), "--socket", "/run/x/nri.sock"],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    ran = (root / "ran").read_text().splitlines()
    assert ran[:4] == ["--library-path", "/opt/gpuhook/lib", "/opt/gpuhook/libexec/python3", "-I"]
    assert ran[ran.index("-c") + 2:] == ["/opt/gpuhook/lib/python3.99/site-packages", "nri", "--socket",
                                         "/run/x/nri.sock", "--name", "gpuhook", "--index", "10",
                                         "--rootfs-template", nri_plugin.ROOTFS_TEMPLATE, "in /"]


@pytest.mark.parametrize("args, said", [
    (["--nri-socket", "nri.sock"], "gpuhook: --nri-socket nri.sock: not an absolute path"),
    (["--nri-rootfs-template", "/run/x/rootfs"],
     "gpuhook: --nri-rootfs-template must be @state, an absolute path with {id} in it, or ''"),
])
def test_bad_nri_options_are_one_line_and_exit_2(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-m", "gpuhook", "agent", "--root", str(tmp_path), "--front", "nri", *args],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == said, r.stderr
