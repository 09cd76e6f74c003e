"""The invocation: runc's command line as gpuhook reads it (parse_args), what else one call is
given (Call: its caller's environment, directory, umask, deadline) and what it comes to (Answer).

The create path reads nothing of the process it runs in: a fresh interpreter makes its Call
from its own environment and directory (Call.here), the runtime server (server.py) from the
request, and neither is ever changed for a call. Stdlib only (the per-container path).
"""

import os
import time

# runc's and crun's global flags that take a value (both "--flag value" and "--flag=value";
# Go's flag parsing also accepts a single dash). The C front's header has these and the two
# lists below (gen_header.py).
GLOBAL_VALUE_FLAGS = frozenset({"root", "log", "log-format", "criu", "rootless", "cgroup-manager"})
# create/run flags that take a value
CREATE_VALUE_FLAGS = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds", "pidfd-socket"})
# exec flags that take a value (runc's and crun's); the rest (--detach, --tty...) take none
EXEC_VALUE_FLAGS = frozenset(
    {
        "console-socket",
        "pidfd-socket",
        "cwd",
        "env",
        "e",
        "user",
        "u",
        "additional-gids",
        "g",
        "process",
        "p",
        "apparmor",
        "process-label",
        "pid-file",
        "cap",
        "c",
        "preserve-fds",
        "cgroup",
    }
)
EDITING_COMMANDS = frozenset({"create", "run"})
EXEC_COMMAND = "exec"
ROOT_FLAG = "root"  # the global flag of the runtime's state root (the exec record's key)
BUNDLE_FLAGS = ("bundle", "b")  # create/run's bundle directory
# the subcommands whose container id gpuhook reads (the exec env record: exec.py)
VALUE_FLAGS = {
    "create": CREATE_VALUE_FLAGS,
    "run": CREATE_VALUE_FLAGS,
    EXEC_COMMAND: EXEC_VALUE_FLAGS,
    "delete": frozenset(),
}
# Go's strconv.ParseBool's true, for run's --detach=VALUE
_TRUE = ("1", "t", "T", "TRUE", "true", "True")


class Invocation:
    """command: the subcommand. bundle: create/run's. container_id: create/run/exec/delete's.
    root, log, log_format: the global flags (None when absent). process: exec's --process
    file; exec_at: the index in argv of the exec subcommand itself. detach: run's --detach/-d
    (a Go bool flag: bare, or =true/=false and the other forms strconv.ParseBool takes)."""

    __slots__ = ("command", "bundle", "container_id", "log", "log_format", "root", "process", "exec_at", "detach")

    def __init__(
        self, command, bundle, container_id, log, log_format, root=None, process=None, exec_at=None, detach=False
    ):
        self.command = command
        self.bundle = bundle
        self.container_id = container_id
        self.log = log
        self.log_format = log_format
        self.root = root
        self.process = process
        self.exec_at = exec_at
        self.detach = detach


def _flag(arg: str) -> tuple[str, str | None]:
    name, eq, value = arg.lstrip("-").partition("=")
    return name, (value if eq else None)


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and arg != "-"


def _global_flags(argv: list[str]) -> tuple[int, dict[str, str | None]]:
    """The global flags before the subcommand: (the subcommand's index, {flag: its last value})."""
    i, n = 0, len(argv)
    found: dict[str, str | None] = {}
    while i < n and _is_flag(argv[i]):
        if argv[i] == "--":
            return i + 1, found
        name, value = _flag(argv[i])
        if name in GLOBAL_VALUE_FLAGS and value is None:
            value = argv[i + 1] if i + 1 < n else None
            i += 1
        found[name] = value
        i += 1
    return i, found


def _command_flags(argv: list[str], i: int, command: str) -> tuple[list[str], list[tuple[str, str | None]]]:
    """A subcommand's own flags and positionals from argv[i:] (exec: up to the first
    positional, the container id; the process's own argv follows it, never read as flags)."""
    value_flags = VALUE_FLAGS[command]
    positional: list[str] = []
    found: list[tuple[str, str | None]] = []
    n = len(argv)
    while i < n:
        arg = argv[i]
        if arg == "--":
            positional.extend(argv[i + 1 :])
            break
        if _is_flag(arg):
            name, value = _flag(arg)
            if name in value_flags and value is None:
                value = argv[i + 1] if i + 1 < n else None
                i += 1
            found.append((name, value))
        else:
            positional.append(arg)
            if command == EXEC_COMMAND:
                break
        i += 1
    return positional, found


def _last(found: list[tuple[str, str | None]], *names: str) -> str | None:
    """The value of the last of names given (Go's flag parsing: the last one counts)."""
    value = None
    for name, given in found:
        if name in names:
            value = given
    return value


def parse_args(argv: list[str], cwd: str | None = None) -> Invocation:
    """Find the subcommand and the global --root; for create/run the bundle and container
    id, for exec the container id and --process file, for delete the container id.

    Flag values are never taken for the subcommand (`--root create create ...` is a create
    whose state root is "create"). No --bundle means the caller's directory (cwd, or this
    process's when None), as in runc; a relative one is read against it.
    """
    i, flags = _global_flags(argv)
    command = argv[i] if i < len(argv) else None
    inv = Invocation(command, None, None, flags.get("log"), flags.get("log-format"), flags.get(ROOT_FLAG))
    if command not in VALUE_FLAGS:
        return inv
    positional, own = _command_flags(argv, i + 1, command)
    inv.container_id = positional[0] if positional else None
    if command in EDITING_COMMANDS:
        bundle = _last(own, *BUNDLE_FLAGS)
        here = os.getcwd() if cwd is None else cwd
        inv.bundle = here if not bundle else bundle if bundle.startswith("/") else os.path.join(here, bundle)
    elif command == EXEC_COMMAND:
        inv.process = _last(own, "process", "p")
        inv.exec_at = i
    if command == "run" and any(name in ("detach", "d") for name, _ in own):
        detach = _last(own, "detach", "d")
        inv.detach = detach is None or detach in _TRUE
    return inv


class Call:
    """What one call of the runtime is given besides its argv: its caller's environment (env;
    the create path reads PATH, PWD and GPUHOOK_STAGES of it), current directory (cwd: what a
    relative path on the command line is read against), umask (umask: the caller's, the bits
    taken off the modes of files the call creates, and only those: the server's own is not
    the caller's), deadline (deadline_ns, CLOCK_MONOTONIC: past it nobody waits for the answer and
    nothing more is written; None: none), and whether the runtime server runs it (in_server:
    its log line says so). stages: the create's timings, when GPUHOOK_STAGES is set."""

    __slots__ = ("env", "cwd", "umask", "deadline_ns", "in_server", "started", "stages")

    def __init__(self, env, cwd: str, umask: int = 0, deadline_ns: int | None = None, in_server: bool = False):
        self.env = env
        self.cwd = cwd
        self.umask = umask
        self.deadline_ns = deadline_ns
        self.in_server = in_server
        self.started = time.monotonic()  # the log line's duration_ms is since
        self.stages = [("start", time.perf_counter())] if "GPUHOOK_STAGES" in env else None

    @classmethod
    def here(cls) -> "Call":
        """The call this process is: its own environment and directory ("." when the
        directory is gone: what is relative is then read there, as the runtime would)."""
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "."
        mask = os.umask(0)  # read (no call to read it without setting it), then put back
        os.umask(mask)
        return cls(os.environ, cwd, mask)

    def stage(self, name: str) -> None:
        if self.stages is not None:
            self.stages.append((name, time.perf_counter()))

    def still_awaited(self) -> None:
        if self.deadline_ns is not None and time.monotonic_ns() > self.deadline_ns:
            raise Abandoned()

    def path(self, path: str) -> str:
        """A path of the command line as the caller names it: a relative one in its cwd."""
        return path if path.startswith("/") else os.path.join(self.cwd, path)

    def mode(self, mode: int) -> int:
        """The mode a file the call creates has (logline.append_line(exact=True) sets it
        whatever this process's umask): mode, the caller's umask taken off."""
        return mode & ~self.umask


class Abandoned(BaseException):
    """The runtime server's caller stopped waiting: nothing more is written (not an Exception:
    no fail-open handler may turn it into a create that goes on)."""


class Answer:
    """What one call comes to: exec argv (its [0] the real runtime's path), or exit with
    status; said, the text for stderr; log, the call's log line (file, line) for whoever
    answers to write (None: none). Nothing is printed, or logged, before the call is over."""

    __slots__ = ("argv", "status", "said", "log")

    def __init__(self, argv: list[str] | None = None, status: int = 0, said: str = "", log=None):
        self.argv, self.status, self.said, self.log = argv, status, said, log
