"""The probe cache of the per-container path: reused only while nothing it read changed."""

from __future__ import annotations

import json
import os
import time

from fakes import fakehost
from gpuhook.probe import cache


def build(tmp_path, **kw):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, libs=False, **kw)
    return fh


def cached(fh, tmp_path, ttl=10.0):
    return cache.probe_cached(fh.root, str(tmp_path / "cache"), ttl)


def test_hit_returns_the_same_inventory_without_probing(tmp_path, monkeypatch):
    fh = build(tmp_path, gpus=2)
    first = cached(fh, tmp_path)
    import gpuhook.probe as probe_pkg

    monkeypatch.setattr(probe_pkg, "probe", lambda root, **kw: (_ for _ in ()).throw(AssertionError("probed")))
    assert cached(fh, tmp_path) == first


def test_a_resident_process_builds_the_inventory_once_and_still_checks_the_host(tmp_path):
    """The runtime server and the NRI plugin read the same cache file for create after create:
    while it is the same file, its Inventory is not made again; the checks against the host run
    every time (a node created lazily is seen); a file written again is read again."""
    fh = build(tmp_path, gpus=1, uvm_node=False)
    cached(fh, tmp_path)  # probed and stored
    second = cached(fh, tmp_path)  # read from the file
    assert cached(fh, tmp_path) is second  # the same file: the same Inventory, not rebuilt
    time.sleep(0.01)
    fh.chardev("/dev/nvidia-uvm", 510, 0)
    third = cached(fh, tmp_path)
    assert {n.path: n for n in third.vendor("nvidia").control_nodes}["/dev/nvidia-uvm"].present
    (path,) = (tmp_path / "cache").iterdir()
    record = json.loads(path.read_text())
    record["inventory"]["warnings"] = ["written again"]
    path.write_text(json.dumps(record))  # gpuhook's own file, new content: read again
    assert cached(fh, tmp_path).warnings == ("written again",)


def test_a_node_created_lazily_invalidates(tmp_path):
    fh = build(tmp_path, gpus=1, uvm_node=False)
    first = cached(fh, tmp_path)
    assert not {n.path: n for n in first.vendor("nvidia").control_nodes}["/dev/nvidia-uvm"].present
    time.sleep(0.01)
    fh.chardev("/dev/nvidia-uvm", 510, 0)
    again = cached(fh, tmp_path)
    assert {n.path: n for n in again.vendor("nvidia").control_nodes}["/dev/nvidia-uvm"].present


def test_driver_upgrade_invalidates(tmp_path):
    fh = build(tmp_path, gpus=1, driver="550.54.14")
    assert cached(fh, tmp_path).vendor("nvidia").driver_version == "550.54.14"
    fakehost.nvidia(fh, gpus=1, driver="560.35.03", libs=False)
    assert cached(fh, tmp_path).vendor("nvidia").driver_version == "560.35.03"


def test_expired_or_disabled_or_corrupt_means_a_fresh_probe(tmp_path, monkeypatch):
    fh = build(tmp_path, gpus=1)
    cached(fh, tmp_path)
    calls = []
    import gpuhook.probe as probe_pkg

    real = probe_pkg.probe
    monkeypatch.setattr(probe_pkg, "probe", lambda root, **kw: calls.append(root) or real(root, **kw))
    (path,) = [p for p in (tmp_path / "cache").iterdir()]
    record = json.loads(path.read_text())
    record["time"] -= 11
    path.write_text(json.dumps(record))
    cached(fh, tmp_path)                     # expired
    cached(fh, tmp_path, ttl=0)              # disabled
    path.write_text("{garbage")
    cached(fh, tmp_path)                     # unreadable
    assert len(calls) == 3


def test_unwritable_cache_dir_still_probes(tmp_path):
    fh = build(tmp_path, gpus=1)
    (tmp_path / "cache").write_text("a file, not a directory")
    assert len(cached(fh, tmp_path).devices) == 1


def test_the_agent_keeps_the_cache_current_past_the_ttl(tmp_path, monkeypatch):
    """On a node where the agent runs, a lone create after a quiet spell longer than the TTL
    still finds the agent's last probe: no cold probe on the create path. Once the host
    changes, the fingerprint sends the create to a probe at once."""
    from conftest import make_agent

    from gpuhook import probe as probe_pkg
    from gpuhook.config import cache_dir
    from gpuhook.probe import cache

    root = str(tmp_path / "host")
    fakehost.build(root, "nvidia", mknod=False)
    agent = make_agent(tmp_path, root, opts={"interval": 30.0})
    assert agent.sync("start")
    real_probe = probe_pkg.probe
    calls = []

    def counting(*a, **kw):
        calls.append(a)
        return real_probe(*a, **kw)

    monkeypatch.setattr(probe_pkg, "probe", counting)
    later = time.time() + 45  # past the 10 s TTL, within two agent intervals
    monkeypatch.setattr(cache.time, "time", lambda: later)
    inv = cache.probe_cached(root, cache_dir(), 10.0)
    assert calls == [] and [v.vendor for v in inv.vendors] == ["nvidia"]
    # without the agent's mark the TTL holds: a probe, then a plain record of it
    os.unlink(cache._file(cache_dir(), root))
    cache.probe_cached(root, cache_dir(), 10.0)
    assert len(calls) == 1
    later += 11
    cache.probe_cached(root, cache_dir(), 10.0)
    assert len(calls) == 2
    # the agent's record, and then a GPU appears: the fingerprint differs, a probe at once
    assert agent.sync("periodic")
    fakehost.FakeHost(root).chardev("/dev/nvidia8", 195, 8)
    cache.probe_cached(root, cache_dir(), 10.0)
    assert len(calls) == 3


import pytest  # noqa: E402


def _poison(kind: str, path: str, fh_root: str, good: dict) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o600)
        return
    record = dict(good)
    if kind == "list":
        record = []
    elif kind == "deep":
        record["inventory"] = {"root": fh_root, "vendors": [json.loads("[" * 400 + "]" * 400)]}
    elif kind == "wrong-type":
        record["inventory"] = json.loads(json.dumps(good["inventory"]))
        record["inventory"]["vendors"][0]["devices"][0]["nodes"][0]["path"] = 5
    elif kind == "null":
        record["inventory"] = json.loads(json.dumps(good["inventory"]))
        record["inventory"]["vendors"][0]["devices"] = None
    elif kind == "forever":
        record["valid_for"] = 1e18
        record["inventory"] = json.loads(json.dumps(good["inventory"]))
        record["inventory"]["vendors"] = []
        record["time"] = time.time() - 7200
    with open(path, "w") as f:
        json.dump(record, f)
    os.chmod(path, 0o600)


@pytest.mark.parametrize("kind", ["fifo", "list", "deep", "wrong-type", "null", "forever"])
def test_a_bad_cache_file_costs_a_probe_and_is_replaced(tmp_path, kind):
    """Whatever is in the cache file (a FIFO, not an object, too deep, wrong types, a null, a
    validity of ever): the create neither hangs nor fails: it probes, gets the GPUs, and the
    next create reads a good entry again."""
    fh = build(tmp_path)
    inv = cached(fh, tmp_path)
    path = cache._file(str(tmp_path / "cache"), fh.root)
    with open(path) as f:
        good = json.load(f)
    os.unlink(path)
    _poison(kind, path, fh.root, good)
    again = cached(fh, tmp_path)
    assert again == inv and again.vendors
    assert os.path.isfile(path) and not os.path.islink(path)
    with open(path) as f:
        assert json.load(f)["inventory"] == good["inventory"]


# -- a mounted file that is gone (issue 24 item 5) ------------------------------------------

VDPAU = fakehost.HOST_LIBDIR + "/vdpau/libvdpau_nvidia.so.1"


def _names(inv) -> set:
    v = inv.vendor("nvidia")
    return {p.rpartition("/")[2] for p in [lib.path for lib in v.libraries] + list(v.binaries)}


def _vdpau_file(fh) -> str:
    return os.path.realpath(fh.p(VDPAU))


@pytest.mark.parametrize("how", ["removed", "removed-mtime-restored"])
def test_a_file_gone_from_a_directory_the_fingerprint_does_not_watch(tmp_path, how):
    """The video library lives in <libdir>/vdpau, a directory cache.WATCHED does not name: a
    cached result that still names it would send the create to a bind mount of a missing file
    (runc fails the create). Gone, whether its directory's mtime is set back or not: the next
    create probes, and the result no longer names it."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, video=True)
    real = _vdpau_file(fh)
    name = os.path.basename(real)
    assert name in _names(cached(fh, tmp_path))
    assert os.path.dirname(real) not in {fh.p(p) for p in cache.WATCHED}
    d = os.path.dirname(real)
    st = os.stat(d)
    os.unlink(real)
    if how == "removed-mtime-restored":
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(d).st_mtime_ns == st.st_mtime_ns
    assert name not in _names(cached(fh, tmp_path))


def test_a_result_naming_a_file_already_gone_is_not_stored(tmp_path, monkeypatch):
    """A file removed between the probe's read and the store (its directory's stats taken
    after it went): the result is used for this create, never kept for the next."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, video=True)
    import gpuhook.probe as probe_pkg

    real_probe = probe_pkg.probe
    calls = []

    def probe_then_remove(root, **kw):
        calls.append(root)
        inv = real_probe(root, **kw)
        if os.path.exists(_vdpau_file(fh)):
            os.unlink(_vdpau_file(fh))
        return inv

    monkeypatch.setattr(probe_pkg, "probe", probe_then_remove)
    assert "libvdpau_nvidia.so.1" in {lib.soname for lib in cached(fh, tmp_path).vendor("nvidia").libraries}
    assert not list((tmp_path / "cache").glob("inventory-*"))
    monkeypatch.setattr(probe_pkg, "probe", real_probe)
    assert "libvdpau_nvidia.so.1" not in {lib.soname for lib in cached(fh, tmp_path).vendor("nvidia").libraries}


def test_a_record_without_the_directories_of_its_files_is_not_used(tmp_path, monkeypatch):
    """A record of an older gpuhook (no "dirs"): a probe, never a guess."""
    fh = build(tmp_path, gpus=1)
    cached(fh, tmp_path)
    (path,) = (tmp_path / "cache").iterdir()
    record = json.loads(path.read_text())
    del record["dirs"], record["dir_stats"]
    path.write_text(json.dumps(record))
    import gpuhook.probe as probe_pkg

    calls = []
    real = probe_pkg.probe
    monkeypatch.setattr(probe_pkg, "probe", lambda root, **kw: calls.append(root) or real(root, **kw))
    cached(fh, tmp_path)
    assert calls == [fh.root]
