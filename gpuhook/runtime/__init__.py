"""gpuhook-runtime: an OCI runtime with runc's command line that edits config.json at create.

containerd's io.containerd.runc.v2 shim (options.BinaryName) and CRI-O (runtime_path) call
it exactly as they call runc. The C front (bin/gpuhook-runtime, gpuhook-runtime.c) execs the real runtime
itself for every subcommand but create/run, and for create/run on a node with no GPU node
at all, so Python starts only when there may be something to inject, or for an exec into a
container gpuhook injected (execenv.py: the recorded GPUHOOK_* env goes into the exec's
process). It asks the node's runtime server first (server.py: this same path in a warm
interpreter) when one listens. Here:

    parse argv -> load node config -> read <bundle>/config.json -> probe -> plan -> apply
    -> write config.json atomically -> one JSON log line -> exec the real runtime

A failure anywhere in gpuhook is logged and the container starts unmodified (fail_mode =
"open", the default); with fail_mode = "closed" the create fails with one clear line.
Nothing is ever printed on stdout, which belongs to the real runtime.
"""

import os
import sys
import time

# runc's and crun's global flags that take a value (both "--flag value" and "--flag=value";
# Go's flag parsing also accepts a single dash). The C front's GLOBAL_VALUE_FLAGS and the two
# lists below it say these again, in C: tests/unit/test_front.py holds them equal.
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
# the subcommands whose container id gpuhook reads (the exec env record: execenv.py)
VALUE_FLAGS = {"create": CREATE_VALUE_FLAGS, "run": CREATE_VALUE_FLAGS, "exec": EXEC_VALUE_FLAGS, "delete": frozenset()}
MAX_SPEC_BYTES = 16 << 20
# GPUHOOK_STAGES set in the runtime's environment (the node's, never a tenant's): the log line
# gets the milliseconds of each create stage since the interpreter started (tests/perf/bench.py)
STAGES: list | None = None
# set by the runtime server (server.py): its creates' log lines say so ("runtime_server": true)
IN_SERVER = False
# the runtime server's: past this (time.monotonic_ns) its caller has started Python itself, so
# the request writes nothing (Abandoned)
DEADLINE_NS: int | None = None
# the runtime server's: the create's log line goes here, (file, line), not into the file: the
# server's reply carries it and the front writes it, so that a server that dies before it
# replies has logged nothing, and the front's fallback to Python logs that create once
DEFERRED_LOG: list[tuple[str, bytes]] | None = None


class Abandoned(BaseException):
    """The runtime server's caller stopped waiting: nothing more is written (not an Exception:
    no fail-open handler may turn it into a create that goes on)."""


def still_awaited() -> None:
    if DEADLINE_NS is not None and time.monotonic_ns() > DEADLINE_NS:
        raise Abandoned()


def stage(name: str) -> None:
    if STAGES is not None:
        STAGES.append((name, time.perf_counter()))


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


def parse_args(argv: list[str]) -> Invocation:
    """Find the subcommand and the global --root; for create/run the bundle and container
    id, for exec the container id and --process file, for delete the container id.

    Flag values are never taken for the subcommand (`--root create create ...` is a create
    whose state root is "create"). No --bundle means the current directory, as in runc.
    """
    i, n = 0, len(argv)
    log = log_format = root = process = None
    command = None
    while i < n:
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("-") and arg != "-":
            name, value = _flag(arg)
            if name in GLOBAL_VALUE_FLAGS and value is None:
                value = argv[i + 1] if i + 1 < n else None
                i += 1
            if name == "log":
                log = value
            elif name == "log-format":
                log_format = value
            elif name == "root":
                root = value
            i += 1
            continue
        break
    exec_at = None
    if i < n:
        command = argv[i]
        exec_at = i
        i += 1
    bundle = container_id = None
    detach = False
    value_flags = VALUE_FLAGS.get(command) if command is not None else None
    if value_flags is not None:
        rest_positional = []
        while i < n:
            arg = argv[i]
            if arg == "--":
                rest_positional.extend(argv[i + 1 :])
                break
            if arg.startswith("-") and arg != "-":
                name, value = _flag(arg)
                if name in value_flags and value is None:
                    value = argv[i + 1] if i + 1 < n else None
                    i += 1
                if name in ("bundle", "b") and command in EDITING_COMMANDS:
                    bundle = value
                elif name in ("process", "p") and command == "exec":
                    process = value
                elif name in ("detach", "d") and command == "run":
                    detach = value is None or value in ("1", "t", "T", "TRUE", "true", "True")
            else:
                rest_positional.append(arg)
                if command == "exec":  # the process's own argv follows: never read as flags
                    break
            i += 1
        container_id = rest_positional[0] if rest_positional else None
    if command in EDITING_COMMANDS:
        if bundle is None or bundle == "":
            bundle = os.getcwd()
        elif not bundle.startswith("/"):
            bundle = os.path.join(os.getcwd(), bundle)
    return Invocation(
        command, bundle, container_id, log, log_format, root, process, exec_at if command == "exec" else None, detach
    )


# -- the create path -------------------------------------------------------------


class Outcome:
    """What one create did, for the log line."""

    __slots__ = ("decision", "vendors", "nodes", "mounts", "hooks", "error", "warnings", "env", "pod", "plan")

    def __init__(self):
        self.env: list[str] = []
        self.decision = "unchanged"
        self.vendors: list[str] = []
        self.nodes: list[str] = []
        self.mounts: list[str] = []
        self.hooks = 0
        self.error: str | None = None
        self.warnings: list[str] = []
        self.pod: dict = {}  # policy.pod_of: the pod's namespace, name, uid, container name
        self.plan = None  # plan()'s Plan: the devices given and held back, why none was given


def edit_bundle(bundle: str, config, out: Outcome) -> None:
    """Edit <bundle>/config.json in place (atomically); leave it untouched when there is
    nothing to add. Raises on any problem; the caller applies the fail mode."""
    from .. import fastjson
    from ..plan import find_ldconfig, plan, request_from_spec
    from ..plan.policy import pod_of
    from ..config import cache_dir
    from ..probe.cache import probe_cached
    from ..spec import apply, check, write_atomic

    path = os.path.join(bundle, "config.json")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO never hangs it
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            raise ValueError("config.json is not a regular file")
        if st.st_size > MAX_SPEC_BYTES:
            raise ValueError(f"config.json is {st.st_size} bytes, over the {MAX_SPEC_BYTES} limit")
        raw = os.read(fd, MAX_SPEC_BYTES + 1)
    finally:
        os.close(fd)
    stage("imported+read")
    try:
        spec = fastjson.loads(raw)
    except ValueError as e:
        raise ValueError(f"config.json is not valid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError("config.json is not a JSON object")
    check(spec)  # a field of a type runc refuses is left to runc: never read otherwise than runc reads it
    request = request_from_spec(spec, bundle)
    out.pod = pod_of(request.annotations)
    if request.is_sandbox:
        out.decision = "sandbox"
        return
    stage("parsed")
    inventory = probe_cached(config.host_root, cache_dir(), config.probe_cache_ttl, config.nvidia_driver_root)
    stage("probed")
    out.warnings = list(inventory.warnings)
    out.plan = plan(inventory, request, config.ldconfig or find_ldconfig(), config, cache_dir())
    out.warnings += out.plan.warnings
    edits = out.plan.edits
    stage("planned")
    if not edits:
        out.decision = "no-gpu" if not inventory.vendors else "declined"
        return
    spec = apply(spec, edits)
    stage("applied")
    still_awaited()
    write_atomic(path, fastjson.dumps(spec).encode(), st.st_mode & 0o7777, sync_dir=False)
    stage("written")
    out.decision = "injected"
    out.env = list(edits.env)
    out.vendors = list(out.plan.vendors)
    out.nodes = [n.path for n in edits.device_nodes]
    out.mounts = [m.container_path for m in edits.mounts]
    out.hooks = len(edits.hooks)


def log_line(config, inv: Invocation, out: Outcome, started: float) -> None:
    if not config.log_file:
        return
    from .. import fastjson

    record = {
        "time": utc_now(),
        "event": "create",
        "container_id": inv.container_id,
        "bundle": inv.bundle,
        **out.pod,
        "decision": out.decision,
        "vendors": out.vendors,
        "nodes": out.nodes,
        "mounts": out.mounts,
        "hooks": out.hooks,
        "duration_ms": round((time.monotonic() - started) * 1000, 2),
    }
    if IN_SERVER:
        record["runtime_server"] = True
    if out.plan is not None and out.plan.devices:
        record["devices"] = list(out.plan.devices[:256])
    if out.plan is not None and out.plan.held_back:
        record["held_back"] = [h.device for h in out.plan.held_back[:64]]
    if out.plan is not None and out.plan.reason:
        record["reason"] = out.plan.reason
    # bounded: a warning may quote a pod's annotation, which can be a megabyte
    if out.error:
        record["error"] = out.error[:1000]
    if out.warnings:
        record["warnings"] = [str(w)[:500] for w in out.warnings[:20]]
    if STAGES:
        stage("logged")
        t0 = STAGES[0][1]
        record["stages_ms"] = {name: round((t - t0) * 1000, 3) for name, t in STAGES}
    if DEFERRED_LOG is not None:
        DEFERRED_LOG.append((config.log_file, line_bytes(fastjson.dumps(record))))
    else:
        append_line(config.log_file, fastjson.dumps(record))


def record_exec_env(inv: Invocation, out: Outcome, real: str) -> None:
    """After a create: what exec will add (execenv.py); a warning, never a failure."""
    from . import execenv
    from ..config import cache_dir

    try:
        path = execenv.record_path(cache_dir(), inv.root, inv.container_id, real)
        if path is None:
            if out.env:
                out.warnings.append(
                    "exec will not see the GPUHOOK_* env: the runtime root or container id "
                    "is not one the exec record can be keyed by"
                )
            return
        if execenv.state_exists(inv.root, inv.container_id, real):
            return  # that id is taken: the runtime refuses this create, the record is the running container's
        # `run` in the foreground: the runtime removes the container itself, no `delete` comes,
        # so no record (it would outlive the container)
        if out.decision == "injected" and out.env and (inv.command == "create" or inv.detach):
            execenv.write_record(path, out.env, inv.bundle, execenv.config_identity(inv.bundle))
        else:
            execenv.remove_record(path)
    except (OSError, ValueError) as e:
        out.warnings.append(f"exec env record: {e}")


def exec_env(inv: Invocation, args: list[str], real: str, config) -> list[str]:
    """Before an exec: the recorded env into its process; anything odd leaves it unchanged."""
    from . import execenv
    from ..config import cache_dir

    try:
        args, why = execenv.on_exec(inv, args, real, cache_dir())
    except Exception as e:  # the exec goes on, whatever happened here
        why = f"{type(e).__name__}: {e}"
    if why and config.log_file:
        from .. import fastjson

        append_line(
            config.log_file,
            fastjson.dumps(
                {
                    "time": utc_now(),
                    "event": "exec",
                    "container_id": inv.container_id,
                    "decision": "unchanged",
                    "error": why[:1000],
                }
            ),
        )
    return args


def delete_and_forget(inv: Invocation, args: list[str], real: str) -> None:
    """`delete` of a container with an exec record: the runtime first, then the record once
    the runtime has no state for the container any more. Exits with the runtime's status."""
    from . import execenv
    from ..config import cache_dir

    path = execenv.record_path(cache_dir(), inv.root, inv.container_id, real)
    if path is None or not execenv.record_exists(path):
        return
    try:
        pid = os.posix_spawn(real, [real] + args, os.environ)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
    except OSError as e:
        _runtime_error(inv, f"cannot run the real OCI runtime {real}: {e.strerror or e}")
        sys.exit(127)
    if not execenv.state_exists(inv.root, inv.container_id, real):
        execenv.remove_record(path)
    sys.exit(rc if rc >= 0 else 128 - rc)


def utc_now(ms: bool = True, t: float | None = None) -> str:
    """2026-11-29T19:40:49.577Z, the log time format of the runtime and of gpuhook.log (ms=False:
    whole seconds)."""
    t = time.time() if t is None else t
    head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return head + (f".{int(t * 1000) % 1000:03d}Z" if ms else "Z")


def line_bytes(line: str) -> bytes:
    """A log line as append_line writes it: one line, its newline at the end, UTF-8."""
    return (line.replace("\n", " ") + "\n").encode("utf-8", "replace")


def append_line(path: str, line: str) -> None:
    """One write(2) of a whole line with O_APPEND: concurrent creates never interleave."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o640)
    except OSError:
        return
    try:
        os.write(fd, line_bytes(line))
    except OSError:
        pass
    finally:
        os.close(fd)


def _runtime_error(inv: Invocation, msg: str) -> None:
    """Tell the caller why the create failed: stderr, and runc's own --log in its format."""
    sys.stderr.write(f"gpuhook-runtime: {msg}\n")
    if inv.log:
        from .. import fastjson

        if inv.log_format == "json":
            line = fastjson.dumps({"level": "error", "msg": f"gpuhook-runtime: {msg}", "time": utc_now(ms=False)})
        else:
            line = f"gpuhook-runtime: {msg}"
        append_line(inv.log, line)


def prepare(args: list[str]) -> list[str]:
    """Everything before the real runtime runs: the argv to exec (its [0] the runtime's path).
    Raises SystemExit where the call ends here (no runtime, fail_mode closed, a delete's exit
    status). Run by main() and, for a node's resident server, by server.py."""
    global STAGES
    started = time.monotonic()
    STAGES = [("start", time.perf_counter())] if "GPUHOOK_STAGES" in os.environ else None
    inv = parse_args(args)
    from ..config import config_path, find_runtime, is_front, load

    config, config_errors = load()
    stage("config")
    real = find_runtime(config.runtime)
    if real is None:
        _runtime_error(
            inv,
            f"no real OCI runtime: {config.runtime or 'runc or crun'} not found (set `runtime` in {config_path()})",
        )
        sys.exit(127)
    if is_front(real):
        _runtime_error(inv, f"the real OCI runtime {real} is gpuhook-runtime itself (set `runtime` in {config_path()})")
        sys.exit(127)
    if inv.command in EDITING_COMMANDS:
        out = Outcome()
        try:
            edit_bundle(inv.bundle, config, out)
        except Exception as e:  # fail open unless the node says otherwise
            out.decision = "error"
            out.error = f"{type(e).__name__}: {e}" if not isinstance(e, (ValueError, OSError)) else str(e)
        record_exec_env(inv, out, real)
        stage("exec record")
        if config_errors:
            out.warnings = config_errors + out.warnings
        log_line(config, inv, out, started)
        if out.error and config.fail_mode == "closed":
            _runtime_error(inv, f"GPU injection failed ({out.error}); fail_mode is closed")
            sys.exit(1)
    elif inv.command == "exec":
        args = exec_env(inv, args, real, config)
    elif inv.command == "delete":
        delete_and_forget(inv, args, real)
    return [real] + args


def main(argv: list[str] | None = None) -> None:
    args = prepare(list(sys.argv[1:] if argv is None else argv))
    try:
        os.execv(args[0], args)
    except OSError as e:  # e.g. a script whose interpreter is missing, a noexec mount
        _runtime_error(parse_args(args[1:]), f"cannot run the real OCI runtime {args[0]}: {e.strerror or e}")
        sys.exit(127)
