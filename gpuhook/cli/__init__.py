"""The `gpuhook` command: probe, plan, precreate (podman hook), version.

Bad input gives one clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import __version__
from .args import UsageError, add_driver_root_arg, driver_root


SAMPLE_SPEC = {
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "cwd": "/",
    },
    "root": {"path": "/run/containers/sample/rootfs", "readonly": False},
    "hostname": "sample",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
    },
}


def _root(args) -> str:
    root = args.root
    if not os.path.isdir(root):
        raise UsageError(f"--root {root}: not a directory")
    return root


def _read_spec(path: str | None) -> dict:
    if path is None:
        return json.loads(json.dumps(SAMPLE_SPEC))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"--spec {path}: {e.strerror or e}") from None
    return _parse_spec(data, f"--spec {path}")


def _parse_spec(data: bytes, what: str) -> dict:
    try:
        spec = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{what}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(spec, dict):
        raise UsageError(f"{what}: an OCI spec must be a JSON object")
    return spec


# -- probe ---------------------------------------------------------------------------


def _node(n) -> str:
    state = "" if n.present else ", not created yet"
    return f"{n.path} ({n.type} {n.major}:{n.minor}{state})"


def format_inventory(inv) -> str:
    from ..plan import unusable

    lines = []
    if not inv.vendors:
        lines.append(
            f"No GPU found under {inv.root}: this is a CPU-only node. "
            "gpu-optional containers run here on CPU, unchanged."
        )
    for v in inv.vendors:
        head = f"{v.vendor}: {len(v.devices)} device(s)"
        if v.driver_version:
            head += f", driver {v.driver_version}"
        lines.append(head)
        if v.vendor == "nvidia":
            where = {"/": "the host"}.get(v.driver_root or "", v.driver_root)
            lines.append(
                f"  driver userspace: {'from ' + where if where else 'not found'}"
                + (f" (mounted at: {', '.join(f'{a} -> {b}' for a, b in v.mount_map)})" if v.mount_map else "")
            )
        why = unusable(v)
        if why is not None:
            lines.append(
                f"  NOT USABLE: {why[1]}: gpu-optional containers get no {v.vendor} device "
                "and run without it (see the warnings)"
            )
        rows = [("#", "KIND", "ID", "PCI", "MODEL", "NODES")]
        for d in v.devices:
            rows.append(
                (str(d.index), d.kind, d.id, d.pci or "-", d.model or "-", ", ".join(_node(n) for n in d.nodes))
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[5])
        if v.control_nodes:
            lines.append("  control nodes: " + ", ".join(_node(n) for n in v.control_nodes))
        if v.libraries:
            lines.append(f"  libraries ({len(v.libraries)}):")
            lines.extend(
                f"    {lib.path}  [{lib.capability}]"
                + (f" -> {v.container_path(lib.path)}" if v.container_path(lib.path) != lib.path else "")
                for lib in v.libraries
            )
        if v.binaries:
            lines.append(
                "  binaries: "
                + ", ".join(b + (f" -> {v.container_path(b)}" if v.container_path(b) != b else "") for b in v.binaries)
            )
    for w in inv.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def cmd_probe(args) -> int:
    from ..probe import probe

    root = _root(args)
    inv = probe(root, nvidia_driver_root=driver_root(args, root))
    if args.json:
        from ..models import InventoryModel

        print(InventoryModel.model_validate(inv.to_plain()).model_dump_json(indent=2))
    else:
        print(format_inventory(inv))
    return 0


# -- plan ----------------------------------------------------------------------------


def format_edits(edits, root: str) -> str:
    if not edits:
        return f"Nothing to inject (host root {root}): the spec is left exactly as it is."
    lines = [f"Edits for this container (host root {root}):"]
    lines.append("  env:")
    lines.extend(f"    {e}" for e in edits.env)
    lines.append(f"  device nodes ({len(edits.device_nodes)}), each with a cgroup allow rule:")
    lines.extend(f"    {n.path}  {n.type} {n.major}:{n.minor}  {n.permissions}" for n in edits.device_nodes)
    if edits.mounts:
        lines.append(f"  read-only bind mounts ({len(edits.mounts)}):")
        lines.extend(f"    {m.container_path}" for m in edits.mounts)
    for h in edits.hooks:
        lines.append(f"  {h.hook_name} hook: {_describe_hook(h)}")
    if edits.additional_gids:
        lines.append("  additional GIDs: " + ", ".join(map(str, edits.additional_gids)))
    return "\n".join(lines)


def _describe_hook(h) -> str:
    """What a hook of plan() does, by its kind, in words."""
    from .. import hook

    parsed = hook.parse(h.args)
    if h.kind is None or parsed is None:
        return f"{h.path} {' '.join(h.args[1:])}".rstrip()
    kind, rootfs, args = parsed
    if kind == hook.LDCACHE:
        return f"{hook.DESCRIPTION[kind]}, isolated in {rootfs} ({args[0]} {' '.join(args[1:])}; {h.path})"
    pairs = ", ".join(f"{a} -> {b}" for a, b in zip(args[::2], args[1::2]))
    return f"{hook.DESCRIPTION[kind]}, isolated in {rootfs} ({pairs}; {h.path})"


def cmd_plan(args) -> int:
    return _plan(args, _root(args))


def _plan(args, root: str) -> int:
    from ..config import load
    from ..plan import plan, request_from_spec
    from ..probe import nodestate, probe

    spec = _read_spec(args.spec)
    config, errors = load()
    inv = probe(
        root, nvidia_driver_root=driver_root(args, root) if args.nvidia_driver_root else config.nvidia_driver_root
    )
    # a dry run: no state_dir, so the max-gpus round robin neither reads nor moves
    request = request_from_spec(spec, os.path.dirname(os.path.abspath(args.spec)) if args.spec else None)
    planned = plan(inv, nodestate.read(inv, config), request, config)
    edits = planned.edits
    warnings = [*errors, *inv.warnings, *planned.warnings]
    held = [{"device": h.device, "why": h.why} for h in planned.held_back]
    if args.json:
        print(
            json.dumps(
                {
                    "root": root,
                    "vendors": [v.vendor for v in inv.vendors],
                    "edits": edits.to_cdi(),
                    "held_back": held,
                    "reason": planned.reason,
                    "warnings": warnings,
                },
                indent=2,
            )
        )
    else:
        print(format_edits(edits, root))
        if planned.reason:
            print(f"No GPU for this container: {planned.reason}.")
        if held:
            print(
                f'held back ({len(held)}; share = "{config.share}", set share = "all" in the node config '
                "to give them anyway):"
            )
            print("\n".join(f"  {h['device']}: {h['why']}" for h in held))
        for w in warnings:
            print(f"warning: {w}")
    return 0


# -- precreate -------------------------------------------------------------------------


def cmd_precreate(args) -> int:
    """podman's precreate hook, an adapter around the create core (inject.py): OCI spec on
    stdin, edited spec on stdout, the core's record (front "precreate") in the node log."""
    import time

    from .. import fastjson, inject
    from ..config import load
    from ..logline import PRECREATE, append_line
    from ..plan import request_from_spec
    from ..probe import probe
    from ..spec import apply, check

    started = time.monotonic()
    data = sys.stdin.buffer.read(64 << 20)
    spec = _parse_spec(data, "stdin")
    config, errors = load()
    root = args.root if args.root_given else config.host_root
    decision = None
    try:
        check(spec)  # read the spec only as the runtime will (the same rule as gpuhook-runtime)
        request = request_from_spec(spec)
        decision = inject.decide(
            request, config, errors, probe=lambda: probe(root, nvidia_driver_root=config.nvidia_driver_root)
        )
        if decision.edits:
            spec = apply(spec, decision.edits)
    except Exception as e:  # fail open: podman gets the spec it gave us
        decision = inject.failed(e, decision, errors)
    if config.log_file:
        record = inject.record(decision, PRECREATE, None, (time.monotonic() - started) * 1000)
        append_line(config.log_file, fastjson.dumps(record.to_line()))
    if decision.error and config.fail_mode == "closed":
        raise UsageError(f"GPU injection failed ({decision.error}); fail_mode is closed")
    if decision.error:
        print(f"gpuhook: GPU injection failed, spec left unchanged: {decision.error}", file=sys.stderr)
    for w in decision.warnings:
        print(f"gpuhook: {w}", file=sys.stderr)
    if not decision.edits:
        sys.stdout.buffer.write(data)
        return 0
    json.dump(spec, sys.stdout)
    return 0


def cmd_runtime_server(args) -> int:
    """The runtime's resident server (runtime/server.py), on systemd's socket or its own."""
    from ..runtime import server

    try:
        sock = server.listening_socket()
    except OSError as e:
        raise UsageError(f"runtime-server: cannot listen on {server.socket_path()}: {e.strerror or e}") from None
    print(f"gpuhook runtime-server: listening on {server.socket_path()}", file=sys.stderr)
    server.serve(sock)
    print("gpuhook runtime-server: another gpuhook version is installed: exiting", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuhook", description="GPU-optional containers: probe the node, inject its GPUs.")
    p.add_argument("--version", action="version", version=f"gpuhook {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def root_arg(sp):
        sp.add_argument("--root", default="/", metavar="DIR", help="host root to probe (default /)")

    sp = sub.add_parser("probe", help="show the GPUs this node has")
    root_arg(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    add_driver_root_arg(sp)
    sp.set_defaults(func=cmd_probe)

    sp = sub.add_parser("plan", help="dry run: the edits a container would get")
    root_arg(sp)
    sp.add_argument("--spec", metavar="FILE", help="an OCI config.json (default: a sample container)")
    sp.add_argument("--json", action="store_true", help="machine-readable output (CDI containerEdits)")
    add_driver_root_arg(sp)
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("precreate", help="podman precreate hook: OCI spec on stdin, edited spec on stdout")
    sp.add_argument("--root", default=None, metavar="DIR", help="host root (default: the node config's host_root)")
    sp.set_defaults(func=cmd_precreate)

    sp = sub.add_parser(
        "runtime-server",
        help="keep the create path warm: gpuhook-runtime asks this server instead of starting Python",
    )
    sp.set_defaults(func=cmd_runtime_server)
    # One module per command group adds its subcommands (module-level imports kept light).
    from . import agent, cdi, config, dra, install, log, nri

    for group in (install, config, cdi, agent, log, nri, dra):
        group.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "command", None) is None:
        parser.print_help()
        return 2
    if args.command == "precreate":
        args.root_given = args.root is not None
        args.root = args.root or "/"
    try:
        return args.func(args)
    except UsageError as e:
        print(f"gpuhook: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
