"""NVIDIA: GPUs from the driver's /proc files, control nodes, driver libraries and tools.

Sources, in order of trust:
- /proc/driver/nvidia/gpus/<bus id>/information: Device Minor, GPU UUID, Model (per GPU);
- /proc/driver/nvidia/version: the kernel module's version;
- /proc/devices: majors ("nvidia" or the old "nvidia-frontend" = 195; nvidia-uvm, nvidia-caps,
  nvidia-nvswitch, nvidia-nvlink are dynamic);
- /dev/nvidia<N> when /proc has no GPUs (e.g. a host root without procfs);
- the host's etc/ld.so.cache for libraries, else the usual library directories.

/dev/nvidia<N>: N is the Device Minor, which need not be the GPU's index.
Control nodes are created lazily by the driver: one whose major is known is reported even
when the file is missing (runc creates it in the container from type/major/minor).
"""


from ..inventory import Device, Library, Node, VendorInventory
from .common import char_majors, device_node, first_major, is_uint
from .host import Host

FRONTEND_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
GPUS_DIR = "/proc/driver/nvidia/gpus"

# soname -> driver capability it serves (NVIDIA_DRIVER_CAPABILITIES vocabulary)
LIBRARIES = {
    "libcuda.so.1": "compute",
    "libcudadebugger.so.1": "compute",
    "libnvidia-ptxjitcompiler.so.1": "compute",
    "libnvidia-nvvm.so.4": "compute",
    "libnvidia-gpucomp.so": "compute",
    "libnvidia-opencl.so.1": "compute",
    "libnvidia-allocator.so.1": "compute",
    "libnvidia-ml.so.1": "utility",
    "libnvidia-cfg.so.1": "utility",
}
BINARIES = {
    "nvidia-smi": "utility",
    "nvidia-debugdump": "utility",
    "nvidia-persistenced": "compute",
    "nvidia-cuda-mps-control": "compute",
    "nvidia-cuda-mps-server": "compute",
}
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64",
            "/usr/lib/aarch64-linux-gnu", "/usr/lib/powerpc64le-linux-gnu", "/usr/lib")
BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin")


def parse_information(text: str) -> dict[str, str]:
    """The `information` file: "Key: \\t value" lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_version(text: str) -> str | None:
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


def _is_version(s: str) -> bool:
    parts = s.split(".")
    return len(parts) >= 2 and all(is_uint(p) for p in parts)


def _gpus_from_proc(host: Host, major: int) -> list[Device]:
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
        out.append(Device("nvidia", "gpu", index, info.get("GPU UUID") or bus_id, (node,),
                          pci=bus_id.lower(), model=info.get("Model"), driver="nvidia"))
    return out


def _gpus_from_dev(host: Host, major: int) -> list[Device]:
    minors = sorted(int(n[6:]) for n in host.listdir("/dev") if n.startswith("nvidia") and is_uint(n[6:]))
    out = []
    for index, minor in enumerate(minors):
        node = device_node(host, f"/dev/nvidia{minor}", major, minor)
        if node is not None:
            out.append(Device("nvidia", "gpu", index, f"nvidia{minor}", (node,), driver="nvidia"))
    return out


def _control_nodes(host: Host, majors: dict[str, list[int]], major: int) -> tuple[Node, ...]:
    uvm = first_major(majors, "nvidia-uvm")
    wanted = [("/dev/nvidiactl", major, CTL_MINOR), ("/dev/nvidia-modeset", major, MODESET_MINOR)]
    if uvm is None:  # no /proc/devices: take the nodes' own numbers when they exist
        wanted += [("/dev/nvidia-uvm", None, None), ("/dev/nvidia-uvm-tools", None, None)]
    else:
        wanted += [("/dev/nvidia-uvm", uvm, 0), ("/dev/nvidia-uvm-tools", uvm, 1)]
    nodes = (device_node(host, path, maj, mi, lazy=True) for path, maj, mi in wanted)
    return tuple(n for n in nodes if n is not None)


def _ldcache(host: Host) -> dict[str, str]:
    data = host.read_bytes("/etc/ld.so.cache", limit=64 << 20, quiet=True)
    if data is None:
        return {}
    from . import ldcache

    try:
        return ldcache.lookup(ldcache.parse(data))
    except ldcache.LdCacheError as e:
        host.warn(f"/etc/ld.so.cache: {e}; searching the usual directories")
        return {}


def _version_suffix(path: str, soname: str) -> str | None:
    base = path.rsplit("/", 1)[-1]
    stem = soname.split(".so", 1)[0] + ".so."
    return base[len(stem):] if base.startswith(stem) and _is_version(base[len(stem):]) else None


def _libraries(host: Host, version: str | None) -> tuple[tuple[Library, ...], str | None]:
    cache = _ldcache(host)
    libs = []
    for soname, capability in LIBRARIES.items():
        path = cache.get(soname)
        if path is None:
            path = next((f"{d}/{soname}" for d in LIB_DIRS if host.exists(f"{d}/{soname}")), None)
        if path is None:
            continue
        real = host.realpath(path)
        if not host.exists(real):
            host.warn(f"nvidia: {soname} -> {path} does not exist, skipped")
            continue
        found = _version_suffix(real, soname)
        if version is None and soname == "libcuda.so.1":
            version = found
        if version is not None and found is not None and found != version:
            host.warn(f"nvidia: {real} is not of driver {version}, skipped")
            continue
        libs.append(Library(real, soname, capability))
    return tuple(libs), version


def _binaries(host: Host) -> tuple[str, ...]:
    out = []
    for name in BINARIES:
        for d in BIN_DIRS:
            if host.exists(f"{d}/{name}"):
                out.append(host.realpath(f"{d}/{name}"))
                break
    return tuple(dict.fromkeys(out))


def probe(host: Host) -> VendorInventory | None:
    majors = char_majors(host)
    major = first_major(majors, "nvidia", "nvidia-frontend") or FRONTEND_MAJOR
    devices = _gpus_from_proc(host, major) or _gpus_from_dev(host, major)
    if not devices:
        return None
    text = host.read_text("/proc/driver/nvidia/version", quiet=True)
    version = parse_version(text) if text else None
    libraries, version = _libraries(host, version)
    return VendorInventory("nvidia", tuple(devices), _control_nodes(host, majors, major),
                           libraries, _binaries(host), version)
