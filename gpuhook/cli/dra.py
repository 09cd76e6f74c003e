"""`gpuhook dra`: gpuhook's DRA driver for the kubelet (wired in gpuhook.cli; gpuhook/dra)."""

from __future__ import annotations

import os

from .args import seconds, usage_error


def add_commands(sub) -> None:
    from ..defaults import CDI_DIR
    from ..dra import DRIVER, PLUGINS_DIR, PLUGINS_REGISTRY

    sp = sub.add_parser(
        "dra",
        help="run as the node's DRA driver (resource.k8s.io/v1): ResourceSlices of its GPUs and `none`, "
        "prepare through gpuhook's CDI specs",
    )
    sp.add_argument("--root", default="/", metavar="DIR", help="the node's / (/host in the DaemonSet; default /)")
    sp.add_argument(
        "--spec-root",
        default="/",
        metavar="DIR",
        help="the node's / as the container runtime reading the CDI specs sees it (default /)",
    )
    sp.add_argument(
        "--cdi-dir", metavar="DIR", help=f"where the CDI specs go (default <root>{CDI_DIR}, as the agent writes them)"
    )
    from .args import add_cdi_dir_args

    add_cdi_dir_args(sp)  # the agent's, for the same files: give both the same
    sp.add_argument("--ldconfig", metavar="PATH", help="the node's ldconfig for the ld-cache hook (found when unset)")
    sp.add_argument(
        "--plugins-dir",
        default=PLUGINS_DIR,
        metavar="DIR",
        help=f"the kubelet's plugins directory, as the kubelet sees it: the DRA socket and the checkpoint go in "
        f"<dir>/{DRIVER}/ (default {PLUGINS_DIR})",
    )
    sp.add_argument(
        "--registry-dir",
        default=PLUGINS_REGISTRY,
        metavar="DIR",
        help=f"where the kubelet looks for plugins' registration sockets (default {PLUGINS_REGISTRY})",
    )
    sp.add_argument(
        "--interval",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="probe the node and check its ResourceSlices this often (default 30)",
    )
    sp.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="reach the Kubernetes API as this kubeconfig says (default: in a pod, its service account)",
    )
    sp.add_argument("--context", metavar="NAME", help="the kubeconfig's context to use (default: its current-context)")
    sp.add_argument(
        "--node", metavar="NAME", help="this node's name in the API (default: $NODE_NAME, else the host name)"
    )
    sp.add_argument("--log-format", choices=("auto", "json", "console"), default="auto", help="default auto")
    from .args import add_driver_root_arg

    add_driver_root_arg(sp)
    sp.set_defaults(func=cmd_dra)


def _api(args):
    """The API client: the kubeconfig's, else the pod's service account's; a UsageError when
    there is none (prepare reads the allocation from the ResourceClaim)."""
    from ..agent.kube import KubeAPI
    from ..agent.kubeclient import KubeError

    try:
        if args.kubeconfig:
            return KubeAPI.from_kubeconfig(args.kubeconfig, args.context, args.node)
        api = KubeAPI.in_cluster(node=args.node)
    except KubeError as e:
        raise usage_error(str(e)) from None
    if api is None:
        raise usage_error(
            "no Kubernetes API: run in a pod (its service account) or give --kubeconfig FILE "
            "(the allocations the kubelet asks to prepare are in ResourceClaims)"
        )
    return api


def cmd_dra(args) -> int:
    import signal

    from .. import log as logmod
    from ..defaults import CDI_DIR
    from ..dra import DRIVER, driver, publish, service
    from .args import driver_root, max_cdi_version
    from .cdi import hook_paths

    if not os.path.isdir(args.root):
        raise usage_error(f"--root {args.root}: not a directory")
    for flag, path in (
        ("--spec-root", args.spec_root),
        ("--plugins-dir", args.plugins_dir),
        ("--registry-dir", args.registry_dir),
    ):
        if not path.startswith("/"):
            raise usage_error(f"{flag} {path}: not an absolute path")
    if not args.interval > 0:
        raise usage_error("--interval must be more than 0")
    if args.context and not args.kubeconfig:
        raise usage_error("--context needs --kubeconfig")
    max_version = max_cdi_version(args)
    api = _api(args)
    logmod.configure(fmt=args.log_format)
    log = logmod.get(front="dra", node=api.node)
    ldconfig, helper = hook_paths(args.root, args.spec_root, args.ldconfig)
    cdi_dir = args.cdi_dir or os.path.join(args.root, CDI_DIR.lstrip("/"))
    devices = publish.NodeDevices(
        args.root,
        cdi_dir,
        args.spec_root,
        ldconfig,
        helper,
        driver_root(args, args.root),
        cdi_format=args.cdi_format,
        max_cdi_version=max_version,
    )
    here = driver.plugin_dir(DRIVER, args.plugins_dir)
    checkpoint = driver.Checkpoint(os.path.join(here, driver.CHECKPOINT))
    drv = driver.Driver(
        api.node,
        checkpoint,
        api.get_resource_claim,
        devices.table,
        lambda msg: log.warning("dra.prepare", error=msg),
        lambda event, **fields: log.info(event, **fields),
    )
    svc = service.Service(api.node, devices, drv, api, log, args.interval)
    svc.round()  # the devices known (and published) before the kubelet can ask
    sockets = (os.path.join(here, driver.DRA_SOCKET), driver.registration_socket(DRIVER, args.registry_dir))

    def on_status(ok: bool, error: str) -> None:
        (log.info if ok else log.error)("dra.registration", registered=ok, error=error or None)

    try:
        server = driver.serve(drv, *sockets, on_status=on_status)
    except (OSError, RuntimeError) as e:
        raise usage_error(f"cannot serve the kubelet on {', '.join(sockets)}: {e}") from None
    log.info("dra.serving", endpoint=sockets[0], registration=sockets[1])
    signal.signal(signal.SIGTERM, lambda *a: svc.stop.set())
    signal.signal(signal.SIGINT, lambda *a: svc.stop.set())
    try:
        svc.run()
    finally:
        server.stop(5).wait()
        for path in sockets:  # the kubelet unregisters a plugin whose socket is gone
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        log.info("dra.stopped")
    return 0
