"""The createContainer hooks gpuhook adds, by kind, and the helper that runs them isolated.

A createContainer hook runs as root on the host, in the container's mount namespace, before
pivot_root. Whatever works over the image's tree runs in `gpuhook-hook` (gpuhook-hook.c
beside this file, built with the package): its own mount namespace, no procfs, pivot_root
into the rootfs, few capabilities. See gpuhook-hook.c and SECURITY.md.

Each kind is a subcommand of the helper; plan() makes an Edits Hook with `kind` set, and
argv() turns a kind and its arguments into the hook's command line, in one place.
"""

import os

NAME = "gpuhook-hook"
LDCACHE = "ldcache"  # the node's ldconfig refreshes the container's ld cache
BYPATH = "bypath"  # /dev/dri/by-path links for Level Zero (OCI has no symlink edit)
TIMEOUT = {LDCACHE: 30, BYPATH: 10}
# the helper's own deadline for ldconfig, under its hook's TIMEOUT: a slow ldconfig is stopped
# and the container starts, before runc's timeout would fail the create
LDCONFIG_DEADLINE = 25
DESCRIPTION = {LDCACHE: "ld cache update", BYPATH: "/dev/dri/by-path links"}
# where the host bundle keeps a copy (gpuhook/install/build.py), for specs named from a pod
BUNDLE_PATH = "libexec/" + NAME
ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)  # explicit: never the container's env
# The node log the helper writes its outcome to when it could not do its work (ldconfig
# timed out or failed, a check refused): runc drops a hook's stderr when it exits 0. The
# node config's log_file, never anything of the container's (gpuhook-hook.c: open_log).
LOG_ENV = "GPUHOOK_LOG_FILE"
EVENT = "hook"  # the log line's event (gpuhook.log reads it beside its create)


# A hook's ROOTFS where the container's root is not known when the hook is made (a CDI spec,
# an NRI plugin's adjustment): the helper reads it from what the runtime wrote, the OCI state
# on its stdin ("bundle") and that bundle's config.json ("root": {"path"}) (gpuhook-hook.c:
# state_rootfs). Never a path: an absolute ROOTFS is the root itself.
ROOTFS_FROM_STATE = "@state"


def env(log_file: "str | None" = None) -> tuple[str, ...]:
    """The hook's whole environment: ENV, and the node log when there is one."""
    return ENV + (f"{LOG_ENV}={log_file}",) if log_file and log_file.startswith("/") else ENV


def package_helper() -> str:
    """The helper built with this very package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), NAME)


def helper(consumer_root: str = "/") -> str | None:
    """The helper as the node sees it, when it is there to run. consumer_root: where the
    node's / is from here (/host in the DaemonSet's pod, which names the installed bundle's)."""
    if consumer_root == "/":
        path = package_helper()
        return path if os.access(path, os.X_OK) else None
    from ..defaults import INSTALL_PREFIX

    path = f"{INSTALL_PREFIX}/{BUNDLE_PATH}"
    return path if os.access(consumer_root.rstrip("/") + path, os.X_OK) else None


def argv(kind: str, rootfs: str, args) -> tuple[str, ...]:
    """The hook's argv for one kind: NAME KIND ROOTFS ARGS..."""
    return (NAME, kind, rootfs, *args)


def parse(args) -> tuple[str, str, tuple[str, ...]] | None:
    """(kind, rootfs, args) of a hook argv made by argv(); None for any other hook."""
    if len(args) >= 3 and args[0] == NAME and args[1] in TIMEOUT:
        return args[1], args[2], tuple(args[3:])
    return None
