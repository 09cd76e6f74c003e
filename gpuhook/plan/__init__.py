"""Policy: plan(Inventory, NodeState, Request, Config) -> Plan. Every decision about what a
container gets lives here.

The probe only reports and the spec editor only applies; this module decides, and reads no
file: what it needs of the node beyond the Inventory (the kubelet's allocations, the AMD
partitions, the MPS directory, ldconfig, gpuhook-hook) is read before it into a NodeState
(probe/nodestate.py), the config comes typed (config.Config). Its inputs are validated by
plan/policy.py (annotations, the checkpoint's ids) and plan/nvidia.py (NVIDIA's env); the
decisions, in order:

1. Nothing for a sandbox (pause) container, a CPU-only node, or `gpuhook.dev/inject: "false"`.
2. Vendors: every vendor of the node, narrowed by `gpuhook.dev/vendors`, without those whose
   userspace the container cannot work without is missing (`unusable`: NVIDIA with no
   libcuda of the running driver for a container that asks for compute, no NVML for one
   that asks for utility only; WSL's dxg without libdxcore): never advertise what cannot
   work. Such a vendor is left out whole (no device, no GPUHOOK_ACCELERATOR) with a warning.
3. Devices of a vendor: when the spec already holds nodes of that vendor's devices (a device
   plugin put them there), exactly those: no further device of that vendor. Else every
   device, narrowed for NVIDIA by NVIDIA_VISIBLE_DEVICES (void/empty: nothing; none: driver
   files only; a list of indices or UUIDs), and, with the node's `share = "unallocated"`,
   without the devices the kubelet allocated to other pods.
4. `gpuhook.dev/max-gpus`: at most that many devices in all, the devices already in the spec
   counted first; the others chosen least-used first (NodeState.round_robin: round robin
   over the node's state file, the one step plan() hands to the node while it runs).
5. Per vendor, what the chosen devices need: their nodes, the vendor's control nodes,
   libraries and tools; for NVIDIA only what NVIDIA_DRIVER_CAPABILITIES asks for (DRM
   nodes only for graphics/display), GSP firmware and the IPC sockets, the MPS pipe
   directory with compute; for Intel the /dev/dri/by-path links; the host groups of nodes
   that only a group may open (render, video) as additional GIDs.

plan() returns a Plan: the edits, the vendors and devices given, the devices held back and
why, and the reasons for every refusal (invalid annotation, unknown GPU in
NVIDIA_VISIBLE_DEVICES...) as warnings: the runtime logs them, and the container starts as
the node policy says. NVIDIA's policy is plan/nvidia.py; what any other vendor's choice
adds, plan/parts.py.
"""

import os

from .. import hook
from . import nvidia, policy
from .parts import Choice, Part, dri_name, vendor_part
from ..edits import DeviceNode, Edits, Hook
from ..inventory import Allocation, Device, Inventory, NodeState, VendorInventory
from ..record import Record

TYPE_CHECKING = False  # mypy reads this name as typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from ..config import Config

SANDBOX_ANNOTATIONS = (
    ("io.kubernetes.cri.container-type", "sandbox"),  # containerd CRI
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),  # CRI-O
)
DXG_NEEDS = "libdxcore.so"
# Why a device was held back (share = "unallocated"): Held.reason
ALLOCATED = "allocated"  # the kubelet allocated it to another pod
UNMAPPED = "unmapped"  # the kubelet allocated an id of its vendor that names no GPU here
UNREADABLE = "unreadable"  # the kubelet's checkpoint could not be read


class Request(Record):
    """What the container brings: its env (dict), annotations (dict), absolute rootfs path
    (None when unknown), the device nodes its spec already has (path -> (type, major,
    minor), or None where the spec gives no numbers), the destinations of its mounts, and
    whether it has a user namespace of its own."""

    env: "dict[str, str]"
    annotations: "dict[str, str]"
    rootfs: "str | None"
    spec_devices: "dict[str, tuple[str, int, int] | None] | None" = None
    mounts: "tuple[str, ...]" = ()
    userns: bool = False

    __slots__ = ()

    @property
    def is_sandbox(self) -> bool:
        return any(self.annotations.get(k) == v for k, v in SANDBOX_ANNOTATIONS)


def request_from_spec(spec: dict, bundle: "str | None" = None) -> "Request":
    process: dict = spec["process"] if isinstance(spec.get("process"), dict) else {}
    env = {}
    for item in process.get("env") or ():
        if isinstance(item, str):
            k, _, v = item.partition("=")
            env[k] = v
    annotations = spec.get("annotations")
    annotations = {k: v for k, v in annotations.items() if isinstance(v, str)} if isinstance(annotations, dict) else {}
    root = spec.get("root")
    rootfs = root.get("path") if isinstance(root, dict) else None
    if isinstance(rootfs, str) and rootfs:
        if not rootfs.startswith("/"):
            rootfs = os.path.join(bundle, rootfs) if bundle else None
    else:
        rootfs = None
    linux: dict = spec["linux"] if isinstance(spec.get("linux"), dict) else {}
    devices: list = linux["devices"] if isinstance(linux.get("devices"), list) else []
    numbers = {}
    for d in devices:
        if isinstance(d, dict) and isinstance(d.get("path"), str):
            t, ma, mi = d.get("type"), d.get("major"), d.get("minor")
            ok = isinstance(ma, int) and isinstance(mi, int) and not isinstance(ma, bool)
            numbers[d["path"]] = ((t if t in ("c", "b", "u") else "c"), ma, mi) if ok else None
    mounts: list = spec["mounts"] if isinstance(spec.get("mounts"), list) else []
    dests = tuple(m["destination"] for m in mounts if isinstance(m, dict) and isinstance(m.get("destination"), str))
    namespaces: list = linux["namespaces"] if isinstance(linux.get("namespaces"), list) else []
    userns = any(isinstance(n, dict) and n.get("type") == "user" for n in namespaces)
    # rootfs as runc resolves it: a link then ".." is the link target's parent, never the
    # link's own directory (os.path.normpath's), as the hook's realpath(3) reads it too
    return Request(env, annotations, rootfs and os.path.realpath(rootfs), numbers, dests, userns)


def _in_spec(d: "Device", req: "Request") -> bool:
    """Does the spec already hold a node of this device (a device plugin's)? By number; by
    path only where the spec gives no number."""
    known = req.spec_devices or {}
    for n in d.nodes:
        if n.path.startswith("/dev/nvidia-caps/"):
            continue  # MIG capabilities come with the GPU, they do not name it
        if n.path in known:
            have = known[n.path]
            if have is None or have == (n.type, n.major, n.minor):
                return True
        elif (n.type, n.major, n.minor) in _numbers(known):
            return True
    return False


def _numbers(known: dict) -> frozenset:
    return frozenset(v for v in known.values() if v is not None)


def _takes(ref: "policy.DeviceRef", d: "Device", xcp: dict) -> bool:
    """Does the checkpoint's id take this device? NVIDIA GPUs by UUID, index or /dev minor
    (a MIG instance or a replica takes its whole GPU), AMD's by PCI address (a partition is
    taken when its GPU is) or by a partition's render node, Intel's by card name (card1-0).
    An id under no GPU vendor's resource is matched against every id of the device."""
    kind, value = ref.kind, ref.value
    if kind == "any":
        return value in _keys(d) or value.split("-")[0] in _cards(d)
    if ref.vendor != d.vendor:
        return False
    if kind == "uuid":
        return d.id.lower() == value
    if kind == "index":
        return d.index == int(value)
    if kind == "minor":
        return any(n.path == f"/dev/nvidia{int(value)}" for n in d.nodes)
    if kind == "minors":
        return any(n.path == f"/dev/nvidia{int(m)}" for m in value.split(",") for n in d.nodes)
    if kind == "pci":
        return value in _keys(d)
    if kind == "card":
        return value in _cards(d)
    if kind == "xcp":
        return any(n.path in xcp.get(value, ()) for n in d.nodes)
    return False


def _ref(a: "policy.Allocation") -> "policy.DeviceRef":
    """What an allocation takes. A MIG UUID names no parent GPU: the plugin's answer for that
    container does when it passed device nodes (/dev/nvidia<minor>: "minors")."""
    ref = policy.device_ref(a.resource, a.id)
    if ref.kind != "mig":
        return ref
    minors = sorted(
        {p[11:] for p in policy.alloc_device_paths(a.alloc_resp) if p.startswith("/dev/nvidia") and p[11:].isdigit()}
    )
    return policy.DeviceRef(ref.vendor, "minors", ",".join(minors)) if minors else ref


def _keys(d: "Device") -> set:
    return {x.lower() for x in (d.id, d.pci, d.parent) if x}


def _cards(d: "Device") -> set:
    return {name for n in d.nodes if (name := dri_name(n.path)) and name.startswith("card")}


class Held(Record):
    """A device held back (share = "unallocated"): its vendor:id, why (ALLOCATED, UNMAPPED,
    UNREADABLE) and the kubelet's allocation that took it (None for UNREADABLE)."""

    device: str
    reason: str
    allocation: "Allocation | None" = None

    __slots__ = ()

    @property
    def why(self) -> str:
        """The reason in words, for the log and `gpuhook plan`."""
        a = self.allocation
        if self.reason == UNREADABLE or a is None:
            return "the kubelet's checkpoint is unreadable"
        pod, what = policy.show(a.pod, 40), f"{a.resource} {policy.show(a.id, 80)}"
        if self.reason == UNMAPPED:
            return f"the kubelet allocated {what} to pod {pod}, which gpuhook cannot map to a GPU of this node"
        return f"allocated by the kubelet to pod {pod} ({what})"


class Plan(Record):
    """What plan() decided for one container. edits: what to add (empty: leave the spec
    exactly as it is). vendors: those that gave a device (GPUHOOK_ACCELERATOR), devices: the
    vendor:id of each device given (GPUHOOK_DEVICES), both empty when nothing is added.
    held_back: the devices the kubelet allocated to other pods. reason: when a node with GPUs
    gives the container none, one line saying why (None otherwise, but for an unreadable
    kubelet checkpoint). warnings: what was refused and why."""

    edits: "Edits"
    vendors: "tuple[str, ...]" = ()
    devices: "tuple[str, ...]" = ()
    held_back: "tuple[Held, ...]" = ()
    reason: "str | None" = None
    warnings: "tuple[str, ...]" = ()

    __slots__ = ()


class _Taken(Record):
    """What the kubelet allocated to other pods (share = "unallocated"): each allocation with
    the device it names (DeviceRef, Allocation), and the render nodes of the AMD partitions
    they name; unknown: why none can be given when its checkpoint cannot be read."""

    refs: tuple = ()
    xcp: "dict | None" = None
    unknown: "str | None" = None

    __slots__ = ()


def unusable(v: "VendorInventory", caps: "frozenset | None" = None) -> "tuple[str, str] | None":
    """(code, reason) when the vendor's devices are there but what its userspace needs is
    not, for a container asking for `caps` (NVIDIA; None: the default capabilities); None
    when it can work. code is short enough for a label value (agent/labels.py)."""
    if v.vendor == "nvidia":
        return nvidia.missing(v, caps)
    if v.vendor == "dxg" and not any(lib.path.rpartition("/")[2] == DXG_NEEDS for lib in v.libraries):
        return "no-libdxcore", f"no {DXG_NEEDS} in /usr/lib/wsl/lib"
    return None


# what a failed plan() leaves on the exception it raises: the warnings given before it (the
# create logs them with the error); the exception itself goes on as it was
WARNINGS_SO_FAR = "gpuhook_plan_warnings"


def plan(inv: "Inventory", state: "NodeState", req: "Request", config: "Config") -> "Plan":
    """The Plan for one container on the node `inv` and `state` describe (state: read before,
    probe/nodestate.py), under the node config `config`. Reads no file. A failure on the way
    raises as it is, with the warnings given before it as its WARNINGS_SO_FAR attribute."""
    warnings: list[str] = []
    try:
        return _plan(inv, state, req, config, warnings)
    except Exception as e:
        setattr(e, WARNINGS_SO_FAR, tuple(warnings))
        raise


def _plan(inv: "Inventory", state: "NodeState", req: "Request", config: "Config", warnings: list[str]) -> "Plan":
    warn = warnings.append
    if req.is_sandbox or not inv.vendors:
        return Plan(Edits())
    pod = policy.pod_policy(req.annotations, warn)
    if not pod.inject:
        return Plan(Edits(), reason=f'the pod says {policy.INJECT}: "false"', warnings=tuple(warnings))
    taken = _taken(state, req, config, warn)
    held: list[Held] = []
    choices = [c for v in inv.vendors if (c := _choice(v, req, pod, taken, held, warn)) is not None]
    if pod.max_gpus is not None:
        fixed = sum(_in_spec(d, req) for c in choices for d in c.devices)
        choices = _limit(choices, req, max(0, pod.max_gpus - fixed), state, warn)
    edits = _edits(inv, req, [c for c in choices if c.devices or c.driver_only], state, config, warn)
    given = [c for c in choices if c.devices] if edits else []
    return Plan(
        edits,
        tuple(c.vendor.vendor for c in given),
        tuple(f"{c.vendor.vendor}:{d.id}" for c in given for d in c.devices),
        tuple(held),
        taken.unknown or (None if edits else _why_none(inv, pod, held, choices)),
        tuple(warnings),
    )


def _taken(state: "NodeState", req: "Request", config: "Config", warn) -> "_Taken":
    """What the kubelet allocated to pods other than this container's own."""
    if config.share != "unallocated":
        return _Taken()
    why = state.allocations_unknown
    if why is not None:
        warn(f"share = unallocated: {why}; no GPU is given (which are free is unknown)")
        return _Taken(unknown=f"{why}: which GPUs are free is unknown (share = unallocated)")
    own = policy.pod_uid(req.annotations)
    refs = tuple((_ref(a), a) for a in state.allocations if own is None or a.pod != own)
    return _Taken(refs, state.partitions)


def _choice(v: "VendorInventory", req: "Request", pod, taken: "_Taken", held: list, warn) -> "Choice | None":
    """The vendor's share: None when it gives nothing (no device, not among the pod's vendors,
    NVIDIA_VISIBLE_DEVICES void, its userspace missing)."""
    if not v.devices or (pod.vendors is not None and v.vendor not in pod.vendors):
        return None
    vis, caps = None, None
    if v.vendor == "nvidia":
        vis = nvidia.visible(req.env, req.mounts)
        if vis.mode == "void":
            return None
        caps = nvidia.driver_caps(req.env, warn)
    missing = unusable(v, caps)
    if missing is not None:
        warn(f"{v.vendor}: {len(v.devices)} device(s) not given: {missing[1]}; the container runs without them")
        return None
    fixed = [d for d in v.devices if _in_spec(d, req)]
    if fixed:
        candidates = []
    else:
        candidates = list(v.devices) if vis is None else nvidia.visible_devices(v, vis, warn)
    if candidates and taken.unknown:
        held.extend(Held(f"{v.vendor}:{d.id}", UNREADABLE) for d in candidates)
        candidates = []
    elif candidates and taken.refs:
        candidates = _hold_back(v, candidates, taken, held, warn)
    return Choice(v, fixed + candidates, vis is not None and vis.mode == "none", caps)


def _hold_back(v: "VendorInventory", candidates: "list[Device]", taken: "_Taken", held: list, warn) -> "list[Device]":
    """The candidates the kubelet did not allocate to other pods; each one held back is
    appended to `held`. An id under the vendor's resource that maps to no GPU of this node (a
    format gpuhook does not know, a MIG UUID, a GPU it does not see) holds back all of the
    vendor's GPUs: which one it takes is unknown."""
    xcp = taken.xcp or {}
    unmapped = [
        a
        for ref, a in taken.refs
        if ref.vendor == v.vendor and ref.kind != "none" and not any(_takes(ref, d, xcp) for d in v.devices)
    ]
    if unmapped:
        first = Held("", UNMAPPED, unmapped[0])
        warn(f"share = unallocated: {first.why}; no {v.vendor} GPU is given")
        held.extend(first._replace(device=f"{v.vendor}:{d.id}") for d in candidates)
        return []
    keep = []
    for d in candidates:
        a = next((a for ref, a in taken.refs if _takes(ref, d, xcp)), None)
        if a is None:
            keep.append(d)
        else:
            held.append(Held(f"{v.vendor}:{d.id}", ALLOCATED, a))
    return keep


def _why_none(inv: "Inventory", pod, held: "list[Held]", choices: "list[Choice]") -> str:
    """One line: why a node with GPUs gave this container none."""
    if held and not any(c.devices for c in choices):
        unmapped = next((h.why for h in held if h.reason == UNMAPPED), None)
        if unmapped is not None:
            return f'all {len(held)} GPU(s) held back: {unmapped} (share = "unallocated")'
        return f'all {len(held)} GPU(s) held back: allocated by the kubelet to other pods (share = "unallocated")'
    if pod.max_gpus == 0:
        return f'the pod says {policy.MAX_GPUS}: "0"'
    if pod.vendors is not None and not any(v.vendor in pod.vendors for v in inv.vendors if v.devices):
        return f"the pod's {policy.VENDORS} names no vendor of this node"
    return (
        "no usable GPU for this container (its NVIDIA_VISIBLE_DEVICES, or a vendor's userspace missing: see warnings)"
    )


def _limit(choices: "list[Choice]", req: "Request", budget: int, state: "NodeState", warn) -> "list[Choice]":
    keys = [f"{c.vendor.vendor}:{d.id}" for c in choices for d in c.devices if not _in_spec(d, req)]
    choose = state.round_robin
    keep = set(choose(keys, budget, warn) if choose is not None else keys[:budget])
    return [
        c._replace(devices=[d for d in c.devices if _in_spec(d, req) or f"{c.vendor.vendor}:{d.id}" in keep])
        for c in choices
    ]


def _edits(
    inv: "Inventory", req: "Request", choices: "list[Choice]", state: "NodeState", config: "Config", warn
) -> "Edits":
    parts = [
        nvidia.part(inv.root, req.env, c, state, warn) if c.vendor.vendor == "nvidia" else vendor_part(inv.root, c)
        for c in choices
    ]
    nodes = [n for p in parts for n in p.nodes]
    mounts = [m for p in parts for m in p.mounts]
    if req.userns:
        nodes = _creatable(inv, nodes, warn)
    if not nodes and not mounts:
        return Edits()
    nodes = list(dict.fromkeys(nodes))
    given = [c for c in choices if c.devices]
    env: tuple[str, ...] = ()
    if given:
        ids = ",".join(f"{c.vendor.vendor}:{d.id}" for c in given for d in c.devices)
        env = (f"GPUHOOK_ACCELERATOR={','.join(c.vendor.vendor for c in given)}", f"GPUHOOK_DEVICES={ids}")
    hooks = _hooks(req, parts, state, config, warn)
    return Edits(env, tuple(nodes), tuple(dict.fromkeys(mounts)), hooks, _group_gids(nodes))


def _creatable(inv: "Inventory", nodes: "list[DeviceNode]", warn) -> "list[DeviceNode]":
    """In a user namespace runc cannot mknod: it bind-mounts each node from the host, and a
    node the driver has not created yet (nvidia-uvm-tools, nvidia-modeset...) would fail the
    whole create. Such nodes are left out there."""
    absent = {
        n.path
        for v in inv.vendors
        for n in (*v.control_nodes, *(m for d in v.devices for m in d.nodes))
        if not n.present
    }
    left_out = sorted({n.path for n in nodes if n.path in absent})
    if not left_out:
        return nodes
    warn(f"user namespace: {', '.join(left_out)} not created on the host yet, left out")
    return [n for n in nodes if n.path not in absent]


def _hooks(req: "Request", parts: "list[Part]", state: "NodeState", config: "Config", warn) -> "tuple[Hook, ...]":
    """The createContainer hooks: the ld cache over the directories of the libraries mounted,
    and Intel's /dev/dri/by-path links. They run as root on the host before pivot_root: each
    in gpuhook-hook, isolated from the host (gpuhook/hook/)."""
    rootfs = req.rootfs
    if not rootfs:
        return ()
    lib_paths = [p for part in parts for p in part.lib_paths]
    lib_dirs = sorted({os.path.dirname(p) for p in lib_paths if ".so" in p.rpartition("/")[2]})
    bypath = tuple(x for part in parts for x in part.bypath)
    wanted: dict[str, tuple[str, ...]] = {}
    if lib_dirs and state.ldconfig:
        wanted[hook.LDCACHE] = (state.ldconfig, *lib_dirs)
    if bypath:
        wanted[hook.BYPATH] = bypath
    helper = state.helper
    if wanted and helper is None:
        what = ", ".join(hook.DESCRIPTION[k] for k in wanted)
        warn(f"{hook.package_helper()} is missing: no {what} in the container (reinstall gpuhook with a C compiler)")
        return ()
    env = hook.env(config.log_file)
    return tuple(
        Hook("createContainer", helper, hook.argv(kind, rootfs, args), env, hook.TIMEOUT[kind], kind)
        for kind, args in wanted.items()
        if helper
    )


def _group_gids(nodes: "list[DeviceNode]") -> "tuple[int, ...]":
    """The host groups of nodes that only their group may open (0660 render, video): without
    them a non-root container cannot use the device."""
    gids = []
    for n in nodes:
        if n.gid and n.file_mode is not None and (n.file_mode & 0o006) != 0o006 and (n.file_mode & 0o060):
            gids.append(n.gid)
    return tuple(dict.fromkeys(gids))
