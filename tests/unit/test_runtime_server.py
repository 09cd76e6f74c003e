"""The runtime's resident server (gpuhook/runtime/server.py) through the installed front.

A real server (`gpuhook runtime-server` from the venv, on a cache dir of the test's own) and
the venv's gpuhook-runtime: a create on a fake 8-GPU host is edited by the server, with no
Python started by the front (GPUHOOK_PYTHON is a stand-in that leaves a mark), and the fake
runtime runs with the caller's argv. Without a server, with a stale one (another installed
version), one that answers nothing or garbage: the front starts Python itself. systemd's
socket activation (LISTEN_FDS) is served too, and the socket unit names the same socket."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import FRONT, REPO, is_root, log_records, wrapper_path
from gpuhook import defaults
from gpuhook.runtime import server

pytestmark = pytest.mark.skipif(wrapper_path() is None, reason="no installed gpuhook-runtime (make venv)")
SPEC = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["true"], "env": ["PATH=/bin"]},
        "linux": {}}


class Node:
    """A cache dir, a fake host, a node config whose runtime records its argv, a bundle."""

    def __init__(self, tmp_path, make_host, fail_mode: str = "open"):
        self.tmp = tmp_path
        self.cache = str(tmp_path / "cache")
        self.host = make_host("nvidia", gpus=8)
        self.log = str(tmp_path / "gpuhook.log")
        self.argv_file = tmp_path / "runtime-argv"
        rt = tmp_path / "runc"
        rt.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {self.argv_file}\n')
        rt.chmod(0o755)
        self.config = tmp_path / "config.toml"
        self.config.write_text(f'runtime = "{rt}"\nhost_root = "{self.host}"\nlog_file = "{self.log}"\n'
                               f'fail_mode = "{fail_mode}"\n')
        self.mark = tmp_path / "python-ran"
        py = tmp_path / "fake-python"
        py.write_text(f'#!/bin/sh\necho "$@" > {self.mark}\n')
        py.chmod(0o755)
        self.fake_python = str(py)
        self.bundle = tmp_path / "bundle"
        self.bundle.mkdir()
        (self.bundle / "config.json").write_text(json.dumps(SPEC))
        self.proc: subprocess.Popen | None = None

    def env(self, **extra) -> dict:
        return {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(self.config), "GPUHOOK_CACHE_DIR": self.cache,
                "GPUHOOK_PYTHON": self.fake_python, **extra}

    def start_server(self, argv=None, **popen) -> subprocess.Popen:
        env = self.env()
        env.pop("GPUHOOK_PYTHON")
        self.proc = subprocess.Popen(argv or [sys.executable, "-m", "gpuhook", "runtime-server"], env=env,
                                     cwd=self.tmp, stderr=subprocess.PIPE, text=True, **popen)
        sock = os.path.join(self.cache, server.SOCKET_NAME)
        for _ in range(300):
            if os.path.exists(sock) or self.proc.poll() is not None:
                break
            time.sleep(0.02)
        assert self.proc.poll() is None, self.proc.stderr.read()
        time.sleep(0.2)
        return self.proc

    def front(self, *argv, binary=None) -> subprocess.CompletedProcess:
        if self.mark.exists():
            self.mark.unlink()
        return subprocess.run([binary or wrapper_path(), *argv], env=self.env(), cwd=self.tmp, capture_output=True,
                              text=True, timeout=30)

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


@pytest.mark.parametrize("answer", [b"", b"exec\0", b"exec\0\0", b"exit\0" + b"1", b"what\0", b"x" * 70000])
def test_a_server_that_answers_nothing_sure_means_python(node, answer):
    os.makedirs(node.cache, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(node.cache, server.SOCKET_NAME))
    s.listen(1)
    proc = subprocess.Popen([wrapper_path(), "create", "--bundle", str(node.bundle), "c4"], env=node.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    conn, _ = s.accept()
    conn.settimeout(5)
    while conn.recv(65536):
        pass
    conn.sendall(answer)
    conn.close()
    assert proc.wait(timeout=30) == 0
    assert node.mark.exists()
    s.close()


def test_a_stale_server_is_not_used_and_goes(node):
    """A front of another installed version (here: the source tree's) gets no answer from
    this server, which then exits: systemd starts the new version on the next connection."""
    node.start_server()
    r = node.front("create", "--bundle", str(node.bundle), "c5", binary=FRONT)
    assert r.returncode == 0, r.stderr
    assert node.mark.exists()
    assert node.proc.wait(timeout=10) == 0
    assert "another gpuhook version" in node.proc.stderr.read()


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
    (state / "c7").mkdir(parents=True)  # the runtime's state: the container exists
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


def test_the_socket_is_named_once():
    source = open(os.path.join(REPO, "gpuhook", "runtime", "gpuhook-runtime.c")).read()
    assert re.findall(r'^#define SOCKET_NAME "([^"]+)"', source, re.M) == [server.SOCKET_NAME]
    assert re.findall(r'^#define SERVER_MAGIC "([^"]+)"', source, re.M) == [server.MAGIC]
    from gpuhook.install import units

    assert re.findall(r"^ListenStream=(.+)$", units.SOCKET_TEXT, re.M) == [f"{defaults.CACHE_DIR}/{server.SOCKET_NAME}"]
    assert re.search(rf"^ExecStart={defaults.INSTALL_PREFIX}/bin/gpuhook runtime-server$", units.SERVICE_TEXT, re.M)


@pytest.mark.parametrize("data", [b"", b"gpuhook-runtime 1\0", b"other\0/\0/\x000\x000\0",
                                  b"gpuhook-runtime 1\0/b\0rel\x000\x000\0", b"gpuhook-runtime 1\0/b\0/\x002\0A=1\x000\0",
                                  b"gpuhook-runtime 1\0/b\0/\x00x\x000\0"])
def test_bad_requests_are_refused(data):
    assert server.parse_request(data) is None


def test_a_request_parses():
    req = server.parse_request(b"gpuhook-runtime 1\0/b\0/w\x002\0A=1\0A=2\x002\0create\0x\0")
    assert (req.here, req.cwd, req.env, req.argv) == ("/b", "/w", {"A": "1"}, ["create", "x"])


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
