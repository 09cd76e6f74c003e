"""Policy: (Inventory, Request) -> Edits. Every decision about what a container gets lives here.

The probe only reports and the spec editor only applies; this module decides. Its inputs
are validated by plan/policy.py (annotations, env, state); the decisions, in order:

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
   counted first; the others chosen least-used first (policy.least_used: round robin over
   the node's state file).
5. Per vendor, what the chosen devices need: their nodes, the vendor's control nodes,
   libraries and tools; for NVIDIA only what NVIDIA_DRIVER_CAPABILITIES asks for (DRM
   nodes only for graphics/display), GSP firmware and the IPC sockets, the MPS pipe
   directory with compute; for Intel the /dev/dri/by-path links; the host groups of nodes
   that only a group may open (render, video) as additional GIDs.

Reasons for every refusal (invalid annotation, unknown GPU in NVIDIA_VISIBLE_DEVICES...)
are appended to `warnings`: the runtime logs them, and the container starts as the node
policy says.
"""

import os

from .. import defaults, hook
from . import policy
from ..edits import DeviceNode, Edits, Hook, Mount
from ..inventory import Device, Inventory, Node, VendorInventory, node_number
from ..nvidia_tools import NVIDIA_TOOLS
from ..config import DEFAULT_SHARE
from ..record import Record

SANDBOX_ANNOTATIONS = (
    ("io.kubernetes.cri.container-type", "sandbox"),  # containerd CRI
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),  # CRI-O
)
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")
# The createContainer hooks (the ld cache, Intel's /dev/dri/by-path links) run as root on the
# host before pivot_root: each runs in gpuhook-hook, isolated from the host (gpuhook/hook/).
# Names and targets of by-path links are made here from sysfs data and checked, never taken
# from the container.
BYPATH_CHARS = frozenset("0123456789abcdef:.")
BIND_RW = ("nosuid", "nodev", "noexec", "rbind", "rprivate")
IMEX_PREFIX = "/dev/nvidia-caps-imex-channels/channel"
NVIDIA_DRIVER_ONLY_CAPS = ("firmware", "ipc")  # mounted with any NVIDIA driver files
# What a container of NVIDIA cannot work without: the library of the first of these
# capabilities it asks for (NVIDIA_DRIVER_CAPABILITIES).
NVIDIA_NEEDS = (("compute", "libcuda.so.1"), ("utility", "libnvidia-ml.so.1"))
# Driver libraries that build tools and JIT compilers link by their development name
# (`-lcuda`: Triton, nvcc's link step): the same file is mounted at that name too, beside
# the library, so nothing is written through the image.
NVIDIA_DEV_NAMES = {
    "libcuda.so.1": "libcuda.so",
    "libnvidia-ml.so.1": "libnvidia-ml.so",
    "libnvcuvid.so.1": "libnvcuvid.so",
    "libnvidia-encode.so.1": "libnvidia-encode.so",
}
DXG_NEEDS = "libdxcore.so"


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
    return Request(env, annotations, rootfs and os.path.normpath(rootfs), numbers, dests, userns)


def find_ldconfig() -> "str | None":
    """The node's own ldconfig (the hook runs on the real node, not in a fake host root)."""
    return next((p for p in LDCONFIG_CANDIDATES if os.access(p, os.X_OK)), None)


def _node(n: "Node") -> "DeviceNode":
    return DeviceNode(n.path, n.type, n.major, n.minor, "rwm", n.file_mode, n.uid, n.gid)


def _on_host(root: str, path: str) -> str:
    """A node path as the runtime sees it: under the host root (tests, dry runs) or as is."""
    return path if root == "/" else root.rstrip("/") + path


def _drop(_msg: str) -> None:
    pass


class _Choice(Record):
    """One vendor's share of the container: its inventory, the devices given (fixed ones
    from the spec first), whether it gives driver files without any device, and (NVIDIA)
    the driver capabilities the container asks for."""

    vendor: "VendorInventory"
    devices: "list[Device]"
    driver_only: bool
    caps: "frozenset[str] | None" = None

    __slots__ = ()


def unusable(v: "VendorInventory", caps: "frozenset | None" = None) -> "tuple[str, str] | None":
    """(code, reason) when the vendor's devices are there but what its userspace needs is
    not, for a container asking for `caps` (NVIDIA; None: the default capabilities); None
    when it can work. code is short enough for a label value (agent/labels.py)."""
    if v.vendor == "nvidia":
        for cap, soname in NVIDIA_NEEDS:
            if cap in (policy.DEFAULT_CAPS if caps is None else caps):
                if any(lib.soname == soname for lib in v.libraries):
                    return None
                return (
                    f"no-{soname.partition('.so')[0]}",
                    f"no {soname} of driver {v.driver_version or '(unknown version)'} on this node (capability {cap})",
                )
        return None
    if v.vendor == "dxg" and not any(lib.path.rpartition("/")[2] == DXG_NEEDS for lib in v.libraries):
        return "no-libdxcore", f"no {DXG_NEEDS} in /usr/lib/wsl/lib"
    return None


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


def _visible_nvidia(v: "VendorInventory", vis: "policy.Visible", warn) -> "list[Device]":
    if vis.mode == "all":
        return list(v.devices)
    if vis.mode != "list":
        return []
    picked: list[Device] = []
    for t in vis.tokens:
        low = t.lower()
        if t.isascii() and t.isdigit():
            found = [d for d in v.devices if d.index == int(t)]
        elif low.startswith("gpu-"):
            found = [d for d in v.devices if d.id.lower().startswith(low)]
        else:
            warn(
                f"{policy.VISIBLE_ENV}: {policy.show(t)} is not a GPU index or UUID "
                "(MIG devices are not supported), ignored"
            )
            continue
        if len(found) != 1:
            what = "matches no GPU of this node" if not found else f"matches {len(found)} GPUs"
            warn(f"{policy.VISIBLE_ENV}: {policy.show(t)} {what}, ignored")
            continue
        if found[0] not in picked:
            picked.append(found[0])
    return sorted(picked, key=lambda d: d.index)


DRI_DIR = "/dev/dri/"


def _dri_name(path: str) -> "str | None":
    """card1 of /dev/dri/card1; None for a node elsewhere."""
    return path[len(DRI_DIR) :] if path.startswith(DRI_DIR) else None


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
    return {name for n in d.nodes if (name := _dri_name(n.path)) and name.startswith("card")}


def _xcp_nodes(root: str, refs: list) -> dict:
    """amdgpu_xcp_<n> (ROCm's id of a partition) -> its render nodes' /dev paths, from
    <root>/sys/devices/platform/<id>/drm; read only when the checkpoint holds such an id."""
    names = {r.value for r, _ in refs if r.kind == "xcp"}
    if not names:
        return {}
    from ..probe.host import Host

    host = Host(root)
    return {
        x: {f"/dev/dri/{e}" for e in host.listdir(f"/sys/devices/platform/{x}/drm") if e.startswith("renderD")}
        for x in names
    }


UNMAPPED = "which gpuhook cannot map to a GPU of this node"


def _hold_back(
    v: "VendorInventory", candidates: "list[Device]", refs: list, xcp: dict, held: list, warn
) -> "list[Device]":
    """The candidates the kubelet did not allocate to other pods; each one held back is
    appended to `held` as {"device", "why"}. An id under the vendor's resource that maps to
    no GPU of this node (a format gpuhook does not know, a MIG UUID, a GPU it does not see)
    holds back all of the vendor's GPUs: which one it takes is unknown."""
    unmapped = [
        a
        for ref, a in refs
        if ref.vendor == v.vendor and ref.kind != "none" and not any(_takes(ref, d, xcp) for d in v.devices)
    ]
    if unmapped:
        a = unmapped[0]
        why = f"the kubelet allocated {a.resource} {policy.show(a.id, 80)} to pod {policy.show(a.pod, 40)}, " + UNMAPPED
        warn(f"share = unallocated: {why}; no {v.vendor} GPU is given")
        held.extend({"device": f"{v.vendor}:{d.id}", "why": why} for d in candidates)
        return []
    keep = []
    for d in candidates:
        a = next((a for ref, a in refs if _takes(ref, d, xcp)), None)
        if a is None:
            keep.append(d)
        else:
            held.append(
                {
                    "device": f"{v.vendor}:{d.id}",
                    "why": f"allocated by the kubelet to pod {policy.show(a.pod, 40)} ({a.resource} {policy.show(a.id, 80)})",
                }
            )
    return keep


def plan(
    inv: "Inventory",
    req: "Request",
    ldconfig: "str | None" = None,
    config=None,
    state_dir: "str | None" = None,
    warnings: "list | None" = None,
    helper: "str | None" = None,
    explain: "dict | None" = None,
) -> "Edits":
    """The edits for one container. Empty Edits mean: leave the spec exactly as it is.

    ldconfig: the node's (None: find_ldconfig()). helper: gpuhook-hook as the node sees it
    (None: this package's own, when it was built).

    config: the node config (gpuhook.config.Config; None: the defaults). state_dir: where
    the round robin of max-gpus remembers what it gave (None: no memory, the first devices).
    warnings: a list the reasons for what was refused are appended to.

    explain: a dict that gets "vendors" (those that gave a device: GPUHOOK_ACCELERATOR),
    "devices" (the vendor:id of each device given: GPUHOOK_DEVICES), "held_back"
    (the devices held back because the kubelet
    allocated them to other pods: [{"device", "why"}]) and, when a node with GPUs gives the
    container none, "reason" (one line: why it runs without)."""
    warn = warnings.append if warnings is not None else _drop
    explain = {} if explain is None else explain
    if req.is_sandbox or not inv.vendors:
        return Edits()
    pod = policy.pod_policy(req.annotations, warn)
    if not pod.inject:
        explain["reason"] = f'the pod says {policy.INJECT}: "false"'
        return Edits()
    share = getattr(config, "share", None) or DEFAULT_SHARE
    allocated: list | None = []
    held: list[dict] = []
    refs: list = []
    xcp: dict = {}
    if share == "unallocated":
        allocated, why = policy.allocated_devices(inv.root, policy.pod_uid(req.annotations))
        if allocated is None:
            warn(f"share = unallocated: {why}; no GPU is given (which are free is unknown)")
            explain["reason"] = f"{why}: which GPUs are free is unknown (share = unallocated)"
        elif allocated:
            refs = [(_ref(a), a) for a in allocated]
            xcp = _xcp_nodes(inv.root, refs)
    choices: list[_Choice] = []
    fixed_count = 0
    for v in inv.vendors:
        if not v.devices or (pod.vendors is not None and v.vendor not in pod.vendors):
            continue
        fixed = [d for d in v.devices if _in_spec(d, req)]
        driver_only = False
        caps: frozenset | None = None
        if v.vendor == "nvidia":
            vis = policy.nvidia_visible(req.env, req.mounts)
            if vis.mode == "void":
                continue
            caps = policy.nvidia_caps(req.env, warn)
        missing = unusable(v, caps)
        if missing is not None:
            warn(f"{v.vendor}: {len(v.devices)} device(s) not given: {missing[1]}; the container runs without them")
            continue
        if v.vendor == "nvidia":
            driver_only = vis.mode == "none"
            candidates = [] if fixed else _visible_nvidia(v, vis, warn)
        else:
            candidates = [] if fixed else list(v.devices)
        if candidates and allocated is None:
            held.extend(
                {"device": f"{v.vendor}:{d.id}", "why": "the kubelet's checkpoint is unreadable"} for d in candidates
            )
            candidates = []
        elif candidates and allocated:
            candidates = _hold_back(v, candidates, refs, xcp, held, warn)
        fixed_count += len(fixed)
        choices.append(_Choice(v, fixed + candidates, driver_only, caps))
    if pod.max_gpus is not None:
        choices = _limit(choices, req, max(0, pod.max_gpus - fixed_count), state_dir, warn)
    if held:
        explain["held_back"] = held
    edits = _edits(inv, req, [c for c in choices if c.devices or c.driver_only], ldconfig, config, warn, helper)
    if edits:
        given = [c for c in choices if c.devices]
        explain["vendors"] = [c.vendor.vendor for c in given]
        explain["devices"] = [f"{c.vendor.vendor}:{d.id}" for c in given for d in c.devices]
    if not edits and "reason" not in explain:
        explain["reason"] = _why_none(inv, pod, held, choices)
    return edits


def _why_none(inv: "Inventory", pod, held: list, choices: list) -> str:
    """One line: why a node with GPUs gave this container none."""
    if held and not any(c.devices for c in choices):
        unmapped = next((h["why"] for h in held if h["why"].endswith(UNMAPPED)), None)
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


def _limit(choices: "list[_Choice]", req: "Request", budget: int, state_dir, warn) -> "list[_Choice]":
    keys = [f"{c.vendor.vendor}:{d.id}" for c in choices for d in c.devices if not _in_spec(d, req)]
    keep = set(policy.least_used(keys, budget, state_dir, warn))
    return [
        c._replace(devices=[d for d in c.devices if _in_spec(d, req) or f"{c.vendor.vendor}:{d.id}" in keep])
        for c in choices
    ]


def _edits(inv: "Inventory", req: "Request", choices: "list[_Choice]", ldconfig, config, warn, helper) -> "Edits":
    nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    lib_paths: list[str] = []
    accelerators: list[str] = []
    ids: list[str] = []
    bypath: list[str] = []
    for c in choices:
        v = c.vendor
        if c.devices:
            accelerators.append(v.vendor)
            ids.extend(f"{v.vendor}:{d.id}" for d in c.devices)
        if v.vendor == "nvidia":
            part = _nvidia(inv, req, c, config, warn)
            nodes += part.nodes
            mounts += part.mounts
            lib_paths += part.lib_paths
            continue
        for d in c.devices:
            nodes.extend(_node(n) for n in d.nodes)
            if v.vendor == "intel" and d.pci and set(d.pci) <= BYPATH_CHARS:
                for n in d.nodes:
                    name = _dri_name(n.path)
                    numbered = node_number(name) if name else None
                    if numbered is not None:  # (kind, N): a card or render node
                        bypath += [f"pci-{d.pci}-{numbered[0]}", f"../{name}"]
        nodes.extend(_node(n) for n in v.control_nodes)
        for lib in v.libraries:
            mounts.append(Mount(_on_host(inv.root, lib.path), v.container_path(lib.path)))
            lib_paths.append(v.container_path(lib.path))
        mounts.extend(Mount(_on_host(inv.root, b), v.container_path(b)) for b in v.binaries)
    if req.userns:
        # In a user namespace runc cannot mknod: it bind-mounts each node from the host, and a
        # node the driver has not created yet (nvidia-uvm-tools, nvidia-modeset...) would
        # fail the whole create. Such nodes are left out there.
        absent = {
            n.path
            for v in inv.vendors
            for n in (*v.control_nodes, *(m for d in v.devices for m in d.nodes))
            if not n.present
        }
        left_out = sorted({n.path for n in nodes if n.path in absent})
        if left_out:
            warn(f"user namespace: {', '.join(left_out)} not created on the host yet, left out")
            nodes = [n for n in nodes if n.path not in absent]
    if not nodes and not mounts:
        return Edits()
    nodes = list(dict.fromkeys(nodes))
    env: tuple[str, ...] = ()
    if accelerators:
        env = (f"GPUHOOK_ACCELERATOR={','.join(accelerators)}", f"GPUHOOK_DEVICES={','.join(ids)}")
    hooks: list[Hook] = []
    lib_dirs = sorted({os.path.dirname(p) for p in lib_paths if ".so" in p.rpartition("/")[2]})
    wanted: dict[str, tuple[str, ...]] = {}
    rootfs = req.rootfs
    if lib_dirs and rootfs:
        ldconfig = ldconfig or find_ldconfig()
        if ldconfig:
            wanted[hook.LDCACHE] = (ldconfig, *lib_dirs)
    if bypath and rootfs:
        wanted[hook.BYPATH] = tuple(bypath)
    if wanted and helper is None:
        helper = hook.package_helper()
        if not os.access(helper, os.X_OK):
            warn(
                f"{helper} is missing: no {', '.join(hook.DESCRIPTION[k] for k in wanted)} in the container "
                "(reinstall gpuhook with a C compiler)"
            )
            wanted = {}
    if wanted and rootfs and helper:
        for kind, args in wanted.items():
            hooks.append(
                Hook(
                    "createContainer",
                    helper,
                    hook.argv(kind, rootfs, args),
                    hook.env(getattr(config, "log_file", None)),
                    hook.TIMEOUT[kind],
                    kind,
                )
            )
    return Edits(env, tuple(nodes), tuple(dict.fromkeys(mounts)), tuple(hooks), _group_gids(nodes))


def _group_gids(nodes: "list[DeviceNode]") -> "tuple[int, ...]":
    """The host groups of nodes that only their group may open (0660 render, video): without
    them a non-root container cannot use the device."""
    gids = []
    for n in nodes:
        if n.gid and n.file_mode is not None and (n.file_mode & 0o006) != 0o006 and (n.file_mode & 0o060):
            gids.append(n.gid)
    return tuple(dict.fromkeys(gids))


class _Part(Record):
    """What one vendor's choice adds to a container: device nodes, mounts, and the library
    paths (in the container) whose directories the ld-cache hook covers."""

    nodes: "list[DeviceNode]"
    mounts: "list[Mount]"
    lib_paths: "list[str]"

    __slots__ = ()


def _nvidia(inv: "Inventory", req: "Request", c: "_Choice", config, warn) -> "_Part":
    nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    lib_paths: list[str] = []
    v = c.vendor
    caps = c.caps if c.caps is not None else policy.nvidia_caps(req.env, warn)
    drm = bool(caps & {"graphics", "display"})
    for d in c.devices:
        nodes.extend(_node(n) for n in d.nodes if drm or not n.path.startswith("/dev/dri/"))
    channels = policy.imex_channels(req.env)
    for n in v.control_nodes:
        if n.path.startswith(IMEX_PREFIX) and channels is not None and int(n.path[len(IMEX_PREFIX) :]) not in channels:
            continue
        nodes.append(_node(n))
    for lib in v.libraries:
        cap = lib.capability
        if cap in caps or cap in NVIDIA_DRIVER_ONLY_CAPS:
            # from a driver root (the GPU Operator's, GKE's): at its path in the container
            dest = v.container_path(lib.path)
            mounts.append(Mount(_on_host(inv.root, lib.path), dest))
            if lib.soname:
                lib_paths.append(dest)
            dev = NVIDIA_DEV_NAMES.get(lib.soname or "")
            if dev:
                mounts.append(Mount(_on_host(inv.root, lib.path), os.path.join(os.path.dirname(dest), dev)))
    mounts.extend(
        Mount(_on_host(inv.root, b), v.container_path(b))
        for b in v.binaries
        if NVIDIA_TOOLS.get(b.rpartition("/")[2], "utility") in caps
    )
    if "compute" in caps:
        _mps(inv, req, v, config, mounts, warn)
    return _Part(nodes, mounts, lib_paths)


def _mps(inv: "Inventory", req: "Request", v: "VendorInventory", config, mounts: list, warn) -> None:
    """The MPS control daemon's pipe directory, read-write, where the container's CUDA looks
    for it (its CUDA_MPS_PIPE_DIRECTORY, else the default). Only where the node config names
    it (mps_pipe_dir; unset: no MPS), never a path the container names; checked on every
    create (plan/trusted.py: root's, no link, nobody else can write or swap it) and mounted
    by its resolved path, the one checked."""
    host_dir = getattr(config, "mps_pipe_dir", None)
    if not host_dir:
        return
    from .trusted import trusted_dir

    real, why = trusted_dir(inv.root, host_dir)
    if real is None:
        warn(f"mps_pipe_dir: {why}; MPS not mounted")
        return
    dest = defaults.MPS_PIPE_DIR
    if policy.MPS_ENV in req.env:
        dest = policy.container_dir(req.env[policy.MPS_ENV]) or dest
        if dest != req.env[policy.MPS_ENV].rstrip("/"):
            warn(
                f"{policy.MPS_ENV}: {policy.show(req.env[policy.MPS_ENV])} is not a usable directory; "
                "the MPS pipes are at /tmp/nvidia-mps"
            )
    mounts.append(Mount(real, dest, "bind", BIND_RW))
