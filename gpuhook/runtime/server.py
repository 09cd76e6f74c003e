"""The runtime's resident server: the create path without an interpreter's start per container.

A fresh interpreter costs ~7 ms before gpuhook runs a line, and its imports ~2 ms more, on
every GPU container's create. A node may instead keep one interpreter warm:
`gpuhook runtime-server`, started by systemd on its socket (systemd/gpuhook-runtime.socket)
or by hand. The front (gpuhook-runtime.c) connects to <cache dir>/runtime.sock for each
create, run or exec that needs Python; the server runs runtime.prepare, exactly what a fresh
interpreter would run, in the caller's environment and current directory, and answers with
the argv the front then execs (or the exit status and the lines to print).

When there is no server, or it refuses, or does not answer within the front's deadline, the
front starts Python itself: the server only ever saves time. It serves only the front of its
own installation (the same directory and the same file, by device and inode) in its own
mount namespace, and only before the front's deadline (less a margin: past it the front has
started Python, so the request writes nothing: runtime.Abandoned). Any other front gets
"fallback"; when its own installation has changed under it (an upgrade: a new front file, or
the bundle's current version is another), "stale", and it exits: systemd starts the new
one on the next connection.

One request at a time, in one thread: prepare changes the process's environment and current
directory for the request, and ~2 ms of work each leaves nothing to gain from threads under
one interpreter lock. A caller has REQUEST_TIMEOUT seconds to send its request; only the
server's own user may connect (SO_PEERCRED), and the socket is 0600 in a 0700 directory.

The wire: NUL-terminated fields. Request: MAGIC, the front's directory (its links resolved),
its file's "dev:ino", its mount namespace's "dev:ino", its umask, its deadline
(CLOCK_MONOTONIC ns), the current directory, the number of env entries and the entries, the
number of arguments and the arguments. Reply: "exec", the text for stderr, then the argv; or "exit", the status,
the text for stderr; or "fallback" (start Python) or "stale" (the same, and the server goes).
"""

import io
import os
import socket
import struct
import sys
import time

from .. import runtime
from ..config import cache_dir
from ..defaults import BUNDLE_VERSIONS
from . import EDITING_COMMANDS, parse_args, prepare

MAGIC = "gpuhook-runtime 2"
SOCKET_NAME = "runtime.sock"  # in the cache dir (the front names it too: tests/unit/test_front.py)
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 2.0
MARGIN_NS = 1_000_000_000  # the server gives up this long before the front does
FRONT = os.path.join("bin", "gpuhook-runtime")  # the front, in its installation's root
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
    "gpuhook.runtime.execenv",
)


class Request:
    __slots__ = ("here", "exe", "mntns", "umask", "deadline_ns", "cwd", "env", "argv")

    def __init__(self, here, exe, mntns, umask, deadline_ns, cwd, env, argv):
        self.here, self.exe, self.mntns, self.umask, self.deadline_ns = here, exe, mntns, umask, deadline_ns
        self.cwd, self.env, self.argv = cwd, env, argv


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
    if len(fields) < 10 or fields.pop() != b"" or fields[0].decode(errors="replace") != MAGIC:
        return None
    try:
        here, exe, mntns, umask, deadline = (os.fsdecode(f) for f in fields[1:6])
        cwd = os.fsdecode(fields[6])
        n_env = int(fields[7])
        env_fields = fields[8 : 8 + n_env]
        n_argv = int(fields[8 + n_env])
        argv = [os.fsdecode(a) for a in fields[9 + n_env :]]
        umask_value, deadline_ns = int(umask), int(deadline)
    except (ValueError, IndexError):
        return None
    if len(env_fields) != n_env or len(argv) != n_argv or not cwd.startswith("/") or not 0 <= umask_value <= 0o777:
        return None
    env: dict[str, str] = {}
    for entry in env_fields:
        key, eq, value = os.fsdecode(entry).partition("=")
        if eq and key:
            env.setdefault(key, value)  # the first of a name, as getenv(3) reads it
    return Request(here, exe, mntns, umask_value, deadline_ns, cwd, env, argv)


def identity(path: str) -> str:
    """ "dev:ino" of a file, as the front sends it ("0:0" when it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return "0:0"
    return f"{st.st_dev}:{st.st_ino}"


class Installation:
    """What this server serves: its installation's root, its front, its mount namespace."""

    def __init__(self):
        self.root = install_root()
        self.front = identity(os.path.join(self.root, FRONT))
        self.mntns = identity("/proc/self/ns/mnt")

    def changed(self) -> bool:
        """An upgrade under this server: its front is another file now, or (a host bundle's
        version directory, install/files.py) the bundle's current version is another."""
        if identity(os.path.join(self.root, FRONT)) != self.front:
            return True
        versions = os.path.dirname(self.root)
        if os.path.basename(versions) == BUNDLE_VERSIONS:
            current = os.path.realpath(os.path.join(os.path.dirname(versions), "bin"))
            return os.path.dirname(current) != self.root
        return False


def _reply(*fields: str) -> bytes:
    return b"".join(os.fsencode(f) + b"\0" for f in fields)


def handle(req: Request, own: Installation) -> bytes:
    """Run the create path for one request, in its environment, directory and umask."""
    if time.monotonic_ns() > req.deadline_ns - MARGIN_NS or req.mntns != own.mntns:
        return _reply("fallback")
    if os.path.realpath(os.path.join(req.here, "..")) != own.root or req.exe != own.front:
        return _reply("stale" if own.changed() else "fallback")
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
    saved_umask = os.umask(req.umask)
    runtime.DEADLINE_NS = req.deadline_ns - MARGIN_NS
    try:
        try:
            argv = prepare(list(req.argv))
            return _reply("exec", err.getvalue(), *argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            return _reply("exit", str(code), err.getvalue())
    except (Exception, runtime.Abandoned):  # a bug here, or nobody waiting: Python runs it afresh
        return _reply("fallback")
    finally:
        runtime.DEADLINE_NS = None
        os.umask(saved_umask)
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


def listening_socket() -> socket.socket:
    """systemd's (socket activation: LISTEN_FDS), else one bound at socket_path(): 0600, in
    a 0700 directory, an old socket there replaced. Bound and listening under a temporary
    name first, then renamed into place: a front never finds a socket nobody listens on yet."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS") == "1":
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(name, None)  # the requests' runtimes must not think they are activated
        os.set_inheritable(3, False)
        return socket.socket(fileno=3)
    path = socket_path()
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        import stat

        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(f"{path} is there and not a socket")
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    old = os.umask(0o177)
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        sock.bind(tmp)
        sock.listen(128)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.umask(old)
    return sock


def serve(sock: socket.socket) -> None:
    """Answer requests until its installation changes under it (a stale request)."""
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    own = Installation()
    runtime.IN_SERVER = True
    os.chdir("/")
    while True:
        conn, _ = sock.accept()
        with conn:
            try:
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid != os.geteuid():
                    continue
                conn.settimeout(REQUEST_TIMEOUT)
                data = _receive(conn)
                req = parse_request(data) if data is not None else None
                reply = handle(req, own) if req is not None else _reply("fallback")
                conn.sendall(reply)
            except OSError:
                continue
        if reply.startswith(b"stale\0"):
            return
