"""The runtime's lines: gpuhook's log line (one JSON object, the node's log_file) and the
runtime's own error line (stderr, and runc's --log in its format). Stdlib only."""

import os
import time


def utc_now(ms: bool = True, t: float | None = None) -> str:
    """2026-11-29T19:40:49.577Z, the log time format of the runtime and of gpuhook.log (ms=False:
    whole seconds)."""
    t = time.time() if t is None else t
    head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))
    return head + (f".{int(t * 1000) % 1000:03d}Z" if ms else "Z")


def line_bytes(line: str) -> bytes:
    """A log line as append_line writes it: one line, its newline at the end, UTF-8."""
    return (line.replace("\n", " ") + "\n").encode("utf-8", "replace")


def append_line(path: str, line: str | bytes, mode: int = 0o640, exact: bool = False) -> None:
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

            line = fastjson.dumps({"level": "error", "msg": f"gpuhook-runtime: {msg}", "time": utc_now(ms=False)})
        else:
            line = f"gpuhook-runtime: {msg}"
        append_line(call.path(inv.log), line, call.mode(0o640), exact=True)
    return f"gpuhook-runtime: {msg}\n"
