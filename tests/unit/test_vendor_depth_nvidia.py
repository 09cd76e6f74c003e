"""NVIDIA in depth: driver capabilities, versioned libraries, MIG, NVSwitch, IMEX, firmware,
IPC sockets, MPS, NVIDIA_VISIBLE_DEVICES; probe and plan on fake hosts (fakehost.nvidia)."""

from __future__ import annotations

import os

import pytest

from conftest import FIXTURES
from conftest import plan_on
from conftest import request as req
from gpuhook import hook
from fakes import fakehost

from gpuhook.probe import probe

LIB = "/usr/lib/x86_64-linux-gnu"
V = "550.54.14"


def host(tmp_path, name="host", **kw) -> str:
    fh = fakehost.FakeHost(str(tmp_path / name), mknod=False)
    fakehost.nvidia(fh, **kw)
    return fh.root




def edits_for(root, env=None, warnings=None, config=None, **kw):
    p = plan_on(probe(root), req(env=env, **kw), ldconfig="/sbin/ldconfig", config=config)
    if warnings is not None:
        warnings += p.warnings
    return p.edits


def mounted(e) -> set[str]:
    return {m.container_path for m in e.mounts}


def nodes(e) -> list[str]:
    return [n.path for n in e.device_nodes]


def test_capability_utility_gives_nvml_and_smi_not_cuda(tmp_path):
    root = host(tmp_path, gpus=2)
    e = edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    got = mounted(e)
    assert f"{LIB}/libnvidia-ml.so.{V}" in got and f"{LIB}/libnvidia-cfg.so.{V}" in got
    assert "/usr/bin/nvidia-smi" in got
    assert not any("libcuda" in p or "ptxjit" in p or "nvvm" in p for p in got)
    assert "/dev/nvidia0" in nodes(e) and "/dev/nvidiactl" in nodes(e)  # devices do not depend on caps


def test_capability_default_is_utility_and_compute(tmp_path):
    root = host(tmp_path, gpus=1, graphics=True, video=True)
    got = mounted(edits_for(root))
    assert {f"{LIB}/libcuda.so.{V}", f"{LIB}/libnvidia-ml.so.{V}", f"{LIB}/libnvidia-nvvm.so.{V}",
            "/usr/bin/nvidia-smi"} <= got
    assert not any("GLX" in p or "nvcuvid" in p or "icd.d" in p for p in got)


def test_capability_compute_only_has_no_smi(tmp_path):
    root = host(tmp_path, gpus=1)
    got = mounted(edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "compute"}))
    assert f"{LIB}/libcuda.so.{V}" in got
    assert "/usr/bin/nvidia-smi" not in got and not any("libnvidia-ml" in p for p in got)


def test_capability_video_and_graphics(tmp_path):
    root = host(tmp_path, gpus=2, graphics=True, video=True)
    e = edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "video"})
    got = mounted(e)
    assert {f"{LIB}/libnvcuvid.so.{V}", f"{LIB}/libnvidia-encode.so.{V}", f"{LIB}/libnvidia-opticalflow.so.{V}",
            f"{LIB}/vdpau/libvdpau_nvidia.so.{V}"} <= got
    assert not any("GLX" in p or "libcuda" in p for p in got)
    assert not any(p.startswith("/dev/dri/") for p in nodes(e))  # DRM nodes only for graphics/display
    (h,) = e.hooks
    _ldconfig, *hook_dirs = hook.parse(h.args)[2]
    assert f"{LIB}/vdpau" in hook_dirs  # the ld-cache hook makes libvdpau_nvidia.so.1 there

    e = edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "graphics"})
    got = mounted(e)
    for stem in ("libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libnvidia-glcore", "libnvidia-eglcore",
                 "libnvidia-glsi", "libnvidia-tls", "libnvidia-vulkan-producer"):
        assert f"{LIB}/{stem}.so.{V}" in got, stem
    assert {"/usr/share/vulkan/icd.d/nvidia_icd.json", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"} <= got
    assert not any("nvcuvid" in p or "libcuda" in p for p in got)
    assert {"/dev/dri/card1", "/dev/dri/renderD128", "/dev/dri/card2", "/dev/dri/renderD129"} <= set(nodes(e))


def test_capability_all(tmp_path):
    root = host(tmp_path, gpus=1, graphics=True, video=True)
    got = mounted(edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "all"}))
    assert {f"{LIB}/libcuda.so.{V}", f"{LIB}/libnvidia-ml.so.{V}", f"{LIB}/libnvcuvid.so.{V}",
            f"{LIB}/libGLX_nvidia.so.{V}", "/usr/share/vulkan/icd.d/nvidia_icd.json"} <= got


def test_unknown_capability_is_a_warning(tmp_path):
    root = host(tmp_path, gpus=1)
    w: list[str] = []
    got = mounted(edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "utility,teleport"}, warnings=w))
    assert "/usr/bin/nvidia-smi" in got and not any("libcuda" in p for p in got)
    assert any("teleport" in x for x in w)


def test_stale_libcuda_beside_the_running_driver_is_not_mounted(tmp_path):
    """libcuda.so.470.82.01 beside 550.54.14, and the soname link even points at the stale one
    (a half-done upgrade): the running driver's file is mounted, the stale one never."""
    root = host(tmp_path, gpus=1, stale="470.82.01")
    assert os.readlink(os.path.join(root, LIB.lstrip("/"), "libcuda.so.1")) == "libcuda.so.470.82.01"
    inv = probe(root)
    paths = [lib.path for lib in inv.vendor("nvidia").libraries]
    assert f"{LIB}/libcuda.so.{V}" in paths and f"{LIB}/libnvidia-ml.so.{V}" in paths
    assert not any("470" in p for p in paths)
    got = mounted(plan_on(inv, req(), ldconfig="/sbin/ldconfig").edits)
    assert f"{LIB}/libcuda.so.{V}" in got and not any("470" in p for p in got)


def test_only_a_stale_library_is_skipped_with_a_warning(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "h"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False, userspace=False)
    fh.library(LIB, "libcuda.so.1", "470.82.01", real_elf=False)
    fh.library(LIB, "libnvidia-ml.so.1", V, real_elf=False)
    inv = probe(fh.root)
    assert [lib.soname for lib in inv.vendor("nvidia").libraries] == ["libnvidia-ml.so.1"]
    assert any("libcuda.so.470.82.01" in w and "not of driver" in w for w in inv.warnings)


def test_mig_capability_nodes(tmp_path):
    root = host(tmp_path, gpus=2, mig=True, libs=False)  # GPU index 0 has Device Minor 1
    nv = probe(root).vendor("nvidia")
    gpu0 = nv.devices[0]
    caps = [(n.path, n.major, n.minor) for n in gpu0.nodes[1:]]
    # gpu1/gi1/access = 3 + 135 + 9 = 147, its ci0 = 148; gi2 = 156, ci0 157, ci1 158
    assert caps == [(f"/dev/nvidia-caps/nvidia-cap{m}", 235, m) for m in (147, 148, 156, 157, 158)]
    assert len(nv.devices[1].nodes) == 1  # not in MIG mode
    e = plan_on(probe(root), req()).edits
    got = nodes(e)
    assert {p for p, _, _ in caps} <= set(got)
    assert "/dev/nvidia-caps/nvidia-cap1" not in got and "/dev/nvidia-caps/nvidia-cap2" not in got  # config, monitor


def test_mig_minors_parser_and_fallback_to_present_nodes(tmp_path):
    from gpuhook.probe.nvidia import parse_mig_minors

    assert parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngarbage\nx y\ngpu0/gi1/ci0/access ²\n") == {
        "config": 1, "monitor": 2, "gpu0/gi1/access": 12}
    # a capture without /proc/driver/nvidia/capabilities: the cap nodes that exist for the GPU
    fh = fakehost.FakeHost(str(tmp_path / "h"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    fh.file("/proc/driver/nvidia-caps/mig-minors", "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
            "gpu0/gi2/access 21\n")
    fh.chardev("/dev/nvidia-caps/nvidia-cap12", 235, 12)
    fh.chardev("/dev/nvidia-caps/nvidia-cap13", 235, 13)
    fh.chardev("/dev/nvidia-caps/nvidia-cap1", 235, 1)
    d = probe(fh.root).vendor("nvidia").devices[0]
    assert [n.path for n in d.nodes] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]


def test_nvswitch_and_imex_nodes(tmp_path):
    root = host(tmp_path, gpus=2, nvswitch=3, imex_channels=3, libs=False)
    ctl = {n.path: (n.major, n.minor) for n in probe(root).vendor("nvidia").control_nodes}
    assert ctl["/dev/nvidia-nvswitchctl"] == (511, 255)
    assert [ctl[f"/dev/nvidia-nvswitch{i}"] for i in range(3)] == [(511, i) for i in range(3)]
    assert [ctl[f"/dev/nvidia-caps-imex-channels/channel{i}"] for i in range(3)] == [(234, i) for i in range(3)]
    got = nodes(plan_on(probe(root), req()).edits)
    assert "/dev/nvidia-nvswitch2" in got and "/dev/nvidia-caps-imex-channels/channel2" in got
    got = nodes(plan_on(probe(root), req(env={"NVIDIA_IMEX_CHANNELS": "1"})).edits)
    assert [p for p in got if "imex" in p] == ["/dev/nvidia-caps-imex-channels/channel1"]


def test_no_nvswitch_node_from_a_major_alone(tmp_path):
    """/proc/devices names nvidia-nvswitch on every driver install: no nodes, nothing given."""
    root = host(tmp_path, gpus=1, libs=False)
    assert not any("nvswitch" in n.path for n in probe(root).vendor("nvidia").control_nodes)


def test_gsp_firmware_of_the_running_version_only(tmp_path):
    root = host(tmp_path, gpus=1, firmware=True)
    e = edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "utility"})
    fw = [m for m in e.mounts if "/firmware/" in m.container_path]
    assert sorted(m.container_path for m in fw) == [f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin",
                                                   f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin"]
    assert all(m.options[0] == "ro" for m in fw)
    assert all(m.host_path == root + m.container_path for m in fw)
    assert not any(d in e.hooks[0].args for d in (f"/lib/firmware/nvidia/{V}",))  # not a library dir


def test_ipc_sockets_and_mps(tmp_path):
    from gpuhook.config import Config

    root = host(tmp_path, gpus=1, persistenced=True, fabricmanager=True, mps=True)
    on = Config(mps_pipe_dir="/tmp/nvidia-mps")
    assert "/tmp/nvidia-mps" not in mounted(edits_for(root))  # MPS is opt-in: not without the node's word
    e = edits_for(root, config=on)
    by_dest = {m.container_path: m for m in e.mounts}
    for sock in ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"):
        assert by_dest[sock].host_path == root + sock and by_dest[sock].options[0] == "ro"
    mps = by_dest["/tmp/nvidia-mps"]
    assert mps.host_path == root + "/tmp/nvidia-mps" and "ro" not in mps.options  # clients write pipes
    # where the container's CUDA looks for them; never a host path the container names
    e = edits_for(root, {"CUDA_MPS_PIPE_DIRECTORY": "/var/mps"}, config=on)
    assert {m.container_path: m.host_path for m in e.mounts}["/var/mps"] == root + "/tmp/nvidia-mps"
    w: list[str] = []
    e = edits_for(root, {"CUDA_MPS_PIPE_DIRECTORY": "/proc/../etc"}, warnings=w, config=on)
    assert "/tmp/nvidia-mps" in mounted(e) and any("CUDA_MPS_PIPE_DIRECTORY" in x for x in w)
    # no compute, no MPS; sockets go with any driver files
    got = mounted(edits_for(root, {"NVIDIA_DRIVER_CAPABILITIES": "utility"}, config=on))
    assert "/tmp/nvidia-mps" not in got and "/run/nvidia-persistenced/socket" in got


def test_no_sockets_no_mps_when_absent(tmp_path):
    root = host(tmp_path, gpus=1)
    got = mounted(edits_for(root))
    assert not any("persistenced" in p or "mps" in p or "firmware" in p for p in got)


def test_mps_dir_from_node_config(tmp_path):
    from gpuhook.config import Config

    root = host(tmp_path, gpus=1)
    fh = fakehost.FakeHost(root)
    fh.file("/run/mps/control", "")
    e = plan_on(probe(root), req(), config=Config(mps_pipe_dir="/run/mps")).edits
    assert {m.container_path: m.host_path for m in e.mounts}["/tmp/nvidia-mps"] == root + "/run/mps"


# -- NVIDIA_VISIBLE_DEVICES ----------------------------------------------------------------

@pytest.mark.parametrize("value", ["void", "", "  ", "VOID"])
def test_visible_void_or_empty_gives_nothing(tmp_path, value):
    root = host(tmp_path, gpus=2)
    assert not edits_for(root, {"NVIDIA_VISIBLE_DEVICES": value})


def test_visible_none_gives_driver_files_and_control_nodes_but_no_gpu(tmp_path):
    root = host(tmp_path, gpus=2)
    e = edits_for(root, {"NVIDIA_VISIBLE_DEVICES": "none"})
    assert f"{LIB}/libcuda.so.{V}" in mounted(e)
    assert "/dev/nvidiactl" in nodes(e)
    assert not any(p.startswith("/dev/nvidia") and p[11:].isdigit() for p in nodes(e))
    assert not any(x.startswith("GPUHOOK_ACCELERATOR=") for x in e.env)  # no GPU: the app runs on CPU


def test_visible_all_and_unset(tmp_path):
    root = host(tmp_path, gpus=3)
    for env in ({}, {"NVIDIA_VISIBLE_DEVICES": "all"}):
        assert {f"/dev/nvidia{m}" for m in range(3)} <= set(nodes(edits_for(root, env)))


def test_visible_list_of_indices_and_uuid_prefixes(tmp_path):
    root = host(tmp_path, gpus=4)  # minors reversed: index i is /dev/nvidia(3-i)
    e = edits_for(root, {"NVIDIA_VISIBLE_DEVICES": "2, GPU-00000000"})
    gpus = [p for p in nodes(e) if p[11:].isdigit()]
    assert gpus == ["/dev/nvidia3", "/dev/nvidia1"]
    assert "GPUHOOK_DEVICES=nvidia:GPU-00000000-1111-2222-3333-444444444444,nvidia:GPU-00000002-1111-2222-3333-444444444446" in e.env
    w: list[str] = []
    e = edits_for(root, {"NVIDIA_VISIBLE_DEVICES": "GPU-0000000,7,MIG-abc,../x"}, warnings=w)
    assert not e  # nothing named a GPU of this node: no NVIDIA at all, the container runs on CPU
    assert len(w) == 4 and any("matches 4 GPUs" in x for x in w) and any("matches no GPU" in x for x in w)


def test_visible_volume_mounts_strategy(tmp_path):
    root = host(tmp_path, gpus=4)
    uuid = "GPU-00000001-1111-2222-3333-444444444445"
    e = edits_for(root, {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
                  mounts=("/proc", f"/var/run/nvidia-container-devices/{uuid}"))
    assert [p for p in nodes(e) if p[11:].isdigit()] == ["/dev/nvidia2"]


def test_capture_ctk_rootfs_still_reads():
    """The NVIDIA container toolkit's test root (no /proc: no driver version): the longer
    library list adds nothing that is not on disk."""
    inv = probe(os.path.join(FIXTURES, "nvidia-ctk-rootfs-1"))
    assert [lib.path for lib in inv.vendor("nvidia").libraries] == ["/lib/x86_64-linux-gnu/libcuda.so.1"]


def test_planning_from_a_cached_probe_does_not_import_the_probe():
    """plan.py takes the tool -> capability table from nvidia_tools, not from the probe."""
    import subprocess
    import sys

    code = ("import sys; import gpuhook.plan; "
            "print(sorted(m for m in sys.modules if m.startswith('gpuhook.probe.')))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))).stdout
    assert "gpuhook.probe.nvidia" not in out
