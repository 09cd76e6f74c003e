"""The runtime's lines: gpuhook's log line (one JSON object, the node's log_file) and the
runtime's own error line (stderr, and runc's --log in its format). Stdlib only."""

import os
import time


# The log time (UTC), printf-style, as the front writes it too (gen_header): year, month, day,
# hour, minute, second, then (TIME_FORMAT) the milliseconds; TIME_FORMAT_S, whole seconds.
_DATE_TIME = "%04d-%02d-%02dT%02d:%02d:%02d"
TIME_FORMAT = _DATE_TIME + ".%03dZ"
TIME_FORMAT_S = _DATE_TIME + "Z"
# a log file's mode when a line creates it (the front's too)
LOG_MODE = 0o640
# the most characters of an error a log line carries (the create's, the exec's, the NRI
# plugin's, and gpuhook-hook's own)
MAX_ERROR = 1000
# The runtime's error lines begin with PREFIX; a call with no real runtime to run says one of
# these (printf-style: the runtime, then the config file or the error) and exits NO_RUNTIME_STATUS.
# The front says them too (gen_header).
PREFIX = "gpuhook-runtime: "
NO_RUNTIME = "no real OCI runtime: %s not found (set `runtime` in %s)"
RUNTIME_IS_FRONT = "the real OCI runtime %s is gpuhook-runtime itself (set `runtime` in %s)"
CANNOT_RUN = "cannot run the real OCI runtime %s: %s"
NO_RUNTIME_STATUS = 127


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


def append_line(path: str, line: str | bytes, mode: int = LOG_MODE, exact: bool = False) -> None:
    """One write(2) of a whole line with O_APPEND: concurrent creates never interleave. A
    str is made one line (line_bytes); bytes are written as they are. mode: a new file's,
    less this process's umask; exact: mode itself (a file for a caller, whose umask is in
    mode: the server's own umask is not the caller's), set on the file this call created."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    created = False
    try:
        if not exact:
            fd = os.open(path, flags | os.O_CREAT, mode)
        else:
            try:
                fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
            except FileExistsError:
                fd = os.open(path, flags)
    except OSError:
        return
    try:
        if created:
            os.fchmod(fd, mode)
        os.write(fd, line if isinstance(line, bytes) else line_bytes(line))
    except OSError:
        pass
    finally:
        os.close(fd)


def write_log(entry: "tuple[str, bytes] | None") -> None:
    """An Answer's log line (file, line), written where it goes."""
    if entry is not None:
        append_line(entry[0], entry[1])


def runtime_error(inv, call, msg: str) -> str:
    """Why the call failed, for the caller: runc's own --log gets it now, in its format (a
    relative --log in the caller's directory); returned, the text for stderr."""
    if inv.log:
        if inv.log_format == "json":
            from .. import fastjson

            line = fastjson.dumps({"level": "error", "msg": PREFIX + msg, "time": utc_now(ms=False)})
        else:
            line = PREFIX + msg
        append_line(call.path(inv.log), line, call.mode(LOG_MODE), exact=True)
    return PREFIX + msg + "\n"
