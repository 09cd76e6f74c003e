"""The runtime's resident server: the create path without an interpreter's start per container.

A fresh interpreter costs ~7 ms before gpuhook runs a line, and its imports ~2 ms more, on
every GPU container's create. A node may instead keep one interpreter warm:
`gpuhook runtime-server`, started by systemd on its socket (systemd/gpuhook-runtime.socket)
or by hand. The front (gpuhook-runtime.c) connects to <cache dir>/runtime.sock for each
create, run or exec that needs Python; the server runs runtime.prepare, exactly what a fresh
interpreter would run, with the caller's current directory, umask and command line passed in
(args.Call), and answers with the argv the front then execs (or the exit status and the
lines to print).

When there is no server, or it refuses, or does not answer within the front's deadline, the
front starts Python itself: the server only ever saves time. Who the caller is, the server
asks the kernel, never the request: the peer's pid and uid (SO_PEERCRED), a pidfd of it
(SO_PEERPIDFD), then its executable, mount namespace and user namespace from /proc/<pid>,
read while the pidfd shows it alive (so the pid was not another's meanwhile). It serves only
its own uid, its own installation's front (that file, by device and inode), its own mount
and user namespaces and root directory, and a request whose directory is the caller's own
(/proc/<pid>/cwd: the front's getcwd is a claim, "/" when its directory is gone, and a
relative path is read in that directory); any other caller gets "fallback", and an upgrade of its own installation
(a new front file, or the bundle's current version another) "stale", and it exits: systemd
starts the new one on the next connection. What it reads and writes is chosen by its own
environment and node config, never the request's: a request whose GPUHOOK_CONFIG or
GPUHOOK_CACHE_DIR is not the server's own gets "fallback" (the fresh interpreter, in the
caller's own context, honours them), and so does one naming a path of the reading process's
own (OWN_PROCESS_PATHS: /dev/stderr is the server's here); of the request's environment only
CALLER_ENV is used.
Past the front's deadline less a margin the front has started Python, so the request writes
nothing (args.Abandoned). The create's log line travels in the answer and the front writes
it: a server that dies before it answers has logged nothing, and the create is logged once.

Requests are read concurrently (one selector): each connection has one deadline,
REQUEST_TIMEOUT from its accept, for its whole request and answer, and a slow or silent
client holds only its own connection. A whole request runs at once, one at a time in this
thread (~1-2 ms of work each leaves nothing to gain from threads under one interpreter
lock). No request changes the process: its environment, directory ("/"), umask and stderr
stay the server's own; what a request needs is its args.Call, and what it says (the stderr
text, the log line) comes back in its args.Answer. The socket is 0600 in a 0700 directory.

The wire (REQUEST_FIELDS, REPLIES): NUL-terminated fields. Request: MAGIC, the front's umask,
its deadline (CLOCK_MONOTONIC ns), the current directory, the number of env entries and the
entries, the number of arguments and the arguments. Reply: "exec", the text for stderr, the log
file and its line ("" and "" for none), then the argv; or "exit", the status, the text for
stderr, the log file and its line; or "fallback" (start Python) or "stale" (the same, and the
server goes).
The front acts on nothing but a reply whole and well-formed in every field.
"""

import errno
import os
import selectors
import signal
import socket
import struct
import time

from .. import vendors
from ..config import cache_dir
from ..defaults import BUNDLE_VERSIONS
from . import prepare
from .args import EDITING_COMMANDS, EXEC_COMMAND, Abandoned, Call, parse_args

MAGIC = "gpuhook-runtime 3"
# The wire, by name (the front's header is generated from these: gen_header.py). A request is
# these fields in this order, each one field but a counted list (REQUEST_LISTS): its length,
# then that many fields.
REQUEST_FIELDS = ("magic", "umask", "deadline_ns", "cwd", "env", "argv")
REQUEST_LISTS = ("env", "argv")
# A reply is its kind, then that kind's fields in this order; REPLY_REST, last, is a list: the
# rest of the reply. The front acts on "exec" and "exit"; anything else starts Python.
REPLIES = {
    "exec": ("said", "log_file", "log_line", "argv"),
    "exit": ("status", "said", "log_file", "log_line"),
    "fallback": (),  # start Python
    "stale": (),  # the same, and the server goes
}
REPLY_REST = "argv"
SOCKET_NAME = "runtime.sock"  # in the cache dir
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 2.0  # for a connection's whole request and answer, from its accept
MAX_CONNECTIONS = 64  # read at once; one more gets "fallback" at once
MARGIN_NS = 1_000_000_000  # the server gives up this long before the front does
# the front's side of the wire (its header is generated from these: gen_header.py): it waits
# FRONT_TIMEOUT_S for the whole exchange (then starts Python itself: a wedged server costs a
# create that long), and acts on no answer over these bounds
FRONT_TIMEOUT_S = 3
MAX_REPLY_BYTES = 1 << 20
MAX_REPLY_FIELDS = 4096
MAX_REPLY_TEXT = 64 << 10  # the stderr text of an answer
MAX_REPLY_LOG_LINE = 256 << 10  # its log line (runtime.log_line bounds what a pod can put there)
FRONT = os.path.join("bin", "gpuhook-runtime")  # the front, in its installation's root
# the subcommands the front brings here
SERVED = EDITING_COMMANDS | {EXEC_COMMAND}
# The environment a create reads (config.py, runtime/). What chooses the files the server
# reads and writes is its own: a request naming another value of these, or a relative one,
# gets "fallback" (a fresh interpreter honours them, as the caller's own process)...
OWN_ENV = ("GPUHOOK_CONFIG", "GPUHOOK_CACHE_DIR")
# ...and these are the caller's: where its real runtime is on its PATH (the front execs what
# the answer names), the $PWD its relative --root is read against, and GPUHOOK_STAGES (the
# log line's timings). Nothing else of the request's environment is used.
CALLER_ENV = ("PATH", "PWD", "GPUHOOK_STAGES")
# paths that name the process that reads them (its fds, its /proc): the caller's own in its
# fresh interpreter, the server's own here, so a request naming one is not served
OWN_PROCESS_PATHS = ("/proc/self", "/proc/thread-self", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
# what the server reads of /proc/<peer pid> (Peer's fields, in this order)
PEER_FILES = ("exe", "ns/mnt", "ns/user", "root", "cwd")
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5; Python 3.11's socket lacks the name
# what a create may import, imported before the first request (a probe imports its vendor's)
WARM = (
    "gpuhook.plan",
    "gpuhook.plan.policy",
    "gpuhook.probe.cache",
    "gpuhook.probe.host",
    *vendors.warm_up(),
    "gpuhook.spec",
    "gpuhook.fastjson",
    "gpuhook.runtime.create",
    "gpuhook.runtime.exec",
    "gpuhook.runtime.logline",
    "gpuhook.logline",
    "gpuhook.inject",
)


class Request:
    __slots__ = ("umask", "deadline_ns", "cwd", "env", "argv")

    def __init__(self, umask, deadline_ns, cwd, env, argv):
        self.umask, self.deadline_ns, self.cwd, self.env, self.argv = umask, deadline_ns, cwd, env, argv


def socket_path() -> str:
    return os.path.join(cache_dir(), SOCKET_NAME)


def install_root() -> str:
    """Where the gpuhook this server runs is installed: <root>/lib/python3.X/site-packages/gpuhook
    (the host bundle's version directory, or a venv), as the front's <root>/bin names it."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.realpath(os.path.join(pkg, "..", "..", "..", ".."))


def parse_request(data: bytes) -> Request | None:
    """None for anything that is not a whole, well-formed request (REQUEST_FIELDS)."""
    fields, at = data.split(b"\0"), 0
    one: dict[str, bytes] = {}
    lists: dict[str, list[bytes]] = {}
    if fields.pop() != b"":
        return None
    try:
        for name in REQUEST_FIELDS:
            if name in REQUEST_LISTS:
                n = int(fields[at])
                lists[name], at = fields[at + 1 : at + 1 + n], at + 1 + n
                if n < 0 or len(lists[name]) != n:
                    return None
            else:
                one[name], at = fields[at], at + 1
        umask_value, deadline_ns = int(one["umask"]), int(one["deadline_ns"])
    except (ValueError, IndexError):
        return None
    cwd = os.fsdecode(one["cwd"])
    if at != len(fields) or one["magic"] != MAGIC.encode() or not cwd.startswith("/"):
        return None
    if not 0 <= umask_value <= 0o777:
        return None
    env: dict[str, str] = {}
    for entry in lists["env"]:
        key, eq, value = os.fsdecode(entry).partition("=")
        if eq and key:
            env.setdefault(key, value)  # the first of a name, as getenv(3) reads it
    return Request(umask_value, deadline_ns, cwd, env, [os.fsdecode(a) for a in lists["argv"]])


def identity(path: str) -> str:
    """ "dev:ino" of a file, its links followed ("0:0" when it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return "0:0"
    return f"{st.st_dev}:{st.st_ino}"


class Peer:
    """The process at the other end of a connection, as the kernel says: its executable, mount
    namespace, user namespace, root directory and current directory ("dev:ino" each)."""

    __slots__ = ("exe", "mntns", "userns", "root", "cwd")

    def __init__(self, exe: str, mntns: str, userns: str, root: str, cwd: str):
        self.exe, self.mntns, self.userns, self.root, self.cwd = exe, mntns, userns, root, cwd


def peer_of(conn: socket.socket) -> Peer | None:
    """Who connected: None when it is not this server's uid, or cannot be told for sure. The
    pid (SO_PEERCRED) names /proc/<pid>; the pidfd (SO_PEERPIDFD, taken at connect by the
    kernel) still alive after /proc/<pid> was read says that pid was the peer's throughout.
    A kernel without SO_PEERPIDFD (before 6.5): a pidfd opened now, of the pid the peer had."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.geteuid() or pid <= 0:
        return None
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError as e:
        if e.errno != errno.ENOPROTOOPT:  # no SO_PEERPIDFD here; anything else (ESRCH: gone): no answer
            return None
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
    try:
        exe, mntns, userns, root, cwd = (identity(f"/proc/{pid}/{name}") for name in PEER_FILES)
        peer = Peer(exe, mntns, userns, root, cwd)
        signal.pidfd_send_signal(pidfd, 0)
    except OSError:
        return None
    finally:
        os.close(pidfd)
    return None if "0:0" in (peer.exe, peer.mntns, peer.userns, peer.root, peer.cwd) else peer


class Installation:
    """What this server serves: its installation's root, its front, its namespaces and its
    root directory (fsroot: a caller chroot'ed elsewhere names other files by the same path)."""

    def __init__(self):
        self.root = install_root()
        self.front = identity(os.path.join(self.root, FRONT))
        self.mntns = identity("/proc/self/ns/mnt")
        self.userns = identity("/proc/self/ns/user")
        self.fsroot = identity("/proc/self/root")

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


def _reply(*fields: str | bytes) -> bytes:
    return b"".join((f if isinstance(f, bytes) else os.fsencode(f)) + b"\0" for f in fields)


def reply(kind: str, **named: "str | bytes | list[str]") -> bytes:
    """A reply of `kind` (REPLIES), its fields given by name, put in the wire's order."""
    fields: list[str | bytes] = [kind]
    for name in REPLIES[kind]:
        value = named.pop(name)
        if isinstance(value, list) != (name == REPLY_REST):
            raise TypeError(f"{kind!r} reply: {name} is {'the rest, a list' if name == REPLY_REST else 'one field'}")
        fields.extend(value) if isinstance(value, list) else fields.append(value)
    if named:
        raise TypeError(f"not fields of a {kind!r} reply: {sorted(named)}")
    return _reply(*fields)


def refusal(peer: Peer | None, own: Installation) -> bytes | None:
    """The answer to a caller this server does not serve ("fallback", or "stale" when its own
    installation changed under it), None for its own front in its own namespaces and root
    directory."""
    if peer is None or (peer.mntns, peer.userns, peer.root) != (own.mntns, own.userns, own.fsroot):
        return reply("fallback")
    if peer.exe != own.front:
        return reply("stale" if own.changed() else "fallback")
    return None


def names_own_process(req: Request) -> bool:
    """Whether an argument (or an --option=value's value), a PATH entry, $PWD or the directory
    of the request names a path under OWN_PROCESS_PATHS, as it is spelt (relative ones read in
    the request's directory)."""
    values = [*req.argv, *req.env.get("PATH", "").split(":"), req.env.get("PWD", ""), req.cwd]
    for value in values:
        for v in (value, value.partition("=")[2]):
            if v:
                path = "/" + os.path.normpath(os.path.join(req.cwd, v)).lstrip("/")
                if any(path == p or path.startswith(p + "/") for p in OWN_PROCESS_PATHS):
                    return True
    return False


def call_of(req: Request) -> Call | None:
    """The call a request is, with CALLER_ENV of its environment alone; None for one this
    server does not run: its OWN_ENV not the server's own (or relative: then another file in
    the caller's directory), a path of the process's own named (names_own_process), its
    directory not one, its subcommand not SERVED."""
    for name in OWN_ENV:
        value = req.env.get(name) or ""
        if value != (os.environ.get(name) or "") or (value and not value.startswith("/")):
            return None
    if names_own_process(req):
        return None
    if not os.path.isdir(req.cwd) or parse_args(req.argv, req.cwd).command not in SERVED:
        return None
    env = {name: req.env[name] for name in CALLER_ENV if name in req.env}
    return Call(env, req.cwd, req.umask, req.deadline_ns - MARGIN_NS, in_server=True)


def handle(req: Request, own: Installation) -> bytes:
    """Run the create path for one request (of a caller refusal() let through), as its call
    (call_of): its directory, umask, CALLER_ENV and deadline are passed in, never set here."""
    if time.monotonic_ns() > req.deadline_ns - MARGIN_NS:
        return reply("fallback")
    call = call_of(req)
    if call is None:
        return reply("fallback")
    try:
        answer = prepare(list(req.argv), call)
    except (Exception, Abandoned):  # a bug here, or nobody waiting: Python runs it afresh
        return reply("fallback")
    log_file, log_line = answer.log or ("", b"")
    if answer.argv is None:
        return reply("exit", status=str(answer.status), said=answer.said, log_file=log_file, log_line=log_line)
    return reply("exec", said=answer.said, log_file=log_file, log_line=log_line, argv=answer.argv)


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


class Connection:
    """One caller's connection: what it sent so far, the answer still to send, its deadline."""

    __slots__ = ("sock", "deadline", "chunks", "size", "out", "peer")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.peer: Peer | None = None  # who connected (peer_of), once refusal() let it through
        self.chunks: list[bytes] = []
        self.size = 0
        self.out: bytes | None = None


class Loop:
    """The connections being read and answered at once (one selector, this one thread)."""

    def __init__(self, sock: socket.socket, own: Installation):
        self.sock, self.own = sock, own
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)
        self.open: dict[int, Connection] = {}
        self.stale = False  # a caller found this installation changed: the server goes

    def close(self, c: Connection) -> None:
        self.sel.unregister(c.sock)
        del self.open[c.sock.fileno()]
        c.sock.close()

    def answer(self, c: Connection, reply: bytes) -> None:
        c.out = reply
        self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self.send(c)

    def send(self, c: Connection) -> None:
        out = c.out or b""
        try:
            n = c.sock.send(out, socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.close(c)
        c.out = out[n:]
        if not c.out:
            self.close(c)

    def accept(self) -> None:
        """Every connection waiting; one of a caller refusal() refuses is answered at once."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # none left (BlockingIOError), or out of fds: the backlog waits
                return
            conn.setblocking(False)
            c = Connection(conn, time.monotonic() + REQUEST_TIMEOUT)
            self.open[conn.fileno()] = c
            self.sel.register(conn, selectors.EVENT_READ, c)
            try:
                c.peer = peer_of(conn) if len(self.open) <= MAX_CONNECTIONS else None
                refused = refusal(c.peer, self.own)
            except OSError:
                refused = reply("fallback")
            if refused is not None:
                self.stale = self.stale or refused == reply("stale")
                self.answer(c, refused)

    def read(self, c: Connection) -> None:
        """More of a request; a whole one (the caller's end shut) is run now."""
        try:
            chunk = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.close(c)
        c.size += len(chunk)
        if c.size > MAX_REQUEST:
            self.answer(c, reply("fallback"))
        elif chunk:
            c.chunks.append(chunk)
        else:
            req = parse_request(b"".join(c.chunks))
            # a relative path is read in req.cwd: only where that is the caller's directory
            if req is None or c.peer is None or identity(req.cwd) != c.peer.cwd:
                self.answer(c, reply("fallback"))
            else:
                self.answer(c, handle(req, self.own))

    def turn(self) -> None:
        """What is ready, once; then the connections past their deadline are closed."""
        wait = min((c.deadline for c in self.open.values()), default=None)
        for key, _mask in self.sel.select(None if wait is None else max(0.0, wait - time.monotonic())):
            c = key.data
            if key.fileobj is self.sock:
                self.accept()
            elif c.sock.fileno() in self.open:
                if c.out is not None:
                    self.send(c)
                else:
                    self.read(c)
        now = time.monotonic()
        for c in [c for c in self.open.values() if c.deadline <= now]:
            self.close(c)


def warm() -> None:
    """Import what a create may import, before the first request."""
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def serve(sock: socket.socket) -> None:
    """Answer requests until its installation changes under it (a stale request). The
    process's environment, directory and umask are never changed for a request: its
    directory is "/" throughout (it holds no other)."""
    warm()
    loop = Loop(sock, Installation())
    os.chdir("/")
    sock.setblocking(False)
    while not loop.stale:
        loop.turn()
