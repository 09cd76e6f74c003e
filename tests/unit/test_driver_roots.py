"""NVIDIA driver roots (the host, the GPU Operator's /run/nvidia/driver, GKE's
/home/kubernetes/bin/nvidia, nvidia_driver_root) and rule 2: a vendor whose userspace is
missing is never advertised. Unit level: probe, plan, cache, config, labels, CDI, agent, CLI;
tests/e2e/test_e2e_driver_roots.py runs real containers on the same fake hosts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import NO_CONFIG, gpuhook
from conftest import plan_on
from gpuhook.agent import core as agent_mod
from gpuhook.agent import summary as agent_summary
from gpuhook import cdi, config as cfg
from fakes import fakehost
from gpuhook.agent import labels
from gpuhook.inventory import Inventory
from gpuhook.plan import Request, unusable
from gpuhook.probe import cache, probe
from gpuhook.probe.host import Host

V = "550.54.14"
OLD = "535.104.05"
LIB = "/usr/lib/x86_64-linux-gnu"


def host(tmp_path, scenario, name="host", **kw) -> fakehost.FakeHost:
    fh = fakehost.FakeHost(str(tmp_path / name), mknod=False)
    getattr(fakehost, scenario)(fh, **kw)
    return fh


def request(tmp_path, env=None) -> Request:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True, exist_ok=True)
    return Request(env or {}, {}, str(rootfs))


def mounts(edits) -> dict[str, str]:
    return {m.container_path: m.host_path for m in edits.mounts}


def nvidia_warnings(inv) -> list[str]:
    return [w for w in inv.warnings if w.startswith("nvidia")]


# -- where the driver is found ---------------------------------------------------------------

def test_gpu_operator_driver_root(tmp_path):
    fh = host(tmp_path, "gpu_operator")
    inv = probe(fh.root)
    v = inv.vendor("nvidia")
    assert inv.warnings == ()
    assert v.driver_root == "/run/nvidia/driver" and v.driver_version == V
    libs = {lib.soname: lib for lib in v.libraries}
    assert libs["libcuda.so.1"].path == f"/run/nvidia/driver{LIB}/libcuda.so.{V}"
    assert v.container_path(libs["libcuda.so.1"].path) == f"{LIB}/libcuda.so.{V}"
    assert v.binaries == ("/run/nvidia/driver/usr/bin/nvidia-smi",)
    assert v.container_path(v.binaries[0]) == "/usr/bin/nvidia-smi"
    fw = [lib.path for lib in v.libraries if lib.capability == "firmware"]
    assert fw == [f"/run/nvidia/driver/lib/firmware/nvidia/{V}/gsp_ga10x.bin"]
    assert v.container_path(fw[0]) == f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin"
    # nothing from the host: its ld cache lists no NVIDIA library
    assert all(lib.path.startswith("/run/nvidia/driver/") for lib in v.libraries)


def test_gke_driver_root(tmp_path):
    fh = host(tmp_path, "gke")
    inv = probe(fh.root)
    v = inv.vendor("nvidia")
    assert inv.warnings == ()
    assert v.driver_root == "/home/kubernetes/bin/nvidia"
    got = {v.container_path(lib.path): lib.path for lib in v.libraries}
    assert got[f"/usr/local/nvidia/lib64/libcuda.so.{V}"] == f"/home/kubernetes/bin/nvidia/lib64/libcuda.so.{V}"
    assert got[f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin"] == f"/home/kubernetes/bin/nvidia/firmware/nvidia/{V}/gsp_ga10x.bin"
    assert [v.container_path(b) for b in v.binaries] == ["/usr/bin/nvidia-smi"]


@pytest.mark.parametrize("scenario,libdir", [("gpu_operator", LIB), ("gke", "/usr/local/nvidia/lib64")])
def test_plan_mounts_the_driver_root_at_the_container_paths(tmp_path, scenario, libdir):
    fh = host(tmp_path, scenario)
    inv = probe(fh.root)
    p = plan_on(inv, request(tmp_path), "/sbin/ldconfig")
    e = p.edits
    assert p.warnings == ()
    got = mounts(e)
    src = inv.vendor("nvidia").driver_root
    assert got[f"{libdir}/libcuda.so.{V}"] == fh.root + src + ("/lib64" if scenario == "gke" else LIB) + f"/libcuda.so.{V}"
    assert got["/usr/bin/nvidia-smi"].startswith(fh.root + src + "/")
    assert all(os.path.exists(h) for h in got.values())
    assert "GPUHOOK_ACCELERATOR=nvidia" in e.env
    # the ld-cache hook is given the library directory as the container sees it
    assert any(libdir in a for h in e.hooks for a in h.args)
    assert not any(src in a for h in e.hooks for a in h.args)


def test_the_host_driver_comes_first_and_roots_are_never_mixed(tmp_path):
    fh = host(tmp_path, "nvidia", gpus=1)
    fakehost.operator_driver_root(fh, V)
    v = probe(fh.root).vendor("nvidia")
    assert v.driver_root == "/" and v.mount_map == ()
    assert not any("/run/nvidia/driver" in p for p in [lib.path for lib in v.libraries] + list(v.binaries))


def test_a_stale_host_driver_gives_way_to_the_operator_root(tmp_path):
    """The host has only another version's libcuda: the Operator's root of the running
    driver is taken, and nothing of the host's other version is mounted."""
    fh = host(tmp_path, "gpu_operator", gpus=1)
    fh.library(LIB, "libcuda.so.1", OLD)
    fh.ldconfig([LIB])
    inv = probe(fh.root)
    v = inv.vendor("nvidia")
    assert v.driver_root == "/run/nvidia/driver" and inv.warnings == ()
    e = plan_on(inv, request(tmp_path), "/sbin/ldconfig").edits
    assert not any(OLD in h for h in mounts(e).values())
    assert mounts(e)[f"{LIB}/libcuda.so.{V}"].endswith(f"/run/nvidia/driver{LIB}/libcuda.so.{V}")


# -- never advertise what cannot work ----------------------------------------------------------

@pytest.mark.parametrize("installed,why", [
    (False, "/run/nvidia/driver: missing"),
    ("partial", "/run/nvidia/driver: no libcuda.so.1 (no /run/nvidia/validations/driver-ready yet"),
])
def test_no_driver_userspace_means_no_nvidia_injection(tmp_path, installed, why):
    fh = host(tmp_path, "gpu_operator", installed=installed)
    inv = probe(fh.root)
    v = inv.vendor("nvidia")
    assert len(v.devices) == 2  # the GPUs are there...
    assert not any(lib.soname == "libcuda.so.1" for lib in v.libraries)  # ...their userspace is not
    (w,) = nvidia_warnings(inv)
    assert why in w and "/home/kubernetes/bin/nvidia: missing" in w and "/: no libcuda.so.1" in w
    assert unusable(v)[0] == "no-libcuda"
    p = plan_on(inv, request(tmp_path), "/sbin/ldconfig")
    assert not p.edits
    (w,) = p.warnings
    assert w.startswith("nvidia: 2 device(s) not given: no libcuda.so.1 of driver 550.54.14")
    assert "runs without them" in w


def test_another_vendor_is_still_given_when_nvidia_cannot_work(tmp_path):
    fh = host(tmp_path, "gpu_operator", installed=False)
    fakehost.intel(fh, dgpu=False)
    e = plan_on(probe(fh.root), request(tmp_path), "/sbin/ldconfig").edits
    assert "GPUHOOK_ACCELERATOR=intel" in e.env
    assert not any(n.path.startswith("/dev/nvidia") for n in e.device_nodes)


def test_a_utility_only_container_needs_nvml_not_libcuda(tmp_path):
    fh = host(tmp_path, "nvidia", gpus=1, libs=False, userspace=False)
    fh.library(LIB, "libnvidia-ml.so.1", V)
    inv = probe(fh.root)
    assert not plan_on(inv, request(tmp_path), "/sbin/ldconfig").edits  # default caps: compute, utility
    e = plan_on(inv, request(tmp_path, {"NVIDIA_DRIVER_CAPABILITIES": "utility"}), "/sbin/ldconfig").edits
    assert "GPUHOOK_ACCELERATOR=nvidia" in e.env and f"{LIB}/libnvidia-ml.so.{V}" in mounts(e)
    bare = host(tmp_path, "nvidia", name="bare", gpus=1, libs=False, userspace=False)
    p = plan_on(probe(bare.root), request(tmp_path, {"NVIDIA_DRIVER_CAPABILITIES": "utility"}), "/sbin/ldconfig")
    assert not p.edits
    assert "no libnvidia-ml.so.1" in p.warnings[0]


def test_wsl_without_libdxcore_is_not_given(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "wsl"), mknod=False)
    fh.proc_devices({"dxg": 240})
    fh.file("/dev/dxg", "")
    p = plan_on(probe(fh.root), request(tmp_path), None)
    assert not p.edits
    assert "no libdxcore.so" in p.warnings[0]
    fh.file("/usr/lib/wsl/lib/libdxcore.so", b"\x7fELF")
    assert "GPUHOOK_ACCELERATOR=dxg" in plan_on(probe(fh.root), request(tmp_path), None).edits.env


# -- bad input: one warning, no crash, never another version's library ------------------------------

def _outside_driver(tmp_path) -> str:
    """A complete driver root of the running version outside the host root."""
    out = fakehost.FakeHost(str(tmp_path / "outside"), mknod=False)
    fakehost.nvidia_userspace(out, V)
    return out.root


@pytest.mark.parametrize("case", ["missing", "file", "dangling", "relative-link-out", "absolute-link-out",
                                  "other-version"])
def test_bad_driver_root_is_one_warning_and_no_driver(tmp_path, case):
    fh = host(tmp_path, "gpu_operator", installed=False)
    root = "/opt/nvidia/driver"
    if case == "file":
        fh.file(root, "not a directory\n")
    elif case == "dangling":
        fh.symlink(root, "/nowhere")
    elif case == "relative-link-out":
        outside = _outside_driver(tmp_path)
        fh.symlink(root, os.path.relpath(outside, os.path.dirname(fh.p(root))))
    elif case == "absolute-link-out":
        # resolved inside the host root, as chroot would: the outside tree is not reached
        fh.symlink(root, _outside_driver(tmp_path))
    elif case == "other-version":
        fakehost.operator_driver_root(fh, OLD, root=root)
    inv = probe(fh.root, nvidia_driver_root=root)
    v = inv.vendor("nvidia")
    assert len(inv.warnings) == 1, inv.warnings
    assert inv.warnings[0].startswith(f"nvidia: no driver userspace of driver {V}: {root}: ")
    assert v.libraries == () and v.binaries == () and v.driver_root is None
    assert not plan_on(inv, request(tmp_path), "/sbin/ldconfig").edits
    reason = inv.warnings[0].split(f"{root}: ", 1)[1]
    assert {"missing": "missing", "file": "not a directory", "dangling": "a dangling link",
            "relative-link-out": "a link that leads out of the host root",
            "absolute-link-out": "a dangling link", "other-version": f"libcuda.so.1 is of driver {OLD}"}[case] in reason


def test_a_configured_root_is_the_only_one(tmp_path):
    """nvidia_driver_root names one root: the host's own driver is not taken instead."""
    fh = host(tmp_path, "nvidia", gpus=1)
    fakehost.gke_driver_root(fh, V, root="/opt/drv")
    v = probe(fh.root, nvidia_driver_root="/opt/drv").vendor("nvidia")
    assert v.driver_root == "/opt/drv" and all(lib.path.startswith("/opt/drv/") for lib in v.libraries)
    inv = probe(fh.root, nvidia_driver_root="/opt/other")
    assert inv.vendor("nvidia").libraries == () and len(inv.warnings) == 1


def test_links_inside_a_driver_root_stay_inside_it(tmp_path):
    """An absolute link in the driver container's tree means a path of that tree."""
    fh = host(tmp_path, "gpu_operator", gpus=1)
    d = fh.p(f"/run/nvidia/driver{LIB}")
    os.unlink(f"{d}/libcuda.so.1")
    os.symlink(f"{LIB}/libcuda.so.{V}", f"{d}/libcuda.so.1")
    fh.library(LIB, "libcuda.so.1", OLD)  # the host's path of that name is another driver
    v = probe(fh.root).vendor("nvidia")
    assert {lib.soname: lib.path for lib in v.libraries}["libcuda.so.1"] == f"/run/nvidia/driver{LIB}/libcuda.so.{V}"


def test_host_escapes():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.makedirs(f"{d}/root/a")
        os.symlink("../../..", f"{d}/root/a/up")
        os.symlink("/a", f"{d}/root/abs")
        h = Host(f"{d}/root")
        assert h.escapes("/a/up/etc") and not h.escapes("/abs") and not h.escapes("/a")
        assert not Host("/").escapes("/a/up")


# -- the probe cache: a "no driver" answer is not kept once the driver is there ------------------

def test_cache_sees_the_driver_root_appear(tmp_path):
    fh = host(tmp_path, "gpu_operator", installed=False)
    cdir = str(tmp_path / "cache")

    def cached():
        return cache.probe_cached(fh.root, cdir, 3600)

    assert unusable(cached().vendor("nvidia"))
    assert unusable(cached().vendor("nvidia"))  # a hit: nothing changed
    fakehost.operator_driver_root(fh, V)
    fh.file(fakehost.OPERATOR_READY, "")
    v = cached().vendor("nvidia")
    assert unusable(v) is None and v.driver_root == "/run/nvidia/driver"


def test_cache_sees_a_half_installed_root_completed(tmp_path):
    fh = host(tmp_path, "gpu_operator", installed="partial")
    cdir = str(tmp_path / "cache")
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia"))
    fakehost.operator_driver_root(fh, V)  # the driver container finishes: libraries and ld cache
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia")) is None


def test_cache_sees_the_ready_file_and_a_gke_install(tmp_path):
    fh = host(tmp_path, "gke", installed=False)
    cdir = str(tmp_path / "cache")
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia"))
    fakehost.gke_driver_root(fh, V)
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia")) is None
    key = cache.fingerprint(fh.root)
    fh.file(fakehost.OPERATOR_READY, "")
    assert cache.fingerprint(fh.root) != key


def test_cache_is_keyed_by_the_setting(tmp_path):
    fh = host(tmp_path, "gpu_operator", gpus=1)
    cdir = str(tmp_path / "cache")
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia")) is None
    assert unusable(cache.probe_cached(fh.root, cdir, 3600, "/").vendor("nvidia"))


def test_inventory_round_trip_keeps_the_driver_root(tmp_path):
    inv = probe(host(tmp_path, "gke").root)
    back = Inventory.from_plain(json.loads(json.dumps(inv.to_plain())))
    assert back == inv and back.vendor("nvidia").mount_map == inv.vendor("nvidia").mount_map


# -- the node config ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,ok", [
    ("auto", True), ("/", True), ("/run/nvidia/driver", True), ("/home/kubernetes/bin/nvidia", True),
    ("run/nvidia/driver", False), ("/run/../etc", False), ("/run/nvidia/driver/", False), ("//x", False),
    ("Auto", False), ("", False),
])
def test_config_key_is_checked(value, ok):
    c, errors = cfg.parse(f'nvidia_driver_root = "{value}"\n')
    assert (errors == []) == ok
    assert c.nvidia_driver_root == (value if ok else "auto")
    if not ok:
        assert errors[0].startswith("nvidia_driver_root:")


def test_config_default_and_type():
    assert cfg.Config().nvidia_driver_root == "auto"
    c, errors = cfg.parse("nvidia_driver_root = 1\n")
    assert c.nvidia_driver_root == "auto" and "expected a string" in errors[0]


# -- labels, CDI, the agent --------------------------------------------------------------------

def test_labels_say_none_and_why(tmp_path):
    fh = host(tmp_path, "gpu_operator", installed=False)
    got = labels.node_labels(probe(fh.root))
    assert got == {"gpuhook.dev/accelerator": "none", "gpuhook.dev/gpu.count": "0",
                   "gpuhook.dev/nvidia.unusable": "no-libcuda",
                   "gpuhook.dev/accelerator.reason": "nvidia-no-libcuda"}
    fakehost.intel(fh, dgpu=False)
    got = labels.node_labels(probe(fh.root))
    assert got["gpuhook.dev/accelerator"] == "intel" and got["gpuhook.dev/nvidia.unusable"] == "no-libcuda"
    assert "gpuhook.dev/accelerator.reason" not in got and "gpuhook.dev/accelerator.nvidia" not in got


def test_cdi_uses_the_driver_root_and_skips_an_unusable_vendor(tmp_path):
    fh = host(tmp_path, "gke")
    specs = cdi.specs(probe(fh.root), fh.root, False)
    nv = next(s for s in specs if s["kind"] == "gpuhook.dev/nvidia")
    got = {m["containerPath"]: m["hostPath"] for m in nv["containerEdits"]["mounts"]}
    assert got[f"/usr/local/nvidia/lib64/libcuda.so.{V}"] == fh.root + f"/home/kubernetes/bin/nvidia/lib64/libcuda.so.{V}"
    assert [d["name"] for d in nv["devices"]][0] == "0"  # per-device entries are still there
    bare = host(tmp_path, "gke", name="bare", installed=False)
    assert cdi.specs(probe(bare.root), bare.root, False) == []


def test_agent_follows_the_driver_root(tmp_path):
    from conftest import make_agent, read_state

    fh = host(tmp_path, "gpu_operator", installed=False)
    events = []
    a = make_agent(tmp_path, fh.root)
    a.events.post = lambda reason, message, type_="Normal": events.append((reason, message, type_))
    assert a.sync("start")
    specs, found = read_state(tmp_path)
    assert specs == {} and found["gpuhook.dev/accelerator"] == "none"
    assert found["gpuhook.dev/accelerator.reason"] == "nvidia-no-libcuda"
    assert ("GPUUnusable", events[-1][1], "Warning") == events[-1] and "no libcuda.so.1" in events[-1][1]
    fakehost.operator_driver_root(fh, V)
    assert a.sync("timer")
    specs, found = read_state(tmp_path)
    assert found["gpuhook.dev/accelerator"] == "nvidia" and "gpuhook.dev/nvidia.unusable" not in found
    assert "gpuhook.dev/nvidia" in specs
    assert events[-1][0] == "GPUInventoryChanged" and "nvidia not usable -> usable" in events[-1][1]


def test_agent_options_carry_the_setting(tmp_path):
    from conftest import make_agent

    fh = host(tmp_path, "gpu_operator", gpus=1)
    a = make_agent(tmp_path, fh.root, opts={"nvidia_driver_root": "/"})
    assert unusable(a.probe(fh.root).vendor("nvidia"))
    assert agent_summary.describe(a.probe(fh.root)).startswith("1 GPU (0 usable): nvidia x1 (")


# -- the CLI -----------------------------------------------------------------------------------

def test_cli_probe_says_where_the_driver_is(tmp_path):
    fh = host(tmp_path, "gpu_operator")
    r = gpuhook("probe", "--root", fh.root, config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    assert "driver userspace: from /run/nvidia/driver (mounted at: /run/nvidia/driver -> /)" in r.stdout
    assert f"/run/nvidia/driver{LIB}/libcuda.so.{V}  [compute] -> {LIB}/libcuda.so.{V}" in r.stdout
    r = gpuhook("probe", "--root", fh.root, "--json", config=NO_CONFIG)
    assert json.loads(r.stdout)["vendors"][0]["driver_root"] == "/run/nvidia/driver"
    # the node config's setting, and the flag over it
    conf = tmp_path / "gpuhook.toml"
    conf.write_text('nvidia_driver_root = "/"\n')
    r = gpuhook("probe", "--root", fh.root, config=str(conf))
    assert "NOT USABLE: no libcuda.so.1 of driver 550.54.14" in r.stdout and "driver userspace: not found" in r.stdout
    r = gpuhook("probe", "--root", fh.root, "--nvidia-driver-root", "auto", config=str(conf))
    assert "from /run/nvidia/driver" in r.stdout


def test_cli_plan_and_cdi_say_why_nothing(tmp_path):
    fh = host(tmp_path, "gpu_operator", installed="partial")
    r = gpuhook("plan", "--root", fh.root, config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    assert "Nothing to inject" in r.stdout
    assert "warning: nvidia: 2 device(s) not given: no libcuda.so.1 of driver 550.54.14" in r.stdout
    assert "warning: nvidia: no driver userspace of driver 550.54.14: " in r.stdout
    r = gpuhook("cdi", "generate", "--root", fh.root, "--spec-root", fh.root, "--output", "-", config=NO_CONFIG)
    assert r.returncode == 0 and r.stdout == "" and "no driver userspace" in r.stderr
    r = gpuhook("plan", "--root", fakehost.build(str(tmp_path / "sim-gke"), "gke", mknod=False).root, "--json",
                config=NO_CONFIG)
    edits = json.loads(r.stdout)["edits"]
    assert any(m["containerPath"] == f"/usr/local/nvidia/lib64/libcuda.so.{V}" for m in edits["mounts"])


@pytest.mark.parametrize("command", [["probe"], ["plan"], ["cdi", "generate", "--output", "-"]])
def test_cli_bad_driver_root_flag_is_one_line(tmp_path, command):
    fh = host(tmp_path, "gke", gpus=1)
    r = gpuhook(*command, "--root", fh.root, "--nvidia-driver-root", "opt/x", config=NO_CONFIG)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--nvidia-driver-root opt/x" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount --bind)")
def test_cache_sees_a_driver_root_mounted_over_an_empty_directory(tmp_path):
    """The GPU Operator mounts the driver container's root on /run/nvidia/driver, which may
    already be there, empty: the mount alone invalidates the cached "no driver" answer."""
    fh = host(tmp_path, "gpu_operator", installed=False)
    os.makedirs(fh.p(fakehost.OPERATOR_ROOT))
    drv = fakehost.FakeHost(str(tmp_path / "driver-container"), mknod=False)
    fakehost.nvidia_userspace(drv, V, firmware_dir="/lib/firmware/nvidia")
    cdir = str(tmp_path / "cache")
    assert unusable(cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia"))
    subprocess.run(["mount", "--bind", drv.root, fh.p(fakehost.OPERATOR_ROOT)], check=True)
    try:
        v = cache.probe_cached(fh.root, cdir, 3600).vendor("nvidia")
    finally:
        subprocess.run(["umount", fh.p(fakehost.OPERATOR_ROOT)], check=True)
    assert unusable(v) is None and v.driver_root == "/run/nvidia/driver"


def test_cli_agent_once_takes_the_setting(tmp_path):
    fh = host(tmp_path, "gpu_operator", gpus=1)
    common = ["agent", "--once", "--no-install", "--no-udev", "--root", fh.root, "--spec-root", fh.root,
              "--cdi-dir", str(tmp_path / "cdi"), "--nfd-dir", str(tmp_path / "nfd"), "--ready-file", "",
              "--log-format", "json"]
    r = gpuhook(*common, "--nvidia-driver-root", "/", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    found = labels.parse_nfd((tmp_path / "nfd" / "gpuhook").read_text())
    assert found["gpuhook.dev/accelerator"] == "none" and found["gpuhook.dev/nvidia.unusable"] == "no-libcuda"
    assert not (tmp_path / "cdi" / "gpuhook.dev-nvidia.yaml").exists()
    r = gpuhook(*common, config=NO_CONFIG)  # auto: the Operator's root
    assert r.returncode == 0, r.stderr
    assert labels.parse_nfd((tmp_path / "nfd" / "gpuhook").read_text())["gpuhook.dev/accelerator"] == "nvidia"
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V}" in (tmp_path / "cdi" / "gpuhook.dev-nvidia.yaml").read_text()


def _nv(*sonames, version=V):
    from gpuhook.inventory import Library, VendorInventory

    libs = tuple(Library(f"{LIB}/{s.rpartition('.so')[0]}.so.{V}", s, "compute") for s in sonames)
    return VendorInventory("nvidia", (), libraries=libs, driver_version=version)


@pytest.mark.parametrize("sonames, caps, code", [
    (("libcuda.so.1", "libnvidia-ml.so.1"), None, None),
    (("libcuda.so.1",), None, None),  # a compute container runs on libcuda alone
    (("libnvidia-ml.so.1",), None, "no-libcuda"),
    (("libnvidia-ml.so.1",), frozenset({"utility"}), None),
    ((), frozenset({"utility"}), "no-libnvidia-ml"),
    (("libcuda.so.1",), frozenset({"utility"}), "no-libnvidia-ml"),
    ((), frozenset({"compute", "video"}), "no-libcuda"),
    ((), frozenset({"video", "graphics"}), None),  # neither library is what such a container needs
    ((), frozenset(), None),
])
def test_which_library_a_container_cannot_do_without(sonames, caps, code):
    """The capabilities a container asks for decide which missing library makes NVIDIA
    unusable for it; the reason names the library, the driver and the capability."""
    got = unusable(_nv(*sonames), caps)
    assert (got and got[0]) == code
    if code:
        lib = code[3:]
        assert f"no {lib}.so.1 of driver {V}" in got[1] and "capability" in got[1]


def test_an_unknown_driver_version_is_said_so():
    code, why = unusable(_nv(version=None))
    assert code == "no-libcuda" and "unknown version" in why and "None" not in why


@pytest.mark.parametrize("paths, code", [
    (("/usr/lib/wsl/lib/libdxcore.so", "/usr/lib/wsl/lib/libd3d12.so"), None),
    (("/usr/lib/wsl/lib/libd3d12.so",), "no-libdxcore"),
    (("/usr/lib/wsl/lib/libdxcore.so.bak", "/usr/lib/wsl/lib/not-libdxcore.so"), "no-libdxcore"),
    ((), "no-libdxcore"),
])
def test_wsl_needs_libdxcore_by_its_file_name(paths, code):
    from gpuhook.inventory import Library, VendorInventory

    v = VendorInventory("dxg", (), libraries=tuple(Library(p, None, "dxg") for p in paths))
    got = unusable(v)
    assert (got and got[0]) == code
    if code:
        assert "libdxcore.so" in got[1]


@pytest.mark.parametrize("vendor", ["amd", "intel", "accel"])
def test_other_vendors_need_no_library(vendor):
    from gpuhook.inventory import VendorInventory

    assert unusable(VendorInventory(vendor, ())) is None
    assert unusable(VendorInventory(vendor, ()), frozenset({"compute"})) is None
