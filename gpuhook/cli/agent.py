"""`gpuhook agent` and `gpuhook ready` (wired in gpuhook.cli).

Module-level imports stay light: structlog, pyudev, lightkube and the agent load only when
the agent runs; `ready` (the DaemonSet's readiness probe, every few seconds) loads none of them.
"""

from __future__ import annotations

import os
import sys

from .. import defaults
from .args import add_cdi_dir_args, add_driver_root_arg, max_cdi_version, seconds, usage_error


def add_commands(sub) -> None:
    sp = sub.add_parser("agent", help="the node agent: install, watch the GPUs, keep CDI specs and node labels current")
    _add_node_args(sp)
    _add_file_args(sp)
    _add_run_args(sp)
    _add_report_args(sp)
    add_driver_root_arg(sp)
    sp.set_defaults(func=cmd_agent)

    sp = sub.add_parser("ready", help="exit 0 when the node agent is ready (the DaemonSet's readiness probe)")
    sp.add_argument(
        "--ready-file",
        default=defaults.READY_FILE,
        metavar="FILE",
        help=f"the file `gpuhook agent --ready-file` writes (default {defaults.READY_FILE})",
    )
    sp.set_defaults(func=cmd_ready)


def _add_node_args(sp) -> None:
    """Where the node is, how it is installed, and which front serves its creates."""
    from ..agent.nri import DEFAULT_FRONT, FRONTS
    from ..nri.plugin import DEFAULT_SOCKET, ROOTFS_TEMPLATE

    sp.add_argument(
        "--root", default="/", metavar="DIR", help="where the node's / is (default /; /host in the DaemonSet)"
    )
    sp.add_argument(
        "--spec-root",
        default="/",
        metavar="DIR",
        help="the node's / as its container runtime sees it (prefix of host paths in CDI specs; default /)",
    )
    sp.add_argument(
        "--no-install", action="store_true", help="do not run gpuhook install first (installed by other means)"
    )
    sp.add_argument(
        "--install-restart",
        choices=("signal", "systemd", "none"),
        default="none",
        help="how gpuhook install makes the runtime load its config (see gpuhook install --restart)",
    )
    sp.add_argument(
        "--front",
        choices=FRONTS,
        default=DEFAULT_FRONT,
        help="nri: run the NRI plugin (gpuhook nri) in a process of its own; auto: so where the node's runtime "
        f"has an NRI socket (a socket, owned by root); wrapper: no plugin (default {DEFAULT_FRONT})",
    )
    sp.add_argument(
        "--nri-socket",
        default=DEFAULT_SOCKET,
        metavar="PATH",
        help=f"the runtime's NRI socket as the node sees it (default {DEFAULT_SOCKET})",
    )
    sp.add_argument(
        "--nri-rootfs-template",
        default=ROOTFS_TEMPLATE,
        metavar="PATH",
        help=f"the plugin's --rootfs-template (default {ROOTFS_TEMPLATE}: the rootfs the runtime wrote into the "
        "container's bundle, read by the hook when it runs)",
    )
    sp.add_argument("--ldconfig", metavar="PATH", help="the node's ldconfig for the CDI ld-cache hook")


def _add_file_args(sp) -> None:
    """The files the agent writes."""
    sp.add_argument("--cdi-dir", metavar="DIR", help="CDI spec directory (default <root>/var/run/cdi; '' = none)")
    add_cdi_dir_args(sp)
    sp.add_argument(
        "--nfd-dir",
        metavar="DIR",
        help="NFD feature file directory (default <root>/etc/kubernetes/node-feature-discovery/features.d; '' = none)",
    )
    sp.add_argument(
        "--ready-file",
        default=defaults.READY_FILE,
        metavar="FILE",
        help=f"written after the first successful install and probe (default {defaults.READY_FILE}; '' = none)",
    )


def _add_run_args(sp) -> None:
    """When it probes, how it stops, how it logs."""
    sp.add_argument(
        "--interval",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="re-probe this often even without udev events (default 30)",
    )
    sp.add_argument(
        "--debounce",
        type=seconds,
        default=1.0,
        metavar="SECONDS",
        help="after a udev event, re-probe once none came for this long (default 1)",
    )
    sp.add_argument("--once", action="store_true", help="install, probe and write once, then exit")
    sp.add_argument("--no-udev", action="store_true", help="do not watch udev: periodic probing only")
    sp.add_argument(
        "--grace",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="after SIGTERM, exit at the latest this much later (default 10)",
    )
    sp.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="auto: console on a terminal, JSON lines otherwise",
    )
    sp.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def _add_report_args(sp) -> None:
    """Metrics, pod Events and the Kubernetes API."""
    sp.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus metrics here (default: off; 127.0.0.1:9402 for this node only, "
        ":9402 for every interface of the node: the DaemonSet runs in the host network)",
    )
    sp.add_argument(
        "--runtime-log",
        metavar="FILE",
        help="the runtime's log the agent follows for pod Events "
        "and metrics (default: the node config's log_file under --root; '' = none)",
    )
    sp.add_argument(
        "--log-position",
        metavar="FILE",
        help=f"where the agent keeps how far it read that log, to go on from there when it starts again "
        f"(default {defaults.LOG_POSITION} under --root; '' = none: it starts at the log's end)",
    )
    sp.add_argument(
        "--no-pod-events",
        action="store_true",
        help="no Events and no gpuhook.dev/accelerator label on gpu-optional pods",
    )
    sp.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="reach the Kubernetes API as this kubeconfig says (to run "
        "the agent from a workstation against a cluster; default: in a pod, its service account; "
        "elsewhere, no API work)",
    )
    sp.add_argument("--context", metavar="NAME", help="the kubeconfig's context to use (default: its current-context)")
    sp.add_argument(
        "--node", metavar="NAME", help="this node's name in the API (default: $NODE_NAME, else the host name)"
    )


def cmd_agent(args) -> int:
    from .. import log as logmod
    from ..agent.core import Agent
    from ..agent.kubeclient import KubeError

    opts = _options(args)
    logmod.configure(fmt=args.log_format, level=args.log_level)
    log = logmod.get()
    try:
        agent = Agent(opts, log=log)
    except KubeError as e:  # a kubeconfig that cannot be used: one line, exit 2
        raise usage_error(str(e)) from None
    _stop_on_signals(agent, log, args.grace)
    return agent.run()


def _options(args):
    """The agent's Options from the command line, checked: a UsageError for what cannot be used."""
    from ..agent.core import Options
    from .nri import ROOTFS_TEMPLATE_RULE, rootfs_template_ok
    from .args import driver_root

    if not os.path.isdir(args.root):
        raise usage_error(f"--root {args.root}: not a directory")
    if args.interval <= 0:
        raise usage_error("--interval must be more than 0")
    max_version = max_cdi_version(args)
    if args.context and not args.kubeconfig:
        raise usage_error("--context needs --kubeconfig")
    if not args.nri_socket.startswith("/"):
        raise usage_error(f"--nri-socket {args.nri_socket}: not an absolute path")
    if not rootfs_template_ok(args.nri_rootfs_template):
        raise usage_error(f"--nri-rootfs-template {ROOTFS_TEMPLATE_RULE}")
    if args.metrics_address:
        from ..agent.metrics import parse_address

        try:
            parse_address(args.metrics_address)
        except ValueError as e:
            raise usage_error(str(e)) from None
    return Options(
        root=args.root,
        nvidia_driver_root=driver_root(args, args.root),
        spec_root=args.spec_root,
        interval=args.interval,
        debounce=args.debounce,
        cdi_dir=args.cdi_dir,
        nfd_dir=args.nfd_dir,
        cdi_format=args.cdi_format,
        cdi_max_version=max_version,
        install=not args.no_install,
        once=args.once,
        ready_file=args.ready_file,
        ldconfig=args.ldconfig,
        install_restart=args.install_restart,
        udev=not args.no_udev,
        runtime_log=args.runtime_log,
        log_position=args.log_position,
        pod_events=not args.no_pod_events,
        metrics_address=args.metrics_address or None,
        kubeconfig=args.kubeconfig or None,
        kube_context=args.context,
        node_name=args.node,
        front=args.front,
        nri_socket=args.nri_socket,
        nri_rootfs_template=args.nri_rootfs_template,
    )


def _stop_on_signals(agent, log, grace: float) -> None:
    """SIGTERM, SIGINT: stop after the step in progress, at the latest `grace` s later; a second one: now."""
    import signal
    import threading

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if agent.stop_event.is_set():
            log.warning("agent.stop", reason=f"second {name}", forced=True)
            os._exit(0)
        agent.stop(name)

        def force():
            log.warning("agent.stop", reason=f"{name}: still busy after {grace}s", forced=True)
            os._exit(0)

        t = threading.Timer(grace, force)
        t.daemon = True
        t.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


# -- ready -------------------------------------------------------------------------------


def cmd_ready(args) -> int:
    """The readiness probe, as an exec of gpuhook itself (the image has no shell nor `test`):
    ready once the agent wrote its ready file (after the first install and probe)."""
    path = args.ready_file
    if os.path.isfile(path):
        return 0
    print(
        f"gpuhook: not ready: {path} is not there yet (the agent writes it after its first install and probe)",
        file=sys.stderr,
    )
    return 1
