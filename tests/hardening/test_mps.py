"""The MPS pipe directory: mounted read-write into every container that gets compute, so only
one the node config names, that no non-root user owns, can write or can swap (SECURITY.md).

A user who made /tmp/nvidia-mps (NVIDIA's default, under a world-writable /tmp) had it mounted
into every GPU container (a channel across tenants, a fake MPS `control`); swapping it for a
link to a root-only host directory after a create put that directory into the next
container. Here: MPS is opt-in (mps_pipe_dir, unset by default), and the directory is checked
on every create (probe/trusted.py), by its resolved path, which is the path mounted.
"""

from __future__ import annotations

import os

import pytest

from conftest import needs_runc
from conftest import plan_on
from gpuhook.config import Config
from gpuhook.plan import Request
from gpuhook.probe import cache, probe
from fakes import fakehost

USER = 65534  # nobody: a local user of the node
MPS = "/tmp/nvidia-mps"


def node(tmp_path) -> fakehost.FakeHost:
    """An NVIDIA node whose /tmp is as a node's (root's, 1777) and whose MPS daemon made its
    pipe directory (root's, 0755, a `control` FIFO in it)."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, mps=True)
    os.chmod(fh.p("/tmp"), 0o1777)
    os.chmod(fh.p(MPS), 0o755)
    return fh


def mps_mount(fh, config: Config, warnings: "list[str] | None" = None):
    p = plan_on(probe(fh.root), Request({}, {}, "/rootfs"), config=config)
    if warnings is not None:
        warnings += p.warnings
    found = [m for m in p.edits.mounts if m.container_path == MPS]
    return found[0] if found else None


def test_mps_is_opt_in(tmp_path):
    """A node config that does not name mps_pipe_dir mounts no MPS directory, even with a
    daemon's directory at NVIDIA's default place."""
    fh = node(tmp_path)
    assert mps_mount(fh, Config()) is None
    m = mps_mount(fh, Config(mps_pipe_dir=MPS))  # control: named, it is mounted
    assert m is not None and m.host_path == fh.p(MPS) and "ro" not in m.options


def _user_dir(fh):
    os.chown(fh.p(MPS), USER, USER)


def _world_writable(fh):
    os.chmod(fh.p(MPS), 0o777)


def _group_writable(fh):
    os.chmod(fh.p(MPS), 0o775)


def _sticky_world_writable(fh):
    os.chmod(fh.p(MPS), 0o1777)


def _user_link_to_root_only_dir(fh):
    secret = fh.p("/root-only")
    os.makedirs(secret, mode=0o700)
    fh.file("/root-only/control", "")
    fh.file("/root-only/shadow", "root:secret:\n", 0o600)
    os.rename(fh.p(MPS), fh.p("/tmp/old-mps"))
    os.symlink("../root-only", fh.p(MPS))
    os.lchown(fh.p(MPS), USER, USER)


def _in_a_user_parent(fh):
    os.chown(fh.p("/tmp"), USER, USER)
    os.chmod(fh.p("/tmp"), 0o755)


def _in_a_world_writable_parent(fh):
    os.chmod(fh.p("/tmp"), 0o777)  # not sticky: anyone may rename the directory away


def _a_file(fh):
    os.rename(fh.p(MPS), fh.p("/tmp/old-mps"))
    fh.file(MPS, "")


REFUSED = {
    "owned by a user": (_user_dir, "owned by uid 65534"),
    "world-writable": (_world_writable, "writable by group or others"),
    "group-writable": (_group_writable, "writable by group or others"),
    "sticky and world-writable": (_sticky_world_writable, "writable by group or others"),
    "a user's link to a root-only directory": (_user_link_to_root_only_dir, "the link /tmp/nvidia-mps is owned by uid"),
    "in a user's directory": (_in_a_user_parent, "/tmp is owned by uid 65534"),
    "in a world-writable directory": (_in_a_world_writable_parent, "/tmp is writable by group or others"),
    "a file": (_a_file, "is not a directory"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_directory_a_user_owns_writes_or_can_swap_is_never_mounted(tmp_path, case):
    make, says = REFUSED[case]
    fh = node(tmp_path)
    assert mps_mount(fh, Config(mps_pipe_dir=MPS)) is not None  # control: as the daemon made it
    make(fh)
    warnings: list[str] = []
    assert mps_mount(fh, Config(mps_pipe_dir=MPS), warnings) is None
    assert any(w.startswith("mps_pipe_dir: ") and says in w and "MPS not mounted" in w for w in warnings), warnings


def test_a_root_link_is_resolved_and_the_resolved_directory_mounted(tmp_path):
    """/var/run -> /run as on any node: the mount's source is the directory itself, with no
    link in its path (runc follows nothing that was not checked)."""
    fh = node(tmp_path)
    os.makedirs(fh.p("/run/nvidia/mps"))
    fh.file("/run/nvidia/mps/control", "")
    os.makedirs(fh.p("/var"))
    os.symlink("../run", fh.p("/var/run"))
    m = mps_mount(fh, Config(mps_pipe_dir="/var/run/nvidia/mps"))
    assert m is not None and m.host_path == fh.p("/run/nvidia/mps")
    assert os.path.realpath(m.host_path) == m.host_path


def test_checked_on_every_create_not_from_the_probe_cache(tmp_path):
    """A cached probe and a directory that a user took over since: the next create's plan
    refuses it (the probe cache holds no MPS directory at all)."""
    fh = node(tmp_path)
    cache_dir = str(tmp_path / "cache")
    config = Config(mps_pipe_dir=MPS)
    inv = cache.probe_cached(fh.root, cache_dir, 3600)
    assert not any("mps" in lib.path for v in inv.vendors for lib in v.libraries)
    e = plan_on(inv, Request({}, {}, "/rootfs"), config=config).edits
    assert MPS in {m.container_path for m in e.mounts}
    _user_link_to_root_only_dir(fh)
    p = plan_on(cache.probe_cached(fh.root, cache_dir, 3600), Request({}, {}, "/rootfs"), config=config)
    assert MPS not in {m.container_path for m in p.edits.mounts} and any("mps_pipe_dir" in w for w in p.warnings)


@needs_runc
def test_a_swap_after_a_create_gets_nothing_of_the_host_into_the_next(make_host, runtime):
    """The attack as tried on a node: after a create with the daemon's directory, a user swaps
    it for a link to a root-only host directory. Through real runc, the next container sees
    nothing of that directory, and the log says why."""
    root = make_host("nvidia", mknod=True, gpus=1, mps=True)
    fh = fakehost.FakeHost(root)
    os.chmod(fh.p("/tmp"), 0o1777)
    os.chmod(fh.p(MPS), 0o755)
    rt = runtime(root, mps_pipe_dir=MPS)
    show = f"echo started; ls -a {MPS} 2>/dev/null | sed 's/^/entry /'; cat {MPS}/shadow 2>/dev/null; true"
    r = rt.run(rt.bundle("first", ["sh", "-c", show]), "mps-first")
    assert r.returncode == 0 and "entry control" in r.stdout, r.stdout + r.stderr
    _user_link_to_root_only_dir(fh)
    r = rt.run(rt.bundle("second", ["sh", "-c", show]), "mps-second")
    assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr
    assert "secret" not in r.stdout and "entry shadow" not in r.stdout, r.stdout
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected" and MPS not in rec["mounts"], rec
    assert any("mps_pipe_dir" in w and "owned by uid 65534" in w for w in rec.get("warnings", [])), rec
