"""Exec records do not outlive their containers for long (gpuhook/runtime/execenv.py: sweep).

`delete` is the runtime's alone (the front passes it through), so the record of a deleted
container is swept by a later create that writes one under the same runtime root: the
records of containers the runtime has no state for, once older than SWEEP_AFTER_S. A record
of a container the runtime knows is never swept, nor one a create has just written.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from conftest import FRONT
from gpuhook.runtime import exec as execenv
from fakes.front import prime

ENV = ["GPUHOOK_ACCELERATOR=nvidia"]
# a runtime that keeps a state directory per container, as runc and crun do: made at create,
# removed at delete
FAKE_RUNTIME = r"""#!/bin/sh
root= prev= cmd= last=
for a; do
    case $prev in --root) root=$a ;; esac
    case $a in create | run | delete) [ -z "$cmd" ] && cmd=$a ;; esac
    prev=$a last=$a
done
case $cmd in
    create | run) mkdir -p "$root/$last" ;;
    delete) rm -rf "$root/$last" ;;
esac
"""


def _age(path: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)


def _records(key_dir: str) -> list[str]:
    return sorted(os.listdir(key_dir)) if os.path.isdir(key_dir) else []


def test_create_and_delete_many_containers_keeps_the_records_bounded(tmp_path, make_host):
    """Through the front and Python, with a runtime that keeps state as runc does: 25
    containers created (each injected) and deleted, a minute apart (the records aged as if):
    each create sweeps the record of the container deleted before it, so there is never more
    than the live container's."""
    host = make_host("nvidia", mknod=False, gpus=1, libs=False)
    runtime = tmp_path / "runc"
    runtime.write_text(FAKE_RUNTIME)
    runtime.chmod(0o755)
    cfg, cache, state = tmp_path / "config.toml", str(tmp_path / "cache"), str(tmp_path / "state")
    cfg.write_text(f'runtime = "{runtime}"\nhost_root = "{host}"\nlog_file = ""\n')
    prime(str(cfg), cache)
    env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": cache,
           "GPUHOOK_PYTHON": sys.executable}
    key_dir = os.path.dirname(execenv.record_path(cache, state, "x", str(runtime)))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    most = 0
    for n in range(25):
        (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, '
                                            '"process": {"env": ["PATH=/bin"]}}')
        cid = f"c{n}"
        for step in (["create", "--bundle", str(bundle), cid], ["delete", cid]):
            r = subprocess.run([FRONT, "--root", state, *step], env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            if step[0] == "create":
                assert os.path.exists(execenv.record_path(cache, state, cid, str(runtime))), "not injected"
                most = max(most, len(_records(key_dir)))
        for name in _records(key_dir):  # a minute passes before the next container
            _age(os.path.join(key_dir, name), execenv.SWEEP_AFTER_S + 1)
    assert most == 1, f"{most} records for one live container"
    assert _records(key_dir) == ["c24"]  # deleted, and swept by the next create under this root


def test_a_record_of_a_live_container_is_never_swept(tmp_path):
    """Old records: of a container the runtime knows (kept), of one it does not (swept), a
    write's leftover temporary file (swept); young: a record whose create has not made the
    state yet (kept). Another root's records are another sweep's."""
    cache, root, other = str(tmp_path / "cache"), str(tmp_path / "root"), str(tmp_path / "other")
    os.makedirs(os.path.join(root, "live"))
    paths = {cid: execenv.record_path(cache, root, cid, "runc") for cid in ("live", "gone", "young")}
    for path in paths.values():
        execenv.write_record(path, ENV, "/b")
    elsewhere = execenv.record_path(cache, other, "gone", "runc")
    execenv.write_record(elsewhere, ENV, "/b")
    leftover = os.path.join(os.path.dirname(paths["gone"]), ".gone.gpuhook-1-abc.tmp")
    open(leftover, "w").close()
    for path in (paths["live"], paths["gone"], leftover, elsewhere):
        _age(path, 3600)
    assert execenv.sweep(paths["young"], root, "runc") == 2
    assert [os.path.exists(p) for p in (paths["live"], paths["gone"], paths["young"], leftover, elsewhere)] == [
        True, False, True, False, True]
    # a minute on, the young one's create has failed (no state): it goes too, the live one stays
    assert execenv.sweep(paths["young"], root, "runc", now=time.time() + execenv.SWEEP_AFTER_S + 1) == 1
    assert execenv.read_record(paths["live"]) == ENV and not os.path.exists(paths["young"])


def test_no_state_root_at_all_means_no_container_of_it(tmp_path):
    cache, root = str(tmp_path / "cache"), str(tmp_path / "never-made")
    path = execenv.record_path(cache, root, "c1", "runc")
    execenv.write_record(path, ENV, "/b")
    _age(path, 3600)
    assert execenv.sweep(path, root, "runc") == 1 and not os.path.exists(path)


def test_a_state_root_not_to_be_read_sweeps_nothing(tmp_path):
    cache, root = str(tmp_path / "cache"), tmp_path / "root"
    root.write_text("not a directory")
    path = execenv.record_path(cache, str(root), "c1", "runc")
    execenv.write_record(path, ENV, "/b")
    _age(path, 3600)
    assert execenv.sweep(path, str(root), "runc") == 0 and os.path.exists(path)


@pytest.mark.parametrize("held", [fcntl.LOCK_SH, fcntl.LOCK_EX], ids=["a-write", "another-sweep"])
def test_a_sweep_never_waits_for_a_write_or_another_sweep(tmp_path, held):
    """While a record is being written (its directory locked shared) or another process
    sweeps (exclusive), a sweep removes nothing and returns at once."""
    cache, root = str(tmp_path / "cache"), str(tmp_path / "root")
    path = execenv.record_path(cache, root, "c1", "runc")
    execenv.write_record(path, ENV, "/b")
    _age(path, 3600)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; "
                               "fcntl.flock(int(sys.argv[1]), int(sys.argv[2])); print(flush=True); time.sleep(30)",
                               str(fd), str(held)], pass_fds=(fd,), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"\n"
        started = time.monotonic()
        assert execenv.sweep(path, root, "runc") == 0 and os.path.exists(path)
        assert time.monotonic() - started < 1
    finally:
        holder.kill()
        holder.wait()
        os.close(fd)
    assert execenv.sweep(path, root, "runc") == 1


def test_records_are_swept_only_through_gpuhooks_own_directories(tmp_path):
    """A root's record directory that is a link (to another root's records): nothing is
    removed through it."""
    cache, root, victim_root = str(tmp_path / "cache"), str(tmp_path / "root"), str(tmp_path / "victim")
    victim = execenv.record_path(cache, victim_root, "c1", "runc")
    execenv.write_record(victim, ENV, "/b")
    _age(victim, 3600)
    path = execenv.record_path(cache, root, "c1", "runc")
    os.symlink(os.path.dirname(victim), os.path.dirname(path))
    assert execenv.sweep(path, root, "runc") == 0 and os.path.exists(victim)
