"""The GPU vendors gpuhook knows: one entry each, and everything else reads it from here.

A vendor's `name` is the one word for it everywhere: the inventory (Device.vendor), the
planner, GPUHOOK_ACCELERATOR, the `gpuhook.dev/vendors` annotation, node labels and CDI
kinds. `aliases` are older spellings an operator may have written in an annotation; they
are read as the name and never written.

`signs` are where a GPU of the vendor can show up (paths under the host root; a name may end
in `*` or `[0-9]*` as in sh): the probe imports and runs a vendor's module only when one of
them is there, and the C front (its generated header, probe.SIGNS) starts Python only then.
`probe` is its probe module (`probe(host) -> VendorInventory | None`), which the runtime
server imports ahead with `warm` (modules that probe imports late). `udev` are the udev
subsystems whose events mean its devices changed, `kernel_modules` the kernel modules whose
load or unload does (the agent's watch). `resources`: the prefixes of the device plugins' resource
names whose ids name its GPUs (the kubelet's checkpoint, share = "unallocated").

The order is the probe's, discrete GPUs before integrated ones: the first vendor a container
gets is GPUHOOK_ACCELERATOR's first. A new vendor is one probe module and one entry here.

On the per-container path: stdlib and record.py only.
"""

from .record import Record

# what a container given no GPU runs on, where a vendor would be named: the pod label
# gpuhook.dev/accelerator of such a container (agent/events.py), and GPUHOOK_ACCELERATOR of
# one given DRA's `none` device (gpuhook.dev/none=none): the default of the README's
# os.environ.get("GPUHOOK_ACCELERATOR", "cpu")
CPU = "cpu"


class Vendor(Record):
    name: str
    signs: "tuple[str, ...]"
    probe: str
    udev: "tuple[str, ...]" = ()
    kernel_modules: "tuple[str, ...]" = ()
    resources: "tuple[str, ...]" = ()
    aliases: "tuple[str, ...]" = ()
    warm: "tuple[str, ...]" = ()

    __slots__ = ()


VENDORS = (
    Vendor(
        "nvidia",
        ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*"),
        "gpuhook.probe.nvidia",
        kernel_modules=("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"),
        resources=("nvidia.com/",),
    ),
    Vendor(
        "amd",
        ("/dev/kfd", "/sys/class/kfd/kfd/topology/nodes", "/dev/dri/renderD*", "/sys/class/drm/renderD*"),
        "gpuhook.probe.amd",
        udev=("drm", "kfd"),
        kernel_modules=("amdgpu",),
        resources=("amd.com/",),
    ),
    Vendor(
        "intel",
        ("/dev/dri/renderD*", "/sys/class/drm/renderD*"),
        "gpuhook.probe.intel",
        udev=("drm",),
        kernel_modules=("i915", "xe"),
        resources=("gpu.intel.com/",),
    ),
    Vendor("accel", ("/dev/accel/accel*", "/sys/class/accel/accel*"), "gpuhook.probe.accel", udev=("accel",)),
    # WSL2's paravirtualized GPU, named after its device (/dev/dxg); "wsl" was the probe's word
    Vendor("dxg", ("/dev/dxg",), "gpuhook.probe.wsl", aliases=("wsl",)),
)


def _index(vendors: "tuple[Vendor, ...]") -> tuple:
    """(names, name -> Vendor, every spelling a user may write -> the vendor's name)."""
    names = tuple(v.name for v in vendors)
    return (
        names,
        {v.name: v for v in vendors},
        {**{a: v.name for v in vendors for a in v.aliases}, **{n: n for n in names}},
    )


NAMES, BY_NAME, SPELLINGS = _index(VENDORS)


def canonical(word: str) -> "str | None":
    """The vendor's name for a word an operator wrote (its name or an alias); None if none."""
    return SPELLINGS.get(word)


def udev_subsystems() -> "tuple[str, ...]":
    """The udev subsystems the agent watches: every vendor's, then "module" when a vendor
    names kernel modules."""
    out = [s for v in VENDORS for s in v.udev]
    if any(v.kernel_modules for v in VENDORS):
        out.append("module")
    return tuple(dict.fromkeys(out))


def udev_modules() -> "frozenset[str]":
    """The kernel modules whose load and unload the agent acts on."""
    return frozenset(m for v in VENDORS for m in v.kernel_modules)


def warm_up() -> "tuple[str, ...]":
    """The modules of every vendor's probe, for the runtime server to import ahead."""
    return tuple(dict.fromkeys(m for v in VENDORS for m in (v.probe, *v.warm)))


def gpu_resources() -> "tuple[tuple[str, str], ...]":
    """(resource name prefix, vendor name) of every vendor's device plugins."""
    return tuple((p, v.name) for v in VENDORS for p in v.resources)


def by_module(module: str) -> Vendor:
    """The vendor whose probe module is `module` (a probe module's own __name__: its name is
    the registry's, never spelt again there)."""
    return next(v for v in VENDORS if v.probe == module)
