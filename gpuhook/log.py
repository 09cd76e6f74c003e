"""Structured logs: one event vocabulary for the runtime's per-create line, the agent and the CLI.

Every record is one JSON object per line with `time` (ISO-8601 UTC, milliseconds, "Z") and
`event` (the event's name) first, then the event's own keys. The keys are shared:

    front, container_id, bundle, decision, vendors, nodes, mounts,
    hooks                                                          (event "create": logline.CreateRecord,
                                                                    the one record of every front:
                                                                    "wrapper", "nri", "precreate")
    container_id, kind, outcome, error                             (gpuhook-hook: event "hook",
                                                                    only when it could not work)
    pod_namespace, pod_name, pod_uid, container_name               (create, when the CRI says)
    held_back, reason                                              (create: GPUs held back, why none)
    devices, driver_version, added, removed, labels, files, kind,
    reason, source, error, warnings, duration_ms                   (agent and CLI)

On a terminal the same records are printed by structlog's console renderer instead.
structlog is imported only by configure(): a create's line is written by its front (the
create core's record, gpuhook/logline.py, with utc_now, the one time format), which never
imports this module.
"""

import os
import sys

from . import defaults
from .logline import UNNAMED_FRONT, utc_now  # the node log's time format

_configured = False

DEFAULT_RUNTIME_LOG = defaults.LOG_FILE


def _stamp(logger, method, event_dict: dict) -> dict:
    """time and event first, level after them, then the event's own keys."""
    event = event_dict.pop("event", None)
    out = {"time": utc_now(), "event": event, "level": method if method != "msg" else "info"}
    if out["level"] in ("info",):
        del out["level"]  # info is the normal case, as in the runtime's lines
    out.update(event_dict)
    return out


def configure(stream=None, fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog once for this process: JSON lines on `stream` (default stderr),
    or the console renderer when fmt is "console" (or "auto" and the stream is a TTY)."""
    global _configured
    import json
    import logging

    import structlog

    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(timestamp_key="time", colors=_colors(stream))
    else:
        renderer = structlog.processors.JSONRenderer(
            serializer=lambda o, **kw: json.dumps(  # type: ignore[assignment]
                o, separators=(",", ":"), default=str, ensure_ascii=False
            )
        )
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.format_exc_info, _stamp, renderer],  # type: ignore[list-item]
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    _configured = True


def _colors(stream) -> bool:
    return not os.environ.get("NO_COLOR") and getattr(stream, "isatty", lambda: False)()


def get(**context):
    """A bound logger; configures JSON lines on stderr first if nobody did."""
    import structlog

    if not _configured:
        configure()
    return structlog.get_logger().bind(**context) if context else structlog.get_logger()


# -- the runtime's log file: `gpuhook log` ---------------------------------------------


def tail_records(path: str, n: int, event: str | None = "create", max_bytes: int = 64 << 20) -> tuple[list[dict], int]:
    """The last `n` records of a JSON-lines log (of `event`, when given), reading backwards
    from the end. Torn, partial or garbage lines are skipped and counted. A create record gets
    `hook_errors` ([{kind, outcome, error}]) from the hook lines of its container that follow
    it (gpuhook-hook writes one when ldconfig timed out, failed or was refused: the create's
    line, written before the hook ran, says "injected" all the same), or come just before it
    (the NRI plugin writes its line once the runtime made the container, after the hook).
    Returns (records oldest first, lines skipped)."""
    from .hook import EVENT as HOOK_EVENT

    out: list[dict] = []
    pending: dict = {}  # container id -> the hook lines after its create (read backwards: first)
    shown: dict = {}  # container id -> its NRI create record (a hook line before it is its: NRI writes it after)
    skipped = 0
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        pos = f.tell()
        tail = b""
        read = 0
        while pos > 0 and len(out) < n and read < max_bytes:
            step = min(65536, pos)
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            read += step
            lines = (chunk + tail).split(b"\n")
            tail = lines[0] if pos > 0 else b""  # the first piece may be cut: keep it for the next block
            body = lines[1:] if pos > 0 else lines
            for raw in reversed(body):
                if len(out) >= n:
                    break
                rec, bad = parse_line(raw)
                skipped += bad
                if rec is None:
                    continue
                cid = rec.get("container_id")
                if event == "create" and rec.get("event") == HOOK_EVENT and isinstance(cid, str):
                    hook = {k: rec.get(k) for k in ("kind", "outcome", "error")}
                    if cid in shown:  # before its create line: the NRI plugin's, written once confirmed
                        shown[cid].setdefault("hook_errors", []).insert(0, hook)
                    elif len(pending) < 4096:
                        pending.setdefault(cid, []).insert(0, hook)
                elif event is None or rec.get("event") == event:
                    if event == "create" and isinstance(cid, str):
                        if cid in pending:
                            rec["hook_errors"] = pending.pop(cid)
                        if rec.get("front") == "nri" and len(shown) < 4096:
                            shown[cid] = rec
                    out.append(rec)
    out.reverse()
    return out, skipped


# How every node log line begins (each writer puts "time" first: create.log_line, the NRI
# plugin's, the front's NO_GPU_LINE, gpuhook-hook's): where a line glued onto a damaged one
# starts. Inside a JSON string a quote is escaped, so these bytes begin a record or nothing.
LINE_START = b'{"time":'


def parse_line(raw: bytes) -> tuple[dict | None, int]:
    """A node log line's record, and 1 when the line was damaged (0 when not; a blank line is
    no record and no damage). A line that does not parse, such as a half line an older writer
    left on a full disk with the next line appended to it, is damaged; the whole record that
    follows the damage in it is kept (the longest end of it that parses from a LINE_START)."""
    import json

    raw = raw.strip()
    if not raw:
        return None, 0
    rec = _record(raw, json)
    if rec is not None:
        return rec, 0
    at = raw.find(LINE_START, 1)
    while at > 0:
        rec = _record(raw[at:], json)
        if rec is not None:
            return rec, 1
        at = raw.find(LINE_START, at + 1)
    return None, 1


def _record(raw: bytes, json) -> dict | None:
    try:
        rec = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def _short(value, width: int) -> str:
    s = "-" if value in (None, "", []) else str(value)
    return s if len(s) <= width else s[: width - 1] + "…"


def pod_column(r: dict) -> str:
    """namespace/name:container of a create record; "-" for a container outside Kubernetes."""
    ns, name, ctr = (r.get(k) for k in ("pod_namespace", "pod_name", "container_name"))
    if not name:
        return "-"
    return f"{ns or '?'}/{name}" + (f":{ctr}" if ctr else "")


def front_of(record: dict) -> str:
    """Which front made a create: its "front" ("wrapper", "nri", "precreate"); a line of an
    older gpuhook without one is the wrapper's."""
    front = record.get("front")
    return front if isinstance(front, str) and front else UNNAMED_FRONT


def format_records(records: list[dict], wide: bool = False) -> str:
    """A readable table of the runtime's create records (for the NRI plugin's late, missed
    and unconfirmed creates, the ERROR column says why the container has no GPU)."""
    from .logline import LATE, MISSED, UNCONFIRMED

    not_given = (LATE, MISSED, UNCONFIRMED)
    if not records:
        return "No container creates in the log."
    from .logline import CreateRecord

    rows = [("TIME", "CONTAINER", "POD", "FRONT", "DECISION", "VENDORS", "NODES", "MOUNTS", "MS", "ERROR")]
    for r in records:
        c = CreateRecord.read({**r, "event": "create"}) or CreateRecord()  # the create's line, typed
        cid = c.container_id or "-"
        pod = pod_column(r)
        decision = c.decision or "-"
        error = c.error
        if decision in not_given:  # the NRI plugin's: the runtime made it without its GPUs, why
            error = c.reason
        hooks = [h for h in r.get("hook_errors") or [] if isinstance(h, dict)]
        if hooks:  # the create said "injected", but a hook could not do its work
            decision += " (" + ", ".join(f"{h.get('kind')} {h.get('outcome')}" for h in hooks) + ")"
            error = "; ".join(([str(error)] if error else []) + [str(h.get("error")) for h in hooks])
        rows.append(
            (
                c.time or "-",
                cid if wide else _short(cid, 16),
                pod if wide else _short(pod, 48),
                c.front,
                decision,
                ",".join(c.vendors) or "-",
                str(len(c.nodes)),
                str(len(c.mounts)),
                _short(c.duration_ms, 8),
                _short(error, 200 if wide else 60),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in rows)
