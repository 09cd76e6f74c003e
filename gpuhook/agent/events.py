"""What a node log record means for its pod: the pure mapping from a create's line (or a hook
line, with its container's pod) to one core/v1 Event (reason, type, message) and the value of
the pod's gpuhook.dev/accelerator label. No API work here: PodReporter (podevents.py) posts it.

- GPUsInjected: vendor, count, device ids (and how many were held back);
- RanOnCPU: why (CPU-only node, gpuhook.dev/inject "false", every GPU held back, a gpuhook
  error); a Warning when the NRI plugin's line says the runtime made the container without
  its adjustment, "late", or while it was not registered, "missed";
- GPUsUnconfirmed: a Warning, no label: the runtime never said what it made, "unconfirmed";
- a hook line (decision HOOK_DECISION): LdCacheNotUpdated, GPUHookFailed for another hook.
"""

from __future__ import annotations

from ..nri.plugin import LATE as NRI_LATE, MISSED as NRI_MISSED, UNCONFIRMED as NRI_UNCONFIRMED
from ..vendors import CPU

MAX_IDS = 16  # device ids named in one message
HOOK_DECISION = "hook-failed"  # a hook line, as PodReporter hands it to event_for
# the NRI plugin's decisions that the runtime's word made (nri/plugin.py): no GPU is claimed
NRI_NOT_GIVEN = (NRI_LATE, NRI_MISSED, NRI_UNCONFIRMED)


def why_of(rec: dict) -> str:
    return str(rec.get("reason") or "no GPU was given")[:300]


def event_for(rec: dict) -> tuple[str, str, str, str | None] | None:
    """(reason, type, message, accelerator label value: None to leave it) for a create's line
    (read as the typed logline.CreateRecord) or a hook line with its pod, decision
    HOOK_DECISION; None when it is not about a container of a pod (sandbox, no pod in the line)."""
    from ..inject import DECLINED, ERROR, INJECTED, NO_GPU
    from ..logline import NRI, CreateRecord

    if rec.get("decision") == HOOK_DECISION:
        return _hook_event(rec)
    r = CreateRecord.read(rec)
    if r is None or r.decision not in (INJECTED, NO_GPU, DECLINED, ERROR, "unchanged", *NRI_NOT_GIVEN):
        return None
    where = _where(r.container_name, r.front == NRI)
    decision = r.decision
    if decision == INJECTED:
        vendors, ids = list(r.vendors), list(r.devices)
        if vendors:
            per = ", ".join(f"{v} x{sum(1 for d in ids if d.startswith(v + ':'))}" for v in vendors)
            shown = ", ".join(ids[:MAX_IDS]) + (f" (+{len(ids) - MAX_IDS})" if len(ids) > MAX_IDS else "")
            msg = (
                f"{where} got {len(ids)} GPU device(s): {per}: {shown}"
                if ids
                else f"{where} got GPUs: {', '.join(vendors)}"
            )  # a line of a gpuhook before device ids
            if r.held_back:
                msg += f"; {len(r.held_back)} held back (allocated by the kubelet to other pods)"
            return "GPUsInjected", "Normal", msg, vendors[0]
        return "RanOnCPU", "Normal", f"{where} got GPU driver files but no GPU device", CPU
    if decision == NRI_UNCONFIRMED:  # the plugin answered; the runtime never said what it made: no claim
        msg = f"{where}: gpuhook's NRI plugin gave it GPUs, but the runtime never confirmed it got them ({why_of(rec)})"
        return "GPUsUnconfirmed", "Warning", msg, None
    if decision in NRI_NOT_GIVEN:  # late, missed: the runtime made it without gpuhook's adjustment
        return "RanOnCPU", "Warning", f"{where} runs without a GPU: {why_of(rec)}", CPU
    if decision == NO_GPU:
        why = "CPU-only node"
    elif decision == ERROR:
        why = f"gpuhook failed ({(r.error or 'unknown error')[:300]}); it started without GPUs"
    else:
        why = r.reason or "no GPU was given"
    return "RanOnCPU", ("Warning" if decision == ERROR else "Normal"), f"{where} runs without a GPU: {why}", CPU


def _where(container_name, through_nri: bool) -> str:
    where = f"container {container_name}" if isinstance(container_name, str) and container_name else "a container"
    return where + " (through NRI)" if through_nri else where  # the NRI plugin's create; the wrapper's say nothing


def _hook_event(rec: dict) -> tuple[str, str, str, str | None]:
    """A hook line's Event (with its container's pod): the label stays as the create set it."""
    from ..hook import DESCRIPTION, LDCACHE
    from ..logline import NRI

    where = _where(rec.get("container_name"), rec.get("front") == NRI)
    kind = rec.get("kind")
    what = DESCRIPTION.get(kind, "a gpuhook hook") if isinstance(kind, str) else "a gpuhook hook"
    msg = f"{where}: {what} {str(rec.get('outcome') or 'failed')[:16]}: {str(rec.get('error') or '')[:300]}"
    return ("LdCacheNotUpdated" if kind == LDCACHE else "GPUHookFailed"), "Warning", msg, None
