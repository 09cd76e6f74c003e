"""Build fake GPU hosts: a directory laid out like a node's `/` (proc, sys, dev, libraries).

Used by `make demo` (the built-in simulated GPU node), by tests/simulate.py, and by
the tests. The layouts follow the kernel's and the drivers' real ones:

- NVIDIA: /proc/driver/nvidia/{version,gpus/<bdf>/information}, /proc/devices majors,
  /dev/nvidia<minor>, /dev/nvidiactl, libraries with real sonames and an ld.so.cache; the
  driver's userspace on the host, or in a driver root: the GPU Operator's
  /run/nvidia/driver (gpu_operator) or GKE's /home/kubernetes/bin/nvidia (gke).
- DRM: /sys/devices/pci0000:00/<bdf>/{vendor,device,class,uevent,driver->,drm/<card|renderD>/dev}
  with /sys/class/drm/<name> -> ../../devices/..., and /dev/dri/<name>.
- KFD: /sys/class/kfd/kfd/topology/nodes/<n>/properties, /dev/kfd.

Device nodes are real (mknod) when `mknod=True` and the caller may create them, else empty
regular files (what captured fixtures use; the probe then takes the driver's numbers).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from gpuhook import defaults
from gpuhook.probe import driverroot

DRM_MAJOR = 226
NVIDIA_MAJOR = 195


class FakeHost:
    def __init__(self, root: str, mknod: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.mknod = mknod
        os.makedirs(self.root, exist_ok=True)
        self.majors: dict[str, int] = {}

    def p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def file(self, path: str, content: str | bytes = "", mode: int = 0o644) -> str:
        full = self.p(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        os.chmod(full, mode)
        return full

    def symlink(self, path: str, target: str) -> None:
        full = self.p(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if os.path.lexists(full):
            os.unlink(full)
        os.symlink(target, full)

    def chardev(self, path: str, major: int, minor: int, mode: int = 0o666, gid: int = 0) -> None:
        full = self.p(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if os.path.lexists(full):
            os.unlink(full)
        if self.mknod:
            os.mknod(full, 0o020000 | mode, os.makedev(major, minor))
            os.chmod(full, mode)
            if gid:
                os.chown(full, 0, gid)
        else:
            self.file(path, "", 0o644)

    def proc_devices(self, extra: dict[str, int] | None = None) -> None:
        majors = {"mem": 1, "tty": 4, "misc": 10, **self.majors, **(extra or {})}
        lines = ["Character devices:"] + [f"{m:3d} {n}" for n, m in sorted(majors.items(), key=lambda x: x[1])]
        lines += ["", "Block devices:", "  7 loop", "259 blkext", ""]
        self.file("/proc/devices", "\n".join(lines))

    # -- PCI / DRM -----------------------------------------------------------
    def pci_device(self, bdf: str, vendor: int, device: int, driver: str | None, pci_class: int = 0x030000) -> str:
        """A PCI function under /sys/devices; returns its node path."""
        path = f"/sys/devices/pci0000:00/{bdf}"
        self.file(path + "/vendor", f"0x{vendor:04x}\n")
        self.file(path + "/device", f"0x{device:04x}\n")
        self.file(path + "/class", f"0x{pci_class:06x}\n")
        ev = [f"PCI_ID={vendor:04X}:{device:04X}", f"PCI_SLOT_NAME={bdf}"]
        if driver:
            ev.insert(0, f"DRIVER={driver}")
            self.file(f"/sys/bus/pci/drivers/{driver}/.keep", "")
            self.symlink(path + "/driver", f"../../../bus/pci/drivers/{driver}")
        self.file(path + "/uevent", "\n".join(ev) + "\n")
        return path

    def drm(self, device_path: str, name: str, minor: int, gid: int | None = None) -> None:
        """A DRM node (card<N> or renderD<N>) of the device at `device_path`; its group is
        `gid`, else the host's render/video group (root when there is none)."""
        self.file(f"{device_path}/drm/{name}/dev", f"{DRM_MAJOR}:{minor}\n")
        self.symlink(f"{device_path}/drm/{name}/device", "../../../" + os.path.basename(device_path))
        rel = os.path.relpath(self.p(f"{device_path}/drm/{name}"), self.p("/sys/class/drm"))
        self.symlink(f"/sys/class/drm/{name}", rel)
        if gid is None:
            gid = _group_gid("render" if name.startswith("render") else "video")
        self.chardev(f"/dev/dri/{name}", DRM_MAJOR, minor, 0o660, gid=gid)
        bdf = os.path.basename(device_path)
        kind = "render" if name.startswith("render") else "card"
        if ":" in bdf:
            self.symlink(f"/dev/dri/by-path/pci-{bdf}-{kind}", f"../{name}")

    def drm_gpu(
        self,
        bdf: str,
        vendor: int,
        device: int,
        driver: str | None,
        card: int,
        render: int | None,
        pci_class: int = 0x030000,
    ) -> str:
        path = self.pci_device(bdf, vendor, device, driver, pci_class)
        self.drm(path, f"card{card}", card)
        if render is not None:
            self.drm(path, f"renderD{render}", render)
        return path

    # -- libraries -----------------------------------------------------------
    def library(self, libdir: str, soname: str, version: str, real_elf: bool = True) -> str:
        """libX.so.<version> with soname link libX.so.N; a real ELF when gcc is there."""
        stem = soname.split(".so")[0]
        real = f"{libdir}/{stem}.so.{version}"
        full = self.p(real)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if real_elf and shutil.which("gcc"):
            src = full + ".c"
            with open(src, "w") as f:
                f.write(f'const char *gpuhook_fake_{stem.replace("-", "_")}(void) {{ return "{version}"; }}\n')
            subprocess.run(
                ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", full, src], check=True, capture_output=True
            )
            os.unlink(src)
        else:
            self.file(real, b"\x7fELF fake\n")
        if soname != os.path.basename(real):  # libnvidia-glcore.so.<version> is its own soname
            self.symlink(f"{libdir}/{soname}", os.path.basename(real))
        return real

    def socket(self, path: str) -> None:
        """A listening-socket file (a real AF_UNIX socket with mknod, else an empty file)."""
        full = self.p(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if os.path.lexists(full):
            os.unlink(full)
        if not self.mknod:
            self.file(path, "")
            return
        import socket

        # bind through /proc/self/fd: a socket path is limited to 108 bytes
        dfd = os.open(os.path.dirname(full), os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(f"/proc/self/fd/{dfd}/{os.path.basename(full)}")
        finally:
            os.close(dfd)

    def ldconfig(self, dirs: list[str]) -> bool:
        """Write etc/ld.so.cache with the real ldconfig; False when there is none."""
        ldc = shutil.which("ldconfig") or next(
            (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
        )
        if not ldc:
            return False
        self.file("/etc/ld.so.conf", "".join(d + "\n" for d in dirs))
        subprocess.run([ldc, "-r", self.root, "-X"], check=True, capture_output=True)
        return True


def _group_gid(name: str) -> int:
    try:
        import grp

        return grp.getgrnam(name).gr_gid
    except (KeyError, ImportError):
        return 0


# -- scenarios -----------------------------------------------------------------

NVIDIA_LIBS = {
    # soname -> capability
    "libcuda.so.1": "compute",
    "libnvidia-ptxjitcompiler.so.1": "compute",
    "libnvidia-nvvm.so.4": "compute",
    "libnvidia-ml.so.1": "utility",
    "libnvidia-cfg.so.1": "utility",
}
NVIDIA_VIDEO_LIBS = {
    "libnvcuvid.so.1": "video",
    "libnvidia-encode.so.1": "video",
    "libnvidia-opticalflow.so.1": "video",
    "libvdpau_nvidia.so.1": "video",  # in <libdir>/vdpau
}
NVIDIA_GRAPHICS_LIBS = {  # VERSION: the driver's version (these sonames are versioned names)
    "libGLX_nvidia.so.0": "graphics",
    "libEGL_nvidia.so.0": "graphics",
    "libGLESv2_nvidia.so.2": "graphics",
    "libnvidia-glcore.so.VERSION": "graphics",
    "libnvidia-eglcore.so.VERSION": "graphics",
    "libnvidia-glsi.so.VERSION": "graphics",
    "libnvidia-tls.so.VERSION": "graphics",
    "libnvidia-vulkan-producer.so.VERSION": "graphics",
}
NVIDIA_GRAPHICS_FILES = {
    "/usr/share/vulkan/icd.d/nvidia_icd.json": '{"file_format_version": "1.0.0", "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"}}\n',
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": '{"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}\n',
}


def nvidia(
    fh: FakeHost,
    gpus: int = 8,
    driver: str = "550.54.14",
    minors: list[int] | None = None,
    uvm_node: bool = True,
    libs: bool = True,
    model: str = "NVIDIA H100 80GB HBM3",
    *,
    graphics: bool = False,
    video: bool = False,
    stale: str | None = None,
    mig: bool = False,
    nvswitch: int = 0,
    imex_channels: int = 0,
    firmware: bool = False,
    persistenced: bool = False,
    fabricmanager: bool = False,
    mps: bool = False,
    userspace: bool = True,
) -> None:
    """An NVIDIA node: `gpus` GPUs whose Device Minors are `minors` (default: reversed, so
    they differ from the indices), nvidia-uvm present or not yet created.

    The keywords add the rest of a full driver install (all off by default):
    graphics (GL/EGL/Vulkan libraries, their ICD/vendor JSON files, a card/render DRM node
    per GPU), video (NVDEC/NVENC/VDPAU libraries), stale (libraries of that other driver
    version beside the running one, libcuda.so.1 pointing at the stale one), mig (the
    first GPU in MIG mode: GI 1 with CI 0, GI 2 with CIs 0 and 1; mig-minors, the
    capabilities in /proc and /dev/nvidia-caps, config and monitor too), nvswitch (that many
    NVSwitches and the nvswitchctl node), imex_channels, firmware (GSP firmware of the
    running and of an older version), persistenced / fabricmanager (their sockets), mps
    (an MPS control daemon's pipe directory).

    libs=False leaves out the library set and the ld cache, but for one libcuda of the
    running driver (the least a container that asks for compute needs: plan.unusable);
    userspace=False leaves that out too: a node with no driver userspace on the host."""
    minors = minors if minors is not None else list(reversed(range(gpus)))
    _nvidia_nodes(fh, driver, minors[:gpus], model, graphics=graphics, uvm_node=uvm_node, imex=bool(imex_channels))
    fh.proc_devices()
    if mig:
        nvidia_mig(fh, minors[0], {1: [0], 2: [0, 1]}, gpus=max(minors) + 1)
    _nvidia_extras(
        fh,
        driver,
        nvswitch,
        imex_channels,
        firmware=firmware,
        persistenced=persistenced,
        fabricmanager=fabricmanager,
        mps=mps,
    )
    if libs:
        nvidia_userspace(fh, driver, video=video, graphics=graphics, stale=stale, mps=mps)
    elif userspace:
        fh.library(HOST_LIBDIR, "libcuda.so.1", driver)


def _nvidia_nodes(
    fh: FakeHost, driver: str, minors: list[int], model: str, *, graphics: bool, uvm_node: bool, imex: bool
) -> None:
    """The kernel module's majors and version file; per GPU (of Device Minor `minors[i]`)
    its /proc information, PCI device and /dev node (DRM card/render nodes with graphics);
    nvidiactl and the nvidia-uvm nodes (when uvm_node)."""
    fh.majors.update({"nvidia-frontend": NVIDIA_MAJOR, "nvidia-uvm": 510, "nvidia-caps": 235, "nvidia-nvswitch": 511})
    if imex:
        fh.majors["nvidia-caps-imex-channels"] = 234
    if graphics:
        fh.majors["drm"] = DRM_MAJOR
    fh.file(
        "/proc/driver/nvidia/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    )
    for i, minor in enumerate(minors):
        bdf = f"0000:{0x18 + 0x10 * i:02x}:00.0"
        uuid = f"GPU-{i:08x}-1111-2222-3333-{0x444444444444 + i:012x}"
        fh.file(
            f"/proc/driver/nvidia/gpus/{bdf}/information",
            f"Model: \t\t {model}\nIRQ:   \t\t {100 + i}\nGPU UUID: \t {uuid}\n"
            f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
            f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bdf}\nDevice Minor: \t {minor}\n"
            "GPU Firmware: \t 550.54.14\nGPU Excluded:\t No\n",
        )
        path = fh.pci_device(bdf, 0x10DE, 0x2330, "nvidia", 0x030200)
        fh.chardev(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor)
        if graphics:
            fh.drm(path, f"card{i + 1}", i + 1)
            fh.drm(path, f"renderD{128 + i}", 128 + i)
    fh.chardev("/dev/nvidiactl", NVIDIA_MAJOR, 255)
    if uvm_node:
        fh.chardev("/dev/nvidia-uvm", 510, 0)
        fh.chardev("/dev/nvidia-uvm-tools", 510, 1)


def _nvidia_extras(
    fh: FakeHost,
    driver: str,
    nvswitch: int,
    imex_channels: int,
    *,
    firmware: bool,
    persistenced: bool,
    fabricmanager: bool,
    mps: bool,
) -> None:
    """What nvidia()'s keywords of the same names add beside the GPUs."""
    if nvswitch:
        fh.chardev("/dev/nvidia-nvswitchctl", 511, 255)
        for i in range(nvswitch):
            fh.chardev(f"/dev/nvidia-nvswitch{i}", 511, i)
    for i in range(imex_channels):
        fh.chardev(f"/dev/nvidia-caps-imex-channels/channel{i}", 234, i)
    if firmware:
        for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            fh.file(f"/lib/firmware/nvidia/{driver}/{name}", b"\x00fake gsp firmware\n")
        fh.file("/lib/firmware/nvidia/535.104.05/gsp_ga10x.bin", b"\x00an older driver's firmware\n")
    if persistenced:
        fh.socket("/run/nvidia-persistenced/socket")
    if fabricmanager:
        fh.socket("/run/nvidia-fabricmanager/socket")
    if mps:
        mps_dir = defaults.MPS_PIPE_DIR
        os.makedirs(fh.p(mps_dir), exist_ok=True)
        if fh.mknod:
            os.mkfifo(fh.p(f"{mps_dir}/control"))
        else:
            fh.file(f"{mps_dir}/control", "")
        fh.file(f"{mps_dir}/log/control.log", "")


HOST_LIBDIR = "/usr/lib/x86_64-linux-gnu"
OPERATOR_ROOT = driverroot.OPERATOR_ROOT
OPERATOR_READY = driverroot.READY_FILE
GKE_ROOT = driverroot.GKE_ROOT


def nvidia_userspace(
    fh: FakeHost,
    driver: str,
    libdir: str = HOST_LIBDIR,
    bindir: str = "/usr/bin",
    ld_cache: bool = True,
    *,
    video: bool = False,
    graphics: bool = False,
    stale: str | None = None,
    mps: bool = False,
    firmware_dir: str | None = None,
) -> None:
    """The driver's userspace in the tree of `fh` (the host, or a driver root): libraries of
    `driver` in libdir (real ELF with their sonames), nvidia-smi in bindir, an ld cache of
    libdir when ld_cache, GSP firmware in firmware_dir/<driver> when given."""
    names = dict(NVIDIA_LIBS)
    if video:
        names.update(NVIDIA_VIDEO_LIBS)
    if graphics:
        names.update({k.replace("VERSION", driver): v for k, v in NVIDIA_GRAPHICS_LIBS.items()})
    for soname in names:
        fh.library(f"{libdir}/vdpau" if soname.startswith("libvdpau") else libdir, soname, driver)
    if stale:
        for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
            fh.library(libdir, soname, stale)  # the soname link now points at the stale one
    fh.file(f"{bindir}/nvidia-smi", f"#!/bin/sh\necho fake nvidia-smi {driver}\n", 0o755)
    if mps:
        fh.file(f"{bindir}/nvidia-cuda-mps-control", "#!/bin/sh\n", 0o755)
    if graphics:
        for path, text in NVIDIA_GRAPHICS_FILES.items():
            fh.file(path, text)
    if firmware_dir:
        fh.file(f"{firmware_dir}/{driver}/gsp_ga10x.bin", b"\x00fake gsp firmware\n")
    if ld_cache:
        fh.ldconfig([libdir])


def gpu_operator(
    fh: FakeHost,
    gpus: int = 2,
    driver: str = "550.54.14",
    *,
    installed: bool | str = True,
    ready: bool | None = None,
    root_driver: str | None = None,
) -> None:
    """A node of the NVIDIA GPU Operator: the GPUs, /proc/driver/nvidia and /dev/nvidia* on the
    host, whose own ld cache lists no NVIDIA library; the driver's userspace in the driver
    container's root, /run/nvidia/driver (usr/lib/x86_64-linux-gnu, usr/bin/nvidia-smi,
    etc/ld.so.cache, lib/firmware/nvidia/<version>), and /run/nvidia/validations/driver-ready.

    installed: True (all of it), "partial" (the driver container still installing: the root
    with nvidia-smi and NVML, no libcuda, no ld cache) or False (no root yet). ready: the
    driver-ready file (default: when installed is True). root_driver: the version of the
    userspace in the root (default `driver`; another one is a mismatched driver container)."""
    nvidia(fh, gpus=gpus, driver=driver, libs=False, userspace=False)
    os.makedirs(fh.p(HOST_LIBDIR), exist_ok=True)
    fh.ldconfig([HOST_LIBDIR])  # the host's own cache: no NVIDIA library in it
    if installed:
        operator_driver_root(fh, root_driver or driver, partial=installed == "partial")
    if ready if ready is not None else installed is True:
        fh.file(OPERATOR_READY, "")


def operator_driver_root(fh: FakeHost, driver: str, partial: bool = False, root: str = OPERATOR_ROOT) -> None:
    """The GPU Operator's driver container root at `root` (what gpu_operator makes)."""
    sub = FakeHost(fh.p(root), mknod=fh.mknod)
    if partial:
        sub.library(HOST_LIBDIR, "libnvidia-ml.so.1", driver)
        sub.file("/usr/bin/nvidia-smi", f"#!/bin/sh\necho fake nvidia-smi {driver}\n", 0o755)
        os.makedirs(sub.p("/etc"), exist_ok=True)
        return
    nvidia_userspace(sub, driver, firmware_dir="/lib/firmware/nvidia")


def gke(
    fh: FakeHost, gpus: int = 1, driver: str = "550.54.14", *, installed: bool = True, model: str = "NVIDIA L4"
) -> None:
    """A GKE node on Container-Optimized OS: the GPUs on the host, the driver installer's
    userspace under /home/kubernetes/bin/nvidia/{lib64,bin} (and firmware/nvidia/<version>),
    no ld cache listing it, nothing NVIDIA in the host's library directories."""
    nvidia(fh, gpus=gpus, driver=driver, libs=False, userspace=False, model=model)
    if installed:
        gke_driver_root(fh, driver)


def gke_driver_root(fh: FakeHost, driver: str, root: str = GKE_ROOT) -> None:
    sub = FakeHost(fh.p(root), mknod=fh.mknod)
    nvidia_userspace(sub, driver, libdir="/lib64", bindir="/bin", ld_cache=False, firmware_dir="/firmware/nvidia")


def nvidia_mig(fh: FakeHost, gpu_minor: int, instances: dict[int, list[int]], gpus: int = 1) -> dict[str, int]:
    """MIG on the GPU with Device Minor `gpu_minor`: instances = {GI id: [CI ids]}. Writes the
    driver's mig-minors table (every possible instance of `gpus` GPUs, as the driver does),
    /proc/driver/nvidia/capabilities/... access files and /dev/nvidia-caps/nvidia-cap<N>
    (config and monitor too). Returns name -> minor of what was made."""
    table = {"config": 1, "monitor": 2}
    for g in range(gpus):
        for gi in range(15):
            base = 3 + g * 135 + gi * 9
            table[f"gpu{g}/gi{gi}/access"] = base
            for ci in range(8):
                table[f"gpu{g}/gi{gi}/ci{ci}/access"] = base + 1 + ci
    fh.file("/proc/driver/nvidia-caps/mig-minors", "".join(f"{k} {v}\n" for k, v in table.items()))
    made = {"config": 1, "monitor": 2}
    for name in ("config", "monitor"):
        fh.file(
            f"/proc/driver/nvidia/capabilities/mig/{name}",
            f"DeviceFileMinor: {table[name]}\nDeviceFileMode: 256\nDeviceFileModify: 1\n",
        )
    for gi, cis in instances.items():
        names = [f"gpu{gpu_minor}/gi{gi}/access"] + [f"gpu{gpu_minor}/gi{gi}/ci{ci}/access" for ci in cis]
        for name in names:
            made[name] = table[name]
            fh.file(
                f"/proc/driver/nvidia/capabilities/{name.replace(f'gi{gi}', f'mig/gi{gi}', 1)}",
                f"DeviceFileMinor: {table[name]}\nDeviceFileMode: 292\nDeviceFileModify: 1\n",
            )
    for minor in made.values():
        fh.chardev(f"/dev/nvidia-caps/nvidia-cap{minor}", fh.majors.get("nvidia-caps", 235), minor, 0o444)
    return made


def cpu_only(fh: FakeHost) -> None:
    fh.proc_devices()
    fh.file("/sys/class/drm/.keep", "")
    fh.file("/dev/null", "")


def bmc_only(fh: FakeHost) -> None:
    """A server whose only display is the ASPEED BMC (card0, no render node)."""
    fh.proc_devices({"drm": DRM_MAJOR})
    fh.drm_gpu("0000:03:00.0", 0x1A03, 0x2000, "ast", card=0, render=None)


# a GPU's memory as its kernel driver states it (probe/drm.py vram_bytes)
MI210_VRAM = 68702699520  # amdgpu's mem_info_vram_total of an Instinct MI210 (64 GiB HBM2e, 65520 MiB usable)
FLEX170_VRAM = 17179869184  # xe's tile0/physical_vram_size_bytes of a Data Center GPU Flex 170 (16 GiB)


def amd(fh: FakeHost, gpus: int = 2, vram: int | None = MI210_VRAM) -> None:
    """AMD node: KFD topology with one CPU node and `gpus` GPUs, each with card+render and
    amdgpu's mem_info_vram_total (`vram` bytes; None: no such file)."""
    fh.majors.update({"kfd": 235, "drm": DRM_MAJOR})
    fh.chardev("/dev/kfd", 235, 0, 0o660, gid=_group_gid("render"))
    topo = "/sys/class/kfd/kfd/topology/nodes"
    fh.file(
        f"{topo}/0/properties",
        "cpu_cores_count 64\nsimd_count 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\n",
    )
    for i in range(gpus):
        bus = 0x43 + 0x20 * i
        bdf = f"0000:{bus:02x}:00.0"
        path = fh.drm_gpu(bdf, 0x1002, 0x740F, "amdgpu", card=i + 1, render=128 + i)
        if vram is not None:
            fh.file(path + "/mem_info_vram_total", f"{vram}\n")
        fh.file(
            f"{topo}/{i + 1}/properties",
            f"cpu_cores_count 0\nsimd_count 416\nvendor_id 4098\ndevice_id 29711\n"
            f"location_id {bus << 8}\ndomain 0\ndrm_render_minor {128 + i}\ngfx_target_version 90010\n",
        )
    fh.proc_devices()


def intel(fh: FakeHost, dgpu: bool = True) -> None:
    """Intel iGPU (i915 at 00:02.0: no memory file) plus optionally a discrete GPU (xe, one
    tile with its physical_vram_size_bytes)."""
    fh.majors["drm"] = DRM_MAJOR
    fh.drm_gpu("0000:00:02.0", 0x8086, 0xA7A0, "i915", card=0, render=128)
    if dgpu:
        path = fh.drm_gpu("0000:03:00.0", 0x8086, 0x56C0, "xe", card=1, render=129)
        fh.file(path + "/tile0/physical_vram_size_bytes", f"{FLEX170_VRAM}\n")
    fh.proc_devices()


def amd_mi300(
    fh: FakeHost, gpus: int = 1, partitions: int = 8, render_gid: int | None = None, video_gid: int | None = None
) -> None:
    """AMD Instinct MI300X in a compute-partition mode (CPX: 8 partitions per GPU).

    Each partition is its own KFD node (location_id: the function bits differ) with its own
    render node: partition 0 on the PCI device (card + render), the others on the amdgpu_xcp
    platform devices the driver registers (/sys/devices/platform/amdgpu_xcp.<N>, numbered
    across GPUs, each with a card and a render node). /dev/kfd and the render nodes belong to
    `render_gid`, the card nodes to `video_gid` (default: the host's render/video groups,
    else 109/44), mode 0660, as udev makes them."""
    render_gid = render_gid if render_gid is not None else (_group_gid("render") or 109)
    video_gid = video_gid if video_gid is not None else (_group_gid("video") or 44)
    fh.majors.update({"kfd": 235, "drm": DRM_MAJOR})
    fh.chardev("/dev/kfd", 235, 0, 0o660, gid=render_gid)
    topo = "/sys/class/kfd/kfd/topology/nodes"
    fh.file(
        f"{topo}/0/properties",
        "cpu_cores_count 96\nsimd_count 0\nvendor_id 0\ndevice_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\n",
    )
    xcp = card = 0
    node = 1
    for g in range(gpus):
        bus = 0x05 + 0x20 * g
        path = fh.pci_device(f"0000:{bus:02x}:00.0", 0x1002, 0x74A1, "amdgpu", 0x120000)
        for p in range(partitions):
            card += 1
            minor = 128 + g * partitions + p
            if p:
                path = f"/sys/devices/platform/amdgpu_xcp.{xcp}"
                fh.file(path + "/uevent", "")
                xcp += 1
            fh.drm(path, f"card{card}", card, gid=video_gid)
            fh.drm(path, f"renderD{minor}", minor, gid=render_gid)
            fh.file(
                f"{topo}/{node}/properties",
                f"cpu_cores_count 0\nsimd_count 152\nvendor_id 4098\ndevice_id 29857\n"
                f"location_id {(bus << 8) | p}\ndomain 0\ndrm_render_minor {minor}\n"
                "gfx_target_version 90402\nnum_xcc 1\n",
            )
            node += 1
    fh.proc_devices()


def intel_sriov(fh: FakeHost, vfs: int = 2, vf_driver: str = "xe") -> None:
    """An Intel Data Center GPU Flex (xe) whose physical function has `vfs` virtual functions
    enabled (sriov_numvfs, virtfn<N> links; each VF has a physfn link back). VFs bound to
    xe/i915 have their own card/render nodes; bound to vfio-pci (for VMs) they have none."""
    fh.majors["drm"] = DRM_MAJOR
    pf = fh.drm_gpu("0000:03:00.0", 0x8086, 0x56C0, "xe", card=1, render=129)
    fh.file(pf + "/sriov_totalvfs", "16\n")
    fh.file(pf + "/sriov_numvfs", f"{vfs}\n")
    for i in range(vfs):
        bdf = f"0000:03:00.{i + 1}"
        vf = fh.pci_device(bdf, 0x8086, 0x56C5, vf_driver, 0x038000)
        fh.symlink(f"{pf}/virtfn{i}", f"../{bdf}")
        fh.symlink(f"{vf}/physfn", "../0000:03:00.0")
        if vf_driver in ("xe", "i915"):
            fh.drm(vf, f"card{i + 2}", i + 2)
            fh.drm(vf, f"renderD{130 + i}", 130 + i)
    fh.proc_devices()


SCENARIOS = {
    "nvidia": lambda fh: nvidia(fh),
    "nvidia-2": lambda fh: nvidia(fh, gpus=2),
    "amd": lambda fh: amd(fh),
    "intel": lambda fh: intel(fh),
    "nvidia+intel": lambda fh: [nvidia(fh, gpus=2), intel(fh, dgpu=False)],  # type: ignore[func-returns-value]
    "nvidia-full": lambda fh: nvidia(
        fh,
        gpus=4,
        graphics=True,
        video=True,
        mig=True,
        nvswitch=2,
        imex_channels=2,
        firmware=True,
        persistenced=True,
        fabricmanager=True,
        mps=True,
    ),
    "mi300": lambda fh: amd_mi300(fh),
    "intel-sriov": lambda fh: intel_sriov(fh),
    "gpu-operator": lambda fh: gpu_operator(fh),
    "gke": lambda fh: gke(fh),
    "bmc": bmc_only,
    "cpu": cpu_only,
}


def build(root: str, scenario: str = "nvidia", mknod: bool | None = None) -> FakeHost:
    if mknod is None:
        mknod = os.geteuid() == 0
    fh = FakeHost(root, mknod=mknod)
    SCENARIOS[scenario](fh)
    return fh
