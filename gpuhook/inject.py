"""The one create core: what every front (the wrapper, podman's precreate hook, the NRI plugin)
decides for a container, and the one log record of it.

    decide(request, config, config_errors) -> Decision     probe -> plan, never raises
    failed(error, decision) -> Decision                    a front's own step failed
    record(decision, front, ...) -> logline.CreateRecord   the create's line, naming its front

A front is an adapter around these: it reads its input into a plan.Request (request_from_spec
for a spec, request_from_nri for NRI's container), says the Decision's edits its own way (a
config.json rewritten, a spec on stdout, a ContainerAdjustment), and logs the record. No front
loads the config on its own terms, plans or builds a log record by itself, so every front says
the same of the same container: its warnings start with the node config's errors, its line
names the GPUs held back.

On the per-create path: the planner and the probe cache are imported when a create needs them.
"""

from .logline import CreateRecord, utc_now
from .record import Record

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from .plan import Plan

# a Decision's decision
INJECTED = "injected"  # edits were added (the front says so only once they are in place)
NO_GPU = "no-gpu"  # the node has no GPU gpuhook knows
DECLINED = "declined"  # the node has GPUs; the container gets none (the plan's reason says why)
SANDBOX = "sandbox"  # a pod's sandbox (pause) container: never touched
ERROR = "error"  # gpuhook failed; the container starts unmodified (fail_mode open)


class Decision(Record):
    """What the create core decided for one container: decision (above), the pod it belongs to
    (plan.policy.pod_of's keys; {} outside Kubernetes), the Plan (None before one was made),
    the warnings (the node config's errors first, then the probe's and the plan's, then the
    front's own), the error when decision is ERROR, and the device paths and mount
    destinations the container had already (no front adds them again)."""

    decision: str
    pod: "dict" = {}
    plan: "Plan | None" = None
    warnings: "tuple[str, ...]" = ()
    error: "str | None" = None
    had_nodes: "tuple[str, ...]" = ()
    had_mounts: "tuple[str, ...]" = ()

    __slots__ = ()

    @property
    def edits(self):
        """The edits to add (plan.edits), None when there are none to add."""
        return self.plan.edits if self.plan is not None and self.decision == INJECTED else None

    @property
    def held_back(self) -> "tuple[str, ...]":
        """The vendor:id of each device held back for other pods (allocated by the kubelet)."""
        return tuple(h.device for h in self.plan.held_back) if self.plan is not None else ()

    def warned(self, *more: str) -> "Decision":
        """This Decision with the front's own warnings after its others."""
        return self._replace(warnings=self.warnings + tuple(more)) if more else self


def error_text(e: BaseException) -> str:
    """A failure as the log says it: an OSError's or ValueError's own words (they name the file
    or the field), any other exception with its type in front."""
    return str(e) if isinstance(e, (ValueError, OSError)) else f"{type(e).__name__}: {e}"


def failed(e: BaseException, decision: "Decision | None" = None, config_errors=()) -> Decision:
    """decision (what was decided before a front's own step failed: the pod, the plan and the
    warnings stay) turned into an ERROR by e; without one (the front failed before the core
    decided), an ERROR with the node config's errors as its warnings."""
    if decision is None:
        return Decision(ERROR, warnings=tuple(config_errors), error=error_text(e))
    return decision._replace(decision=ERROR, error=error_text(e))


def decide(request, config, config_errors=(), probe=None, stage=None, remember: bool = True) -> Decision:
    """The Decision for `request` (plan.Request) on this node: its pod, then (no sandbox) the
    node's probe (probe(), when the front probes the node its own way; else the probe cache),
    then the plan. Never raises: a failure is an ERROR Decision with the warnings given before it.
    stage(name), when given, is called after each step (the wrapper's GPUHOOK_STAGES);
    remember=False: a check, not a create (the max-gpus round robin's memory is not touched)."""
    from .plan.policy import pod_of

    warnings = tuple(config_errors)
    pod: dict = {}
    try:
        pod = pod_of(request.annotations)
        if request.is_sandbox:
            return Decision(SANDBOX, pod, warnings=warnings)
        had = (tuple(request.spec_devices or ()), tuple(request.mounts))
        if stage:
            stage("parsed")
        if probe is not None:
            inventory = probe()
        else:
            from .config import cache_dir
            from .probe.cache import probe_cached

            inventory = probe_cached(config.host_root, cache_dir(), config.probe_cache_ttl, config.nvidia_driver_root)
        if stage:
            stage("probed")
        warnings += tuple(inventory.warnings)
        planned = _plan(inventory, request, config, remember)
    except Exception as e:
        from .plan import WARNINGS_SO_FAR

        return Decision(ERROR, pod, warnings=warnings + tuple(getattr(e, WARNINGS_SO_FAR, ())), error=error_text(e))
    if stage:
        stage("planned")
    warnings += planned.warnings
    if planned.edits:
        decision = INJECTED
    else:
        decision = NO_GPU if not inventory.vendors else DECLINED
    return Decision(decision, pod, planned, warnings, None, *had)


def _plan(inventory, request, config, remember: bool):
    """The node's state read (probe/nodestate.py: only what the config asks for), then the
    pure plan over it; remember=False: the round robin's memory is neither read nor written."""
    from .config import cache_dir
    from .plan import plan
    from .probe import nodestate

    return plan(inventory, nodestate.read(inventory, config, cache_dir() if remember else None), request, config)


def record(
    decision: Decision,
    front: str,
    container_id: "str | None",
    duration_ms: float,
    bundle: "str | None" = None,
    runtime_server: bool = False,
    stages_ms: "dict | None" = None,
) -> CreateRecord:
    """The create's log record: what `decision` says, made by `front` (logline.WRAPPER, NRI,
    PRECREATE) for the container `container_id`. What was added (vendors, hooks, the nodes
    and mounts the container did not have already, as every front leaves those alone) only
    when it was (INJECTED); the devices and those held back whenever a plan said them."""
    p = decision.plan
    edits = decision.edits
    return CreateRecord(
        time=utc_now(),
        front=front,
        container_id=container_id,
        bundle=bundle,
        **decision.pod,
        decision=decision.decision,
        vendors=tuple(p.vendors) if edits and p is not None else (),
        nodes=_new(decision.had_nodes, (n.path for n in edits.device_nodes)) if edits else (),
        mounts=_new(decision.had_mounts, (m.container_path for m in edits.mounts)) if edits else (),
        hooks=len(edits.hooks) if edits else 0,
        duration_ms=round(duration_ms, 2),
        runtime_server=runtime_server,
        devices=tuple(p.devices) if p is not None else (),
        held_back=decision.held_back,
        reason=p.reason if p is not None else None,
        error=decision.error,
        warnings=decision.warnings,
        stages_ms=stages_ms,
    )


def _new(had: "tuple[str, ...]", names) -> "tuple[str, ...]":
    """names, in order, less those in had and those named before."""
    seen = set(had)
    out = []
    for name in names:
        if name not in seen:
            seen.add(name)
            out.append(name)
    return tuple(out)
