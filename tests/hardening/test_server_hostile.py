"""The runtime server (gpuhook/runtime/server.py) against callers that lie, stall or die.

A real server on a cache dir of the test's own, the venv's front, a fake 8-GPU host. Who the
caller is, the server asks the kernel: a client that is not the front, or a front in another
mount or user namespace, is refused whatever its request says, and nothing that chooses the
files the server reads or writes is taken from the request. A slow client holds only its own
connection, for one deadline. A server killed while it writes leaves no temp file, and one
that dies before it answers leaves the create to be logged once, by the fallback Python.
Each fails on the code before these defences (SECURITY.md, "Checked by removal")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import SERVER_SPEC, ServerNode, is_root, log_records, requires, wrapper_path
from gpuhook.runtime import server

pytestmark = pytest.mark.skipif(wrapper_path() is None, reason="no installed gpuhook-runtime (make venv)")
SPEC = SERVER_SPEC
# the server, with a patch of the test's run first (argv[1])
LAUNCH = ("import sys; exec(sys.argv.pop(1)); from gpuhook.cli import main; sys.exit(main(['runtime-server']))")
# the fresh interpreter's create path, with a patch first
RUNTIME = "import sys; exec(sys.argv.pop(1)); from gpuhook.runtime import main; main()"
# a patch: stop (and say so in MARK) at the named os call on the bundle's files
PAUSE = """
import os, time
def _pause_at(name, test):
    real = getattr(os, name)
    def call(*a, **k):
        if test(*a):
            open({mark!r}, "w").close()
            time.sleep(120)
        return real(*a, **k)
    setattr(os, name, call)
"""


class Node(ServerNode):
    """ServerNode whose server runs a patch of the test's first (LAUNCH), paused or killed at will."""

    def __init__(self, tmp_path, make_host):
        super().__init__(tmp_path, make_host)
        self.paused = tmp_path / "paused"

    def start_server(self, patch: str = "") -> subprocess.Popen:  # type: ignore[override]
        return super().start_server([sys.executable, "-c", LAUNCH, patch], stderr=subprocess.DEVNULL)

    def create(self, cid: str, prefix=(), **env) -> subprocess.CompletedProcess:
        return self.front("create", "--bundle", str(self.bundle), cid, prefix=prefix, **env)

    def untouched(self) -> bool:
        return json.loads((self.bundle / "config.json").read_text()) == SPEC

    def pause_at(self, name: str, test: str) -> str:
        """A patch for start_server (or RUNTIME): stop at os.<name> when test(args) holds."""
        return PAUSE.format(mark=str(self.paused)) + f"_pause_at({name!r}, {test})\n"

    def wait_paused(self, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 20
        while not self.paused.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "it never reached the pause"
            time.sleep(0.01)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def node(tmp_path, make_host):
    n = Node(tmp_path, make_host)
    yield n
    n.stop()


def request(node: Node, *argv: str, **env: str) -> bytes:
    """A whole, well-formed request as the front sends it, with the node's environment."""
    entries = [f"{k}={v}" for k, v in {**node.env(), **env}.items()]
    named = {"magic": server.MAGIC, "umask": "18", "deadline_ns": str(time.monotonic_ns() + 10**10),
             "cwd": str(node.tmp), "env": entries, "argv": list(argv)}
    fields: list[str] = []
    for name in server.REQUEST_FIELDS:  # by name, in the wire's order
        value = named[name]
        fields += [str(len(value)), *value] if name in server.REQUEST_LISTS else [value]
    return b"".join(os.fsencode(f) + b"\0" for f in fields)


# -- who the caller is: the kernel's word, not the request's (issue 20, item 3) ----------------

CLIENT = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
reply = b""
try:
    s.sendall(open(sys.argv[2], "rb").read())
    s.shutdown(socket.SHUT_WR)
    while chunk := s.recv(65536):
        reply += chunk
except (BrokenPipeError, ConnectionResetError):  # refused before it read all: no answer, as good
    pass
sys.stdout.write(repr(reply))
"""


@pytest.mark.parametrize("where", ["here", "another-mount-namespace", "another-user-namespace"])
def test_a_client_that_is_not_the_front_is_refused_whatever_it_sends(node, where):
    """A root client sends a well-formed request with the server's own environment and a create
    of a real bundle: not the front (the kernel's /proc/<pid>/exe), so "fallback" and nothing
    written, in this mount namespace or another (the attack of a pod with a hostPath of the
    cache dir)."""
    if where != "here" and not is_root():
        pytest.skip("needs root (unshare)")
    node.start_server()
    data = node.tmp / "request"
    data.write_bytes(request(node, "create", "--bundle", str(node.bundle), "c1"))
    prefix = {"here": [], "another-mount-namespace": ["unshare", "--mount", "--propagation", "private"],
              "another-user-namespace": ["unshare", "--user", "--map-root-user"]}[where]
    r = subprocess.run([*prefix, sys.executable, "-c", CLIENT, os.path.join(node.cache, server.SOCKET_NAME),
                        str(data)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout in (repr(b"fallback\0"), repr(b"")), r.stdout
    assert node.untouched() and not os.path.exists(node.log), "the server acted on a caller that is not its front"
    assert node.proc.poll() is None


@requires(is_root() and bool(shutil.which("unshare")), "needs root and unshare")
@pytest.mark.parametrize("namespace", [["--mount", "--propagation", "private"], ["--user", "--map-root-user"]],
                         ids=["mount", "user"])
def test_the_front_itself_in_another_namespace_is_not_served(node, namespace):
    """The installation's own front, run in another mount or user namespace (its paths may be
    other files, its root another's): the server refuses it, and the front starts Python."""
    node.start_server()
    r = node.create("c2", prefix=["unshare", *namespace])
    assert r.returncode == 0, r.stderr
    assert node.mark.exists(), "the server served a front in another namespace"
    assert node.untouched() and not os.path.exists(node.log)
    r = node.create("c2")  # the same front here: served
    assert r.returncode == 0 and not node.mark.exists(), r.stderr


@pytest.mark.parametrize("name", ["GPUHOOK_CONFIG", "GPUHOOK_CACHE_DIR"])
def test_the_request_does_not_choose_what_the_server_reads_or_writes(node, name):
    """The front's environment names another node config (whose log_file is a file the caller
    chose) or another cache dir (a link to the server's, so that the front still reaches it):
    the server answers "fallback" (the fresh interpreter, as the caller's own process, honours
    them) and reads and writes nothing of them."""
    node.start_server()
    planted = node.tmp / "planted.log"
    other = node.tmp / "other.toml"
    other.write_text(node.config.read_text().replace(node.log, str(planted)))
    link = node.tmp / "cache-link"
    os.symlink(node.cache, link)
    r = node.create("c3", **{name: str(other) if name == "GPUHOOK_CONFIG" else str(link)})
    assert r.returncode == 0, r.stderr
    assert node.mark.exists(), f"the server served a request with its own {name}"
    assert not planted.exists() and not os.path.exists(node.log) and node.untouched()
    assert not (link / "exec").exists() and node.proc.poll() is None


# -- one slow client holds no other create (issue 20, item 4) ----------------------------------

def test_slow_clients_hold_no_create(node):
    """Six clients each send a byte every 0.3 s and never finish their request (on the code
    before, one held the server: each create waited the front's 3 s, then Python). Meanwhile a
    create through the front is served, and the slow ones are closed."""
    node.start_server()
    path = os.path.join(node.cache, server.SOCKET_NAME)
    closed = []
    stop = threading.Event()

    def trickle():
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        try:
            for b in server.MAGIC.encode() * 100:
                if stop.wait(0.3):
                    return
                s.send(bytes([b]))
        except OSError:  # closed by the server
            closed.append(True)
        finally:
            s.close()

    threads = [threading.Thread(target=trickle) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        r = node.create("c4")
        assert r.returncode == 0, r.stderr
        assert not node.mark.exists(), "a slow client held the server: the front started Python"
        assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()
        limit = time.monotonic() + 5 * server.REQUEST_TIMEOUT
        while len(closed) < 6 and time.monotonic() < limit:
            time.sleep(0.1)
        assert len(closed) == 6, "a trickling client kept its connection"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


def test_the_fronts_own_silent_connection_gets_one_deadline(node):
    """A connection the kernel says is the front's (a process that connected, sent part of a
    request and then became the front, which goes on with a create of its own): the server
    reads it beside the others, serves that create meanwhile, and closes the silent one once
    REQUEST_TIMEOUT has passed since its accept (not per read: it would wait for ever)."""
    proc = node.start_server()
    proc.send_signal(signal.SIGSTOP)  # both connections wait in the backlog, so that the
    try:  # server looks at the first only once its process is the front
        s = socket.socket(socket.AF_UNIX)
        pid = os.fork()
        if pid == 0:
            try:
                s.connect(os.path.join(node.cache, server.SOCKET_NAME))
                s.send(server.MAGIC.encode() + b"\0")
                os.execve(wrapper_path(), [wrapper_path(), "create", "--bundle", str(node.bundle), "c9"], node.env())
            finally:
                os._exit(127)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGCONT)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not node.mark.exists(), "the front's create was not served beside the silent connection"
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()
    s.settimeout(5 * server.REQUEST_TIMEOUT)
    try:
        assert s.recv(100) == b""  # closed by the server, unanswered
    except TimeoutError:
        pytest.fail("the server kept a silent connection open past its deadline")
    finally:
        s.close()


# -- a server killed while it writes (issue 24, item 3) ---------------------------------------

def in_bundle(node: Node) -> str:
    """A patch's test: an fd (or a path) of a file in the bundle."""
    b = str(node.bundle) + "/"
    return (f"lambda x, *a: (os.readlink(f'/proc/self/fd/{{x}}') if isinstance(x, int) else str(x))"
            f".startswith({b!r})")


def test_a_server_killed_while_it_writes_leaves_no_temp_file(node):
    """SIGKILL while config.json's new content is being written (its fsync): nothing but
    config.json in the bundle, the old one, and the front's fallback runs the create."""
    proc = node.start_server(node.pause_at("fsync", in_bundle(node)))
    front = subprocess.Popen([wrapper_path(), "create", "--bundle", str(node.bundle), "c5"], env=node.env(),
                             cwd=node.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node.wait_paused(proc)
    proc.kill()
    proc.wait(timeout=10)
    assert front.wait(timeout=30) == 0 and node.mark.exists()
    assert os.listdir(node.bundle) == ["config.json"], os.listdir(node.bundle)
    assert node.untouched()


def test_the_fresh_interpreter_killed_while_it_writes_leaves_no_temp_file(node):
    """The same rule on the other path: Python's create SIGKILLed in the same place."""
    patch = node.pause_at("fsync", in_bundle(node))
    proc = subprocess.Popen([sys.executable, "-c", RUNTIME, patch, "create", "--bundle", str(node.bundle), "c6"],
                            env=node.env(), cwd=node.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node.wait_paused(proc)
    proc.kill()
    proc.wait(timeout=10)
    assert os.listdir(node.bundle) == ["config.json"], os.listdir(node.bundle)
    assert node.untouched()


def test_a_writer_killed_before_its_rename_leaves_nothing_once_the_create_is_redone(node):
    """Killed after the new file got its name and before the rename over config.json (two
    calls apart): the next write of that file, the front's fallback to Python, takes the name
    over. The bundle then holds config.json alone, edited."""
    patch = node.pause_at("rename", f"lambda src, *a: str(src).startswith(('.config.json.gpuhook', "
                                    f"{str(node.bundle) + '/'!r}))")
    proc = subprocess.Popen([sys.executable, "-c", RUNTIME, patch, "create", "--bundle", str(node.bundle), "c7"],
                            env=node.env(), cwd=node.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node.wait_paused(proc)
    proc.kill()
    proc.wait(timeout=10)
    r = subprocess.run([sys.executable, "-m", "gpuhook.runtime", "create", "--bundle", str(node.bundle), "c7"],
                       env=node.env(), cwd=node.tmp, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert os.listdir(node.bundle) == ["config.json"], os.listdir(node.bundle)
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()


# -- one create, one log line (issue 24, item 4) ----------------------------------------------

# a patch: the server stops (6 s, and says so in MARK) when it sends an "exec" answer
STOP_AT_EXEC = """
import socket, time
_send, _sendall = socket.socket.send, socket.socket.sendall
def _stop_at_exec(real):
    def call(self, data, *a):
        if bytes(data[:5]) == b"exec\\0":
            open({mark!r}, "w").close()
            time.sleep(6)
        return real(self, data, *a)
    return call
socket.socket.send = _stop_at_exec(_send)
socket.socket.sendall = _stop_at_exec(_sendall)
"""


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGSTOP"])
def test_a_server_that_stops_before_it_answers_leaves_one_log_line(node, stop):
    """The server wrote config.json and stops before its answer is sent (killed; or stopped
    until the front gave up, then let go): the front's fallback, a real Python, logs the
    create, and that is its one line."""
    proc = node.start_server(STOP_AT_EXEC.format(mark=str(node.paused)))
    front = subprocess.Popen([wrapper_path(), "create", "--bundle", str(node.bundle), "c8"],
                             env=node.env(GPUHOOK_PYTHON=sys.executable), cwd=node.tmp, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    node.wait_paused(proc)
    proc.send_signal(getattr(signal, stop))
    assert front.wait(timeout=30) == 0, front.stderr.read()
    if stop == "SIGSTOP":
        proc.send_signal(signal.SIGCONT)
        time.sleep(7)  # its pause ends; it sends to a front long gone
    lines = [rec for rec in log_records(node.log) if rec.get("container_id") == "c8"]
    assert len(lines) == 1, lines
    assert lines[0]["decision"] == "injected" and "runtime_server" not in lines[0]
