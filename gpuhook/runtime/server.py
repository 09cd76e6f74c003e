"""The runtime's resident server: the create path without an interpreter's start per container.

A fresh interpreter costs ~7 ms before gpuhook runs a line, and its imports ~2 ms more, on
every GPU container's create. A node may instead keep one interpreter warm:
`gpuhook runtime-server`, started by systemd on its socket (systemd/gpuhook-runtime.socket)
or by hand. The front (gpuhook-runtime.c) connects to <cache dir>/runtime.sock for each
create, run or exec that needs Python; the server runs runtime.prepare, exactly what a fresh
interpreter would run, in the caller's environment and current directory, and answers with
the argv the front then execs (or the exit status and the lines to print).

When there is no server, or it refuses, is another installed version than the front's (an
upgrade: the server then exits, and systemd starts the new one on the next connection), or
does not answer in time, the front starts Python itself: the server only ever saves time.

One request at a time, in one thread: prepare changes the process's environment and current
directory for the request, and ~2 ms of work each leaves nothing to gain from threads under
one interpreter lock. A caller has REQUEST_TIMEOUT seconds to send its request; only the
server's own user may connect (SO_PEERCRED), and the socket is 0600 in a 0700 directory.

The wire: NUL-terminated fields. Request: MAGIC, the front's directory (its links resolved),
the current directory, the number of env entries and the entries, the number of arguments
and the arguments. Reply: "exec", the text for stderr, then the argv; or "exit", the status,
the text for stderr; or "fallback" (start Python) or "stale" (the same, and the server goes).
"""

import io
import os
import socket
import struct
import sys

from .. import runtime
from ..config import cache_dir
from . import EDITING_COMMANDS, parse_args, prepare

MAGIC = "gpuhook-runtime 1"
SOCKET_NAME = "runtime.sock"  # in the cache dir (the front names it too: tests/unit/test_front.py)
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 2.0
# the subcommands the front brings here (delete it handles itself: it runs the runtime first)
SERVED = EDITING_COMMANDS | {"exec"}
# what a create may import, imported before the first request (a probe imports its vendor's)
WARM = (
    "gpuhook.plan",
    "gpuhook.plan.policy",
    "gpuhook.probe.cache",
    "gpuhook.probe.host",
    "gpuhook.probe.nvidia",
    "gpuhook.probe.amd",
    "gpuhook.probe.intel",
    "gpuhook.probe.accel",
    "gpuhook.probe.wsl",
    "gpuhook.spec",
    "gpuhook.fastjson",
    "gpuhook.log",
    "gpuhook.runtime.execenv",
)


class Request:
    __slots__ = ("here", "cwd", "env", "argv")

    def __init__(self, here: str, cwd: str, env: dict[str, str], argv: list[str]):
        self.here, self.cwd, self.env, self.argv = here, cwd, env, argv


def socket_path() -> str:
    return os.path.join(cache_dir(), SOCKET_NAME)


def install_root() -> str:
    """Where the gpuhook this server runs is installed: <root>/lib/python3.X/site-packages/gpuhook
    (the host bundle's version directory, or a venv), as the front's <root>/bin names it."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.realpath(os.path.join(pkg, "..", "..", "..", ".."))


def parse_request(data: bytes) -> Request | None:
    """None for anything that is not a whole, well-formed request."""
    fields = data.split(b"\0")
    if len(fields) < 6 or fields.pop() != b"" or fields[0].decode(errors="replace") != MAGIC:
        return None
    try:
        here, cwd = os.fsdecode(fields[1]), os.fsdecode(fields[2])
        n_env = int(fields[3])
        env_fields = fields[4 : 4 + n_env]
        n_argv = int(fields[4 + n_env])
        argv = [os.fsdecode(a) for a in fields[5 + n_env :]]
    except (ValueError, IndexError):
        return None
    if len(env_fields) != n_env or len(argv) != n_argv or not cwd.startswith("/"):
        return None
    env: dict[str, str] = {}
    for entry in env_fields:
        key, eq, value = os.fsdecode(entry).partition("=")
        if eq and key:
            env.setdefault(key, value)  # the first of a name, as getenv(3) reads it
    return Request(here, cwd, env, argv)


def _reply(*fields: str) -> bytes:
    return b"".join(os.fsencode(f) + b"\0" for f in fields)


def handle(req: Request, root: str) -> bytes:
    """Run the create path for one request, in its environment and current directory."""
    if os.path.realpath(os.path.join(req.here, "..")) != root:
        return _reply("stale")
    if parse_args(req.argv).command not in SERVED:
        return _reply("fallback")
    saved_env, saved_stderr = dict(os.environ), sys.stderr
    err = io.StringIO()
    try:
        os.chdir(req.cwd)
    except OSError:
        return _reply("fallback")
    os.environ.clear()
    os.environ.update(req.env)
    sys.stderr = err
    try:
        argv = prepare(list(req.argv))
        return _reply("exec", err.getvalue(), *argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        return _reply("exit", str(code), err.getvalue())
    except Exception:  # a bug here must not cost the container anything: Python runs it afresh
        return _reply("fallback")
    finally:
        sys.stderr = saved_stderr
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir("/")


def _receive(conn: socket.socket) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_REQUEST:
            return None
        chunks.append(chunk)


def listening_socket(path: str | None = None) -> socket.socket:
    """systemd's (socket activation: LISTEN_FDS), else one bound at `path` (default
    socket_path()): 0600, in a 0700 directory, an old socket there replaced."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(name, None)  # the requests' runtimes must not think they are activated
        return socket.socket(fileno=3)
    path = path or socket_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        import stat

        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    return sock


def serve(sock: socket.socket, requests: int | None = None) -> None:
    """Answer requests until a stale one (or `requests` of them, for tests)."""
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    root = install_root()
    runtime.IN_SERVER = True
    os.chdir("/")
    served = 0
    while requests is None or served < requests:
        conn, _ = sock.accept()
        served += 1
        with conn:
            try:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid != os.geteuid():
                    continue
                conn.settimeout(REQUEST_TIMEOUT)
                data = _receive(conn)
                req = parse_request(data) if data is not None else None
                reply = handle(req, root) if req is not None else _reply("fallback")
                conn.sendall(reply)
            except OSError:
                continue
        if reply.startswith(b"stale\0"):
            return
