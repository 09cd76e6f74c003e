"""`gpuhook config check`: validate the node config (config.check: the runtime's own rules).

One line per problem ("FILE: key: what is wrong"), exit 1 when there is any, 0 when the file
is valid (or absent: the defaults apply); never a traceback.
"""

from __future__ import annotations

import os
import sys


def add_commands(sub) -> None:
    sp = sub.add_parser("config", help="the node config: `gpuhook config check`")
    csub = sp.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    sp.set_defaults(func=lambda args: (sp.print_help(sys.stderr), 2)[1])
    cp = csub.add_parser("check", help="validate the node config; one line per error, exit 1 on errors")
    cp.add_argument(
        "--config", metavar="FILE", help="the file to check (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.toml)"
    )
    cp.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from ..config import config_path

    path = args.config or config_path()
    try:
        with open(path, "rb") as f:
            raw = f.read((1 << 20) + 1)
    except FileNotFoundError:
        if args.config:
            print(f"{path}: no such file")
            return 1
        print(f"{path}: no config file; the defaults apply")
        return 0
    except OSError as e:
        print(f"{path}: cannot read: {e.strerror or e}")
        return 1
    if len(raw) > 1 << 20:
        print(f"{path}: larger than 1 MiB (the runtime reads no more)")
        return 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        print(f"{path}: not UTF-8 (byte {e.start})")
        return 1
    try:
        from ..config import check

        errors = check(text)
    except Exception as e:  # never a traceback
        print(f"{path}: cannot be checked: {type(e).__name__}: {e}")
        return 1
    for line in errors:
        print(f"{path}: {line}")
    if errors:
        return 1
    print(f"{os.path.abspath(path)}: OK")
    return 0
