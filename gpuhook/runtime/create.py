"""The create path, in steps: read <bundle>/config.json -> probe -> plan -> apply -> write it
atomically -> the exec record -> one JSON log line.

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
from .logline import MAX_ERROR, line_bytes, runtime_error, utc_now

MAX_SPEC_BYTES = 16 << 20


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


def planned(inventory, request, config, out: "Outcome"):
    """The Plan for this request on this node (plan.plan: the one call of it); its warnings
    added to out's, those given before a failure too."""
    from ..config import cache_dir
    from ..plan import WARNINGS_SO_FAR, plan
    from ..probe import nodestate

    try:
        p = plan(inventory, nodestate.read(inventory, config, cache_dir()), request, config)
    except Exception as e:
        out.warnings += getattr(e, WARNINGS_SO_FAR, ())
        raise
    out.warnings += p.warnings
    return p


def edit_bundle(bundle: str, config, out: Outcome, call: Call) -> None:
    """Edit <bundle>/config.json in place (atomically); leave it untouched when there is
    nothing to add. Raises on any problem; the caller applies the fail mode."""
    from .. import fastjson
    from ..config import cache_dir
    from ..plan import request_from_spec
    from ..plan.policy import pod_of
    from ..probe.cache import probe_cached
    from ..spec import apply, write_atomic

    path = os.path.join(bundle, "config.json")
    raw, mode = read_spec(path)
    call.stage("imported+read")
    spec = parse_spec(raw)
    request = request_from_spec(spec, bundle)
    out.pod = pod_of(request.annotations)
    if request.is_sandbox:
        out.decision = "sandbox"
        return
    call.stage("parsed")
    inventory = probe_cached(config.host_root, cache_dir(), config.probe_cache_ttl, config.nvidia_driver_root)
    call.stage("probed")
    out.warnings = list(inventory.warnings)
    out.plan = planned(inventory, request, config, out)
    edits = out.plan.edits
    call.stage("planned")
    if not edits:
        out.decision = "no-gpu" if not inventory.vendors else "declined"
        return
    spec = apply(spec, edits)
    call.stage("applied")
    call.still_awaited()
    write_atomic(path, fastjson.dumps(spec).encode(), mode, sync_dir=False)
    call.stage("written")
    out.decision = "injected"
    out.env = list(edits.env)
    out.vendors = list(out.plan.vendors)
    out.nodes = [n.path for n in edits.device_nodes]
    out.mounts = [m.container_path for m in edits.mounts]
    out.hooks = len(edits.hooks)


def log_line(config, inv: Invocation, out: Outcome, call: Call) -> "tuple[str, bytes] | None":
    """The create's log line, (the log file, the line); None when the node logs nothing."""
    if not config.log_file:
        return None
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
        "duration_ms": round((time.monotonic() - call.started) * 1000, 2),
    }
    if call.in_server:
        record["runtime_server"] = True
    if out.plan is not None and out.plan.devices:
        record["devices"] = list(out.plan.devices[:256])
    if out.plan is not None and out.plan.held_back:
        record["held_back"] = [h.device for h in out.plan.held_back[:64]]
    if out.plan is not None and out.plan.reason:
        record["reason"] = out.plan.reason
    # bounded: a warning may quote a pod's annotation, which can be a megabyte
    if out.error:
        record["error"] = out.error[:MAX_ERROR]
    if out.warnings:
        record["warnings"] = [str(w)[:500] for w in out.warnings[:20]]
    if call.stages:
        call.stage("logged")
        t0 = call.stages[0][1]
        record["stages_ms"] = {name: round((t - t0) * 1000, 3) for name, t in call.stages}
    return config.log_file, line_bytes(fastjson.dumps(record))


def record_exec_env(inv: Invocation, out: Outcome, real: str, call: Call) -> None:
    """After a create: what exec will add (exec.py); a warning, never a failure."""
    from ..config import cache_dir
    from . import exec as execpath

    pwd = execpath.pwd_for(inv, call)
    try:
        path = execpath.record_path(cache_dir(), inv.root, inv.container_id, real, pwd)
        if path is None:
            if out.env:
                out.warnings.append(
                    "exec will not see the GPUHOOK_* env: the runtime root or container id "
                    "is not one the exec record can be keyed by"
                )
            return
        if execpath.state_exists(inv.root, inv.container_id, real, pwd):
            return  # that id is taken: the runtime refuses this create, the record is the running container's
        # `run` in the foreground: the runtime removes the container itself, no `delete` comes,
        # so no record (it would outlive the container)
        if out.decision == "injected" and out.env and (inv.command == "create" or inv.detach):
            execpath.write_record(path, out.env, inv.bundle, execpath.config_identity(inv.bundle))
            execpath.sweep(path, inv.root, real, pwd)  # those of containers gone: `delete` is the runtime's alone
        else:
            execpath.remove_record(path)
    except (OSError, ValueError) as e:
        out.warnings.append(f"exec env record: {e}")


def create_call(inv: Invocation, argv: list[str], real: str, config, config_errors: list[str], call: Call) -> Answer:
    """One create or run, all its steps: the Answer execs the real runtime with argv, or
    (fail_mode closed, after a failure) exits 1."""
    out = Outcome()
    try:
        edit_bundle(inv.bundle, config, out, call)
    except Exception as e:  # fail open unless the node says otherwise
        out.decision = "error"
        out.error = f"{type(e).__name__}: {e}" if not isinstance(e, (ValueError, OSError)) else str(e)
    record_exec_env(inv, out, real, call)
    call.stage("exec record")
    if config_errors:
        out.warnings = config_errors + out.warnings
    log = log_line(config, inv, out, call)
    if out.error and config.fail_mode == "closed":
        said = runtime_error(inv, call, f"GPU injection failed ({out.error}); fail_mode is closed")
        return Answer(status=1, said=said, log=log)
    return Answer([real] + argv, log=log)
