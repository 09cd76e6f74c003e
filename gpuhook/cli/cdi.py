"""`gpuhook cdi generate` (wired in gpuhook.cli)."""

from __future__ import annotations

import os
import sys

from .args import usage, usage_error


def add_commands(sub) -> None:
    sp = sub.add_parser("cdi", help="CDI specs of this node's GPUs")
    cdi_sub = sp.add_subparsers(dest="cdi_command", metavar="COMMAND")
    sp.set_defaults(func=lambda args: usage(sp))
    g = cdi_sub.add_parser("generate", help="write CDI specs describing every GPU this node has")
    g.add_argument("--root", default="/", metavar="DIR", help="host root to probe (default /)")
    g.add_argument(
        "--spec-root",
        default="/",
        metavar="DIR",
        help="the node's / as the container runtime reading the spec sees it: prefix of the "
        "spec's host paths (default /; a fake host's root to use its files)",
    )
    out = g.add_mutually_exclusive_group()
    out.add_argument(
        "--output-dir",
        metavar="DIR",
        help="write one file per kind here, atomically, and remove gpuhook's specs the node "
        "no longer has (default /var/run/cdi)",
    )
    out.add_argument(
        "--output", metavar="FILE|-", help="write one spec (see --kind) to FILE, or every spec to stdout (-)"
    )
    g.add_argument("--format", choices=("yaml", "json"), default="yaml", help="default yaml")
    g.add_argument("--kind", metavar="KIND", help="only this kind: gpuhook.dev/nvidia, or just nvidia, gpu...")
    g.add_argument("--ldconfig", metavar="PATH", help="the node's ldconfig for the ld-cache hook (found when unset)")
    from .args import add_driver_root_arg, add_max_cdi_version_arg

    add_max_cdi_version_arg(g)
    add_driver_root_arg(g)
    g.set_defaults(func=cmd_cdi_generate)


# -- cdi generate ----------------------------------------------------------------------


def hook_paths(root: str, spec_root: str, ldconfig: str | None) -> tuple[str | bool, str | bool]:
    """(ldconfig, gpuhook-hook) as the node sees them, for CDI specs of the node whose / is
    `root` here, read by a runtime that sees `spec_root` as the node's /; False: none."""
    from .. import hook
    from ..probe import nodestate

    consumer = root if spec_root == "/" else "/"
    return ldconfig or nodestate.find_ldconfig(consumer) or False, hook.helper(consumer) or False


def cmd_cdi_generate(args) -> int:
    from .. import cdi
    from ..probe import probe

    if not os.path.isdir(args.root):
        raise usage_error(f"--root {args.root}: not a directory")
    if not args.spec_root.startswith("/"):
        raise usage_error(f"--spec-root {args.spec_root}: must be an absolute path")
    from .args import driver_root

    inv = probe(args.root, nvidia_driver_root=driver_root(args, args.root))
    ldconfig, helper = hook_paths(args.root, args.spec_root, args.ldconfig)
    dropped: list = []
    try:
        specs = cdi.specs(inv, args.spec_root, ldconfig, args.max_cdi_version, dropped, helper)
    except cdi.CDIError as e:
        raise usage_error(str(e)) from None
    for w in inv.warnings:
        print(f"gpuhook: warning: {w}", file=sys.stderr)
    for kind, fields in dropped:
        print(
            f"gpuhook: warning: {kind}: left out for cdiVersion {args.max_cdi_version}: {', '.join(fields)}",
            file=sys.stderr,
        )
    if args.kind:
        kind = args.kind if "/" in args.kind else cdi.kind_of(args.kind)
        specs = [s for s in specs if s["kind"] == kind]
        if not specs:
            raise usage_error(f"--kind {kind}: this node has no such devices")
    if args.output == "-":
        _to_stdout(args, specs)
    elif args.output:
        _to_file(args, specs)
    else:
        _to_dir(args, specs)
    return 0


def _to_stdout(args, specs: list) -> None:
    from .. import cdi

    for i, s in enumerate(specs):
        if args.format == "yaml":
            sys.stdout.write(("---\n" if i else "") + cdi.dumps(s, "yaml"))
        else:
            sys.stdout.write(cdi.dumps(s, "json"))
    if not specs:
        print("gpuhook: no GPU on this node: no CDI spec", file=sys.stderr)


def _to_file(args, specs: list) -> None:
    """--output FILE: the one spec, written atomically."""
    from .. import cdi
    from ..fsutil import write_atomic

    if len(specs) != 1:
        kinds = ", ".join(s["kind"] for s in specs) or "none"
        raise usage_error(
            f"--output takes one spec and this node has {len(specs)} ({kinds}): "
            "choose one with --kind, or use --output-dir"
        )
    try:
        write_atomic(args.output, cdi.dumps(specs[0], args.format).encode(), 0o644)
    except OSError as e:
        raise usage_error(f"--output {args.output}: {e.strerror or e}") from None
    print(f"wrote {args.output} ({specs[0]['kind']}, {len(specs[0]['devices'])} devices)")


def _to_dir(args, specs: list) -> None:
    """--output-dir (default cdi.DEFAULT_DIR): one file per kind, the stale ones removed."""
    from .. import cdi

    directory = args.output_dir or cdi.DEFAULT_DIR
    try:
        # with --kind, the other kinds' specs stay as they are
        written, removed = cdi.write_dir(specs, directory, args.format, prune=not args.kind)
    except OSError as e:
        raise usage_error(f"--output-dir {directory}: {e.strerror or e}") from None
    for s in specs:
        names = [d["name"] for d in s["devices"]]
        print(
            f"{os.path.join(directory, cdi.file_name(s['kind'], args.format))}: {s['kind']} "
            f"(cdiVersion {s['cdiVersion']}): {', '.join(names)}"
        )
    for name in removed:
        print(f"removed {os.path.join(directory, name)} (the node no longer has these devices)")
    if not specs:
        print("No GPU on this node: no CDI spec" + (f" (removed {len(removed)} old ones)" if removed else ""))
    if not written and specs:
        print("(unchanged)")


# -- agent -----------------------------------------------------------------------------
