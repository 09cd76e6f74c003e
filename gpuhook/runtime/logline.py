"""The runtime's own lines: its error line (stderr, and runc's --log in its format) and an
Answer's log line written where it goes. The node log's format, its bounds, its whole-line
writer and the create's record are the base layer's (gpuhook/logline.py). Stdlib only."""

from ..logline import LOG_MODE, append_line, append_node_log, utc_now

# The runtime's error lines begin with PREFIX; a call with no real runtime to run says one of
# these (printf-style: the runtime, then the config file or the error) and exits NO_RUNTIME_STATUS.
# The front says them too (gen_header).
PREFIX = "gpuhook-runtime: "
NO_RUNTIME = "no real OCI runtime: %s not found (set `runtime` in %s)"
RUNTIME_IS_FRONT = "the real OCI runtime %s is gpuhook-runtime itself (set `runtime` in %s)"
CANNOT_RUN = "cannot run the real OCI runtime %s: %s"
NO_RUNTIME_STATUS = 127


def _say(msg: str) -> None:
    """A line on stderr with PREFIX, as the runtime says everything (never raises)."""
    import sys

    try:
        sys.stderr.write(PREFIX + msg + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def write_log(entry: "tuple[str, bytes] | None") -> None:
    """An Answer's log line (file, line), written where it goes (a line not written is said
    once, on stderr)."""
    if entry is not None:
        append_node_log(entry[0], entry[1], say=_say)


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
