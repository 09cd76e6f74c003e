"""`gpuhook agent`, `gpuhook cdi generate`, `gpuhook log` (wired in gpuhook.cli).

Module-level imports stay light: structlog, pyudev and the agent load only when a
command of theirs runs.
"""

from __future__ import annotations

import os
import sys

from . import defaults


def add_commands(sub) -> None:
    sp = sub.add_parser("cdi", help="CDI specs of this node's GPUs")
    cdi_sub = sp.add_subparsers(dest="cdi_command", metavar="COMMAND")
    sp.set_defaults(func=lambda args: _usage(sp))
    g = cdi_sub.add_parser("generate", help="write CDI specs describing every GPU this node has")
    g.add_argument("--root", default="/", metavar="DIR", help="host root to probe (default /)")
    g.add_argument("--spec-root", default="/", metavar="DIR",
                   help="the node's / as the container runtime reading the spec sees it: prefix of the "
                        "spec's host paths (default /; a fake host's root to use its files)")
    out = g.add_mutually_exclusive_group()
    out.add_argument("--output-dir", metavar="DIR",
                     help="write one file per kind here, atomically, and remove gpuhook's specs the node "
                          "no longer has (default /var/run/cdi)")
    out.add_argument("--output", metavar="FILE|-", help="write one spec (see --kind) to FILE, or every spec to stdout (-)")
    g.add_argument("--format", choices=("yaml", "json"), default="yaml", help="default yaml")
    g.add_argument("--kind", metavar="KIND", help="only this kind: gpuhook.dev/nvidia, or just nvidia, gpu...")
    g.add_argument("--ldconfig", metavar="PATH", help="the node's ldconfig for the ld-cache hook (found when unset)")
    g.add_argument("--max-cdi-version", metavar="VERSION", help="the newest cdiVersion the node's runtimes read "
                   "(podman 4.3: 0.5.0): newer fields are left out (default: what the specs need)")
    from .cliargs import add_driver_root_arg

    add_driver_root_arg(g)
    g.set_defaults(func=cmd_cdi_generate)

    sp = sub.add_parser("agent", help="the node agent: install, watch the GPUs, keep CDI specs and node labels current")
    sp.add_argument("--root", default="/", metavar="DIR", help="where the node's / is (default /; /host in the DaemonSet)")
    sp.add_argument("--spec-root", default="/", metavar="DIR", help="the node's / as its container runtime sees it "
                    "(prefix of host paths in CDI specs; default /)")
    sp.add_argument("--interval", type=_seconds, default=30.0, metavar="SECONDS",
                    help="re-probe this often even without udev events (default 30)")
    sp.add_argument("--debounce", type=_seconds, default=1.0, metavar="SECONDS",
                    help="after a udev event, re-probe once none came for this long (default 1)")
    sp.add_argument("--cdi-dir", metavar="DIR", help="CDI spec directory (default <root>/var/run/cdi; '' = none)")
    sp.add_argument("--cdi-format", choices=("yaml", "json"), default="yaml")
    sp.add_argument("--max-cdi-version", metavar="VERSION", help="the newest cdiVersion the node's runtimes read: "
                    "newer fields are left out (default: what the specs need)")
    sp.add_argument("--nfd-dir", metavar="DIR", help="NFD feature file directory (default "
                    "<root>/etc/kubernetes/node-feature-discovery/features.d; '' = none)")
    sp.add_argument("--no-install", action="store_true", help="do not run gpuhook install first (installed by other means)")
    sp.add_argument("--install-restart", choices=("signal", "systemd", "none"), default="none",
                    help="how gpuhook install makes the runtime load its config (see gpuhook install --restart)")
    sp.add_argument("--once", action="store_true", help="install, probe and write once, then exit")
    sp.add_argument("--ready-file", default=defaults.READY_FILE, metavar="FILE",
                    help=f"written after the first successful install and probe (default {defaults.READY_FILE}; '' = none)")
    sp.add_argument("--no-udev", action="store_true", help="do not watch udev: periodic probing only")
    sp.add_argument("--grace", type=_seconds, default=10.0, metavar="SECONDS",
                    help="after SIGTERM, exit at the latest this much later (default 10)")
    sp.add_argument("--ldconfig", metavar="PATH", help="the node's ldconfig for the CDI ld-cache hook")
    sp.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                    help="auto: console on a terminal, JSON lines otherwise")
    sp.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    sp.add_argument("--metrics-address", metavar="HOST:PORT",
                    help="serve Prometheus metrics here (default: off; 127.0.0.1:9402 for this node only, "
                         ":9402 for every interface of the node: the DaemonSet runs in the host network)")
    sp.add_argument("--runtime-log", metavar="FILE", help="the runtime's log the agent follows for pod Events "
                    "and metrics (default: the node config's log_file under --root; '' = none)")
    sp.add_argument("--no-pod-events", action="store_true",
                    help="no Events and no gpuhook.dev/accelerator label on gpu-optional pods")
    sp.add_argument("--kubeconfig", metavar="FILE", help="reach the Kubernetes API as this kubeconfig says (to run "
                    "the agent from a workstation against a cluster; default: in a pod, its service account; "
                    "elsewhere, no API work)")
    sp.add_argument("--context", metavar="NAME", help="the kubeconfig's context to use (default: its current-context)")
    sp.add_argument("--node", metavar="NAME", help="this node's name in the API (default: $NODE_NAME, else the host name)")
    add_driver_root_arg(sp)
    sp.set_defaults(func=cmd_agent)

    sp = sub.add_parser("ready", help="exit 0 when the node agent is ready (the DaemonSet's readiness probe)")
    sp.add_argument("--ready-file", default=defaults.READY_FILE, metavar="FILE",
                    help=f"the file `gpuhook agent --ready-file` writes (default {defaults.READY_FILE})")
    sp.set_defaults(func=cmd_ready)

    sp = sub.add_parser("log", help="the last container creates gpuhook-runtime logged")
    sp.add_argument("--file", metavar="FILE", help="the runtime's log (default: the node config's log_file, "
                    "/var/log/gpuhook.log)")
    sp.add_argument("-n", type=int, default=20, metavar="N", help="how many (default 20)")
    sp.add_argument("--decision", metavar="D", help="only these: injected, no-gpu, sandbox, declined, error")
    sp.add_argument("--wide", action="store_true", help="full container ids and errors")
    sp.add_argument("--json", action="store_true", help="the records themselves, one JSON line each")
    sp.set_defaults(func=cmd_log)


def _usage(parser) -> int:
    parser.print_help()
    return 2


def _seconds(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < 1e6 or value != value:
        raise argparse.ArgumentTypeError(f"{text}: out of range")
    return value


def _usage_error(msg: str):
    from .cliargs import UsageError

    return UsageError(msg)


# -- cdi generate ----------------------------------------------------------------------

def cmd_cdi_generate(args) -> int:
    from . import cdi
    from .probe import probe

    if not os.path.isdir(args.root):
        raise _usage_error(f"--root {args.root}: not a directory")
    if not args.spec_root.startswith("/"):
        raise _usage_error(f"--spec-root {args.spec_root}: must be an absolute path")
    from .cliargs import driver_root

    inv = probe(args.root, nvidia_driver_root=driver_root(args, args.root))
    consumer = args.root if args.spec_root == "/" else "/"
    ldconfig = args.ldconfig or cdi.find_ldconfig(consumer) or False
    helper = cdi.find_helper(consumer) or False
    dropped: list = []
    try:
        specs = cdi.specs(inv, args.spec_root, ldconfig, args.max_cdi_version, dropped, helper)
    except cdi.CDIError as e:
        raise _usage_error(str(e)) from None
    for w in inv.warnings:
        print(f"gpuhook: warning: {w}", file=sys.stderr)
    for kind, fields in dropped:
        print(f"gpuhook: warning: {kind}: left out for cdiVersion {args.max_cdi_version}: {', '.join(fields)}",
              file=sys.stderr)
    if args.kind:
        kind = args.kind if "/" in args.kind else cdi.kind_of(args.kind)
        specs = [s for s in specs if s["kind"] == kind]
        if not specs:
            raise _usage_error(f"--kind {kind}: this node has no such devices")
    if args.output == "-":
        for i, s in enumerate(specs):
            if args.format == "yaml":
                sys.stdout.write(("---\n" if i else "") + cdi.dumps(s, "yaml"))
            else:
                sys.stdout.write(cdi.dumps(s, "json"))
        if not specs:
            print("gpuhook: no GPU on this node: no CDI spec", file=sys.stderr)
        return 0
    if args.output:
        if len(specs) != 1:
            kinds = ", ".join(s["kind"] for s in specs) or "none"
            raise _usage_error(f"--output takes one spec and this node has {len(specs)} ({kinds}): "
                               "choose one with --kind, or use --output-dir")
        from .spec import write_atomic

        try:
            write_atomic(args.output, cdi.dumps(specs[0], args.format).encode(), 0o644)
        except OSError as e:
            raise _usage_error(f"--output {args.output}: {e.strerror or e}") from None
        print(f"wrote {args.output} ({specs[0]['kind']}, {len(specs[0]['devices'])} devices)")
        return 0
    directory = args.output_dir or cdi.DEFAULT_DIR
    try:
        # with --kind, the other kinds' specs stay as they are
        written, removed = cdi.write_dir(specs, directory, args.format, prune=not args.kind)
    except OSError as e:
        raise _usage_error(f"--output-dir {directory}: {e.strerror or e}") from None
    for s in specs:
        names = [d["name"] for d in s["devices"]]
        print(f"{os.path.join(directory, cdi.file_name(s['kind'], args.format))}: {s['kind']} "
              f"(cdiVersion {s['cdiVersion']}): {', '.join(names)}")
    for name in removed:
        print(f"removed {os.path.join(directory, name)} (the node no longer has these devices)")
    if not specs:
        print("No GPU on this node: no CDI spec" + (f" (removed {len(removed)} old ones)" if removed else ""))
    if not written and specs:
        print("(unchanged)")
    return 0


# -- agent -----------------------------------------------------------------------------

def cmd_agent(args) -> int:
    import signal
    import threading

    from . import log as logmod
    from .agent import Agent, Options

    if not os.path.isdir(args.root):
        raise _usage_error(f"--root {args.root}: not a directory")
    from .cliargs import driver_root

    nvidia_driver_root = driver_root(args, args.root)
    logmod.configure(fmt=args.log_format, level=args.log_level)
    log = logmod.get()
    opts = Options(root=args.root, nvidia_driver_root=nvidia_driver_root, spec_root=args.spec_root, interval=args.interval, debounce=args.debounce,
                   cdi_dir=args.cdi_dir, nfd_dir=args.nfd_dir, cdi_format=args.cdi_format,
                   cdi_max_version=args.max_cdi_version,
                   install=not args.no_install, once=args.once, ready_file=args.ready_file,
                   ldconfig=args.ldconfig, install_restart=args.install_restart, udev=not args.no_udev,
                   runtime_log=args.runtime_log, pod_events=not args.no_pod_events,
                   metrics_address=args.metrics_address or None, kubeconfig=args.kubeconfig or None,
                   kube_context=args.context, node_name=args.node)
    if opts.metrics_address:
        from .metrics import parse_address

        try:
            parse_address(opts.metrics_address)
        except ValueError as e:
            raise _usage_error(str(e)) from None
    if opts.interval <= 0:
        raise _usage_error("--interval must be more than 0")
    from .cdi import KNOWN_VERSIONS

    if args.max_cdi_version is not None and args.max_cdi_version not in KNOWN_VERSIONS:
        raise _usage_error(f"--max-cdi-version {args.max_cdi_version}: one of {', '.join(KNOWN_VERSIONS)}")
    if args.context and not opts.kubeconfig:
        raise _usage_error("--context needs --kubeconfig")
    from .kube import KubeError

    try:
        agent = Agent(opts, log=log)
    except KubeError as e:  # a kubeconfig that cannot be used: one line, exit 2
        raise _usage_error(str(e)) from None

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if agent.stop_event.is_set():
            log.warning("agent.stop", reason=f"second {name}", forced=True)
            os._exit(0)
        agent.stop(name)

        def force():
            log.warning("agent.stop", reason=f"{name}: still busy after {args.grace}s", forced=True)
            os._exit(0)

        t = threading.Timer(args.grace, force)
        t.daemon = True
        t.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return agent.run()


# -- ready -------------------------------------------------------------------------------

def cmd_ready(args) -> int:
    """The readiness probe, as an exec of gpuhook itself (the image has no shell nor `test`):
    ready once the agent wrote its ready file (after the first install and probe)."""
    path = args.ready_file
    if os.path.isfile(path):
        return 0
    print(f"gpuhook: not ready: {path} is not there yet (the agent writes it after its first install and probe)",
          file=sys.stderr)
    return 1


# -- log ---------------------------------------------------------------------------------

def cmd_log(args) -> int:
    import json

    from . import log as logmod

    path = args.file
    if path is None:
        from .config import load

        config, _ = load()
        path = config.log_file or logmod.DEFAULT_RUNTIME_LOG
    if args.n <= 0:
        raise _usage_error("-n must be at least 1")
    decisions = set(args.decision.split(",")) if args.decision else None
    try:
        if decisions:
            records, skipped = _filtered(path, args.n, decisions)
        else:
            records, skipped = logmod.tail_records(path, args.n)
    except FileNotFoundError:
        raise _usage_error(f"{path}: no such file (is log_file set in the node config?)") from None
    except OSError as e:
        raise _usage_error(f"{path}: {e.strerror or e}") from None
    if args.json:
        for r in records:
            print(json.dumps(r, separators=(",", ":")))
    else:
        print(logmod.format_records(records, wide=args.wide))
    if skipped:
        print(f"gpuhook: {skipped} unreadable line(s) skipped in {path}", file=sys.stderr)
    return 0


def _filtered(path: str, n: int, decisions: set) -> tuple[list, int]:
    from . import log as logmod

    want = n
    while True:  # read further back until n records of these decisions, or the whole file
        records, skipped = logmod.tail_records(path, want)
        hits = [r for r in records if r.get("decision") in decisions]
        if len(hits) >= n or len(records) < want:
            return hits[-n:], skipped
        want *= 4
