"""The node log's lines, the base layer every front writes and reads them with: the time
format, one whole line per write, the bounds of what a line carries, and the create's
record (CreateRecord), the one shape of a create's line whichever front made it.

Stdlib and record.py only: on the path of every container create.
"""

import os
import time

from .record import Record

# The log time (UTC), printf-style, as the front writes it too (gen_header): year, month, day,
# hour, minute, second, then (TIME_FORMAT) the milliseconds; TIME_FORMAT_S, whole seconds.
_DATE_TIME = "%04d-%02d-%02dT%02d:%02d:%02d"
TIME_FORMAT = _DATE_TIME + ".%03dZ"
TIME_FORMAT_S = _DATE_TIME + "Z"
# a log file's mode when a line creates it (the front's too)
LOG_MODE = 0o640
# A node log line that could not be written (printf-style: the log file, why), said once per
# process (the fronts and gpuhook-hook say it too); SHORT_WRITE, why, for a line of which only
# part fit (the bytes written, the line's). LOST: how many lines this process could not write.
CANNOT_WRITE_LOG = "cannot write the node log %s: %s (said once by this process)"
SHORT_WRITE = "only %d of the line's %d bytes fit"
LOST = 0

# The bounds of a line, whatever a pod's input made of it (SECURITY.md: a warning may quote a
# pod's annotation, which can be a megabyte): the most characters of an error (the create's,
# the exec's, gpuhook-hook's own), the most warnings and characters of each, the most device
# ids given and held back.
MAX_ERROR = 1000
MAX_WARNINGS = 20
MAX_WARNING = 500
MAX_DEVICES = 256
MAX_HELD_BACK = 64

CREATE = "create"  # a create's line's event
# the fronts a create's line names (its "front")
WRAPPER = "wrapper"  # gpuhook-runtime, its C front's own no-GPU line included
NRI = "nri"  # `gpuhook nri`
PRECREATE = "precreate"  # `gpuhook precreate`, podman's hook
# the NRI plugin's create decisions that only the runtime's word makes: the container has no
# GPU of gpuhook's (the agent claims none for them)
LATE, MISSED, UNCONFIRMED = "late", "missed", "unconfirmed"
# what a line read back says of who made it, when it names no front (a gpuhook before fronts
# were named: the wrapper's)
UNNAMED_FRONT = WRAPPER


def utc_now(ms: bool = True, t: float | None = None) -> str:
    """2026-11-29T19:40:49.577Z, the log time format of the runtime and of gpuhook.log (ms=False:
    whole seconds)."""
    t = time.time() if t is None else t
    g = time.gmtime(t)
    date_time = (g.tm_year, g.tm_mon, g.tm_mday, g.tm_hour, g.tm_min, g.tm_sec)
    return TIME_FORMAT % (*date_time, int(t * 1000) % 1000) if ms else TIME_FORMAT_S % date_time


def line_bytes(line: str) -> bytes:
    """A log line as append_line writes it: one line, its newline at the end, UTF-8."""
    return (line.replace("\n", " ") + "\n").encode("utf-8", "replace")


def append_line(path: str, line: str | bytes, mode: int = LOG_MODE, exact: bool = False) -> str | None:
    """One write(2) of a whole line with O_APPEND: concurrent writers never interleave. A
    str is made one line (line_bytes); bytes are written as they are. mode: a new file's,
    less this process's umask; exact: mode itself (a file for a caller, whose umask is in
    mode: the server's own umask is not the caller's), set on the file this call created.
    None when the line is in the file whole; else why not (one line), and nothing of it is
    left for the next line to join (undo_short_write)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    data = line if isinstance(line, bytes) else line_bytes(line)
    created = False
    try:
        if not exact:
            fd = os.open(path, flags | os.O_CREAT, mode)
        else:
            try:
                fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
            except FileExistsError:
                fd = os.open(path, flags)
    except OSError as e:
        return e.strerror or str(e)
    try:
        if created:
            os.fchmod(fd, mode)
        written = os.write(fd, data)
        if written < len(data):
            undo_short_write(fd, written)
            return SHORT_WRITE % (written, len(data))
        return None
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(fd)


def undo_short_write(fd: int, written: int) -> None:
    """Leave no part of a line that did not fit (a full disk wrote `written` bytes of it, the
    last in the file an O_APPEND `fd` wrote): those bytes, which are this writer's alone, are
    overwritten in place with spaces and a newline, a blank line that every reader skips.
    Truncating the file back instead would cut a line another writer (the wrapper's front or
    Python, the NRI plugin, gpuhook-hook: none takes a lock) appended after it meanwhile; an
    overwrite touches no byte but ours, and needs no new space. Only where the overwrite fails
    too (a copy-on-write file system that is full) is the file truncated back, and only while
    it still ends with our bytes. The C writers do the same (logline.h: log_undo)."""
    import fcntl

    try:
        end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: just after the bytes this write put there
        if written <= 0 or end < written:
            return
        start = end - written
        # pwrite on an O_APPEND file appends (Linux): the flag off on this open file first
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
        try:
            if os.pwrite(fd, b" " * (written - 1) + b"\n", start) == written:
                return
        except OSError:
            pass
        if os.fstat(fd).st_size == end:
            os.ftruncate(fd, start)
    except OSError:
        pass


def append_node_log(path: str, line: str | bytes, say=None) -> bool:
    """A line of the node log (append_line): True when it is there. A line that is not is
    counted (LOST) and, the first time in this process, said (CANNOT_WRITE_LOG) with `say`,
    else on stderr: the NRI plugin lives long, and a full disk would otherwise
    fill its own log with one line per create."""
    global LOST
    why = append_line(path, line)
    if why is None:
        return True
    LOST += 1
    if LOST == 1:
        msg = CANNOT_WRITE_LOG % (path, why)
        if say is not None:
            say(msg)
        else:
            import sys

            try:
                sys.stderr.write("gpuhook: " + msg + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
    return False


def bounded_error(error: "str | None") -> "str | None":
    return None if error is None else str(error)[:MAX_ERROR]


def bounded_warnings(warnings) -> "tuple[str, ...]":
    return tuple(str(w)[:MAX_WARNING] for w in list(warnings)[:MAX_WARNINGS])


# the pod's keys of a create's line, in the line's order: CreateRecord's fields of these names,
# and the fields plan.policy.pod_of fills from each runtime's annotations (a test holds them equal)
POD_KEYS = ("pod_namespace", "pod_name", "pod_uid", "container_name")


class CreateRecord(Record):
    """One create's line in the node log, from whichever front made it (the wrapper, the NRI
    plugin, podman's precreate hook: `front`). Every front's line has the same keys for the
    same container: what one create core (inject.py) decided. `what` fields (vendors, nodes,
    mounts, hooks) say what was added; the pod's fields are None outside Kubernetes;
    bundle is None where the front has none (NRI)."""

    time: str = ""
    front: str = UNNAMED_FRONT
    container_id: "str | None" = None
    bundle: "str | None" = None
    pod_namespace: "str | None" = None
    pod_name: "str | None" = None
    pod_uid: "str | None" = None
    container_name: "str | None" = None
    decision: "str | None" = None
    vendors: "tuple[str, ...]" = ()
    nodes: "tuple[str, ...]" = ()
    mounts: "tuple[str, ...]" = ()
    hooks: int = 0
    duration_ms: "float | None" = None
    runtime_server: bool = False
    devices: "tuple[str, ...]" = ()
    held_back: "tuple[str, ...]" = ()
    reason: "str | None" = None
    error: "str | None" = None
    warnings: "tuple[str, ...]" = ()
    stages_ms: "dict | None" = None

    __slots__ = ()

    def to_line(self) -> dict:
        """The line's JSON object, time and event first, bounded (MAX_*): the keys every
        create has, then those a create has only when they say something."""
        line: dict = {"time": self.time, "event": CREATE, "front": self.front, "container_id": self.container_id}
        if self.bundle is not None:
            line["bundle"] = self.bundle
        for key in POD_KEYS:
            if (value := getattr(self, key)) is not None:
                line[key] = value
        line.update(
            decision=self.decision,
            vendors=list(self.vendors),
            nodes=list(self.nodes),
            mounts=list(self.mounts),
            hooks=self.hooks,
            duration_ms=self.duration_ms,
        )
        if self.runtime_server:
            line["runtime_server"] = True
        if self.devices:
            line["devices"] = list(self.devices[:MAX_DEVICES])
        if self.held_back:
            line["held_back"] = list(self.held_back[:MAX_HELD_BACK])
        if self.reason:
            line["reason"] = self.reason
        if self.error:
            line["error"] = bounded_error(self.error)
        if self.warnings:
            line["warnings"] = list(bounded_warnings(self.warnings))
        if self.stages_ms:
            line["stages_ms"] = self.stages_ms
        return line

    @classmethod
    def read(cls, line: dict) -> "CreateRecord | None":
        """A create's line read back from the log (the agent, `gpuhook log`): each field that
        has its type, the default for any other; None for a line that is not a create's. A
        log is not trusted to be gpuhook's: nothing in it is believed beyond its type."""
        if not isinstance(line, dict) or line.get("event") != CREATE:
            return None
        fields: dict = {}
        for name in cls._fields:
            value, default = line.get(name), cls._defaults[name]
            if name == "front" and not (isinstance(value, str) and value):
                continue
            if isinstance(default, tuple):
                if isinstance(value, list):
                    fields[name] = tuple(v for v in value if isinstance(v, str))
            elif name == "duration_ms":
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    fields[name] = float(value)
            elif name == "hooks":
                if isinstance(value, int) and not isinstance(value, bool):
                    fields[name] = value
            elif name == "runtime_server":
                fields[name] = value is True
            elif name == "stages_ms":
                if isinstance(value, dict):
                    fields[name] = value
            elif isinstance(value, str):
                fields[name] = value
        return cls(**fields)
