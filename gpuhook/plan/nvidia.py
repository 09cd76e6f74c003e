"""NVIDIA's policy: its env contract (nvidia-container-toolkit's names and vocabulary) and what
a container of NVIDIA gets.

- NVIDIA_VISIBLE_DEVICES picks the GPUs (void/empty: nothing; none: driver files only; a
  list of indices or UUIDs; the device plugin's volume-mounts strategy);
- NVIDIA_DRIVER_CAPABILITIES picks the driver files (DRM nodes only for graphics/display;
  GSP firmware and the IPC sockets with any; the MPS pipe directory with compute);
- NVIDIA_IMEX_CHANNELS picks the IMEX channels;
- CUDA_MPS_PIPE_DIRECTORY is where the node's MPS pipes go in the container.

Values from the image's env are untrusted: each is read into a small value here, and what is
refused is said through `warn`.
"""

import os

from .. import defaults
from ..edits import DeviceNode, Mount
from ..inventory import Device, NodeState, VendorInventory
from ..nvidia_tools import NVIDIA_TOOLS
from ..record import Record
from .parts import Choice, Part, device_node, on_host
from .policy import show

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
CAPS_ENV = "NVIDIA_DRIVER_CAPABILITIES"
IMEX_ENV = "NVIDIA_IMEX_CHANNELS"
MPS_ENV = "CUDA_MPS_PIPE_DIRECTORY"
ALL_CAPS = frozenset({"compute", "utility", "video", "graphics", "display", "ngx", "compat32"})
DEFAULT_CAPS = frozenset({"utility", "compute"})
# the NVIDIA device plugin's volume-mounts strategy: the ids are mount destinations under it
VOLUME_MOUNTS_DIR = "/var/run/nvidia-container-devices"
IMEX_PREFIX = "/dev/nvidia-caps-imex-channels/channel"
DRIVER_ONLY_CAPS = ("firmware", "ipc")  # mounted with any NVIDIA driver files
# What a container of NVIDIA cannot work without: the library of the first of these
# capabilities it asks for (NVIDIA_DRIVER_CAPABILITIES).
NEEDS = (("compute", "libcuda.so.1"), ("utility", "libnvidia-ml.so.1"))
# Driver libraries that build tools and JIT compilers link by their development name
# (`-lcuda`: Triton, nvcc's link step): the same file is mounted at that name too, beside
# the library, so nothing is written through the image.
DEV_NAMES = {
    "libcuda.so.1": "libcuda.so",
    "libnvidia-ml.so.1": "libnvidia-ml.so",
    "libnvcuvid.so.1": "libnvcuvid.so",
    "libnvidia-encode.so.1": "libnvidia-encode.so",
}
BIND_RW = ("nosuid", "nodev", "noexec", "rbind", "rprivate")


class Visible(Record):
    """mode: all (every GPU), none (driver files, no GPU), void (nothing), list (tokens)."""

    mode: str
    tokens: "tuple[str, ...]" = ()

    __slots__ = ()


def visible(env: dict, mounts: tuple = ()) -> "Visible":
    """NVIDIA_VISIBLE_DEVICES. Unset: every GPU (a gpu-optional container asks for what the
    node has). Empty or "void": nothing at all. "none": driver files, no GPU. "all". Else a
    comma-separated list of indices, UUIDs or UUID prefixes (the device plugin's envvar
    strategy), or /var/run/nvidia-container-devices (its volume-mounts strategy: the ids
    are the names of the spec's mounts under that directory)."""
    if VISIBLE_ENV not in env:
        return Visible("all")
    value = env[VISIBLE_ENV].strip()
    low = value.lower()
    if low in ("", "void"):
        return Visible("void")
    if low in ("none", "all"):
        return Visible(low)
    if value.rstrip("/") == VOLUME_MOUNTS_DIR:
        prefix = VOLUME_MOUNTS_DIR + "/"
        tokens = tuple(m[len(prefix) :] for m in mounts if m.startswith(prefix) and "/" not in m[len(prefix) :])
        return Visible("list", tokens) if tokens else Visible("void")
    return Visible("list", tuple(t.strip() for t in value[:4096].split(",") if t.strip()))


def driver_caps(env: dict, warn) -> frozenset:
    """NVIDIA_DRIVER_CAPABILITIES: default utility,compute; "all"; unknown words are ignored."""
    value = env.get(CAPS_ENV, "").strip().lower()
    if not value:
        return DEFAULT_CAPS
    caps = set()
    for t in value[:1024].split(","):
        t = t.strip()
        if t == "all":
            return ALL_CAPS
        if t in ALL_CAPS:
            caps.add(t)
        elif t:
            warn(f"{CAPS_ENV}: unknown capability {show(t)} ignored")
    return frozenset(caps) or DEFAULT_CAPS


def imex_channels(env: dict) -> "frozenset | None":
    """NVIDIA_IMEX_CHANNELS: None = every channel the node has; else the channel numbers."""
    if IMEX_ENV not in env:
        return None
    value = env[IMEX_ENV].strip().lower()
    if value == "all":
        return None
    return frozenset(
        int(t) for t in value[:4096].split(",") if t.strip().isascii() and t.strip().isdigit() and len(t.strip()) < 7
    )


def container_dir(path: str) -> "str | None":
    """A directory path the container names for itself (CUDA_MPS_PIPE_DIRECTORY): absolute,
    normal, not / and not in /proc, /sys or /dev; None when it is not."""
    if not path.startswith("/") or len(path) > 255 or "\0" in path:
        return None
    norm = os.path.normpath(path)
    if norm != path.rstrip("/") or norm == "/" or norm.split("/")[1] in ("proc", "sys", "dev"):
        return None
    return norm


def missing(v: "VendorInventory", caps: "frozenset | None" = None) -> "tuple[str, str] | None":
    """(code, reason) when the library the container cannot work without (NEEDS: the first
    capability of `caps` it names; None: the default capabilities) is not on the node."""
    for cap, soname in NEEDS:
        if cap in (DEFAULT_CAPS if caps is None else caps):
            if any(lib.soname == soname for lib in v.libraries):
                return None
            return (
                f"no-{soname.partition('.so')[0]}",
                f"no {soname} of driver {v.driver_version or '(unknown version)'} on this node (capability {cap})",
            )
    return None


def visible_devices(v: "VendorInventory", vis: "Visible", warn) -> "list[Device]":
    """The GPUs NVIDIA_VISIBLE_DEVICES names, by index or UUID (prefix), in index order."""
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
            warn(f"{VISIBLE_ENV}: {show(t)} is not a GPU index or UUID (MIG devices are not supported), ignored")
            continue
        if len(found) != 1:
            what = "matches no GPU of this node" if not found else f"matches {len(found)} GPUs"
            warn(f"{VISIBLE_ENV}: {show(t)} {what}, ignored")
            continue
        if found[0] not in picked:
            picked.append(found[0])
    return sorted(picked, key=lambda d: d.index)


def part(root: str, env: dict, c: "Choice", state: "NodeState", warn) -> "Part":
    """What the container's capabilities ask for: the GPUs' nodes (DRM ones for graphics or
    display only), the control nodes (IMEX channels as asked), the libraries of those
    capabilities (and at their development names), their tools, and MPS with compute."""
    v = c.vendor
    caps = c.caps or DEFAULT_CAPS
    drm = bool(caps & {"graphics", "display"})
    nodes: list[DeviceNode] = []
    for d in c.devices:
        nodes.extend(device_node(n) for n in d.nodes if drm or not n.path.startswith("/dev/dri/"))
    channels = imex_channels(env)
    for n in v.control_nodes:
        if n.path.startswith(IMEX_PREFIX) and channels is not None and int(n.path[len(IMEX_PREFIX) :]) not in channels:
            continue
        nodes.append(device_node(n))
    mounts: list[Mount] = []
    lib_paths: list[str] = []
    for lib in v.libraries:
        if lib.capability in caps or lib.capability in DRIVER_ONLY_CAPS:
            # from a driver root (the GPU Operator's, GKE's): at its path in the container
            dest = v.container_path(lib.path)
            mounts.append(Mount(on_host(root, lib.path), dest))
            if lib.soname:
                lib_paths.append(dest)
            dev = DEV_NAMES.get(lib.soname or "")
            if dev:
                mounts.append(Mount(on_host(root, lib.path), os.path.join(os.path.dirname(dest), dev)))
    mounts.extend(
        Mount(on_host(root, b), v.container_path(b))
        for b in v.binaries
        if NVIDIA_TOOLS.get(b.rpartition("/")[2], "utility") in caps
    )
    if "compute" in caps:
        mounts += mps(env, state, warn)
    return Part(nodes, mounts, lib_paths, [])


def mps(env: dict, state: "NodeState", warn) -> "list[Mount]":
    """The MPS control daemon's pipe directory, read-write, where the container's CUDA looks
    for it (its CUDA_MPS_PIPE_DIRECTORY, else the default). Only where the node config names
    it (mps_pipe_dir; unset: no MPS), never a path the container names; checked on every
    create before plan() (probe/trusted.py: root's, no link, nobody else can write or swap
    it: NodeState.mps_dir) and mounted by its resolved path, the one checked."""
    real = state.mps_dir
    if real is None:
        if state.mps_refused is not None:
            warn(f"mps_pipe_dir: {state.mps_refused}; MPS not mounted")
        return []
    dest = defaults.MPS_PIPE_DIR
    if MPS_ENV in env:
        dest = container_dir(env[MPS_ENV]) or dest
        if dest != env[MPS_ENV].rstrip("/"):
            warn(f"{MPS_ENV}: {show(env[MPS_ENV])} is not a usable directory; the MPS pipes are at /tmp/nvidia-mps")
    return [Mount(real, dest, "bind", BIND_RW)]
