"""The runtime's resident server (gpuhook/runtime/server.py) through the installed front.

A real server (`gpuhook runtime-server` from the venv, on a cache dir of the test's own) and
the venv's gpuhook-runtime: a create on a fake 8-GPU host is edited by the server, with no
Python started by the front (GPUHOOK_PYTHON is a stand-in that leaves a mark), and the fake
runtime runs with the caller's argv. Without a server, with a stale one (another installed
version), one that answers nothing or garbage: the front starts Python itself. systemd's
socket activation (LISTEN_FDS) is served too, and the socket unit names the same socket."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FRONT, REPO, SERVER_SPEC, ServerNode, is_root, log_records, wrapper_path
from gpuhook import defaults
from gpuhook.runtime import exec as execenv, server

pytestmark = pytest.mark.skipif(wrapper_path() is None, reason="no installed gpuhook-runtime (make venv)")
SPEC = SERVER_SPEC


class Node(ServerNode):
    """ServerNode with the node config's fail_mode written out, stopped as systemd stops it."""

    def __init__(self, tmp_path, make_host, fail_mode: str = "open"):
        super().__init__(tmp_path, make_host, fail_mode)

    def start_server(self, argv=None, **popen) -> subprocess.Popen:
        return super().start_server(argv, stderr=subprocess.PIPE, text=True, **popen)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)


@pytest.fixture
def node(tmp_path, make_host):
    n = Node(tmp_path, make_host)
    yield n
    n.stop()


def test_a_create_through_the_server_starts_no_python(node):
    node.start_server()
    r = node.front("--root", str(node.tmp / "state"), "create", "--bundle", str(node.bundle), "c1")
    assert r.returncode == 0, r.stderr
    assert not node.mark.exists(), "the front started Python although the server answered"
    assert node.argv_file.read_text().splitlines() == [str(node.tmp / "runc"), "--root", str(node.tmp / "state"),
                                                       "create", "--bundle", str(node.bundle), "c1"]
    spec = json.loads((node.bundle / "config.json").read_text())
    nodes = {d["path"] for d in spec["linux"]["devices"]}
    assert {f"/dev/nvidia{i}" for i in range(8)} <= nodes
    assert "GPUHOOK_ACCELERATOR=nvidia" in spec["process"]["env"]
    (rec,) = log_records(node.log)
    assert rec["decision"] == "injected" and rec["container_id"] == "c1"
    # the server's own environment and directory are untouched by the request's
    assert node.proc.poll() is None


def test_a_relative_bundle_is_the_callers_directory(node):
    node.start_server()
    r = node.front("create", "--bundle", "bundle", "c2")
    assert r.returncode == 0 and not node.mark.exists(), r.stderr
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()


def test_no_server_means_python_starts_here(node):
    r = node.front("create", "--bundle", str(node.bundle), "c3")
    assert r.returncode == 0, r.stderr
    assert node.mark.exists()
    # a socket left behind with nobody listening: the same
    os.makedirs(node.cache, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(node.cache, server.SOCKET_NAME))
    s.close()
    r = node.front("create", "--bundle", str(node.bundle), "c3")
    assert r.returncode == 0 and node.mark.exists(), r.stderr


@pytest.mark.parametrize("answer", [b"", b"exec\0", b"exec\0\0", b"exit\0" + b"1", b"what\0", b"x" * 70000,
                                    None])
def test_a_server_that_answers_nothing_sure_means_python(node, answer):
    """None: the server closes without reading the request, of a 1.2 MB environment (the front
    must not die of SIGPIPE)."""
    os.makedirs(node.cache, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(node.cache, server.SOCKET_NAME))
    s.listen(1)
    env = node.env(**({f"BIG{i}": "x" * 100_000 for i in range(12)} if answer is None else {}))
    proc = subprocess.Popen([wrapper_path(), "create", "--bundle", str(node.bundle), "c4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    conn, _ = s.accept()
    conn.settimeout(5)
    if answer is None:
        conn.recv(10)
    else:
        while conn.recv(65536):
            pass
        conn.sendall(answer)
    conn.close()
    assert proc.wait(timeout=30) == 0
    assert node.mark.exists()
    s.close()


def listener(node) -> socket.socket:
    os.makedirs(node.cache, exist_ok=True)
    path = os.path.join(node.cache, server.SOCKET_NAME)
    if os.path.lexists(path):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    return s


def answered(node, answer: bytes) -> subprocess.CompletedProcess:
    """A create through the front, a listener in the server's place answering `answer`."""
    s = listener(node)
    if node.mark.exists():
        node.mark.unlink()
    proc = subprocess.Popen([wrapper_path(), "create", "--bundle", str(node.bundle), "c4"], env=node.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    conn, _ = s.accept()
    conn.settimeout(5)
    while conn.recv(65536):
        pass
    conn.sendall(answer)
    conn.close()
    s.close()
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


LOG_ABS = "/tmp/gpuhook-test-answer.log"
BAD_ANSWERS = {
    "exit-status-not-a-number": b"exit\0abc\0\0\0\0",
    "exit-status-not-a-number-wire-2": b"exit\0abc\0\0",
    "exit-status-empty": b"exit\0\0\0\0\0",
    "exit-status-negative": b"exit\0-1\0\0\0\0",
    "exit-status-over-255": b"exit\x00256\0\0\0\0",
    "exit-status-with-space": b"exit\0 1\0\0\0\0",
    "exit-status-with-tail": b"exit\x001x\0\0\0\0",
    "exit-status-leading-zero": b"exit\x0007\0\0\0\0",
    "exit-fields-too-few": b"exit\x000\0\0",
    "exit-fields-too-many": b"exit\x000\0\0\0\0\0",
    "exec-no-argv": b"exec\0\0\0\0",
    "exec-argv-empty": b"exec\0\0\0\0\0",
    "exec-argv-not-a-path": b"exec\0\0\0\0true\0",
    "exec-text-too-long": b"exec\0" + b"x" * (64 * 1024 + 1) + b"\0\0\0/bin/true\0",
    "log-file-relative": b"exec\0\0gpuhook.log\0line\n\0/bin/true\0",
    "log-line-without-newline": f"exec\0\0{LOG_ABS}\0line\0/bin/true\0".encode(),
    "log-line-two-lines": f"exec\0\0{LOG_ABS}\0a\nb\n\0/bin/true\0".encode(),
    "log-line-without-file": b"exec\0\0\0line\n\0/bin/true\0",
    "log-file-without-line": f"exec\0\0{LOG_ABS}\0\0/bin/true\0".encode(),
    "log-line-too-long": f"exec\0\0{LOG_ABS}\0".encode() + b"x" * (256 * 1024) + b"\n\0/bin/true\0",
    "fields-too-many": b"exec\0\0\0\0/bin/true\0" + b"a\0" * 5000,
    "not-whole": b"exit\x000\0\0\0",
    "unknown-kind": b"done\x000\0\0\0\0",
    "fallback-with-more": b"fallback\0x\0",
}


@pytest.mark.parametrize("answer", list(BAD_ANSWERS.values()), ids=list(BAD_ANSWERS))
def test_a_malformed_answer_means_python(node, answer):
    """Every field of an answer is checked: a status that is not 0..255 written plainly, a
    field too many or too few, no argv, a runtime that is not a path, text or a log line too
    long, a log file that is not absolute, a log line that is not one line: no answer, and the
    front starts Python (before, `exit\0abc` made the create return 0, runc never run)."""
    if os.path.exists(LOG_ABS):
        os.unlink(LOG_ABS)
    r = answered(node, answer)
    assert r.returncode == 0 and node.mark.exists(), r.stderr
    assert not node.argv_file.exists() and not os.path.exists(LOG_ABS)


def test_a_well_formed_answer_is_acted_on(node, tmp_path):
    """The shapes those are near: an exit status with its text and log line, an exec whose log
    line the front writes before it runs the runtime."""
    log = tmp_path / "answer.log"
    r = answered(node, b"exit\x003\0oops\n\0" + f"{log}\0{{\"a\":1}}\n\0".encode())
    assert (r.returncode, r.stderr, node.mark.exists()) == (3, "oops\n", False)
    assert log.read_text() == '{"a":1}\n'
    r = answered(node, f"exec\0said\n\0{log}\0{{\"b\":2}}\n\0{node.tmp / 'runc'}\0x\0y\0".encode())
    assert (r.returncode, r.stderr, node.mark.exists()) == (0, "said\n", False)
    assert log.read_text().splitlines() == ['{"a":1}', '{"b":2}']
    assert node.argv_file.read_text().splitlines() == [str(node.tmp / "runc"), "x", "y"]


def installation(tmp_path) -> str:
    """A copy of this gpuhook laid out as an installation: <root>/bin/gpuhook-runtime (the
    front) and <root>/lib/python3.X/site-packages/gpuhook (the package it serves)."""
    import shutil

    root = tmp_path / "install"
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    shutil.copytree(os.path.join(REPO, "gpuhook"), site / "gpuhook", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "bin").mkdir()
    shutil.copy2(FRONT, root / "bin" / "gpuhook-runtime")
    return str(root)


def test_another_installations_front_is_not_served(node, tmp_path):
    """A front of another installation sharing the cache dir (here: the source tree's) gets
    "fallback" and starts Python; the server stays for its own."""
    node.start_server()
    r = node.front("create", "--bundle", str(node.bundle), "c5", binary=FRONT)
    assert r.returncode == 0 and node.mark.exists(), r.stderr
    assert node.proc.poll() is None
    r = node.front("create", "--bundle", str(node.bundle), "c5")
    assert r.returncode == 0 and not node.mark.exists(), r.stderr


def test_an_upgraded_installation_makes_its_server_go(node, tmp_path):
    """The installation's front replaced under the server (an upgrade in place): its requests
    are not served, and the server exits (systemd starts the new one on the next connection)."""
    import shutil

    root = installation(tmp_path)
    site = next((Path(root) / "lib").glob("python3*/site-packages"))
    launch = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuhook.cli import main; sys.exit(main())"
    node.start_server([sys.executable, "-I", "-c", launch, str(site), "runtime-server"])
    front = os.path.join(root, "bin", "gpuhook-runtime")
    r = node.front("create", "--bundle", str(node.bundle), "c5", binary=front)
    assert r.returncode == 0 and not node.mark.exists(), r.stderr  # its own front: served
    shutil.copy2(FRONT, front + ".new")
    os.rename(front + ".new", front)  # a new file at the same path
    (node.bundle / "config.json").write_text(json.dumps(SPEC))
    r = node.front("create", "--bundle", str(node.bundle), "c5", binary=front)
    assert r.returncode == 0 and node.mark.exists(), r.stderr
    assert node.proc.wait(timeout=10) == 0
    assert "another gpuhook version" in node.proc.stderr.read()


@pytest.mark.skipif(not is_root(), reason="needs root (unshare)")
def test_another_mount_namespace_is_not_served(node):
    """A caller in another mount namespace (its paths may be other files): Python starts there."""
    node.start_server()
    if node.mark.exists():
        node.mark.unlink()
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", wrapper_path(), "create", "--bundle",
                        str(node.bundle), "c10"], env=node.env(), cwd=node.tmp, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and node.mark.exists(), r.stderr


def ask(node, fields: list[str]) -> bytes:
    """One request to the node's server, as the front sends it; its whole answer."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.path.join(node.cache, server.SOCKET_NAME))
    s.sendall(b"".join(os.fsencode(f) + b"\0" for f in fields))
    s.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := s.recv(65536):
        reply += chunk
    s.close()
    return reply


def request(node, deadline_ns: int, *argv: str, umask: int = 0o22, cwd: str | None = None, **env: str) -> list[str]:
    """A request's fields as the front sends them (by name, in server.REQUEST_FIELDS' order),
    with the node's environment."""
    entries = [f"{k}={v}" for k, v in {"GPUHOOK_CONFIG": str(node.config), "GPUHOOK_CACHE_DIR": node.cache,
                                        **env}.items()]
    named = {"magic": server.MAGIC, "umask": str(umask), "deadline_ns": str(deadline_ns),
             "cwd": cwd or str(node.tmp), "env": entries, "argv": list(argv)}
    fields: list[str] = []
    for name in server.REQUEST_FIELDS:
        value = named[name]
        fields += [str(len(value)), *value] if name in server.REQUEST_LISTS else [value]
    return fields


def answer_of(reply: bytes) -> dict:
    """A reply's fields by name (server.REPLIES: its kind's, the rest a list), its kind as "kind"."""
    kind, *rest = reply.split(b"\0")[:-1]
    fields: dict = {"kind": kind}
    for i, name in enumerate(server.REPLIES[kind.decode()]):
        fields[name] = rest[i:] if name == server.REPLY_REST else rest[i]
    return fields


def test_a_request_past_its_deadline_writes_nothing(node, monkeypatch):
    """A request the front stopped waiting for (it has started Python): the server answers
    "fallback" and writes nothing, config.json, log or exec record (handle(), in this process:
    only the front itself is served through the socket)."""
    for name, value in node.env().items():
        monkeypatch.setenv(name, value)
    own = server.Installation()
    here = os.getcwd()
    argv = ("--root", str(node.tmp / "state"), "create", "--bundle", str(node.bundle), "c11")
    late = server.parse_request(server._reply(*request(node, time.monotonic_ns() - 1, *argv)))
    assert server.handle(late, own) == b"fallback\0"
    assert json.loads((node.bundle / "config.json").read_text()) == SPEC
    assert log_records(node.log) == [] and not os.path.exists(os.path.join(node.cache, "exec"))
    # the same request in time is served; its log line is in the answer (the front writes it)
    req = server.parse_request(server._reply(*request(node, time.monotonic_ns() + 10**10, *argv)))
    reply = answer_of(server.handle(req, own))
    assert reply["kind"] == b"exec" and reply["log_file"] == node.log.encode()
    assert b'"decision":"injected"' in reply["log_line"]
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()
    assert log_records(node.log) == []
    assert os.getcwd() == here and os.environ["GPUHOOK_CONFIG"] == str(node.config)


def test_fail_closed_exits_as_python_would(tmp_path, make_host):
    n = Node(tmp_path, make_host, fail_mode="closed")
    (n.bundle / "config.json").write_text("{not json")
    try:
        n.start_server()
        r = n.front("create", "--bundle", str(n.bundle), "c6")
        assert r.returncode == 1 and not n.mark.exists()
        assert r.stderr.count("\n") == 1 and "fail_mode is closed" in r.stderr
        assert not n.argv_file.exists()
    finally:
        n.stop()


def test_exec_through_the_server_adds_the_recorded_env(node):
    node.start_server()
    state = node.tmp / "state"
    assert node.front("--root", str(state), "create", "--bundle", str(node.bundle), "c7").returncode == 0
    (state / "c7").mkdir(parents=True)  # the runtime's state, as runc writes it: the container exists
    (state / "c7" / "state.json").write_text(json.dumps({"created": "2026-12-01T18:28:07.710911314Z",
                                                         "config": {"labels": [f"bundle={node.bundle}"]}}))
    process = node.tmp / "process.json"
    process.write_text(json.dumps({"args": ["env"], "env": ["PATH=/bin"], "cwd": "/"}))
    process.chmod(0o600)
    r = node.front("--root", str(state), "exec", "--process", str(process), "c7")
    assert r.returncode == 0 and not node.mark.exists(), r.stderr
    argv = node.argv_file.read_text().splitlines()
    assert argv[1:4] == ["--root", str(state), "exec"] and argv[-1] == "c7"
    used = argv[argv.index("--process") + 1]
    assert "GPUHOOK_ACCELERATOR=nvidia" in json.loads(open(used).read())["env"]


def test_socket_activation(node):
    """systemd's socket (fd 3, LISTEN_PID, LISTEN_FDS) is the one served."""
    os.makedirs(node.cache, mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(node.cache, server.SOCKET_NAME))
    s.listen(16)
    fd = s.fileno()
    launch = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()), "
              "LISTEN_FDS='1'); os.execv(sys.executable, [sys.executable, '-m', 'gpuhook', 'runtime-server'])")
    node.start_server([sys.executable, "-c", launch, str(fd)], pass_fds=(fd,))
    s.close()
    r = node.front("create", "--bundle", str(node.bundle), "c8")
    assert r.returncode == 0 and not node.mark.exists(), r.stderr
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()


def test_the_units_name_the_servers_socket():
    """systemd's socket unit listens where the server and the front (its generated header) look."""
    from gpuhook.install import units

    assert re.findall(r"^ListenStream=(.+)$", units.SOCKET_TEXT, re.M) == [f"{defaults.CACHE_DIR}/{server.SOCKET_NAME}"]
    assert re.search(rf"^ExecStart={defaults.INSTALL_PREFIX}/bin/gpuhook runtime-server$", units.SERVICE_TEXT, re.M)
    assert re.findall(r"^UMask=(.+)$", units.SERVICE_TEXT, re.M) == ["0022"]  # belt and braces


HEAD = b"gpuhook-runtime 3\0" + b"18\0" + b"99\0"


@pytest.mark.parametrize("data", [b"", b"gpuhook-runtime 3\0", b"gpuhook-runtime 2\0" + HEAD[18:] + b"/\x000\x000\0",
                                  b"other\0" + HEAD[18:] + b"/\x000\x000\0",
                                  HEAD + b"rel\x000\x000\0", HEAD + b"/\x002\0A=1\x000\0", HEAD + b"/\x00x\x000\0",
                                  HEAD + b"/\x00-1\x000\0",
                                  HEAD.replace(b"18", b"x") + b"/\x000\x000\0",
                                  HEAD.replace(b"18", b"4096") + b"/\x000\x000\0",
                                  HEAD.replace(b"99", b"soon") + b"/\x000\x000\0",
                                  HEAD + b"/\x000\x001\0", HEAD + b"/\x000\x000"])
def test_bad_requests_are_refused(data):
    assert server.parse_request(data) is None


def test_a_request_parses():
    req = server.parse_request(HEAD + b"/w\x002\0A=1\0A=2\x002\0create\0x\0")
    assert (req.umask, req.deadline_ns, req.cwd, req.env, req.argv) == (18, 99, "/w", {"A": "1"}, ["create", "x"])


def test_the_bundle_served(tmp_path, make_host):
    """The host bundle's front and its server agree that they are one version."""
    if not is_root():
        pytest.skip("needs root (mknod)")
    from gpuhook.install import build

    out = str(tmp_path / "opt")
    build.build(out)
    n = Node(tmp_path, make_host)
    try:
        n.start_server([os.path.join(out, "bin", "gpuhook"), "runtime-server"])
        r = n.front("create", "--bundle", str(n.bundle), "c9", binary=os.path.join(out, "bin", "gpuhook-runtime"))
        assert r.returncode == 0 and not n.mark.exists(), r.stderr
        assert "GPUHOOK_ACCELERATOR=nvidia" in (n.bundle / "config.json").read_text()
    finally:
        n.stop()


def test_the_deadlines_are_one_story():
    """The front waits SERVER_TIMEOUT_S for all of the exchange; the server stops MARGIN_NS
    before that, so that what it writes is what the front then uses."""
    timeout = server.FRONT_TIMEOUT_S  # the front's (its generated header)
    assert 0 < server.MARGIN_NS < timeout * 10**9 and server.REQUEST_TIMEOUT < timeout


def test_a_file_in_the_sockets_place_is_one_clear_line(tmp_path):
    """Something not a socket at <cache dir>/runtime.sock: kept, and the server says why."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / server.SOCKET_NAME).write_text("not a socket")
    r = subprocess.run([sys.executable, "-m", "gpuhook", "runtime-server"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "GPUHOOK_CACHE_DIR": str(cache)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a socket" in r.stderr, r.stderr
    assert (cache / server.SOCKET_NAME).read_text() == "not a socket" and os.listdir(cache) == [server.SOCKET_NAME]


# -- one request, one call: nothing of the server's process changes (issue 23) --------------

class Caller:
    """A caller of its own: a directory with its bundle and its own runtime at bin/rt (found
    through the relative PATH entry "bin", so only in this directory), and its environment."""

    def __init__(self, node, name: str, **env: str):
        self.dir = node.tmp / name
        (self.dir / "bundle").mkdir(parents=True)
        (self.dir / "bin").mkdir()
        rt = self.dir / "bin" / "rt"
        rt.write_text("#!/bin/sh\nexit 0\n")
        rt.chmod(0o755)
        self.runtime = str(rt)
        self.env = {"PATH": "bin", "PWD": str(self.dir), **env}
        self.reset()

    def reset(self) -> None:
        (self.dir / "bundle" / "config.json").write_text(json.dumps(SPEC))

    def request(self, node, *argv: str, umask: int = 0o22):
        env = {"GPUHOOK_CONFIG": os.environ["GPUHOOK_CONFIG"], "GPUHOOK_CACHE_DIR": node.cache, **self.env}
        fields = request(node, time.monotonic_ns() + 10**10, *argv, umask=umask, cwd=str(self.dir), **env)
        return server.parse_request(server._reply(*fields))


@pytest.fixture
def callers(node, monkeypatch):
    """Two callers with their own directory, PATH, PWD and GPUHOOK_STAGES (the first only), and
    a node config whose runtime is a name each finds on its own PATH."""
    config = node.tmp / "by-name.toml"
    config.write_text(f'runtime = "rt"\nhost_root = "{node.host}"\nlog_file = "{node.log}"\n')
    monkeypatch.setenv("GPUHOOK_CONFIG", str(config))
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", node.cache)
    monkeypatch.delenv("GPUHOOK_STAGES", raising=False)
    return Caller(node, "a", GPUHOOK_STAGES="1"), Caller(node, "b")


@contextlib.contextmanager
def untouchable():
    """The process-wide state a request must not change, made to fail the test when it does
    (within the block only: pytest itself sets the environment between a test's phases): the
    environment, the current directory, the umask, sys.stderr (the sentinel yielded)."""
    def forbidden(name):
        def call(*a, **k):
            raise AssertionError(f"a request called os.{name}{a}")
        return call

    saved = {name: getattr(os, name) for name in ("chdir", "fchdir", "umask", "putenv", "unsetenv")}
    saved_stderr, sys.stderr = sys.stderr, io.StringIO()
    for name in saved:
        setattr(os, name, forbidden(name))
    try:
        yield sys.stderr
    finally:
        for name, real in saved.items():
            setattr(os, name, real)
        sys.stderr = saved_stderr


def served(node, caller: Caller, cid: str) -> tuple[dict, dict]:
    """A create of the caller's relative bundle, relative --root, answered by handle(): the
    answer's fields and its log line."""
    reply = server.handle(caller.request(node, "--root", "state", "create", "--bundle", "bundle", cid),
                          server.Installation())
    fields = answer_of(reply)
    assert fields["kind"] == b"exec" and fields["log_file"] == node.log.encode(), reply
    return fields, json.loads(fields["log_line"])


def test_each_request_is_served_as_its_own_call(node, callers):
    """Two callers back to back, then at once (threads): each gets its own directory (its
    relative bundle, --root and PATH entry read there), its own PATH and GPUHOOK_STAGES; and
    the process's environment, directory, umask and stderr are never changed (each change
    fails the test, as the server before issue 23 made each of them per request)."""
    env_before, cwd_before = dict(os.environ), os.getcwd()
    a, b = callers
    with untouchable() as stderr:
        served_apart_and_at_once(node, a, b)
        assert sys.stderr is stderr and stderr.getvalue() == ""
    assert (dict(os.environ), os.getcwd()) == (env_before, cwd_before)
    assert log_records(node.log) == []  # the answers carry them: the front writes them


def served_apart_and_at_once(node, a: Caller, b: Caller) -> None:
    import threading

    for rounds in range(3):
        for c in (a, b):
            c.reset()
        if rounds == 0:
            replies = [served(node, c, "c1") for c in (a, b)]
        else:
            replies = [None, None]
            start = threading.Barrier(2)

            def run(i, c):
                start.wait()
                replies[i] = served(node, c, "c1")
            threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((a, b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        for c, (reply, line) in zip((a, b), replies):
            assert reply["argv"] == [os.fsencode(p) for p in (c.runtime, "--root", "state", "create", "--bundle",
                                                              "bundle", "c1")]
            assert line["decision"] == "injected" and line["bundle"] == str(c.dir / "bundle")
            assert line["runtime_server"] is True
            assert "GPUHOOK_ACCELERATOR=nvidia" in (c.dir / "bundle" / "config.json").read_text()
            record = execenv.record_path(node.cache, str(c.dir / "state"), "c1", c.runtime)
            assert execenv.read_record(record), f"no exec record under {c.dir}/state"
        assert "stages_ms" in replies[0][1] and "stages_ms" not in replies[1][1]


def test_a_requests_umask_is_its_own(node, callers):
    """What the call creates for its caller (runc's --log, relative: in the caller's directory)
    has the caller's umask, and the server's own umask is not changed for it."""
    a, _ = callers
    a.env["PATH"] = "/nonexistent"
    req = a.request(node, "--log", "runc.log", "create", "--bundle", "bundle", "c2", umask=0o77)
    with untouchable():
        reply = answer_of(server.handle(req, server.Installation()))
    assert reply["kind"] == b"exit" and reply["status"] == b"127" and b"no real OCI runtime" in reply["said"], reply
    assert stat.S_IMODE(os.stat(a.dir / "runc.log").st_mode) == 0o600
    assert "no real OCI runtime" in (a.dir / "runc.log").read_text()


def test_the_server_process_is_unchanged_by_the_fronts_it_serves(node):
    """Through the socket: two fronts at once, from their own directories with their own umask
    and GPUHOOK_STAGES, each served with its relative bundle; the server's directory stays /
    and its umask its own (/proc)."""
    proc = node.start_server()
    status = f"/proc/{proc.pid}/status"

    def umask_of() -> str:
        return next(line.split()[1] for line in open(status) if line.startswith("Umask:"))

    before = umask_of()
    dirs = [node.tmp / "one", node.tmp / "two"]
    fronts = []
    for i, d in enumerate(dirs):
        (d / "bundle").mkdir(parents=True)
        (d / "bundle" / "config.json").write_text(json.dumps(SPEC))
        env = node.env(**({"GPUHOOK_STAGES": "1"} if i == 0 else {}))
        fronts.append(subprocess.Popen([wrapper_path(), "create", "--bundle", "bundle", f"u{i}"], env=env, cwd=d,
                                       umask=0o77 if i == 0 else 0o2, stderr=subprocess.PIPE, text=True))
    for f in fronts:
        assert f.wait(timeout=30) == 0, f.stderr.read()
    assert not node.mark.exists(), "the front started Python although the server answered"
    lines = {rec["container_id"]: rec for rec in log_records(node.log)}
    for i, d in enumerate(dirs):
        assert "GPUHOOK_ACCELERATOR=nvidia" in (d / "bundle" / "config.json").read_text()
        assert lines[f"u{i}"]["bundle"] == str(d / "bundle") and lines[f"u{i}"]["runtime_server"] is True
    assert "stages_ms" in lines["u0"] and "stages_ms" not in lines["u1"]
    assert os.readlink(f"/proc/{proc.pid}/cwd") == "/" and umask_of() == before


@pytest.mark.parametrize("name", ["GPUHOOK_CONFIG", "GPUHOOK_CACHE_DIR"])
def test_a_relative_own_env_is_not_served(node, callers, monkeypatch, name):
    """GPUHOOK_CONFIG or GPUHOOK_CACHE_DIR relative, the same string for the server and the
    request: another file in each one's directory, so "fallback" (the caller's own Python
    reads its own), and nothing is written."""
    a, _ = callers
    (node.tmp / "server-cwd").mkdir()
    monkeypatch.chdir(node.tmp / "server-cwd")  # where this server's relative setting would be read
    value = os.path.relpath(os.environ[name], a.dir)
    monkeypatch.setenv(name, value)
    req = a.request(node, "create", "--bundle", "bundle", "c3")
    req.env[name] = value
    assert server.handle(req, server.Installation()) == b"fallback\0"
    assert json.loads((a.dir / "bundle" / "config.json").read_text()) == SPEC


def test_a_caller_whose_directory_is_not_the_one_it_names_is_not_served(node):
    """The directory a request names is the front's claim (getcwd; "/" when its directory is
    gone): the server reads a relative path there only when it is the caller's directory as
    the kernel says (/proc/<pid>/cwd). A front in a removed directory with a relative
    --bundle: Python starts in the caller's own directory, and the file of that name under
    "/" is never edited."""
    if not is_root():
        pytest.skip("needs root (a directory under /)")
    node.start_server()
    name = f"gpuhook-test-bundle-{os.getpid()}-{time.monotonic_ns()}"
    decoy = Path("/") / name
    decoy.mkdir()
    try:
        (decoy / "config.json").write_text(json.dumps(SPEC))
        gone = node.tmp / "gone"
        gone.mkdir()
        r = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone),
                            wrapper_path(), "create", "--bundle", name, "c12"], env=node.env(),
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads((decoy / "config.json").read_text()) == SPEC, "the server edited a file under /"
        assert node.mark.exists(), "the server answered for a directory that was not the caller's"
    finally:
        (decoy / "config.json").unlink(missing_ok=True)
        decoy.rmdir()


def test_a_caller_in_another_root_directory_is_not_served():
    """A caller chroot'ed elsewhere (same namespaces, the same front bind-mounted in) names
    other files by the same absolute paths: "fallback", as for another mount namespace."""
    own = server.Installation()
    peer = server.Peer(own.front, own.mntns, own.userns, own.fsroot, server.identity("/"))
    assert server.refusal(peer, own) is None
    peer.root = server.identity("/proc")  # another directory as its root
    assert server.refusal(peer, own) == b"fallback\0"


class ReadEnv(dict):
    """An environment that remembers each name read of it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def test_the_served_calls_read_of_the_callers_environment_only_what_the_server_passes(node, callers):
    """The server passes CALLER_ENV of a request's environment and nothing else: a create (a
    relative --root: its $PWD) and an exec read no other name of the caller's environment, or
    a fresh interpreter and the server would see the caller otherwise."""
    from gpuhook.runtime import prepare
    from gpuhook.runtime.args import Call

    a, _ = callers
    seen: set[str] = set()
    for argv in (("--root", "state", "create", "--bundle", "bundle", "c20"),
                 ("--root", "state", "exec", "c20", "true"), ("exec", "--process", "p.json", "c20")):
        env = ReadEnv({**os.environ, **a.env})
        answer = prepare(list(argv), Call(env, str(a.dir)))
        assert answer.argv is not None and answer.argv[0] == a.runtime, (argv, answer.said)
        seen |= env.read
    assert {"PATH", "PWD"} <= seen and seen <= set(server.CALLER_ENV), seen - set(server.CALLER_ENV)


def test_a_servers_own_umask_is_not_on_the_callers_log(node, callers):
    """runc's --log that the call creates for its caller has the caller's umask only: a server
    under umask 077 gives the caller (umask 022) exactly the mode the caller's own fresh
    interpreter gives it, not 0600."""
    a, _ = callers
    a.env["PATH"] = "/nonexistent"
    fresh = subprocess.run([sys.executable, "-I", "-m", "gpuhook.runtime", "--log", "fresh.log", "create", "--bundle",
                            "bundle", "c2"], env={**os.environ, **a.env}, cwd=a.dir, umask=0o022,
                           capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 127 and "no real OCI runtime" in (a.dir / "fresh.log").read_text(), fresh.stderr
    req = a.request(node, "--log", "served.log", "create", "--bundle", "bundle", "c2", umask=0o022)
    own = os.umask(0o077)
    try:
        reply = server.handle(req, server.Installation()).split(b"\0")
    finally:
        os.umask(own)
    assert reply[:2] == [b"exit", b"127"] and "no real OCI runtime" in (a.dir / "served.log").read_text(), reply
    modes = {name: stat.S_IMODE(os.stat(a.dir / name).st_mode) for name in ("fresh.log", "served.log")}
    assert modes == {"fresh.log": 0o640, "served.log": 0o640}


def test_a_path_of_the_callers_own_process_is_not_served(node):
    """/proc/self/..., /dev/fd/N, /dev/stderr name the caller's own in its fresh interpreter and
    the server's own in the server (whose directory is /): a request naming one is Python's
    afresh. A create of --bundle /proc/self/cwd/bundle edits the caller's bundle."""
    node.start_server()
    r = node.front("create", "--bundle", "/proc/self/cwd/bundle", "c9", GPUHOOK_PYTHON=sys.executable)
    assert r.returncode == 0, r.stderr
    assert "GPUHOOK_ACCELERATOR=nvidia" in (node.bundle / "config.json").read_text()
    assert [rec.get("runtime_server", False) for rec in log_records(node.log)] == [False]


@pytest.mark.parametrize("argv, path", [(["--log", "/dev/stderr"], None), (["--log=/dev/fd/2"], None),
                                        (["--root", "//proc/thread-self/cwd/state"], None),
                                        (["--root", "../../../../../../../../proc/self/root/x"], None),
                                        ([], "/bin:/proc/self/cwd/bin")])
def test_each_way_of_naming_the_own_process_is_not_served(node, callers, argv, path):
    a, _ = callers
    if path:
        a.env["PATH"] = path
    req = a.request(node, *argv, "create", "--bundle", "bundle", "c4")
    assert server.handle(req, server.Installation()) == b"fallback\0"
    assert json.loads((a.dir / "bundle" / "config.json").read_text()) == SPEC
