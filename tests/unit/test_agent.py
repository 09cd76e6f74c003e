"""The node agent: follows GPU changes (debounced), atomic files, udev fallback, install,
the Kubernetes API, SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, make_agent, read_state
from gpuhook.agent import core as agent_mod
from gpuhook.agent import watch as agent_watch
from gpuhook import cdi, log
from gpuhook.defaults import AGENT_NAME
from fakes import fakehost
from gpuhook.agent import labels
from fakes.kubeapi import FakeAPI

SLACK = 1.0  # probe + write + the test's own polling, on a slow 2-core VM


# -- a fake host whose GPUs change ------------------------------------------------------------

def _bdf(i: int) -> str:
    return f"0000:{0x18 + 0x10 * i:02x}:00.0"


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-{0x444444444444 + i:012x}"


def add_nvidia_gpu(fh: fakehost.FakeHost, i: int, minor: int) -> None:
    """One more GPU, laid out as fakehost.nvidia lays them out (a hot-plugged or rebound GPU)."""
    fh.pci_device(_bdf(i), 0x10DE, 0x2330, "nvidia", 0x030200)
    fh.chardev(f"/dev/nvidia{minor}", fakehost.NVIDIA_MAJOR, minor)
    fh.file(f"/proc/driver/nvidia/gpus/{_bdf(i)}/information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {_uuid(i)}\nBus Location: \t {_bdf(i)}\n"
            f"Device Minor: \t {minor}\n")


def remove_nvidia_gpu(fh: fakehost.FakeHost, i: int, minor: int) -> None:
    shutil.rmtree(fh.p(f"/proc/driver/nvidia/gpus/{_bdf(i)}"))
    shutil.rmtree(fh.p(f"/sys/devices/pci0000:00/{_bdf(i)}"))
    os.unlink(fh.p(f"/dev/nvidia{minor}"))


class Running:
    def __init__(self, agent):
        self.agent = agent
        self.rc = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.rc = self.agent.run()

    def stop(self):
        self.agent.stop("test")
        self.thread.join(10)
        assert not self.thread.is_alive()


def wait_for(cond, timeout: float, step: float = 0.01):
    """Poll until cond() is truthy; (value, seconds waited)."""
    t0 = time.monotonic()
    while True:
        value = cond()
        if value:
            return value, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout}s")
        time.sleep(step)


def device_names(specs, kind="gpuhook.dev/nvidia"):
    return [d["name"] for d in specs[kind]["devices"]] if kind in specs else []


# -- following the node ---------------------------------------------------------------------------

def test_files_follow_the_gpus_within_the_debounce_and_are_never_half_written(tmp_path, logs):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=2, libs=False)  # GPU 0 has minor 1, GPU 1 minor 0
    a = make_agent(tmp_path, fh.root)
    debounce = a.opts.debounce
    stop, errors, reads = threading.Event(), [], [0]

    def reader():
        while not stop.is_set():
            try:
                read_state(tmp_path)
                reads[0] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    run = Running(a)
    wait_for(lambda: (tmp_path / "ready").exists(), 10)
    specs, found = read_state(tmp_path)
    assert device_names(specs) == ["0", _uuid(0), "1", _uuid(1), "all"]
    assert found["gpuhook.dev/gpu.count"] == "2"
    t = threading.Thread(target=reader)
    t.start()
    try:
        def follows(n_gpus, names, kind="gpuhook.dev/nvidia"):
            def ok():
                specs, found = read_state(tmp_path)
                return found.get("gpuhook.dev/gpu.count") == str(n_gpus) and device_names(specs, kind) == names
            return ok

        # a GPU appears (udev would say so): both files follow, after the debounce and not before
        add_nvidia_gpu(fh, 2, minor=2)
        a.notify("test:add")
        _, took = wait_for(follows(3, ["0", _uuid(0), "1", _uuid(1), "2", _uuid(2), "all"]), debounce + SLACK)
        assert debounce * 0.9 <= took <= debounce + SLACK, took

        # one disappears
        remove_nvidia_gpu(fh, 0, minor=1)
        a.notify("test:remove")
        _, took = wait_for(follows(2, ["0", _uuid(1), "1", _uuid(2), "all"]), debounce + SLACK)
        assert took <= debounce + SLACK

        # a second vendor appears: its own spec, and NVIDIA stays the primary
        fakehost.intel(fh, dgpu=False)
        a.notify("test:intel")
        def intel_too():
            specs, found = read_state(tmp_path)
            return "gpuhook.dev/intel" in specs and "gpuhook.dev/accelerator.intel" in found
        wait_for(intel_too, debounce + SLACK)
        _, found = read_state(tmp_path)
        assert found["gpuhook.dev/accelerator"] == "nvidia" and found["gpuhook.dev/accelerator.intel"] == "true"
        assert found["gpuhook.dev/gpu.count"] == "3"

        # every GPU goes: no spec at all, and the labels say so
        remove_nvidia_gpu(fh, 1, minor=0)
        remove_nvidia_gpu(fh, 2, minor=2)
        shutil.rmtree(fh.p("/sys/class/drm"))
        a.notify("test:all-gone")
        wait_for(lambda: read_state(tmp_path) == ({}, {"gpuhook.dev/accelerator": "none", "gpuhook.dev/gpu.count": "0",
                                                        "gpuhook.dev/runtime-ready": "true"}), debounce + SLACK)
    finally:
        stop.set()
        t.join()
        run.stop()
    assert not errors, errors[:3]
    assert reads[0] > 20
    assert run.rc == 0 and not (tmp_path / "ready").exists()
    changed = [r for r in logs() if r["event"] == "inventory.changed"]
    assert changed[0]["added"] == [f"nvidia:{_uuid(2)}"] and changed[0]["reason"] == "test:add"
    assert changed[1]["removed"] == [f"nvidia:{_uuid(0)}"]
    assert changed[2]["vendors"] == ["nvidia", "intel"]
    assert changed[3]["vendors"] == [] and changed[3]["message"] == "no GPU: CPU-only node"
    assert os.listdir(tmp_path / "cdi") == [] and os.listdir(tmp_path / "nfd") == ["gpuhook"]


def test_a_burst_of_events_is_one_probe(tmp_path, logs):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    a = make_agent(tmp_path, fh.root, opts={"debounce": 0.4})
    run = Running(a)
    try:
        wait_for(lambda: a.syncs == 1 and a.ready, 10)
        for i in range(10):  # a driver load: a dozen events within a fraction of a second
            a.notify(f"udev:add:drm:card{i}")
            time.sleep(0.03)
        last = time.monotonic()
        wait_for(lambda: a.syncs == 2, 0.4 + SLACK)
        assert time.monotonic() - last >= 0.4 * 0.9
        time.sleep(0.6)
        assert a.syncs == 2
    finally:
        run.stop()
    (same,) = [r for r in logs() if r["event"] == "inventory.same"]
    assert same["reason"].startswith("udev:add:drm:card0, udev:add:drm:card1") and "(+5)" in same["reason"]


def test_the_timer_catches_what_udev_does_not_say(tmp_path, logs):
    """NVIDIA GPUs appear without udev events: the periodic probe is the safety net."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    a = make_agent(tmp_path, fh.root, opts={"interval": 0.5})
    run = Running(a)
    try:
        wait_for(lambda: a.ready, 10)
        add_nvidia_gpu(fh, 1, minor=1)
        wait_for(lambda: read_state(tmp_path)[1].get("gpuhook.dev/gpu.count") == "2", 0.5 + SLACK)
    finally:
        run.stop()
    assert [r["reason"] for r in logs() if r["event"] == "inventory.changed"] == ["timer"]


def test_a_bug_in_one_round_does_not_end_the_agent(tmp_path, logs, monkeypatch):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    real, calls = cdi.specs, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("bug")
        return real(*a, **k)

    monkeypatch.setattr(cdi, "specs", flaky)
    a = make_agent(tmp_path, fh.root, opts={"interval": 0.2})
    run = Running(a)
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 5)
    finally:
        run.stop()
    (err,) = [r for r in logs() if r["event"] == "sync.error"]
    assert err["error"] == "RuntimeError: bug" and "Traceback" in err["exception"]
    assert "gpuhook.dev/nvidia" in read_state(tmp_path)[0]


# -- udev ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["import", "context", "monitor"])
def test_without_libudev_it_polls_and_says_so_once(tmp_path, logs, monkeypatch, how):
    if how == "import":
        monkeypatch.setitem(sys.modules, "pyudev", None)  # import pyudev -> ImportError
    else:
        import pyudev

        def broken(*a, **k):
            raise ImportError("libudev.so.1: cannot open shared object file")
        monkeypatch.setattr(pyudev, "Context" if how == "context" else "Monitor",
                            broken if how == "context" else type("M", (), {"from_netlink": staticmethod(broken)}))
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    a = make_agent(tmp_path, fh.root, opts={"interval": 0.2, "udev": True})
    run = Running(a)
    try:
        wait_for(lambda: a.syncs >= 5, 5)
    finally:
        run.stop()
    records = logs()
    (msg,) = [r for r in records if r["event"].startswith("udev.")]
    assert msg["event"] == "udev.unavailable" and msg["fallback"] == "periodic" and msg["interval"] == 0.2
    assert msg["level"] == "warning" and msg["error"]
    assert a.watch is None


def test_udev_watch_filters_and_notifies():
    """The watch thread on a stand-in monitor: GPU subsystems and GPU driver modules only."""
    class Dev:
        def __init__(self, subsystem, name, action="add"):
            self.subsystem, self.sys_name, self.action = subsystem, name, action

    events = [Dev("drm", "card1"), Dev("module", "snd_hda_intel"), Dev("module", "nvidia", "remove"),
              Dev("kfd", "kfd"), None, Dev("accel", "accel0")]
    stop = threading.Event()

    class Monitor:
        def poll(self, timeout):
            if not events:
                stop.set()
                return None
            return events.pop(0)

    got = []
    w = agent_watch.UdevWatch(got.append, log.get(), stop)
    w.monitor = Monitor()
    w._loop()
    assert got == ["udev:add:drm:card1", "udev:remove:module:nvidia", "udev:add:kfd:kfd", "udev:add:accel:accel0"]


def test_real_udev_monitor_starts_here(tmp_path, logs):
    """pyudev and libudev are installed here: the agent watches (netlink, kernel or udev source)."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.cpu_only(fh)
    a = make_agent(tmp_path, fh.root, opts={"udev": True})
    try:
        import pyudev

        pyudev.Monitor.from_netlink(pyudev.Context())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no netlink uevent socket here: {e}")
    run = Running(a)
    try:
        wait_for(lambda: a.ready, 10)
    finally:
        run.stop()
    (w,) = [r for r in logs() if r["event"].startswith("udev.")]
    assert w["event"] == "udev.watching" and w["subsystems"] == ["drm", "kfd", "accel", "module"]


# -- install, readiness ----------------------------------------------------------------------------

def test_install_first_then_ready_and_retried_until_it_works(tmp_path, logs):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    calls = []

    def installer():
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise OSError("containerd config: Permission denied")

    a = make_agent(tmp_path, fh.root, installer=installer, opts={"install": True, "interval": 0.3})
    run = Running(a)
    try:
        wait_for(lambda: (tmp_path / "nfd" / "gpuhook").exists(), 10)
        # the install failed: GPUs are described, but the node is not ready and does not say so
        _, found = read_state(tmp_path)
        assert "gpuhook.dev/runtime-ready" not in found and found["gpuhook.dev/gpu.count"] == "1"
        assert not (tmp_path / "ready").exists()
        wait_for(lambda: (tmp_path / "ready").exists(), 0.3 + SLACK)
        assert read_state(tmp_path)[1]["gpuhook.dev/runtime-ready"] == "true"
    finally:
        run.stop()
    assert len(calls) == 2
    installs = [r for r in logs() if r["event"] == "install"]
    assert [r["decision"] for r in installs] == ["error", "ok"]
    assert installs[0]["error"] == "containerd config: Permission denied" and installs[0]["level"] == "error"


def test_the_default_installer_is_gpuhook_install(tmp_path, monkeypatch, logs):
    from gpuhook.install import core

    seen = []
    monkeypatch.setattr(core, "install", lambda opts, say: (seen.append(opts), say("handler added")))
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.cpu_only(fh)
    a = make_agent(tmp_path, fh.root, opts={"install": True, "once": True, "install_restart": "signal"})
    assert a.run() == 0
    (opts,) = seen
    assert (opts.host_root, opts.restart, opts.dry_run) == (fh.root, "signal", False)
    assert (opts.front, opts.nri_unit) == ("wrapper", True)  # the agent's default front
    assert any(r["event"] == "install.step" and r["message"] == "handler added" for r in logs())
    assert (tmp_path / "ready").exists()


def test_default_dirs_are_the_nodes_even_through_its_symlinks(tmp_path):
    root = tmp_path / "host"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    os.symlink("/run", root / "var" / "run")  # as on the node: absolute, it would leave the root
    o = agent_mod.Options(root=str(root))
    assert o.resolved_cdi_dir() == str(root / "run" / "cdi")
    assert o.resolved_nfd_dir() == str(root / "etc/kubernetes/node-feature-discovery/features.d")
    assert agent_mod.Options(root=str(root), cdi_dir="").resolved_cdi_dir() == ""


# -- the Kubernetes API --------------------------------------------------------------------------

def test_labels_and_events_through_the_api(tmp_path, logs):
    api = FakeAPI()
    api.label(AGENT_NAME, {"gpuhook.dev/amd.count": "4"})  # an earlier round's: it goes
    try:
        fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
        fakehost.nvidia(fh, gpus=2, libs=False)
        fakehost.intel(fh, dgpu=False)
        calls = []

        def installer():
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("no containerd")

        a = make_agent(tmp_path, fh.root, kube=api.client(), installer=installer,
                       opts={"install": True, "interval": 0.3})
        run = Running(a)
        try:
            wait_for(lambda: api.labels.get("gpuhook.dev/runtime-ready") == "true", 0.3 + 2 * SLACK)
            have = {k: v for k, v in api.labels.items() if k.startswith("gpuhook.dev/")}
            assert have == labels.node_labels(a.probe(fh.root), runtime_ready=True)
            assert "gpuhook.dev/amd.count" not in have  # stale: removed
            remove_nvidia_gpu(fh, 0, minor=1)
            shutil.rmtree(fh.p("/sys/class/drm"))
            a.notify("test:remove")
            wait_for(lambda: api.labels.get("gpuhook.dev/gpu.count") == "1", 0.3 + SLACK)
            assert "gpuhook.dev/accelerator.intel" not in api.labels
            assert api.labels["kubernetes.io/hostname"] == "node-1"
            wait_for(lambda: len(api.events) >= 3, SLACK)
        finally:
            run.stop()
        reasons = [(e["reason"], e["type"]) for e in api.events]
        assert reasons == [("RuntimeInstallFailed", "Warning"), ("GPUInventory", "Normal"), ("GPUInventoryChanged", "Normal")]
        assert api.events[1]["message"].startswith("3 GPUs: nvidia x2")
        assert api.events[1]["involvedObject"]["uid"] == "uid-1234"
        assert f"-nvidia:{_uuid(0)}" in api.events[2]["message"] and "-intel:0000:00:02.0" in api.events[2]["message"]
        patched = [r for r in logs() if r["event"] == "labels.patched"]
        assert "gpuhook.dev/amd.count" in patched[0]["removed"]
        assert "gpuhook.dev/accelerator.intel" in patched[-1]["removed"]
        # labels unchanged between probes: no PATCH, and no GET either until api_resync
        patches = [r for r in api.requests if r[0] == "PATCH"]
        assert len(patches) == len(patched)
    finally:
        api.close()


def test_api_down_never_stops_the_agent(tmp_path, logs):
    api = FakeAPI()
    api.fail_next = [503, 503]
    try:
        fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
        fakehost.nvidia(fh, gpus=1, libs=False)
        a = make_agent(tmp_path, fh.root, kube=api.client(), opts={"interval": 0.2})
        run = Running(a)
        try:
            # ready at once: the node's files do not wait for the API
            wait_for(lambda: (tmp_path / "ready").exists(), 10)
            assert read_state(tmp_path)[1]["gpuhook.dev/gpu.count"] == "1"
            wait_for(lambda: api.labels.get("gpuhook.dev/gpu.count") == "1", 10)
        finally:
            run.stop()
        errors = [r for r in logs() if r["event"] == "kube.error"]
        assert errors and "HTTP 503" in errors[0]["error"]
    finally:
        api.close()


def test_api_errors_are_said_once_and_retried_with_backoff(tmp_path, logs):
    """An API that keeps answering 503 while the agent re-probes 20 times a second: one
    kube.error line, node label syncs backed off (1 s, 2 s...) instead of one per probe;
    when the API is back the labels land and the agent says so."""
    api = FakeAPI()
    api.fail_next = [503] * 1000
    try:
        fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
        fakehost.nvidia(fh, gpus=1, libs=False)
        a = make_agent(tmp_path, fh.root, kube=api.client(), opts={"interval": 0.05})
        run = Running(a)
        try:
            wait_for(lambda: a.syncs >= 40, 20)
            gets = sum(1 for m, p, *_ in list(api.requests) if m == "GET" and p == "/api/v1/nodes/node-1")
            assert 1 <= gets <= 5, (gets, a.syncs)
            assert (tmp_path / "ready").exists()  # the node's files never waited
            api.fail_next = []
            wait_for(lambda: api.labels.get("gpuhook.dev/gpu.count") == "1", 20)
        finally:
            run.stop()
        errors = [r for r in logs() if r["event"] == "kube.error"]
        assert len(errors) == 1 and "HTTP 503" in errors[0]["error"] and errors[0]["kind"] == "http-503"
        assert [r["event"] for r in logs()].count("kube.ok") == 1
    finally:
        api.close()


# -- the process ----------------------------------------------------------------------------------

def agent_cmd(tmp_path, root, *extra):
    return [sys.executable, "-m", "gpuhook", "agent", "--root", root, "--spec-root", root,
            "--cdi-dir", str(tmp_path / "cdi"), "--nfd-dir", str(tmp_path / "nfd"),
            "--ready-file", str(tmp_path / "ready"), "--log-format", "json", *extra]


def test_sigterm_stops_it_cleanly_and_leaves_the_node_working(tmp_path, make_host):
    root = make_host("nvidia", mknod=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    p = subprocess.Popen(agent_cmd(tmp_path, root, "--no-install", "--interval", "60"), cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "ready").exists() or p.poll() is not None, 30, 0.05)
        assert p.poll() is None, p.communicate()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert took < 2.0, took
    records = [json.loads(line) for line in err.splitlines()]
    assert [r["event"] for r in records][0] == "agent.start"
    stop = records[-1]
    assert stop["event"] == "agent.stop" and stop["reason"] == "SIGTERM"
    assert not (tmp_path / "ready").exists()
    # what it wrote stays: the node keeps working without the agent
    specs, found = read_state(tmp_path)
    assert set(specs) == {"gpuhook.dev/nvidia", "gpuhook.dev/gpu"} and found["gpuhook.dev/gpu.count"] == "8"
    udev = [r for r in records if r["event"].startswith("udev.")]
    assert len(udev) == 1


def test_once_with_a_failing_install_is_not_ready(tmp_path, make_host):
    """The real gpuhook install on a host with no container runtime: files, but exit 1."""
    root = make_host("nvidia", mknod=False)
    r = subprocess.run(agent_cmd(tmp_path, root, "--once"), cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")})
    assert r.returncode == 1, r.stderr
    (install,) = [json.loads(line) for line in r.stderr.splitlines() if '"event":"install"' in line]
    assert install["decision"] == "error" and "containerd" in install["error"]
    assert not install["error"].startswith("InstallError")
    specs, found = read_state(tmp_path)
    assert "gpuhook.dev/nvidia" in specs and "gpuhook.dev/runtime-ready" not in found
    assert not (tmp_path / "ready").exists()
    r = subprocess.run(agent_cmd(tmp_path, root, "--once", "--no-install"), cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and (tmp_path / "ready").exists()
    r = subprocess.run(agent_cmd(tmp_path, str(tmp_path / "nope"), "--once"), cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = subprocess.run(agent_cmd(tmp_path, root, "--once", "--max-cdi-version", "9"), cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--max-cdi-version 9: one of 0.3.0" in r.stderr


def test_capped_specs_are_logged(tmp_path, logs):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.intel(fh)
    a = make_agent(tmp_path, fh.root, opts={"once": True, "cdi_max_version": "0.4.0"})
    assert a.run() == 0
    specs, _ = read_state(tmp_path)
    assert {s["cdiVersion"] for s in specs.values()} <= {"0.3.0", "0.4.0"}  # no hostPath under the fake root
    (capped,) = [r for r in logs() if r["event"] == "cdi.capped"]
    assert capped["left_out"]["gpuhook.dev/intel"] == ["device names starting with a digit", "hostPath"]
    assert capped["level"] == "warning"


def test_agent_from_a_workstation_with_a_kubeconfig(tmp_path, make_host):
    """`gpuhook agent --kubeconfig FILE --node NAME`: the API over TLS with the kubeconfig's
    CA and token (no service account, no KUBERNETES_ env); bad kubeconfigs: one line, exit 2."""
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a certificate")
    from fakes.kubeapi import write_kubeconfig

    (tmp_path / "tls").mkdir()
    api = FakeAPI(tls_dir=str(tmp_path / "tls"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    try:
        root = make_host("nvidia", mknod=False)
        cfg = write_kubeconfig(tmp_path / "kubeconfig", api)
        r = subprocess.run(agent_cmd(tmp_path, root, "--once", "--no-install", "--kubeconfig", cfg, "--node", "node-1"),
                           cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        start = next(json.loads(line) for line in r.stderr.splitlines() if '"event":"agent.start"' in line)
        assert start["api"] == api.url and start["node"] == "node-1"
        assert api.labels["gpuhook.dev/accelerator"] == "nvidia" and api.labels["gpuhook.dev/nvidia.count"] == "8"
        assert [e["reason"] for e in api.events] == ["GPUInventory"]
        assert set(api.auth) == {f"Bearer {api.token}"}
        (tmp_path / "bad").write_text("clusters: 3\n")
        for extra, want in ((["--kubeconfig", str(tmp_path / "bad")], f"--kubeconfig {tmp_path / 'bad'}: "),
                            (["--kubeconfig", str(tmp_path / "none")], "not found"),
                            (["--kubeconfig", cfg, "--context", "nope"], "Context 'nope' not found"),
                            (["--context", "other"], "--context needs --kubeconfig")):
            r = subprocess.run(agent_cmd(tmp_path, root, "--once", "--no-install", *extra), cwd=REPO,
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 2 and want in r.stderr, (extra, r.stderr)
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        api.close()


def test_the_runtime_never_imports_the_kubernetes_client():
    """gpuhook.runtime (every container create) and gpuhook.agent.labels stay off lightkube, httpx
    and gpuhook.agent.kube(client); gpuhook.agent.kube itself imports lightkube only when a client is
    made."""
    code = ("import sys\n"
            "import gpuhook.runtime, gpuhook.agent.labels\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2', 'httpcore2', 'msgspec',"
            " 'anyio', 'yaml') or m in ('gpuhook.agent.kube', 'gpuhook.agent.kubeclient'))\n"
            "import gpuhook.agent.kube\n"
            "bad += sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2'))\n"
            "print(' '.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""
    # and the client works when made (the import above was not a stub)
    out = subprocess.run([sys.executable, "-c", "import sys, gpuhook.agent.kube as k; "
                          "k.KubeAPI('http://127.0.0.1:9', 't', 'n'); print('lightkube' in sys.modules)"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "True"
