"""A short-lived cache of the probe's result, for the per-container path.

Probing means importing the vendor modules and reading a few dozen host files: about a
third of gpuhook's time on a GPU node. Containers start in bursts (a Deployment scaled up,
a node rebooted) on a node whose GPUs did not change, so the Inventory is kept in
/run/gpuhook (GPUHOOK_CACHE_DIR) and reused when both hold:

- it is younger than `ttl` seconds (config `probe_cache_ttl`, default 10; 0 disables), and
- nothing it was built from has changed: the inode, size and mtime of the directories
  where device nodes appear and disappear (/dev, /dev/dri, /dev/accel, /sys/class/drm,
  the KFD topology, /proc/driver/nvidia/gpus), of the host's ld.so.cache and library
  directory (a driver upgrade), the text of /proc/driver/nvidia/version, and the NVIDIA
  driver roots (driverroot.watched: the GPU Operator's /run/nvidia/driver and its ld
  cache and library directories, /run/nvidia/validations/driver-ready, GKE's
  /home/kubernetes/bin/nvidia/{lib64,bin}, or the configured root), device number included,
  so that a driver root mounted or filled in later is seen at the next create;
- it was probed with the same nvidia_driver_root setting;
- every directory that holds a file the result names (a library, a tool, a socket: what a
  create bind-mounts) is the one it was when the result was stored: same device, inode,
  size, mtime and ctime. Unlinking or renaming a file changes its directory's mtime and
  ctime, and ctime cannot be set back (touch restoring the mtime sets it): a mounted file
  that is gone sends the create to a probe, whatever subdirectory it is in. A result is
  stored only once each of those files was seen there, after its directories' stats were
  taken: a file removed meanwhile is never kept. (Measured on a fake 8-GPU node, 22 files in
  7 directories: a stat per file 67 us per create, a stat per directory 15 us; a real driver
  has 50-60 files in 3-6 directories.)

The agent (agent.py) stores each of its probes here too (store), marked valid for as long
as it takes to probe again (two of its intervals): on a node where it runs, a create finds
a current result even after a quiet spell longer than the TTL, and never probes cold; the
fingerprint still invalidates it at once, and without the agent the TTL holds.

A node created lazily by the NVIDIA driver, a GPU appearing, a driver upgrade, or a driver
container that finished installing thus invalidates it at once: a "no driver userspace"
answer is never kept once the driver is there. A cache that cannot be read or written only
costs a probe.
"""

import os
import stat
import time

from .. import defaults
from ..inventory import Inventory
from . import sign_dirs
from .driverroot import AUTO, watched

# the directories where a GPU shows up (probe.SIGNS), then what the vendor modules read
WATCHED = tuple(sorted(sign_dirs())) + (
    "/dev/nvidia-caps",
    "/sys/class/kfd/kfd/topology/nodes",
    "/etc/ld.so.cache",
    *defaults.LIB_DIRS,
    defaults.WSL_LIB_DIR,
)
VERSION_FILE = "/proc/driver/nvidia/version"


def fingerprint(root: str, nvidia_driver_root: str | None = None) -> list:
    base = "" if root == "/" else root.rstrip("/")
    out: list = [root, nvidia_driver_root or AUTO]
    for path in WATCHED + watched(nvidia_driver_root):
        try:
            st = os.stat(base + path)
            out.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            out.append(None)
    try:
        with open(base + VERSION_FILE, "rb") as f:
            out.append(f.read(4096).decode("utf-8", "replace"))
    except OSError:
        out.append(None)
    return out


def mounted_files(inv: Inventory) -> "list[str]":
    """The node paths of the files a create may bind-mount from `inv`."""
    return [p for v in inv.vendors for p in [lib.path for lib in v.libraries] + list(v.binaries)]


def _dir_stats(base: str, dirs) -> list:
    out: list = []
    for d in dirs:
        try:
            st = os.stat(base + d)
            out.append([st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        except OSError:
            out.append(None)
    return out


def _file(cache_dir: str, root: str) -> str:
    return os.path.join(cache_dir, "inventory-" + root.replace("%", "%25").replace("/", "%2F") + ".json")


# the longest an entry may be trusted whatever it says (the agent's: 2 x interval + debounce)
MAX_VALID_FOR = 3600.0


# The last cache file this process read, per path: (its identity, the record, the Inventory
# built from it). A resident process (the runtime server, the NRI plugin) reads the same file
# for create after create: while the file is the same one (device, inode, size, mtime and
# ctime: store() replaces it by a rename, so every write is a new identity), its JSON and the
# Inventory are not made again. The record's checks against the host run every time.
_READ: dict = {}


def _read(path: str) -> "tuple[dict, list]":
    """(record, [Inventory] or [] not yet built) of the cache file at path, trusted only when
    gpuhook wrote it. Raises when it cannot be used."""
    from .. import fastjson

    # non-blocking, no link: a FIFO or a link planted here must not hang or steer a create
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ValueError("not written by gpuhook")  # never trusted (SECURITY.md)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        known = _READ.get(path)
        if known is not None and known[0] == identity:
            return known[1], known[2]
        record = fastjson.loads(f.read(1 << 22))
    if not isinstance(record, dict):
        raise ValueError("not a cache record")
    built: list = []
    _READ[path] = (identity, record, built)
    return record, built


def probe_cached(root: str, cache_dir: str, ttl: float, nvidia_driver_root: str | None = None) -> Inventory:
    from . import probe

    if ttl <= 0:
        return probe(root, nvidia_driver_root=nvidia_driver_root)
    key = fingerprint(root, nvidia_driver_root)
    try:
        record, built = _read(_file(cache_dir, root))
        valid = max(ttl, min(float(record.get("valid_for") or 0), MAX_VALID_FOR))
        if (
            record["fingerprint"] == key
            and 0 <= time.time() - record["time"] < valid
            and _dir_stats("" if root == "/" else root.rstrip("/"), record["dirs"]) == record["dir_stats"]
        ):
            if not built:
                built.append(Inventory.from_plain(record["inventory"]))
            return built[0]
    except Exception:  # noqa: BLE001  (a cache that cannot be used, for whatever reason, costs a probe)
        pass
    inv = probe(root, nvidia_driver_root=nvidia_driver_root)
    store(root, cache_dir, inv, key)
    return inv


def store(root: str, cache_dir: str, inv: Inventory, key: list, valid_for: float | None = None) -> None:
    """Keep `inv`, probed from `root` when its fingerprint was `key` (taken before probing,
    so that a change during the probe invalidates it). valid_for: seconds it may be used
    whatever the TTL (the agent's). Not stored when a file it names is not there (any more):
    the next create probes. Never raises: a cache that cannot be written only costs a probe."""
    from .. import fastjson

    base = "" if root == "/" else root.rstrip("/")
    files = mounted_files(inv)
    dirs = sorted({os.path.dirname(p) for p in files})
    dir_stats = _dir_stats(base, dirs)  # before the files are looked at: a removal after this is seen
    for p in files:
        try:
            os.stat(base + p)
        except OSError:
            return
    try:
        from ..fsutil import write_atomic

        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        record = {
            "fingerprint": key,
            "time": time.time(),
            "dirs": dirs,
            "dir_stats": dir_stats,
            "inventory": inv.to_plain(),
        }
        if valid_for:
            record["valid_for"] = float(valid_for)
        write_atomic(_file(cache_dir, root), fastjson.dumps(record).encode(), 0o600, sync_dir=False)
    except (OSError, ValueError, TypeError):
        pass
