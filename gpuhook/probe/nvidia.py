"""NVIDIA: GPUs from the driver's /proc files, control nodes, driver files, IPC sockets.

Sources, in order of trust:
- /proc/driver/nvidia/gpus/<bus id>/information: Device Minor, GPU UUID, Model (per GPU);
- /proc/driver/nvidia/version: the kernel module's version (the *running* driver);
- /proc/devices: majors ("nvidia" or the old "nvidia-frontend" = 195; nvidia-uvm, nvidia-caps,
  nvidia-nvswitch, nvidia-caps-imex-channels are dynamic);
- /dev/nvidia<N> when /proc has no GPUs (e.g. a host root without procfs);
- the driver's userspace (libraries, tools, GSP firmware, ICD files) from its driver root
  (driverroot.py): the host's own (its etc/ld.so.cache, else the usual library
  directories), the GPU Operator's /run/nvidia/driver (its own ld cache and directories),
  GKE's /home/kubernetes/bin/nvidia/{lib64,bin}, or the node config's nvidia_driver_root.
  The first that has libcuda of the running driver is taken, whole: nothing is ever mixed
  from two roots, and nothing of another driver version is taken. Files of a driver root
  other than the host go into the container at the path they have inside it (GKE's
  lib64/bin: /usr/local/nvidia/lib64, /usr/bin), recorded as VendorInventory.mount_map.

/dev/nvidia<N>: N is the Device Minor, which need not be the GPU's index.
Control nodes are created lazily by the driver: one whose major is known is reported even
when the file is missing (runc creates it in the container from type/major/minor).

What is reported, by the capability (NVIDIA_DRIVER_CAPABILITIES) it serves; the planner
decides what a container gets:
- per GPU (Device.nodes): /dev/nvidia<minor>; the MIG access capabilities of its GPU and
  compute instances (/dev/nvidia-caps/nvidia-cap<N>, N from the capability's `access` file,
  else /proc/driver/nvidia-caps/mig-minors); its DRM nodes (/dev/dri/card<N>, renderD<N>)
  when nvidia-drm made them (for graphics/display only);
- control nodes: nvidiactl, nvidia-modeset, nvidia-uvm(-tools), NVSwitch nodes
  (nvidia-nvswitchctl, nvidia-nvswitch<N>) and IMEX channels that exist;
- libraries (Library.capability = compute, utility, video, graphics, display, ngx): only files
  named <stem>.so.<running driver version>; a library of another version is skipped;
- other files (Library with soname None): graphics ICD/vendor JSON files ("graphics"), GSP
  firmware of the running version ("firmware"), the nvidia-persistenced and fabric manager
  sockets ("ipc"). Not the MPS pipe directory: the plan checks it on every create
  (plan/trusted.py), where the node config names it.
"""

import stat as _stat

from .. import defaults, vendors
from ..inventory import Device, Library, Node, VendorInventory
from ..nvidia_tools import NVIDIA_TOOLS
from ..record import Record
from . import driverroot
from .common import char_majors, device_node, first_major, is_uint, numbered_names
from .host import Host

VENDOR = vendors.by_module(__name__).name  # this probe's vendor, as the registry names it

FRONTEND_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
NVSWITCH_CTL_MINOR = 255
VENDOR_ID = 0x10DE
GPUS_DIR = "/proc/driver/nvidia/gpus"
CAPS_DIR = "/proc/driver/nvidia/capabilities"
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DEV_DIR = "/dev/nvidia-caps"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
FIRMWARE_DIR = "/lib/firmware/nvidia"

CUDA_SONAME = "libcuda.so.1"
# file stem -> (soname, or None where the soname is the versioned name itself; capability)
LIBRARIES: "dict[str, tuple[str | None, str]]" = {
    "libcuda": (CUDA_SONAME, "compute"),
    "libcudadebugger": ("libcudadebugger.so.1", "compute"),
    "libnvidia-ptxjitcompiler": ("libnvidia-ptxjitcompiler.so.1", "compute"),
    "libnvidia-nvvm": ("libnvidia-nvvm.so.4", "compute"),
    "libnvidia-gpucomp": (None, "compute"),
    "libnvidia-opencl": ("libnvidia-opencl.so.1", "compute"),
    "libnvidia-allocator": ("libnvidia-allocator.so.1", "compute"),
    "libnvidia-pkcs11": (None, "compute"),
    "libnvidia-pkcs11-openssl3": (None, "compute"),
    "libnvidia-ml": ("libnvidia-ml.so.1", "utility"),
    "libnvidia-cfg": ("libnvidia-cfg.so.1", "utility"),
    "libnvidia-nscq": (None, "utility"),
    "libnvcuvid": ("libnvcuvid.so.1", "video"),
    "libnvidia-encode": ("libnvidia-encode.so.1", "video"),
    "libnvidia-opticalflow": ("libnvidia-opticalflow.so.1", "video"),
    "libvdpau_nvidia": ("libvdpau_nvidia.so.1", "video"),
    "libGLX_nvidia": ("libGLX_nvidia.so.0", "graphics"),
    "libEGL_nvidia": ("libEGL_nvidia.so.0", "graphics"),
    "libGLESv2_nvidia": ("libGLESv2_nvidia.so.2", "graphics"),
    "libGLESv1_CM_nvidia": ("libGLESv1_CM_nvidia.so.1", "graphics"),
    "libnvidia-glcore": (None, "graphics"),
    "libnvidia-eglcore": (None, "graphics"),
    "libnvidia-glsi": (None, "graphics"),
    "libnvidia-tls": (None, "graphics"),
    "libnvidia-glvkspirv": (None, "graphics"),
    "libnvidia-rtcore": (None, "graphics"),
    "libnvidia-vulkan-producer": (None, "graphics"),
    "libnvoptix": ("libnvoptix.so.1", "graphics"),
    "libnvidia-fbc": ("libnvidia-fbc.so.1", "graphics"),
    "libglxserver_nvidia": (None, "display"),
    "libnvidia-ngx": ("libnvidia-ngx.so.1", "ngx"),
}
BINARIES = NVIDIA_TOOLS  # tool name -> capability
# graphics/display files that are not libraries (ICDs, GLVND vendor files, Xorg config)
FILES = (
    ("/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "graphics"),
    ("/etc/glvnd/egl_vendor.d/10_nvidia.json", "graphics"),
    ("/usr/share/vulkan/icd.d/nvidia_icd.json", "graphics"),
    ("/etc/vulkan/icd.d/nvidia_icd.json", "graphics"),
    ("/usr/share/vulkan/implicit_layer.d/nvidia_layers.json", "graphics"),
    ("/etc/vulkan/implicit_layer.d/nvidia_layers.json", "graphics"),
    ("/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json", "graphics"),
    ("/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json", "graphics"),
    ("/usr/share/nvidia/nvoptix.bin", "graphics"),
    ("/usr/share/X11/xorg.conf.d/10-nvidia.conf", "display"),
)
# IPC endpoints (libnvidia-container's list); /var/run is usually a link to /run
SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
LIB_SUBDIRS = {"libvdpau_nvidia": ("vdpau",)}
XORG_DIRS = (
    "/usr/lib/xorg/modules/extensions",
    "/usr/lib64/xorg/modules/extensions",
    "/usr/lib/x86_64-linux-gnu/nvidia/xorg",
)


def parse_information(text: str) -> "dict[str, str]":
    """The `information` file: "Key: \\t value" lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_version(text: str) -> "str | None":
    """/proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  ..."."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            words = line.split()
            for i, w in enumerate(words):
                if w == "Module" and i + 1 < len(words) and _is_version(words[i + 1]):
                    return words[i + 1]
            for w in words:  # older formats: the first dotted number
                if _is_version(w):
                    return w
    return None


def parse_mig_minors(text: str) -> "dict[str, int]":
    """/proc/driver/nvidia-caps/mig-minors: "gpu0/gi1/access 12", "config 1", "monitor 2" lines."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, minor = line.strip().partition(" ")
        minor = minor.strip()
        if name and is_uint(minor) and len(minor) < 8:
            out.setdefault(name, int(minor))
    return out


def _is_version(s: str) -> bool:
    parts = s.split(".")
    return len(parts) >= 2 and all(is_uint(p) for p in parts)


def _gpus_from_proc(host: "Host", major: int) -> "list[Device]":
    bus_ids = [b for b in host.listdir(GPUS_DIR) if ":" in b]
    devices = []
    unknown_minor = []
    for bus_id in bus_ids:
        text = host.read_text(f"{GPUS_DIR}/{bus_id}/information", quiet=True)
        info = parse_information(text) if text is not None else {}
        minor_s = info.get("Device Minor", "")
        if info.get("GPU Excluded", "No").lower().startswith("yes"):
            host.warn(f"nvidia: GPU {bus_id} is excluded by the driver, skipped")
            continue
        minor = int(minor_s) if is_uint(minor_s) else None
        if minor is None:
            unknown_minor.append(bus_id)
        devices.append((bus_id, minor, info))
    if unknown_minor:
        # Old drivers and partial captures: no Device Minor. The driver numbers GPUs in
        # PCI order, so that is the best guess; say so.
        host.warn(f"nvidia: no Device Minor for {', '.join(unknown_minor)}; assuming PCI order")
        taken = {m for _, m, _ in devices if m is not None}
        free = (m for m in range(256) if m not in taken)
        devices = [(b, m if m is not None else next(free), i) for b, m, i in devices]
    out = []
    for index, (bus_id, minor, info) in enumerate(sorted(devices, key=lambda d: d[0].lower())):
        node = device_node(host, f"/dev/nvidia{minor}", major, minor, lazy=True)
        out.append(
            Device(
                VENDOR,
                "gpu",
                index,
                info.get("GPU UUID") or bus_id,
                (node,),
                pci=bus_id.lower(),
                model=info.get("Model"),
                driver="nvidia",
            )
        )
    return out


def _gpus_from_dev(host: "Host", major: int) -> "list[Device]":
    minors = [n for n, _ in numbered_names(host.listdir("/dev"), "nvidia")]
    out = []
    for index, minor in enumerate(minors):
        node = device_node(host, f"/dev/nvidia{minor}", major, minor)
        if node is not None:
            out.append(Device(VENDOR, "gpu", index, f"nvidia{minor}", (node,), driver="nvidia"))
    return out


# -- per-GPU extras: MIG capabilities, DRM nodes --------------------------------------


def _access_minor(host: "Host", path: str, table: "dict[str, int]", name: str) -> "int | None":
    """A MIG capability's minor: its `access` file ("DeviceFileMinor: 12"), else mig-minors."""
    text = host.read_text(path, limit=4096, quiet=True) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and is_uint(value.strip()) and len(value.strip()) < 8:
            return int(value.strip())
    return table.get(name)


def _mig_nodes(host: "Host", gpu_minor: int, table: "dict[str, int]", caps_major: "int | None") -> "list[Node]":
    """The access capabilities of the GPU's MIG instances (GIs and their CIs): what a process
    needs, besides /dev/nvidia<minor>, to use them. Never config/monitor (MIG management)."""
    names: list[tuple[str, str | None]] = []
    base = f"{CAPS_DIR}/gpu{gpu_minor}/mig"
    gis = numbered_names(host.listdir(base), "gi")
    if gis:
        for _, gi in gis:
            names.append((f"gpu{gpu_minor}/{gi}/access", f"{base}/{gi}/access"))
            for _, ci in numbered_names(host.listdir(f"{base}/{gi}"), "ci"):
                names.append((f"gpu{gpu_minor}/{gi}/{ci}/access", f"{base}/{gi}/{ci}/access"))
    elif table and not host.is_dir(CAPS_DIR):
        # no capabilities in /proc (a partial capture): the cap nodes that exist for this GPU
        prefix = f"gpu{gpu_minor}/"
        present = {n for n, _ in numbered_names(host.listdir(CAPS_DEV_DIR), "nvidia-cap")}
        names = [
            (name, None)
            for name, minor in sorted(table.items(), key=lambda x: x[1])
            if name.startswith(prefix) and minor in present
        ]
    out = []
    for name, access in names:
        minor = _access_minor(host, access, table, name) if access else table.get(name)
        if minor is None:
            continue
        node = device_node(host, f"{CAPS_DEV_DIR}/nvidia-cap{minor}", caps_major, minor, lazy=True)
        if node is not None:
            out.append(node)
    return out


def has_mig(d: "Device") -> bool:
    """Whether an NVIDIA GPU of the probe has MIG instances: the access capabilities of its
    GIs and CIs (_mig_nodes), under CAPS_DEV_DIR, are among its nodes."""
    return any(n.path.startswith(CAPS_DEV_DIR + "/") for n in d.nodes)


def _drm_nodes(host: "Host", pcis: "set[str]", drm_major: int) -> "dict[str, tuple[Node, ...]]":
    """PCI address -> the nvidia-drm card/render nodes of that GPU."""
    if not host.listdir("/sys/class/drm"):
        return {}
    from .drm import drm_devices

    out = {}
    for d in drm_devices(host, drm_major):
        if d.pci and d.pci.lower() in pcis and (d.vendor_id in (VENDOR_ID, None)):
            out[d.pci.lower()] = tuple(n for n in (d.card, d.render) if n is not None)
    return out


def _with_extras(host: "Host", devices: "list[Device]", majors: "dict[str, list[int]]") -> "list[Device]":
    table_text = host.read_text(MIG_MINORS, quiet=True)
    table = parse_mig_minors(table_text) if table_text else {}
    caps_major = first_major(majors, "nvidia-caps")
    drm = _drm_nodes(host, {d.pci for d in devices if d.pci}, first_major(majors, "drm") or 226)
    out = []
    for d in devices:
        extra: list[Node] = []
        if table or host.lstat(f"{CAPS_DIR}/gpu{d.nodes[0].minor}") is not None:
            extra += _mig_nodes(host, d.nodes[0].minor, table, caps_major)
        extra += drm.get(d.pci or "", ())
        out.append(d._replace(nodes=d.nodes + tuple(extra)) if extra else d)
    return out


# -- control nodes ---------------------------------------------------------------------


def _control_nodes(host: "Host", majors: "dict[str, list[int]]", major: int) -> "tuple[Node, ...]":
    uvm = first_major(majors, "nvidia-uvm")
    wanted: list[tuple[str, int | None, int | None, bool]] = [
        ("/dev/nvidiactl", major, CTL_MINOR, True),
        ("/dev/nvidia-modeset", major, MODESET_MINOR, True),
    ]
    if uvm is None:  # no /proc/devices: take the nodes' own numbers when they exist
        wanted += [("/dev/nvidia-uvm", None, None, True), ("/dev/nvidia-uvm-tools", None, None, True)]
    else:
        wanted += [("/dev/nvidia-uvm", uvm, 0, True), ("/dev/nvidia-uvm-tools", uvm, 1, True)]
    # NVSwitch and IMEX channels: only the nodes that exist (they are not created lazily here)
    nvswitch = first_major(majors, "nvidia-nvswitch")
    dev = host.listdir("/dev")
    if "nvidia-nvswitchctl" in dev:
        wanted.append(("/dev/nvidia-nvswitchctl", nvswitch, NVSWITCH_CTL_MINOR, False))
    for minor, name in numbered_names(dev, "nvidia-nvswitch"):
        wanted.append((f"/dev/{name}", nvswitch, minor, False))
    imex = first_major(majors, "nvidia-caps-imex-channels")
    for minor, name in numbered_names(host.listdir(IMEX_DIR), "channel"):
        if len(name) < 15:  # at most 8 digits: a minor number
            wanted.append((f"{IMEX_DIR}/{name}", imex, minor, False))
    nodes = (device_node(host, path, maj, mi, lazy=lazy) for path, maj, mi, lazy in wanted)
    return tuple(n for n in nodes if n is not None)


# -- driver files ------------------------------------------------------------------------


class Layout(Record):
    """How a driver root holds the userspace: where its libraries, tools and firmware are,
    and where each goes in the container. dest: (directory in the root, container
    directory) pairs; a path under none of them keeps its path inside the root."""

    name: str
    lib_dirs: "tuple[str, ...]"
    xorg_dirs: "tuple[str, ...]"
    bin_dirs: "tuple[str, ...]"
    firmware_dir: str
    dest: "tuple[tuple[str, str], ...]"

    __slots__ = ()


# the host, and a driver root laid out like one (the GPU Operator's driver container)
ROOTED = Layout("rooted", defaults.LIB_DIRS, XORG_DIRS, defaults.BIN_DIRS, FIRMWARE_DIR, ())
# GKE's installer: lib64/, bin/ (and firmware/nvidia/<version> where it leaves the GSP
# firmware). Libraries go to /usr/local/nvidia/lib64, where CUDA images look on GKE (their
# LD_LIBRARY_PATH; the ld-cache hook adds the directory for the others), tools to /usr/bin,
# on every image's PATH.
FLAT = Layout(
    "flat",
    ("/lib64",),
    (),
    ("/bin",),
    "/firmware/nvidia",
    (("/lib64", "/usr/local/nvidia/lib64"), ("/bin", "/usr/bin"), ("/firmware/nvidia", FIRMWARE_DIR)),
)
# what the probe looks up in an ld cache: sonames and versioned names, all "<stem>.so..."
_CACHE_PREFIXES = tuple(f"{stem}.so".encode() for stem in LIBRARIES)


def _ldcache(host: "Host") -> "dict[str, str]":
    data = host.read_bytes("/etc/ld.so.cache", limit=64 << 20, quiet=True)
    if data is None:
        return {}
    from . import ldcache

    try:
        return ldcache.lookup(ldcache.parse(data, _CACHE_PREFIXES))
    except ldcache.LdCacheError as e:
        host.warn(f"/etc/ld.so.cache: {e}; searching the usual directories")
        return {}


def _version_suffix(path: str, stem: str) -> "str | None":
    base = path.rsplit("/", 1)[-1]
    prefix = stem + ".so."
    return base[len(prefix) :] if base.startswith(prefix) and _is_version(base[len(prefix) :]) else None


class _Dirs:
    """Directory listings, read once each (a library directory holds thousands of names)."""

    __slots__ = ("host", "names")

    def __init__(self, host: "Host") -> None:
        self.host = host
        self.names: dict[str, frozenset] = {}

    def has(self, d: str, name: str) -> bool:
        names = self.names.get(d)
        if names is None:
            names = self.names[d] = frozenset(self.host.listdir(d))
        return name in names


def _search_dirs(stem: str, hit: "str | None", layout: "Layout") -> "list[str]":
    dirs = [hit.rpartition("/")[0]] if hit else []
    if stem == "libglxserver_nvidia":
        dirs += layout.xorg_dirs
    else:
        subs = LIB_SUBDIRS.get(stem)
        dirs += [f"{d}/{s}" for d in layout.lib_dirs for s in subs] if subs else layout.lib_dirs
    return list(dict.fromkeys(dirs))


def _find_library(
    host: "Host",
    stem: str,
    soname: "str | None",
    version: "str | None",
    cache: "dict[str, str]",
    dirs: "_Dirs",
    layout: "Layout",
) -> "str | None":
    """The real file of `stem` for the running driver, as a node path; None (with a warning
    where something of another version or a dangling name was found instead)."""
    hit = (cache.get(soname) if soname else None) or (cache.get(f"{stem}.so.{version}") if version else None)
    where = _search_dirs(stem, hit, layout)
    if version is not None:
        want = f"{stem}.so.{version}"
        for d in where:
            if dirs.has(d, want):
                real = host.realpath(f"{d}/{want}")
                if host.exists(real):
                    return real
    # no file of the running version: look at what the soname leads to, to say why it is skipped
    cand = hit or next((f"{d}/{soname}" for d in where if soname and dirs.has(d, soname)), None)
    if cand is None:
        return None
    real = host.realpath(cand)
    if not host.exists(real):
        host.warn(f"nvidia: {soname or stem} -> {cand} does not exist, skipped")
        return None
    found = _version_suffix(real, stem)
    if version is not None and found != version:
        host.warn(f"nvidia: {real} is not of driver {version}, skipped")
        return None
    return real


def _libraries(host: "Host", version: "str | None", layout: "Layout") -> "tuple[tuple[Library, ...], str | None]":
    cache = _ldcache(host)
    dirs = _Dirs(host)
    if version is None:  # no /proc: the version libcuda.so.1 leads to
        hit = cache.get(CUDA_SONAME) or next(
            (f"{d}/{CUDA_SONAME}" for d in layout.lib_dirs if dirs.has(d, CUDA_SONAME)), None
        )
        if hit:
            version = _version_suffix(host.realpath(hit), "libcuda")
    libs = []
    for stem, (soname, capability) in LIBRARIES.items():
        path = _find_library(host, stem, soname, version, cache, dirs, layout)
        if path is not None:
            libs.append(Library(path, soname or path.rsplit("/", 1)[-1], capability))
    return tuple(dict.fromkeys(libs)), version


def _binaries(host: "Host", layout: "Layout") -> "tuple[str, ...]":
    out = []
    for name in BINARIES:
        for d in layout.bin_dirs:
            if host.exists(f"{d}/{name}"):
                out.append(host.realpath(f"{d}/{name}"))
                break
    return tuple(dict.fromkeys(out))


def _driver_files(host: "Host", version: "str | None", layout: "Layout") -> "tuple[Library, ...]":
    """ICD/vendor files and the GSP firmware of the running version, from a driver root."""
    out = []
    for path, capability in FILES if layout is ROOTED else ():
        st = host.stat(path)
        if st is not None and _stat.S_ISREG(st.st_mode):
            out.append(Library(host.realpath(path), None, capability))
    if version is not None:
        fw = f"{layout.firmware_dir}/{version}"
        for name in host.listdir(fw):
            if name.startswith("gsp") and name.endswith(".bin"):
                st = host.stat(f"{fw}/{name}")
                if st is not None and _stat.S_ISREG(st.st_mode):
                    out.append(Library(host.realpath(f"{fw}/{name}"), None, "firmware"))
    return tuple(dict.fromkeys(out))


def _ipc_files(host: "Host") -> "tuple[Library, ...]":
    """The node's IPC sockets (the host's, whatever the driver root). The MPS pipe directory
    is not probed: plan/trusted.py checks it on every create, where the node config names it."""
    out = []
    for path in SOCKETS:
        st = host.stat(path)
        if st is None:
            st = host.stat("/var" + path)
            path = "/var" + path
        if st is not None and (_stat.S_ISSOCK(st.st_mode) or _stat.S_ISREG(st.st_mode)):
            out.append(Library(host.realpath(path), None, "ipc"))
    return tuple(out)


# -- driver roots ------------------------------------------------------------------------


class Userspace(Record):
    """What one driver root gave, with node paths: root is the node path of the driver root
    (None: nothing found anywhere); mount_map as VendorInventory.mount_map."""

    root: "str | None"
    libraries: "tuple[Library, ...]"
    binaries: "tuple[str, ...]"
    version: "str | None"
    mount_map: "tuple[tuple[str, str], ...]"

    __slots__ = ()


def _open_root(host: "Host", root: str) -> "tuple[Host, Layout] | str":
    """A Host for the driver root `root` (links inside it resolved inside it) and its
    layout; or, as a string, why it cannot be one."""
    if root == driverroot.HOST:
        return Host(host.root), ROOTED
    if not root.startswith("/"):
        return "not an absolute path"
    if host.escapes(root):
        return "a link that leads out of the host root"
    st = host.stat(root)
    if st is None:
        return "a dangling link" if host.lstat(root) is not None else "missing"
    if not _stat.S_ISDIR(st.st_mode):
        return "not a directory"
    sub = Host(host.resolve(root))
    flat = sub.is_dir("/lib64") and not sub.is_dir("/usr")
    return sub, FLAT if flat else ROOTED


def _scan(host: "Host", sub: "Host", layout: "Layout", version: "str | None") -> "Userspace":
    """Libraries, tools and driver files of the driver root `sub`, as node paths of `host`."""
    libs, found = _libraries(sub, version, layout)
    files = _driver_files(sub, found, layout)
    bins = _binaries(sub, layout)
    prefix = host.node_path(sub.root)
    if prefix == "/":
        return Userspace("/", libs + files, bins, found, ())

    def node(p: str) -> str:
        return prefix + p

    mount_map = tuple((prefix + src, dst) for src, dst in layout.dest) + ((prefix, "/"),)
    return Userspace(
        prefix,
        tuple(lib._replace(path=node(lib.path)) for lib in libs + files),
        tuple(node(b) for b in bins),
        found,
        mount_map,
    )


def _why_not(sub: "Host", layout: "Layout", version: "str | None") -> str:
    """Why `sub` gave no libcuda of the running driver, in a few words."""
    cache = _ldcache(sub)
    dirs = _Dirs(sub)
    hit = cache.get(CUDA_SONAME) or next(
        (f"{d}/{CUDA_SONAME}" for d in layout.lib_dirs if dirs.has(d, CUDA_SONAME)), None
    )
    if hit is None:
        have = sorted(
            {
                f[len("libcuda.so.") :]
                for d in layout.lib_dirs
                for f in sub.listdir(d)
                if f.startswith("libcuda.so.") and _is_version(f[len("libcuda.so.") :])
            }
        )
        why = f"libcuda of driver {', '.join(have)} only" if have else f"no {CUDA_SONAME}"
    else:
        other = _version_suffix(sub.realpath(hit), "libcuda")
        why = (
            f"{CUDA_SONAME} is of driver {other}"
            if other and other != version
            else f"{CUDA_SONAME} leads to no library file"
        )
    return why


def _userspace(host: "Host", version: "str | None") -> "Userspace":
    """The driver userspace of the running driver: from the first driver root (the node
    config's nvidia_driver_root, or every one of driverroot.AUTO_ROOTS) that has libcuda of
    that version. None has: one warning that says what each lacked; then the host's own
    libraries (without libcuda) when the host is among the roots, so NVML still works."""
    setting = host.options.get("nvidia_driver_root") or driverroot.AUTO
    tried: list[str] = []
    fallback: tuple[Host, Userspace] | None = None
    for root in driverroot.candidates(setting):
        opened = _open_root(host, root)
        if isinstance(opened, str):
            tried.append(f"{root}: {opened}")
            continue
        sub, layout = opened
        found = _scan(host, sub, layout, version)
        if any(lib.soname == CUDA_SONAME for lib in found.libraries):
            host.warnings.extend(sub.warnings)
            return found
        why = _why_not(sub, layout, version)
        if root == driverroot.OPERATOR_ROOT and not host.exists(driverroot.READY_FILE):
            why += f" (no {driverroot.READY_FILE} yet: the driver container is not ready)"
        tried.append(f"{root}: {why}")
        if root == driverroot.HOST:
            fallback = sub, found
    host.warn(
        f"nvidia: no driver userspace of driver {version or '(unknown version)'}: "
        f"{'; '.join(tried)}. Containers that ask for compute get no NVIDIA GPU"
    )
    if fallback is None:
        return Userspace(None, (), (), version, ())
    sub, found = fallback
    host.warnings.extend(sub.warnings)
    return found if found.libraries or found.binaries else found._replace(root=None)


def probe(host: "Host") -> "VendorInventory | None":
    majors = char_majors(host)
    major = first_major(majors, "nvidia", "nvidia-frontend") or FRONTEND_MAJOR
    devices = _gpus_from_proc(host, major)
    if devices:
        devices = _with_extras(host, devices, majors)
    else:
        devices = _gpus_from_dev(host, major)
    if not devices:
        return None
    text = host.read_text("/proc/driver/nvidia/version", quiet=True)
    version = parse_version(text) if text else None
    found = _userspace(host, version)
    return VendorInventory(
        VENDOR,
        tuple(devices),
        _control_nodes(host, majors, major),
        found.libraries + _ipc_files(host),
        found.binaries,
        found.version,
        found.root,
        found.mount_map,
    )
