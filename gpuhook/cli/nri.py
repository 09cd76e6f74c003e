"""`gpuhook nri`: the NRI plugin's command (gpuhook/nri/plugin.py is the plugin): its options,
checked, and with --root the node's own installed gpuhook run in the node's root."""

from __future__ import annotations

import argparse
import os
import sys

from .. import defaults
from ..hook import ROOTFS_FROM_STATE
from ..nri.plugin import DEFAULT_INDEX, DEFAULT_NAME, DEFAULT_SOCKET, ROOTFS_TEMPLATE, Plugin
from .args import UsageError


def add_commands(sub) -> None:
    sp = sub.add_parser("nri", help="run as an NRI plugin (containerd 2.x, CRI-O): no runtime wrapper")
    sp.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="the node's / (/host in the DaemonSet): chroot there and run the node's installed "
        f"gpuhook ({defaults.INSTALL_PREFIX}), so that config, log and paths are the node's (default /)",
    )
    sp.add_argument("--socket", default=DEFAULT_SOCKET, help=f"the runtime's NRI socket (default {DEFAULT_SOCKET})")
    sp.add_argument("--name", default=DEFAULT_NAME, help=f"the plugin's name (default {DEFAULT_NAME})")
    sp.add_argument("--index", default=DEFAULT_INDEX, help=f"its two-digit index (default {DEFAULT_INDEX})")
    sp.add_argument(
        "--rootfs-template",
        default=ROOTFS_TEMPLATE,
        help=f"where the ld-cache hook finds a container's rootfs: {ROOTFS_FROM_STATE} (the default: from the bundle "
        "the runtime names when the hook runs, containerd's or CRI-O's), a path with {id} (the container's id) in it, "
        "or '' for no hook",
    )
    sp.set_defaults(func=cmd_nri)


# what a --rootfs-template may be, as its error line says it
ROOTFS_TEMPLATE_RULE = f"must be {ROOTFS_FROM_STATE}, an absolute path with {{id}} in it, or ''"


def rootfs_template_ok(template: str) -> bool:
    return template in ("", ROOTFS_FROM_STATE) or ("{id}" in template and template.startswith("/"))


def run_in_root(args: argparse.Namespace) -> int:
    """chroot into --root and exec the node's bundle's `gpuhook nri` with the same options, its
    interpreter started by the bundle's own loader as the C front does (the node needs no shell)."""
    import glob

    from ..layout import LIB, PYTHON_DIRS, SITE_PACKAGES, launch

    if not os.path.isdir(args.root):
        raise UsageError(f"--root {args.root}: not a directory")
    try:
        os.chroot(args.root)
        os.chdir("/")
    except OSError as e:
        print(f"gpuhook nri: cannot chroot into {args.root}: {e.strerror}", file=sys.stderr)
        return 1
    prefix = defaults.INSTALL_PREFIX
    site = sorted(glob.glob(f"{prefix}/{LIB}/{PYTHON_DIRS}*/{SITE_PACKAGES}"))
    if not site:
        print(f"gpuhook nri: no gpuhook installed in {args.root}{prefix} (gpuhook install first)", file=sys.stderr)
        return 1
    argv = [*launch(prefix), *defaults.RUNTIME_FLAGS, defaults.CLI_MAIN, site[-1], "nri", "--socket", args.socket, "--name", args.name, "--index", args.index,
            "--rootfs-template", args.rootfs_template]  # fmt: skip
    try:
        os.execv(argv[0], argv)
    except OSError as e:
        print(f"gpuhook nri: cannot run {args.root}{argv[0]}: {e.strerror}", file=sys.stderr)
    return 1


def cmd_nri(args: argparse.Namespace) -> int:
    if len(args.index) != 2 or not args.index.isdigit():
        raise UsageError(f"--index must be two digits, got {args.index!r}")
    if not args.name or "/" in args.name:
        raise UsageError(f"--name must be a non-empty name without '/', got {args.name!r}")
    if not rootfs_template_ok(args.rootfs_template):
        raise UsageError(f"--rootfs-template {ROOTFS_TEMPLATE_RULE}")
    if args.root != "/":
        return run_in_root(args)
    plugin = Plugin(args.socket, args.name, args.index, args.rootfs_template)
    try:
        plugin.run_forever()
    except KeyboardInterrupt:
        return 0
    return 0
