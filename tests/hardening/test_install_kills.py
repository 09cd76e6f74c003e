"""`gpuhook install` and `gpuhook uninstall` SIGKILLed at every step, then run again.

Each run is forked and SIGKILLs itself at its 1st, 2nd, ... os call that touches the node
(open, write, fsync, rename, unlink, rmdir, link, symlink...), until one runs through. After
each kill the same command runs again, whole, and the node must be exactly what one clean
run leaves: every file, link and directory under the host root the same (bytes, mode, link
target), the install state included. A killed install followed by an uninstall must give the
node back exactly as it was before install: no partial bundle, no backup, no temp file, each
runtime's config byte for byte. Also from a bundle copied file by file (gpuhook before
versions), and for one runtime's uninstall beside another's.

Then the real thing: `python -m gpuhook install` and `uninstall` of the real host bundle
(thousands of files), SIGKILLed at random moments, then run again.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO
from gpuhook.install import core

# every os call the installer makes that touches a file (a few only read: more kill points)
CALLS = ("open", "write", "fchmod", "chmod", "fsync", "close", "rename", "replace", "unlink", "rmdir", "mkdir",
         "link", "symlink", "utime", "ftruncate")

CONTAINERD_CONFIG = """\
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
# --front nri on containerd: 1.7's own `containerd config default` (NRI off: install turns it on)
NRI_CONTAINERD_CONFIG = open(os.path.join(REPO, "tests", "fixtures", "containerd-config-default", "1.7.24.toml")).read()
DAEMON_JSON = '{\n\t"log-driver": "json-file",\n\t"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}\n}\n'


def tree(root: str) -> dict:
    """Everything under `root`: path -> (kind, mode, bytes or link target)."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = re.sub(r"legacy-[0-9]+", "legacy-N", os.path.relpath(p, root))  # (a time in its name)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return out


def differences(got: dict, want: dict) -> str:
    lines = [f"extra:   {k}" for k in sorted(set(got) - set(want))]
    lines += [f"missing: {k}" for k in sorted(set(want) - set(got))]
    lines += [f"differs: {k}: {str(got[k])[:160]} != {str(want[k])[:160]}"
              for k in sorted(set(got) & set(want)) if got[k] != want[k]]
    return "\n".join(lines)


def killed_at(n: int, action, opts: core.Options) -> int:
    """Fork; the child runs action(opts) and SIGKILLs itself at its n-th os call of CALLS.
    The child's wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            count = [0]
            for name in CALLS:
                real = getattr(os, name)

                def call(*a, _real=real, **k):
                    count[0] += 1
                    if count[0] == n:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return _real(*a, **k)
                setattr(os, name, call)
            action(opts, lambda line: None)
            os._exit(0)
        except BaseException:
            os._exit(3)
    return os.waitpid(pid, 0)[1]


@pytest.fixture
def base():
    """Where the nodes go: a tmpfs when there is one (a few thousand installs, each with its
    fsyncs, would take minutes on a disk shared by other jobs)."""
    d = tempfile.mkdtemp(prefix="gpuhook-kills-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def bundle_dir(base) -> str:
    """A bundle of a few files in a few directories: enough for a kill inside its copy."""
    b = base / "bundle"
    names = ["bin/gpuhook-runtime", "bin/gpuhook", "lib/python3/gpuhook/__init__.py", "lib/python3/gpuhook/a.py",
             "lib/libc.so.6", "gpuhook-bundle.json"]
    for i, rel in enumerate(names[:-1]):
        (b / rel).parent.mkdir(parents=True, exist_ok=True)
        (b / rel).write_text(f"#!/bin/sh\n# file {i}\n")
        (b / rel).chmod(0o755 if rel.startswith("bin/") else 0o644)
    (b / "gpuhook-bundle.json").write_text(json.dumps({"files": names}))
    return str(b)


def make_node(base, runtimes: tuple[str, ...], legacy: str | None = None, front: str = "wrapper") -> str:
    """A node with each runtime's config; `legacy`: a bundle copied file by file to
    /opt/gpuhook (gpuhook before versions did that), which install turns into a version;
    `front` nri: containerd 1.7's config, and a runc for CRI-O's plain handler."""
    root = base / "node"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)  # the runtime server's units too
    (root / "opt").mkdir()  # as on every node (uninstall leaves it)
    if legacy:
        shutil.copytree(legacy, root / "opt" / "gpuhook")
        for d, _, names in os.walk(root / "opt" / "gpuhook"):  # another version of it
            for n in names:
                if n.endswith(".py"):
                    with open(os.path.join(d, n), "a") as f:
                        f.write("# older\n")
    if "containerd" in runtimes:
        (root / "etc" / "containerd").mkdir()
        (root / "etc" / "containerd" / "config.toml").write_text(
            NRI_CONTAINERD_CONFIG if front == "nri" else CONTAINERD_CONFIG
        )
    if "crio" in runtimes:
        (root / "etc" / "crio" / "crio.conf.d").mkdir(parents=True)
        (root / "etc" / "crio" / "crio.conf").write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
        (root / "usr" / "sbin").mkdir(parents=True)
        (root / "usr" / "sbin" / "runc").write_text("#!/bin/sh\n")  # (install only looks for it)
    if "docker" in runtimes:
        (root / "etc" / "docker").mkdir()
        (root / "etc" / "docker" / "daemon.json").write_text(DAEMON_JSON)
    return str(root)


def reset(root: str, to: str) -> None:
    shutil.rmtree(root)
    shutil.copytree(to, root, symlinks=True)


def kill_points(action, opts, before, check):
    """Kill `action` at its 1st, 2nd... call (the node reset to `before` first), then
    check(n); until one run goes through. The number of kills."""
    for n in range(1, 2000):
        reset(opts.host_root, before)
        status = killed_at(n, action, opts)
        check(n)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0, f"run {n} failed without a kill"
            return n - 1
        assert os.WTERMSIG(status) == signal.SIGKILL
    pytest.fail("never ran through")


RUNTIMES = [("containerd",), ("docker",), ("crio",), ("containerd", "docker"), ("containerd", "legacy"),
            ("containerd", "nri"), ("crio", "nri")]


@pytest.mark.parametrize("runtimes", RUNTIMES, ids="+".join)
def test_install_and_uninstall_killed_at_every_step_can_be_finished(base, bundle_dir, runtimes):
    legacy = "legacy" in runtimes
    front = "nri" if "nri" in runtimes else "wrapper"
    runtimes = tuple(r for r in runtimes if r not in ("legacy", "nri"))
    root = make_node(base, runtimes, bundle_dir if legacy else None, front)
    say = lambda line: None  # noqa: E731
    opts = {rt: core.Options(host_root=root, runtime=rt, bundle_dir=bundle_dir, front=front) for rt in runtimes}
    plain = core.Options(host_root=root, runtime="auto", bundle_dir=bundle_dir)

    def install_all(_opts=None, _say=say):
        for rt in runtimes:
            core.install(opts[rt], _say)

    original = tree(root)
    pristine = str(base / "pristine")
    shutil.copytree(root, pristine, symlinks=True)
    install_all()
    installed = tree(root)
    assert installed != original
    installed_copy = str(base / "installed")
    shutil.copytree(root, installed_copy, symlinks=True)
    if legacy:
        assert any(k.startswith("opt/gpuhook/.versions/legacy-N/") for k in installed), sorted(installed)
    core.uninstall(plain, say)
    if legacy:  # what install did not copy (no state said so) but made into a version: gone with it
        del original["opt/gpuhook"]
        original = {k: v for k, v in original.items() if not k.startswith("opt/gpuhook/")}
    assert tree(root) == original, differences(tree(root), original)

    def install_finished(n):
        install_all()  # run again, whole
        assert tree(root) == installed, f"install killed at call {n}, run again:\n" + differences(tree(root),
                                                                                                   installed)
        reset(root, installed_copy)  # (the next check starts from a killed one again)

    def install_undone(n):
        core.uninstall(plain, say)
        assert tree(root) == original, f"install killed at call {n}, then uninstall:\n" + differences(tree(root),
                                                                                                     original)

    def uninstall_finished(n):
        core.uninstall(plain, say)
        assert tree(root) == original, f"uninstall killed at call {n}, run again:\n" + differences(tree(root),
                                                                                                   original)

    kills = kill_points(install_all, plain, pristine, install_finished)
    assert kills > 20, kills
    if not legacy:
        kill_points(install_all, plain, pristine, install_undone)
    assert kill_points(core.uninstall, plain, installed_copy, uninstall_finished) > 10
    if len(runtimes) < 2:
        return
    # one runtime's uninstall (--runtime docker), killed: run again, it leaves the node as one
    # clean run of it does (containerd's handler, the bundle and the node config kept)
    reset(root, installed_copy)
    core.uninstall(opts["docker"], say)
    one_left = tree(root)
    assert "opt/gpuhook/.current" in one_left and one_left["etc/docker/daemon.json"][2] == DAEMON_JSON.encode()

    def docker_uninstall_finished(n):
        core.uninstall(opts["docker"], say)
        assert tree(root) == one_left, f"uninstall --runtime docker killed at call {n}, run again:\n" + differences(
            tree(root), one_left)

    assert kill_points(core.uninstall, opts["docker"], installed_copy, docker_uninstall_finished) > 5


@pytest.mark.parametrize("runtime", ["containerd", "crio"])
def test_a_switch_of_front_killed_at_every_step_can_be_finished(base, bundle_dir, runtime):
    """wrapper -> nri, killed at every step: run again, the node is what one clean switch
    leaves (gpuhook-nri.service in, the runtime server's units out); or uninstalled after
    the kill, the node as it was before the first install."""
    root = make_node(base, (runtime,), front="nri")
    say = lambda line: None  # noqa: E731
    original = tree(root)
    wrapper = core.Options(host_root=root, runtime=runtime, bundle_dir=bundle_dir)
    nri = core.Options(host_root=root, runtime=runtime, bundle_dir=bundle_dir, front="nri")
    core.install(wrapper, say)
    as_wrapper = str(base / "as-wrapper")
    shutil.copytree(root, as_wrapper, symlinks=True)
    core.install(nri, say)
    switched = tree(root)
    assert "etc/systemd/system/gpuhook-nri.service" in switched and "etc/systemd/system/gpuhook-runtime.socket" not in switched

    def switch_finished(n):
        core.install(nri, say)
        assert tree(root) == switched, f"switch killed at call {n}, run again:\n" + differences(tree(root), switched)
        core.uninstall(core.Options(host_root=root), say)
        assert tree(root) == original, f"switch killed at call {n}, run again, uninstalled:\n" + differences(
            tree(root), original)

    def switch_undone(n):
        core.uninstall(core.Options(host_root=root), say)
        assert tree(root) == original, f"switch killed at call {n}, then uninstall:\n" + differences(tree(root),
                                                                                                    original)

    assert kill_points(core.install, nri, as_wrapper, switch_finished) > 5
    kill_points(core.install, nri, as_wrapper, switch_undone)


def _cli(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuhook", *map(str, args)], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(*args) -> float:
    """Run the command through; the seconds it took."""
    started = time.monotonic()
    p = _cli(*args)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return time.monotonic() - started


def test_the_real_gpuhook_killed_at_random_moments(base, real_bundle):
    """The CLI with the real bundle, SIGKILLed at a random moment of its run (as issue 24 found
    it: an uninstall killed at 0.2 s left 30 MB of bundle that no later uninstall removed),
    then run again: the node exactly installed, or exactly as before."""
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    root = make_node(base, ("containerd",))
    original = tree(root)
    install = ("install", "--host-root", root, "--runtime", "containerd", "--bundle-dir", real_bundle)
    uninstall = ("uninstall", "--host-root", root)
    took = _finish(*install)
    installed = tree(root)
    took_un = _finish(*uninstall)
    assert tree(root) == original
    for i in range(6):
        for args, span, want in ((install, took, installed), (uninstall, took_un, original)):
            p = _cli(*args)
            time.sleep(rnd.uniform(0.05, span))
            p.kill()
            p.communicate()
            _finish(*args)
            assert tree(root) == want, f"seed {seed}, try {i}: {args[0]} killed, run again:\n" + differences(
                tree(root), want)
