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
# A node log line that could not be written (printf-style: the log file, why), said once per
# process (the front says it too); SHORT_WRITE, why, for a line of which only part fit (the
# bytes written, the line's). LOST: how many lines this process could not write.
CANNOT_WRITE_LOG = "cannot write the node log %s: %s (said once by this process)"
SHORT_WRITE = "only %d of the line's %d bytes fit"
LOST = 0


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
    else on stderr with PREFIX: the NRI plugin lives long, and a full disk would otherwise
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
                sys.stderr.write(PREFIX + msg + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
    return False


def write_log(entry: "tuple[str, bytes] | None") -> None:
    """An Answer's log line (file, line), written where it goes."""
    if entry is not None:
        append_node_log(entry[0], entry[1])


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
