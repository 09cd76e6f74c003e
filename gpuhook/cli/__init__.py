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
    if not args.simulate:
        return _plan(args, _root(args))
    import tempfile

    from ..testing import fakehost

    if args.simulate not in fakehost.SCENARIOS:
        raise UsageError(f"--simulate {args.simulate}: unknown; choose from {', '.join(fakehost.SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="gpuhook-sim-") as root:
        fakehost.build(root, args.simulate, mknod=False)
        return _plan(args, root)


def _plan(args, root: str) -> int:
    from ..config import load
    from ..plan import plan, request_from_spec
    from ..probe import probe

    spec = _read_spec(args.spec)
    config, errors = load()
    inv = probe(
        root, nvidia_driver_root=driver_root(args, root) if args.nvidia_driver_root else config.nvidia_driver_root
    )
    # a dry run: no state_dir, so the max-gpus round robin neither reads nor moves
    request = request_from_spec(spec, os.path.dirname(os.path.abspath(args.spec)) if args.spec else None)
    planned = plan(inv, request, config.ldconfig, config, None)
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
    """podman's precreate hook: OCI spec on stdin, edited spec on stdout."""
    from ..config import cache_dir, load
    from ..plan import find_ldconfig, plan, request_from_spec
    from ..probe import probe
    from ..spec import apply, check

    data = sys.stdin.buffer.read(64 << 20)
    spec = _parse_spec(data, "stdin")
    config, errors = load()
    root = args.root if args.root_given else config.host_root
    warnings = list(errors)
    try:
        check(spec)  # read the spec only as the runtime will (the same rule as gpuhook-runtime)
        inv = probe(root, nvidia_driver_root=config.nvidia_driver_root)
        warnings += inv.warnings
        planned = plan(inv, request_from_spec(spec), config.ldconfig or find_ldconfig(), config, cache_dir())
        warnings += planned.warnings
        edits = planned.edits
        spec = apply(spec, edits) if edits else spec
    except Exception as e:  # fail open: podman gets the spec it gave us
        if config.fail_mode == "closed":
            raise UsageError(f"GPU injection failed ({e}); fail_mode is closed") from None
        print(f"gpuhook: GPU injection failed, spec left unchanged: {e}", file=sys.stderr)
        edits = None
    for w in warnings:
        print(f"gpuhook: {w}", file=sys.stderr)
    if not edits:
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
    sp.add_argument(
        "--simulate",
        metavar="NODE",
        help="probe a built-in simulated node: nvidia, amd, intel, nvidia+intel, gpu-operator, gke, bmc, cpu",
    )
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
    from . import agent, cdi, config, dra, install, log

    for group in (install, config, cdi, agent, log, dra):
        group.add_commands(sub)
    from ..nri import plugin as nri_plugin

    nri_plugin.add_command(sub)
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
