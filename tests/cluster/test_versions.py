"""The real cluster's versions and their build (versions.py, gobuild.py) and what a killed
control plane leaves (controlplane.cleanup): each pin says the version versions.py names, the
docs say it too, the built binaries say it, a build that cannot reach the module proxy fails
with one line and leaves nothing half-written, and the next run removes what a killed one left."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from cluster.conftest import REPO

import controlplane
import gobuild
import versions

HERE = os.path.dirname(os.path.abspath(__file__))


def go_mod(c: versions.Component) -> str:
    with open(os.path.join(gobuild.MODULES, c.module_dir, "go.mod")) as f:
        return f.read()


@pytest.mark.parametrize("name", sorted(versions.COMPONENTS))
def test_each_pin_is_the_version_versions_names(name):
    c = versions.COMPONENTS[name]
    mod = go_mod(c)
    assert re.search(rf"^\s*(require\s+)?{re.escape(c.module)} {re.escape(c.version)}( // indirect)?$", mod, re.M), mod
    with open(os.path.join(gobuild.MODULES, c.module_dir, "tools.go")) as f:
        imported = set(re.findall(r'_ "([^"]+)"', f.read()))
    assert imported == set(c.packages)  # what is built is what the module pins (go mod tidy keeps go.sum so)


def test_every_kubernetes_staging_module_is_the_same_release():
    """k8s.io/kubernetes asks for its staging modules at v0.0.0: each replaced by v0.MINOR.PATCH."""
    mod = go_mod(versions.KUBERNETES)
    staging = dict(re.findall(r"^\s*(k8s\.io/[\w.-]+) => k8s\.io/[\w.-]+ (v\S+)$", mod, re.M))
    assert len(staging) >= 30, staging
    assert set(staging.values()) == {"v0." + versions.KUBERNETES_VERSION.split(".", 1)[1]}, staging


def test_the_docs_name_the_versions_proven():
    with open(os.path.join(REPO, "docs", "testing.md")) as f:
        text = f.read()
    assert f"Kubernetes {versions.KUBERNETES_VERSION}" in text and f"etcd {versions.ETCD_VERSION}" in text


def test_the_cache_key_follows_the_pin(tmp_path, monkeypatch):
    """Another go.sum (a changed pin) is another cache entry: never the old binaries."""
    c = versions.ETCD
    before = gobuild.key(c)
    shutil.copytree(os.path.join(gobuild.MODULES, c.module_dir), tmp_path / c.module_dir)
    monkeypatch.setattr(gobuild, "MODULES", str(tmp_path))
    assert gobuild.key(c) == before
    with open(tmp_path / c.module_dir / "go.sum", "a") as f:
        f.write("example.com/x v1.0.0 h1:AAAA=\n")
    assert gobuild.key(c) != before and gobuild.key(c).startswith(f"etcd-{versions.ETCD_VERSION}-")


# what a machine without the proxy is told (a root without Go, make test-other-release's, is
# told that first)
WHY_NOT = ("the Go module proxy cannot be reached (http://127.0.0.1:9/" if os.access(gobuild.GO, os.X_OK)
           else f"no Go toolchain at {gobuild.GO}")


def test_no_proxy_fails_with_one_line_and_leaves_nothing(tmp_path):
    """A machine with an empty cache and no module proxy: `gobuild.py` exits 1 with one line
    that says so (the cluster fixture fails with the same line), and no cache entry."""
    env = dict(os.environ, GPUHOOK_TEST_ROOTS=str(tmp_path), GOPROXY="http://127.0.0.1:9")
    r = subprocess.run([sys.executable, os.path.join(HERE, "gobuild.py"), "etcd"], env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"gobuild: cannot build etcd {versions.ETCD_VERSION}: "
                                                               + WHY_NOT), r.stderr
    assert "Traceback" not in r.stderr
    assert [n for n in os.listdir(tmp_path / "bin") if not n.endswith(".lock")] == []


@pytest.fixture(scope="module")
def built():
    """The binaries, built when the cache has none (as root a build that cannot be had fails
    the test, never skips it)."""
    if os.geteuid() != 0 and not gobuild.cached(versions.KUBERNETES):
        pytest.skip("builds as root only (make test)")
    try:
        return {name: gobuild.build(name) for name in ("kubernetes", "etcd")}
    except gobuild.Unavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.parametrize("name,argv,says", [
    ("kube-apiserver", ["--version"], f"Kubernetes {versions.KUBERNETES_VERSION}"),
    ("kubelet", ["--version"], f"Kubernetes {versions.KUBERNETES_VERSION}"),
    ("kube-proxy", ["--version"], f"Kubernetes {versions.KUBERNETES_VERSION}"),
    ("kube-controller-manager", ["--version"], f"Kubernetes {versions.KUBERNETES_VERSION}"),
    ("kube-scheduler", ["--version"], f"Kubernetes {versions.KUBERNETES_VERSION}"),
    ("kubectl", ["version", "--client"], f"Client Version: {versions.KUBERNETES_VERSION}"),
    ("etcd", ["--version"], f"etcd Version: {versions.ETCD_VERSION.lstrip('v')}")])
def test_the_built_binaries_say_their_version(built, name, argv, says):
    path = os.path.join(built["etcd" if name == "etcd" else "kubernetes"], name)
    r = subprocess.run([path, *argv], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and says in r.stdout, (r.stdout, r.stderr)


# -- what a killed run leaves, and the next run's cleanup --------------------------------------

def _record(state, name: str, pid: int, start: str | None) -> None:
    os.makedirs(os.path.join(state, "pids"), exist_ok=True)
    with open(os.path.join(state, "pids", name), "w") as f:
        f.write(f"{pid} {start}\n")


def test_cleanup_kills_the_recorded_daemons_and_removes_the_state(tmp_path):
    state = str(tmp_path / "state")
    daemon = subprocess.Popen(["sleep", "600"], start_new_session=True)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _record(state, "etcd", daemon.pid, controlplane._start_time(daemon.pid))
        # a pid file whose process is gone and whose pid now names another (other start time)
        _record(state, "kube-apiserver", bystander.pid, "1")
        assert controlplane.leftovers(state) == [f"etcd (pid {daemon.pid})", state]
        controlplane.cleanup(state)
        assert daemon.wait(10) == -signal.SIGKILL
        assert bystander.poll() is None  # not the recorded process: left alone
        assert not os.path.exists(state) and controlplane.leftovers(state) == []
    finally:
        for p in (daemon, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_daemon_dies_with_the_test_process(tmp_path):
    """The daemons are started with PR_SET_PDEATHSIG: a SIGKILLed pytest takes them along."""
    script = ("import subprocess, sys, time; sys.path.insert(0, sys.argv[1]); import controlplane; "
              "p = subprocess.Popen(['sleep', '600'], preexec_fn=controlplane._pdeathsig, start_new_session=True); "
              "print(p.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script, HERE], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert controlplane._start_time(child) is not None
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while controlplane._start_time(child) is not None and open(f"/proc/{child}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the daemon outlived the test process"
        time.sleep(0.05)


def dynamic_parts(path: str) -> list[int]:
    """The program header types of an ELF64 file that make it dynamic (PT_INTERP 3, PT_DYNAMIC 2)."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:4] == b"\x7fELF" and head[4] == 2, path
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)]
    return [t for t in types if t in (2, 3)]


@pytest.mark.parametrize("component", ["kubernetes", "etcd"])
def test_the_control_planes_binaries_are_static(built, component):
    """No C library of the building machine's in them (versions.Component.cgo false): what
    Debian 12 built runs in Debian 13's root and the other way round (make
    test-other-release binds the cache into its root)."""
    assert not versions.COMPONENTS[component].cgo
    d = built[component]
    names = sorted(n for n in os.listdir(d) if not n.startswith("."))
    assert names and {n: dynamic_parts(os.path.join(d, n)) for n in names} == {n: [] for n in names}


def test_the_cluster_tests_fail_with_one_line_without_the_proxy(tmp_path):
    """make test as root on a machine with nothing built and no module proxy: a cluster test
    errors with the one line that says so (never a skip, never a traceback)."""
    env = dict(os.environ, GPUHOOK_TEST_ROOTS=str(tmp_path), GOPROXY="http://127.0.0.1:9", GPUHOOK_REQUIRE_E2E="1",
               GPUHOOK_CLUSTER_STATE=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(HERE, "test_rbac_real.py") + "::test_the_daemonset_runs_as_the_granted_serviceaccount"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "1 error" in out and "skipped" not in out, out
    why = (f"no control plane: cannot build etcd {versions.ETCD_VERSION}: {WHY_NOT}" if os.geteuid() == 0
           else "the cluster tests need root")
    assert why in out and "Traceback" not in out and "another exception" not in out, out
