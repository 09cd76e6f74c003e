"""`gpuhook install` and `gpuhook uninstall` on the command line (wired in gpuhook.cli)."""

from __future__ import annotations

import sys


def _common(sp) -> None:
    from ..install.runtimes import NAMES

    sp.add_argument(
        "--host-root", default="/", metavar="DIR", help="where the node's / is (default /; /host in the DaemonSet)"
    )
    sp.add_argument(
        "--runtime",
        choices=(*NAMES, "auto"),
        default="auto",
        help="the node's container runtime; several sit side by side (install: default auto, "
        "which says what it found: with a kubelet its CRI runtime, containerd else CRI-O, and "
        "dockerd beside it when there; without one dockerd, else containerd, else CRI-O. "
        "uninstall: default auto, every runtime installed for; X: only X's handler)",
    )
    sp.add_argument(
        "--restart",
        choices=("signal", "systemd", "none"),
        default="none",
        help="how the runtime loads a changed config: signal (containerd: SIGTERM and its "
        "supervisor starts it again; CRI-O and dockerd: SIGHUP reload), systemd (systemctl "
        "restart; docker.service: reload-or-restart), none (default: the next start loads it)",
    )
    sp.add_argument(
        "--restart-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long --restart signal waits for the runtime to stop and come back (default 30)",
    )
    sp.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")


def add_commands(sub) -> None:
    from ..install.runtimes import FRONTS

    sp = sub.add_parser("install", help="put gpuhook on this node and add the gpu-optional runtime handler")
    _common(sp)
    sp.add_argument(
        "--bundle-dir",
        metavar="DIR",
        help="the host bundle to copy to /opt/gpuhook (default: $GPUHOOK_BUNDLE_DIR, else the "
        "bundle this gpuhook runs from, else one built from this Python and this gpuhook, "
        "as packaging/build-bundle.sh builds it)",
    )
    sp.add_argument(
        "--front",
        choices=FRONTS,
        help="how gpu-optional containers get their GPUs (containerd, CRI-O): wrapper (gpuhook-runtime "
        "is the handler's binary, no resident process), or nri (a plain runc handler, NRI turned on "
        "where it is off, and gpuhook's NRI plugin as gpuhook-nri.service: no runtime binary replaced, "
        "but a pod created while the plugin is down starts without its GPUs). Default: the front "
        "installed on this node, wrapper on a fresh one",
    )
    sp.set_defaults(func=cmd_install)

    sp = sub.add_parser("uninstall", help="remove the gpu-optional handler and gpuhook from this node")
    _common(sp)
    sp.add_argument("--keep-bundle", action="store_true", help="leave /opt/gpuhook in place")
    sp.set_defaults(func=cmd_uninstall)


def _options(args):
    from ..install.core import Options

    return Options(
        host_root=args.host_root,
        runtime=args.runtime,
        front=getattr(args, "front", None),
        restart=args.restart,
        bundle_dir=getattr(args, "bundle_dir", None),
        dry_run=args.dry_run,
        keep_bundle=getattr(args, "keep_bundle", False),
        restart_timeout=args.restart_timeout,
    )


def _run(action, args) -> int:
    from .args import UsageError
    from ..install import InstallError

    def say(line: str) -> None:
        print(line, flush=True)

    try:
        action(_options(args), say)
    except InstallError as e:
        raise UsageError(str(e)) from None
    except BrokenPipeError:
        raise
    except OSError as e:  # anything the steps did not word themselves
        where = f"{e.filename}: " if e.filename else ""
        raise UsageError(f"{where}{e.strerror or e}") from None
    sys.stdout.flush()
    return 0


def cmd_install(args) -> int:
    from ..install.core import install

    return _run(install, args)


def cmd_uninstall(args) -> int:
    from ..install.core import uninstall

    return _run(uninstall, args)
