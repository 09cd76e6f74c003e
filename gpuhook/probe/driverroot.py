"""Where NVIDIA's driver userspace (libcuda, nvidia-smi...) lives on a node: its driver roots.

The kernel module is the node's, but its libraries and tools may be in another tree:

- the host itself (`/`: the distribution's packages or the .run installer), found through
  the host's ld cache and library directories;
- the NVIDIA GPU Operator's driver container, whose root the Operator mounts at
  /run/nvidia/driver (its own etc/ld.so.cache, usr/lib/<arch>, usr/bin); the Operator
  writes /run/nvidia/validations/driver-ready once that driver is loaded and installed;
- GKE's driver installer (Container-Optimized OS, and GKE's Ubuntu nodes), which leaves
  everything under /home/kubernetes/bin/nvidia/{lib64,bin} with no ld cache listing it.

The node config's `nvidia_driver_root` is "auto" (these, in this order: the first with a
libcuda of the running driver wins) or one node path (only that one; "/" is the host).
Constants only (with the probe cache's watch list): this module is on the per-container path.
"""

from .. import defaults

AUTO = "auto"
HOST = "/"
OPERATOR_ROOT = "/run/nvidia/driver"  # the GPU Operator's driver container
GKE_ROOT = "/home/kubernetes/bin/nvidia"  # GKE's driver installer
AUTO_ROOTS = (HOST, OPERATOR_ROOT, GKE_ROOT)
READY_FILE = "/run/nvidia/validations/driver-ready"  # the Operator's: its driver is installed
# Under a driver root other than the host: what changes when a driver is installed there
# (a mount on the root itself, its ld cache, a library or tool directory filled in).
WATCH_UNDER = ("", "/etc/ld.so.cache", *defaults.LIB_DIRS, *defaults.BIN_DIRS)


def candidates(setting: str | None) -> tuple[str, ...]:
    """The driver roots to look in, in order, for a `nvidia_driver_root` setting."""
    return AUTO_ROOTS if setting in (None, "", AUTO) else (setting,)


def watched(setting: str | None) -> tuple[str, ...]:
    """Node paths whose change may mean the driver userspace appeared or changed (the
    host's own directories are watched by the cache already)."""
    out = [READY_FILE, READY_FILE.rpartition("/")[0]]
    for root in candidates(setting):
        if root != HOST:
            out.extend(root + sub for sub in WATCH_UNDER)
    return tuple(out)
