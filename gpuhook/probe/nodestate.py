"""What plan() needs of the node besides the Inventory, read into a NodeState before it runs
(inventory.py), so that plan() itself reads no file and can be tested without one.

read(inventory, config) reads only what the node config makes plan() ask for, on every create
(never cached): the kubelet's checkpoint with share = "unallocated" less the pods the agent
found gone (GONE_FILE, when the checkpoint has an entry; and the AMD partitions' render nodes
when the checkpoint names one), the MPS pipe directory when the node names one
and has NVIDIA GPUs (probe/trusted.py checks it), the node's ldconfig and gpuhook-hook. The
round robin of max-gpus is the one thing plan() asks the node for while it runs: its
read-choose-write is one step under one lock (least_used), handed to plan() as RoundRobin.

On the per-container path: stdlib only; the host walker, the lock and the JSON layer are
imported only when a file is there to read.
"""

import os
import stat as _stat

from ..defaults import CACHE_DIR
from ..inventory import Allocation, Inventory, NodeState
from ..record import Record

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from ..config import Config

CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
# the uids of the pods of CHECKPOINT that the agent found gone (agent/podres.py): {"gone": [uid]}
GONE_FILE = CACHE_DIR + "/kubelet-gone-pods.json"
PLATFORM = "/sys/devices/platform"
XCP = "amdgpu_xcp"  # an AMD partition's platform device: amdgpu_xcp.<n> (ROCm's id: amdgpu_xcp_<n>)
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")
STATE_FILE = "gpu-usage.json"
LOCK_FILE = "gpu-usage.lock"
LOCK_WAIT_S = 2.0


def read(
    inv: "Inventory",
    config: "Config",
    state_dir: "str | None" = None,
    ldconfig: "str | None" = None,
    helper: "str | None" = None,
) -> "NodeState":
    """The NodeState plan() needs for a container on this node. state_dir: where the round
    robin of max-gpus remembers what it gave (None: no memory). ldconfig: the node's (None:
    the config's, else the first of LDCONFIG_CANDIDATES here). helper: gpuhook-hook as the
    node sees it (None: this package's own, when it is there to run)."""
    allocations: tuple = ()
    unknown = None
    partitions: dict = {}
    if config.share == "unallocated":
        found, unknown = allocated_devices(inv.root)
        gone = gone_pods(inv.root) if found else frozenset()
        allocations = tuple(a for a in found or () if a.pod not in gone)
        partitions = partitions_of(inv.root, allocations)
    mps_dir = mps_refused = None
    if config.mps_pipe_dir and any(v.vendor == "nvidia" and v.devices for v in inv.vendors):
        from .trusted import trusted_dir

        mps_dir, mps_refused = trusted_dir(inv.root, config.mps_pipe_dir)
    if helper is None:
        from .. import hook

        helper = hook.package_helper()
        helper = helper if os.access(helper, os.X_OK) else None
    return NodeState(
        allocations,
        unknown,
        partitions,
        mps_dir,
        mps_refused,
        ldconfig or config.ldconfig or find_ldconfig(),
        helper,
        RoundRobin(state_dir).choose if state_dir is not None else None,
    )


def find_ldconfig(consumer_root: str = "/") -> "str | None":
    """The node's own ldconfig as the node sees it (the hook runs on the real node, not in a
    fake host root); `consumer_root` is where the node's / is here (/host in the DaemonSet)."""
    base = "" if consumer_root == "/" else consumer_root.rstrip("/")
    return next((p for p in LDCONFIG_CANDIDATES if os.access(base + p, os.X_OK)), None)


# -- kubelet device allocations ---------------------------------------------------------


def allocated_devices(root: str) -> "tuple[list[Allocation] | None, str | None]":
    """The Allocations the kubelet's device manager made to pods, from its checkpoint (<root>/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint:
    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
    "DeviceIDs": {"<NUMA node>": [ids]} (a plain list before Kubernetes 1.20), "AllocResp"}],
    "RegisteredDevices": {...}}, "Checksum": N}). No file: no allocations.
    Returns (allocations, None), or (None, why) when the file exists but cannot be understood."""
    from .host import Host

    host = Host(root)
    if host.lstat(CHECKPOINT) is None:
        return [], None
    data = host.read_bytes(CHECKPOINT, limit=32 << 20, quiet=True)
    if data is None:
        return None, f"{CHECKPOINT} unreadable"
    from .. import fastjson

    try:
        entries = fastjson.loads(data)["Data"]["PodDeviceEntries"] or []
        out: list = []
        for e in entries:
            resource = str(e.get("ResourceName") or "")
            ids = e.get("DeviceIDs") or []
            if isinstance(ids, dict):
                ids = [i for per_numa in ids.values() for i in (per_numa or [])]
            pod = str(e.get("PodUID") or "")
            resp = e.get("AllocResp")
            resp = resp if isinstance(resp, str) else ""
            out.extend(Allocation(resource, str(i), pod, resp) for i in ids if isinstance(i, (str, int)))
        return out, None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"{CHECKPOINT}: not a device manager checkpoint ({type(e).__name__})"


def gone_pods(root: str) -> "frozenset[str]":
    """The uids in <root>GONE_FILE: pods the kubelet's checkpoint may still list that the
    agent found gone (a pod's uid is never used again, so that stays true). No file, or one
    that cannot be read: none (their devices stay held back, the conservative side)."""
    from .host import Host

    data = Host(root).read_bytes(GONE_FILE, limit=4 << 20, quiet=True)
    if data is None:
        return frozenset()
    from .. import fastjson

    try:
        uids = fastjson.loads(data)["gone"]
    except (ValueError, KeyError, TypeError):
        return frozenset()
    return frozenset(u for u in uids if isinstance(u, str) and u) if isinstance(uids, list) else frozenset()


def partitions_of(root: str, allocations: "tuple[Allocation, ...]") -> "dict[str, frozenset[str]]":
    """amdgpu_xcp.<n> (the platform device of an AMD partition) -> its render nodes' /dev
    paths, from <root>/sys/devices/platform/<id>/drm; read only when an allocation names a
    partition (an id holding amdgpu_xcp), else {}."""
    if not any(XCP in a.id.lower() for a in allocations):
        return {}
    from .host import Host

    host = Host(root)
    return {
        x: frozenset(f"/dev/dri/{e}" for e in host.listdir(f"{PLATFORM}/{x}/drm") if e.startswith("renderD"))
        for x in host.listdir(PLATFORM)
        if x.startswith(XCP)
    }


# -- round robin -----------------------------------------------------------------------


class RoundRobin(Record):
    """max-gpus's memory of what it gave on this node: <state_dir>/gpu-usage.json."""

    state_dir: str

    __slots__ = ()

    def choose(self, keys: "list[str]", n: int, warn) -> "list[str]":
        return least_used(keys, n, self.state_dir, warn)


def least_used(keys: "list[str]", n: int, state_dir: "str | None", warn) -> "list[str]":
    """The n of `keys` given out least often on this node (ties: least recently, then in
    the order given), remembered in <state_dir>/gpu-usage.json. The read-choose-write runs
    under an exclusive fcntl lock and the file is replaced atomically, so concurrent creates
    never hand out the same device twice while another one is less used. Without a state
    dir, or when the state cannot be used, the first n (with a warning)."""
    if n >= len(keys):
        return list(keys)
    if n <= 0:
        return []
    if state_dir is None:
        return list(keys[:n])
    from .. import fastjson
    from ..fsutil import flock_within
    from ..fsutil import write_atomic

    path = os.path.join(state_dir, STATE_FILE)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        warn(f"round robin: cannot use {state_dir}: {e.strerror or e}; the first {n} device(s) given")
        return list(keys[:n])
    try:
        if not flock_within(lock, LOCK_WAIT_S, 0.002):
            warn(f"round robin: {path} stayed locked {LOCK_WAIT_S} s; the first {n} device(s) given")
            return list(keys[:n])
        seq, usage = 0, {}
        try:
            # non-blocking: a FIFO planted here must not hang every create (under the lock)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not _stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ValueError("not a regular file")
                record = fastjson.loads(os.read(fd, 1 << 20))
            finally:
                os.close(fd)
            seq = int(record["seq"])
            usage = {k: (int(c), int(t)) for k, (c, t) in record["usage"].items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
            warn(f"round robin: {path} unreadable, started afresh")
            seq, usage = 0, {}
        order = sorted(range(len(keys)), key=lambda i: (*usage.get(keys[i], (0, -1)), i))
        chosen = sorted(order[:n])
        for i in chosen:
            count, _ = usage.get(keys[i], (0, -1))
            usage[keys[i]] = (count + 1, seq)
        if len(usage) > 4096:  # devices that left the node long ago
            usage = dict(sorted(usage.items(), key=lambda kv: kv[1][1])[-4096:])
        data = fastjson.dumps({"seq": seq + 1, "usage": {k: list(v) for k, v in usage.items()}})
        write_atomic(path, data.encode(), 0o600, sync_dir=False)
        return [keys[i] for i in chosen]
    except OSError as e:
        warn(f"round robin: cannot update {path}: {e.strerror or e}; the first {n} device(s) given")
        return list(keys[:n])
    finally:
        os.close(lock)  # releases the lock
