"""When the per-container path may reuse a stored probe (gpuhook/probe/cache.py), and what in
/run/gpuhook or on the host makes it probe again: the entry's age, who wrote it, a link or a
FIFO in its place, the driver-root setting, the host's files. Counted by the probes made."""

from __future__ import annotations

import json
import os
import stat

import pytest

import gpuhook.probe as probe_pkg
from gpuhook.probe import cache
from fakes import fakehost


@pytest.fixture
def probes(monkeypatch):
    """The roots probed, in order (the real probe still runs)."""
    calls: list = []
    real = probe_pkg.probe

    def counting(root, **kw):
        calls.append((root, kw.get("nvidia_driver_root")))
        return real(root, **kw)

    monkeypatch.setattr(probe_pkg, "probe", counting)
    return calls


@pytest.fixture
def clock(monkeypatch):
    """The cache's clock, set by the test."""
    now = [1_000_000.0]
    monkeypatch.setattr(cache.time, "time", lambda: now[0])
    return now


def host(tmp_path, name="host", gpus=1) -> fakehost.FakeHost:
    fh = fakehost.FakeHost(str(tmp_path / name), mknod=False)
    fakehost.nvidia(fh, gpus=gpus, libs=False)
    return fh


def entry_path(tmp_path, fh) -> str:
    return cache._file(str(tmp_path / "cache"), fh.root)


def use(fh, tmp_path, ttl=10.0, **kw):
    return cache.probe_cached(fh.root, str(tmp_path / "cache"), ttl, **kw)


def test_an_entry_is_private_and_used_until_its_ttl_is_over(tmp_path, probes, clock):
    fh = host(tmp_path)
    first = use(fh, tmp_path)
    st = os.lstat(entry_path(tmp_path, fh))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    clock[0] += 9.999
    assert use(fh, tmp_path) == first and len(probes) == 1
    clock[0] += 0.001  # exactly the TTL old: probed again
    assert use(fh, tmp_path) == first and len(probes) == 2
    clock[0] += 2.5
    use(fh, tmp_path, ttl=2.5)  # the TTL of this create, not of the one that stored it
    assert len(probes) == 3
    use(fh, tmp_path, ttl=2.5)
    assert len(probes) == 3


def test_an_entry_from_the_future_is_not_used(tmp_path, probes, clock):
    fh = host(tmp_path)
    use(fh, tmp_path)
    clock[0] -= 1  # the clock stepped back (or a record planted with a later time)
    use(fh, tmp_path)
    assert len(probes) == 2
    use(fh, tmp_path)  # the new entry, at the new time: used
    assert len(probes) == 2


def test_a_ttl_of_zero_probes_every_time_and_stores_nothing(tmp_path, probes):
    fh = host(tmp_path)
    use(fh, tmp_path, ttl=0)
    use(fh, tmp_path, ttl=0)
    assert len(probes) == 2 and not os.path.exists(tmp_path / "cache")
    use(fh, tmp_path, ttl=-1)
    assert len(probes) == 3 and not os.path.exists(tmp_path / "cache")
    use(fh, tmp_path, ttl=0, nvidia_driver_root="/run/nvidia/driver")  # the setting still holds
    assert probes[-1] == (fh.root, "/run/nvidia/driver")


def test_a_ttl_under_a_second_is_a_ttl(tmp_path, probes, clock):
    fh = host(tmp_path)
    use(fh, tmp_path, ttl=0.5)
    clock[0] += 0.4
    use(fh, tmp_path, ttl=0.5)
    assert len(probes) == 1
    clock[0] += 0.1
    use(fh, tmp_path, ttl=0.5)
    assert len(probes) == 2


def test_the_agents_validity_outlasts_the_ttl_up_to_an_hour(tmp_path, probes, clock):
    fh = host(tmp_path)
    inv = probe_pkg.probe(fh.root)
    cache.store(fh.root, str(tmp_path / "cache"), inv, cache.fingerprint(fh.root), valid_for=120)
    clock[0] += 119
    assert use(fh, tmp_path) == inv and len(probes) == 1  # the probe above; none for the create
    clock[0] += 1
    use(fh, tmp_path)
    assert len(probes) == 2
    # a record that claims more than an hour is held to an hour
    record = json.load(open(entry_path(tmp_path, fh)))
    record["valid_for"] = 7200.0
    with open(entry_path(tmp_path, fh), "w") as f:
        json.dump(record, f)
    clock[0] += 3599
    use(fh, tmp_path)
    assert len(probes) == 2
    clock[0] += 1
    use(fh, tmp_path)
    assert len(probes) == 3


def test_a_stored_probe_without_a_validity_of_its_own_has_the_ttl(tmp_path, probes, clock):
    fh = host(tmp_path)
    inv = probe_pkg.probe(fh.root)
    cache.store(fh.root, str(tmp_path / "cache"), inv, cache.fingerprint(fh.root), valid_for=0)
    assert "valid_for" not in json.load(open(entry_path(tmp_path, fh)))
    cache.store(fh.root, str(tmp_path / "cache"), inv, cache.fingerprint(fh.root), valid_for=30)
    assert json.load(open(entry_path(tmp_path, fh)))["valid_for"] == 30.0
    cache.store(fh.root, str(tmp_path / "cache"), inv, cache.fingerprint(fh.root))
    clock[0] += 10
    use(fh, tmp_path)
    assert len(probes) == 2


@pytest.mark.parametrize("how", ["other owner", "group-writable", "world-writable", "link", "directory"])
def test_an_entry_gpuhook_did_not_write_is_never_used(tmp_path, probes, how):
    """Planted in /run/gpuhook by someone else, or steered by a link there: a probe."""
    fh = host(tmp_path)
    use(fh, tmp_path)
    path = entry_path(tmp_path, fh)
    if how == "link":
        os.rename(path, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", path)
    elif how == "directory":
        os.unlink(path)
        os.mkdir(path)
    elif how == "other owner":
        os.chown(path, 1000, 1000)
    else:
        os.chmod(path, 0o620 if how == "group-writable" else 0o602)
    assert use(fh, tmp_path).vendors and len(probes) == 2


@pytest.mark.parametrize("mode", [0o644, 0o755, 0o711])
def test_an_entry_others_may_read_is_still_gpuhooks(tmp_path, probes, mode):
    fh = host(tmp_path)
    use(fh, tmp_path)
    os.chmod(entry_path(tmp_path, fh), mode)
    use(fh, tmp_path)
    assert len(probes) == 1


def test_another_driver_root_setting_is_another_probe(tmp_path, probes):
    fh = host(tmp_path)
    use(fh, tmp_path)
    use(fh, tmp_path, nvidia_driver_root="auto")  # the default, said
    assert len(probes) == 1
    use(fh, tmp_path, nvidia_driver_root="/run/nvidia/driver")
    assert probes[-1] == (fh.root, "/run/nvidia/driver") and len(probes) == 2
    use(fh, tmp_path, nvidia_driver_root="/run/nvidia/driver")
    assert len(probes) == 2
    use(fh, tmp_path)
    assert len(probes) == 3


def test_two_hosts_keep_their_own_entries(tmp_path, probes):
    """Roots whose names differ only where the file name escapes them: no entry evicts the other."""
    a = host(tmp_path, "a%2Fb")
    (tmp_path / "a").mkdir()
    b = host(tmp_path, "a/b", gpus=2)
    for _ in range(2):
        assert len(use(a, tmp_path).devices) == 1 and len(use(b, tmp_path).devices) == 2
    assert len(probes) == 2
    assert entry_path(tmp_path, a) != entry_path(tmp_path, b)


def test_a_root_with_a_trailing_slash_is_the_same_host(tmp_path, probes):
    fh = host(tmp_path)
    root = fh.root + "/"
    inv = cache.probe_cached(root, str(tmp_path / "cache"), 10.0)
    assert cache.probe_cached(root, str(tmp_path / "cache"), 10.0) == inv and len(probes) == 1
    fh.chardev("/dev/nvidia1", 195, 1)  # a node appears in /dev: seen through the same root
    cache.probe_cached(root, str(tmp_path / "cache"), 10.0)
    assert len(probes) == 2


def test_the_fingerprint_sees_each_watched_directory_and_the_driver_version(tmp_path):
    fh = host(tmp_path)
    before = cache.fingerprint(fh.root)
    assert before[:2] == [fh.root, "auto"] and before[1:] == cache.fingerprint(fh.root + "/")[1:]
    version = open(fh.p(cache.VERSION_FILE)).read()
    assert before[-1] == version
    fh.file(cache.VERSION_FILE, version.replace("550", "555"))
    assert cache.fingerprint(fh.root)[-1] == version.replace("550", "555")
    for d in ("/dev", "/etc/ld.so.cache", "/usr/lib/x86_64-linux-gnu"):
        i = 2 + cache.WATCHED.index(d)
        old = cache.fingerprint(fh.root)[i]
        if old is not None:
            os.utime(fh.p(d), ns=(1, 1))
        else:
            fh.file(d + ("/x" if d.startswith("/usr") else ""), "")
        assert cache.fingerprint(fh.root)[i] != old, d
    os.unlink(fh.p(cache.VERSION_FILE))
    assert cache.fingerprint(fh.root)[-1] is None


def test_a_version_file_that_is_not_text_is_still_a_fingerprint(tmp_path):
    fh = host(tmp_path)
    fh.file(cache.VERSION_FILE, b"NVRM version: \xff\xfe 550\n" + b"x" * 5000)
    fp = cache.fingerprint(fh.root)[-1]
    assert fp.startswith("NVRM version: \ufffd\ufffd 550") and len(fp) == 4096 - 2 + 2


def test_the_host_root_itself(tmp_path):
    """/ as the root: the node's own paths, no prefix."""
    fp = cache.fingerprint("/")
    assert fp[:2] == ["/", "auto"]
    st = os.stat("/dev")
    assert fp[2 + cache.WATCHED.index("/dev")] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    assert cache._dir_stats("", ["/dev", "/nonexistent"]) == [fp[2 + cache.WATCHED.index("/dev")], None]


def test_a_root_whose_name_ends_in_x_keeps_its_files(tmp_path, probes):
    """The files a result names are checked under the root as it is named (only a trailing /
    taken off): a result naming libraries is reused."""
    fh = fakehost.FakeHost(str(tmp_path / "hostX"), mknod=False)
    fakehost.nvidia(fh, gpus=1)
    inv = use(fh, tmp_path)
    assert cache.mounted_files(inv)
    assert use(fh, tmp_path) == inv and len(probes) == 1


def test_the_nodes_own_root_reuses_a_result_naming_its_files(tmp_path, monkeypatch):
    """root "/": the node's own paths, unprefixed, for the fingerprint and for the files a
    result names (here one that names /etc/hostname as a library)."""
    from gpuhook.inventory import Inventory, Library, VendorInventory

    inv = Inventory("/", (VendorInventory("nvidia", (), (), (Library("/etc/hostname", "libx.so.1", "compute"),)),))
    monkeypatch.setattr(probe_pkg, "probe", lambda root, **kw: Inventory(root, ()))
    for _ in range(3):  # the node may change meanwhile (a device node made): then once more
        cache.store("/", str(tmp_path / "cache"), inv, cache.fingerprint("/"))
        if cache.probe_cached("/", str(tmp_path / "cache"), 60.0) == inv:
            break
    else:
        raise AssertionError("a result for / naming node files was never reused")


def test_a_root_whose_name_ends_in_x_still_sees_a_change(tmp_path, probes):
    fh = fakehost.FakeHost(str(tmp_path / "hostX"), mknod=False)
    fakehost.nvidia(fh, gpus=1, libs=False)
    use(fh, tmp_path)
    use(fh, tmp_path)
    assert len(probes) == 1
    fh.chardev("/dev/nvidia1", 195, 1)
    use(fh, tmp_path)
    assert len(probes) == 2


def test_a_driver_root_the_node_names_is_watched(tmp_path, probes):
    """nvidia_driver_root = "/opt/nvidia-driver" (not one of auto's): a driver installed there
    later is seen at the next create."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=1, userspace=False)
    os.makedirs(fh.p("/opt/nvidia-driver"))
    use(fh, tmp_path, nvidia_driver_root="/opt/nvidia-driver")
    use(fh, tmp_path, nvidia_driver_root="/opt/nvidia-driver")
    assert len(probes) == 1
    fakehost.operator_driver_root(fh, "550.54.14", root="/opt/nvidia-driver")
    inv = use(fh, tmp_path, nvidia_driver_root="/opt/nvidia-driver")
    assert len(probes) == 2 and inv.vendor("nvidia").driver_root == "/opt/nvidia-driver"
