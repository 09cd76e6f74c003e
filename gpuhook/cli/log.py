"""`gpuhook log`: the last container creates the runtime logged (wired in gpuhook.cli)."""

from __future__ import annotations

import sys

from .args import usage_error


def add_commands(sub) -> None:
    sp = sub.add_parser("log", help="the last container creates gpuhook-runtime logged")
    sp.add_argument(
        "--file", metavar="FILE", help="the runtime's log (default: the node config's log_file, /var/log/gpuhook.log)"
    )
    sp.add_argument("-n", type=int, default=20, metavar="N", help="how many (default 20)")
    sp.add_argument("--decision", metavar="D", help="only these: injected, no-gpu, sandbox, declined, error")
    sp.add_argument("--wide", action="store_true", help="full container ids and errors")
    sp.add_argument("--json", action="store_true", help="the records themselves, one JSON line each")
    sp.set_defaults(func=cmd_log)


# -- log ---------------------------------------------------------------------------------


def cmd_log(args) -> int:
    import json

    from .. import log as logmod

    path = args.file
    if path is None:
        from ..config import load

        config, _ = load()
        path = config.log_file or logmod.DEFAULT_RUNTIME_LOG
    if args.n <= 0:
        raise usage_error("-n must be at least 1")
    decisions = set(args.decision.split(",")) if args.decision else None
    try:
        if decisions:
            records, skipped = _filtered(path, args.n, decisions)
        else:
            records, skipped = logmod.tail_records(path, args.n)
    except FileNotFoundError:
        raise usage_error(f"{path}: no such file (is log_file set in the node config?)") from None
    except OSError as e:
        raise usage_error(f"{path}: {e.strerror or e}") from None
    if args.json:
        for r in records:
            print(json.dumps(r, separators=(",", ":")))
    else:
        print(logmod.format_records(records, wide=args.wide))
    if skipped:
        print(f"gpuhook: {skipped} unreadable line(s) skipped in {path}", file=sys.stderr)
    return 0


def _filtered(path: str, n: int, decisions: set) -> tuple[list, int]:
    from .. import log as logmod

    want = n
    while True:  # read further back until n records of these decisions, or the whole file
        records, skipped = logmod.tail_records(path, want)
        hits = [r for r in records if r.get("decision") in decisions]
        if len(hits) >= n or len(records) < want:
            return hits[-n:], skipped
        want *= 4
