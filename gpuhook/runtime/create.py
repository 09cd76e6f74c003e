"""The wrapper's create, an adapter around the create core (inject.py): read
<bundle>/config.json -> the core's Decision (probe, plan) -> apply its edits -> write it
atomically -> the exec record -> the core's log record, as one JSON line.

Everything one create needs comes in as arguments: the node config, the invocation (args.py)
and the call (args.Call: the caller's environment, directory, deadline and stage timings).
A failure anywhere in gpuhook is logged and the container starts unmodified (fail_mode =
"open", the default); with fail_mode = "closed" the create fails with one clear line. The
log line is returned in the Answer, never written here: whoever answers writes it (the
fresh interpreter at once, the runtime server's caller, the front, once it has the answer).
"""

import os
import time

from .args import Answer, Call, Invocation
from ..logline import line_bytes
from .logline import runtime_error

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from ..inject import Decision

MAX_SPEC_BYTES = 16 << 20


def read_spec(path: str) -> tuple[bytes, int]:
    """<bundle>/config.json's bytes (never through a link, never a FIFO's hang, at most
    MAX_SPEC_BYTES) and its permission bits. Raises ValueError or OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            raise ValueError("config.json is not a regular file")
        if st.st_size > MAX_SPEC_BYTES:
            raise ValueError(f"config.json is {st.st_size} bytes, over the {MAX_SPEC_BYTES} limit")
        return os.read(fd, MAX_SPEC_BYTES + 1), st.st_mode & 0o7777
    finally:
        os.close(fd)


def parse_spec(raw: bytes) -> dict:
    """config.json's JSON object, of the types runc reads (spec.check). Raises ValueError."""
    from .. import fastjson
    from ..spec import check

    try:
        spec = fastjson.loads(raw)
    except ValueError as e:
        raise ValueError(f"config.json is not valid JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError("config.json is not a JSON object")
    check(spec)  # a field of a type runc refuses is left to runc: never read otherwise than runc reads it
    return spec


def edit_bundle(bundle: str, config, config_errors, call: Call) -> "Decision":
    """The create core's Decision for <bundle>/config.json, its edits written into it in place
    (atomically); the file untouched when there is nothing to add. A failure of the front's
    own steps (the read, the write) is the Decision's error, as the core's own are."""
    from .. import fastjson, inject
    from ..fsutil import write_atomic
    from ..plan import request_from_spec
    from ..spec import apply

    path = os.path.join(bundle, "config.json")
    decision = None
    try:
        raw, mode = read_spec(path)
        call.stage("imported+read")
        spec = parse_spec(raw)
        decision = inject.decide(request_from_spec(spec, bundle), config, config_errors, stage=call.stage)
        edits = decision.edits
        if edits:
            spec = apply(spec, edits)
            call.stage("applied")
            call.still_awaited()
            write_atomic(path, fastjson.dumps(spec).encode(), mode, sync_dir=False)
            call.stage("written")
        return decision
    except Exception as e:  # fail open unless the node says otherwise
        return inject.failed(e, decision, config_errors)


def log_line(config, inv: Invocation, decision: "Decision", call: Call) -> "tuple[str, bytes] | None":
    """The create's log line, (the log file, the line); None when the node logs nothing."""
    if not config.log_file:
        return None
    from .. import fastjson, inject
    from ..logline import WRAPPER

    stages = None
    if call.stages:
        call.stage("logged")
        t0 = call.stages[0][1]
        stages = {name: round((t - t0) * 1000, 3) for name, t in call.stages}
    rec = inject.record(
        decision,
        WRAPPER,
        inv.container_id,
        (time.monotonic() - call.started) * 1000,
        bundle=inv.bundle,
        runtime_server=call.in_server,
        stages_ms=stages,
    )
    return config.log_file, line_bytes(fastjson.dumps(rec.to_line()))


def record_exec_env(inv: Invocation, decision: "Decision", real: str, call: Call) -> "list[str]":
    """After a create: what exec will add (exec.py); its warnings, never a failure."""
    from ..config import cache_dir
    from . import exec as execpath

    edits = decision.edits
    env = list(edits.env) if edits else []
    pwd = execpath.pwd_for(inv, call)
    try:
        path = execpath.record_path(cache_dir(), inv.root, inv.container_id, real, pwd)
        if path is None:
            if env:
                return [
                    "exec will not see the GPUHOOK_* env: the runtime root or container id "
                    "is not one the exec record can be keyed by"
                ]
            return []
        if execpath.state_exists(inv.root, inv.container_id, real, pwd):
            return []  # that id is taken: the runtime refuses this create, the record is the running container's
        # `run` in the foreground: the runtime removes the container itself, no `delete` comes,
        # so no record (it would outlive the container)
        if env and (inv.command == "create" or inv.detach):
            execpath.write_record(path, env, inv.bundle, execpath.config_identity(inv.bundle))
            execpath.sweep(path, inv.root, real, pwd)  # those of containers gone: `delete` is the runtime's alone
        else:
            execpath.remove_record(path)
    except (OSError, ValueError) as e:
        return [f"exec env record: {e}"]
    return []


def create_call(inv: Invocation, argv: list[str], real: str, config, config_errors: list[str], call: Call) -> Answer:
    """One create or run, all its steps: the Answer execs the real runtime with argv, or
    (fail_mode closed, after a failure) exits 1."""
    decision = edit_bundle(inv.bundle, config, config_errors, call)
    decision = decision.warned(*record_exec_env(inv, decision, real, call))
    call.stage("exec record")
    log = log_line(config, inv, decision, call)
    if decision.error and config.fail_mode == "closed":
        said = runtime_error(inv, call, f"GPU injection failed ({decision.error}); fail_mode is closed")
        return Answer(status=1, said=said, log=log)
    return Answer([real] + argv, log=log)
