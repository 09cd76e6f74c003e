"""fsutil: the file primitives every module writes with.

write_atomic where the unnamed temp file cannot be used: a filesystem without O_TMPFILE
(EOPNOTSUPP, EISDIR or EINVAL from the kernel) or a bare chroot without /proc to link it from.
Then a named temp file beside the target: still the whole file or nothing, with its mode,
nothing left behind, a name left by a killed writer never in the way."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpuhook import fsutil
from gpuhook.fsutil import write_atomic


@pytest.fixture(params=[errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, "no /proc"])
def no_tmpfile(request, monkeypatch):
    """The kernel's answer of a filesystem without O_TMPFILE, or no /proc/self/fd."""
    real_open, real_link = os.open, os.link

    def open_(path, flags, *a, **kw):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(request.param, os.strerror(request.param))
        return real_open(path, flags, *a, **kw)

    def link(src, *a, **kw):
        if str(src).startswith("/proc/self/fd/"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
        return real_link(src, *a, **kw)

    if request.param == "no /proc":
        monkeypatch.setattr(os, "link", link)
    else:
        monkeypatch.setattr(os, "open", open_)
    return request.param


def test_the_named_way_writes_the_whole_file_with_its_mode(tmp_path, no_tmpfile):
    target = tmp_path / "config.json"
    data = os.urandom(3 << 16)  # more than one write may take
    fsutil.write_atomic(str(target), data, 0o640)
    assert target.read_bytes() == data and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["config.json"]  # no temp file left
    fsutil.write_atomic(str(target), b"new", sync=False, sync_dir=False)  # the mode it has is kept
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["config.json"]


def test_the_named_way_replaces_a_link_never_writes_through_it(tmp_path, no_tmpfile):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "state.json"
    os.symlink(victim, target)
    fsutil.write_atomic(str(target), b"{}", 0o600)
    assert victim.read_text() == "keep" and not target.is_symlink() and target.read_bytes() == b"{}"


def test_the_named_way_gets_past_names_left_by_killed_writers(tmp_path, no_tmpfile, monkeypatch):
    """A temp name is taken (a killed writer's, the same pid in another pid namespace): the next
    random name is tried, up to eight in all; the names in the way are left as they are."""
    parts = iter([b"\x01" * 6] * 7 + [b"\x02" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(parts))
    taken = tmp_path / f".f.gpuhook-{os.getpid()}-{'01' * 6}.tmp"
    taken.write_text("a killed writer's")
    fsutil.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert (tmp_path / "f").read_bytes() == b"data" and taken.read_text() == "a killed writer's"
    assert sorted(os.listdir(tmp_path)) == sorted(["f", taken.name])


def test_the_named_way_gives_up_after_eight_names_in_the_way(tmp_path, no_tmpfile, monkeypatch):
    monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
    taken = tmp_path / f".f.gpuhook-{os.getpid()}-{'01' * 6}.tmp"
    taken.write_text("x")
    with pytest.raises(FileExistsError):
        fsutil.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert not (tmp_path / "f").exists() and os.listdir(tmp_path) == [taken.name]


def test_the_named_way_leaves_nothing_when_the_rename_fails(tmp_path, no_tmpfile):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")  # a non-empty directory in the target's place
    with pytest.raises(OSError):
        fsutil.write_atomic(str(tmp_path / "d"), b"data", 0o600)
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == ["x"]


def test_a_filesystem_error_other_than_no_tmpfile_is_raised(tmp_path, monkeypatch):
    real_open = os.open

    def open_(path, flags, *a, **kw):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(OSError) as e:
        fsutil.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert e.value.errno == errno.ENOSPC and os.listdir(tmp_path) == []


def test_the_named_temp_file_is_never_more_open_than_its_mode(tmp_path, no_tmpfile, monkeypatch):
    """Written before its mode is set: it is created with that mode already (a reader of the
    directory cannot open it meanwhile)."""
    modes = []
    real_write = os.write

    def write(fd, data):
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    old = os.umask(0)
    try:
        fsutil.write_atomic(str(tmp_path / "secret"), b"data", 0o600)
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o600}


def test_a_temp_name_left_by_a_writer_killed_before_its_rename_is_taken_over(tmp_path):
    """The unnamed temp file's way (O_TMPFILE): a writer killed between the link and the rename
    left .<name>.gpuhook.tmp, a whole file; the next write removes it and puts its own in place."""
    (tmp_path / ".f.gpuhook.tmp").write_bytes(b"a killed writer's whole file")
    fsutil.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert (tmp_path / "f").read_bytes() == b"data" and os.listdir(tmp_path) == ["f"]


def test_a_temp_name_taken_over_between_link_and_rename_is_linked_again(tmp_path, monkeypatch):
    """Another writer of the same file took .<name>.gpuhook.tmp over (removed this writer's
    link, put its own file there and renamed it into place) between this writer's link and
    rename: this one links its own file again and wins."""
    real_rename = os.rename
    raced = []

    def rename(src, dst, **kw):
        if not raced:
            raced.append(src)
            os.unlink(src, dir_fd=kw["src_dir_fd"])  # the other writer, in between
            (tmp_path / src).write_bytes(b"theirs")
            real_rename(src, dst, **kw)
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
        return real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", rename)
    fsutil.write_atomic(str(tmp_path / "f"), b"mine", 0o600)
    assert raced and (tmp_path / "f").read_bytes() == b"mine" and os.listdir(tmp_path) == ["f"]


# -- write_atomic (moved from the spec editor's tests) ------------------------------------


def test_write_atomic_keeps_mode_and_leaves_no_temp(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{}")
    p.chmod(0o600)
    write_atomic(str(p), b'{"a":1}')
    assert p.read_text() == '{"a":1}' and (p.stat().st_mode & 0o777) == 0o600
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.json"]

def test_write_atomic_new_file_mode_and_failure_leave_nothing_half_written(tmp_path):
    p = tmp_path / "new.json"
    write_atomic(str(p), b"x" * 100_000, sync_dir=False)
    assert p.read_bytes() == b"x" * 100_000 and (p.stat().st_mode & 0o7777) == 0o644
    write_atomic(str(p), b"y", 0o600, sync=False)
    assert p.read_bytes() == b"y" and (p.stat().st_mode & 0o7777) == 0o600
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "keep").write_text("k")
    with pytest.raises(OSError):
        write_atomic(str(tmp_path / "dir"), b"z")  # rename over a non-empty directory fails
    assert sorted(x.name for x in tmp_path.iterdir()) == ["dir", "new.json"]

def _predictable_temp_names(monkeypatch, first: bytes):
    """os.urandom as write_atomic's temp names see it: `first`, then fresh bytes."""
    import os as _os

    real = _os.urandom
    calls = []

    def urandom(n):
        calls.append(n)
        return first[:n] if len(calls) == 1 else real(n)

    monkeypatch.setattr("gpuhook.fsutil.os.urandom", urandom)
    return calls


def test_write_atomic_never_writes_through_a_link_planted_at_its_temp_name(tmp_path, monkeypatch):
    """Someone who can write the directory plants a symlink where the temp file will be: the
    link's target is untouched, and the file is written anyway (under another temp name)."""
    import os as _os

    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "config.json"
    _predictable_temp_names(monkeypatch, b"\0" * 6)
    (tmp_path / f".config.json.gpuhook-{_os.getpid()}-{'00' * 6}.tmp").symlink_to(victim)
    write_atomic(str(target), b'{"a":1}')
    assert victim.read_text() == "precious"
    assert target.read_bytes() == b'{"a":1}' and not target.is_symlink()


def test_write_atomic_gets_past_a_temp_file_left_by_a_killed_writer(tmp_path, monkeypatch):
    """A writer killed mid-write left its temp file, and its pid is ours now: the write goes on."""
    import os as _os

    left = tmp_path / f".state.json.gpuhook-{_os.getpid()}-{'11' * 6}.tmp"
    left.write_text("half")
    _predictable_temp_names(monkeypatch, b"\x11" * 6)
    write_atomic(str(tmp_path / "state.json"), b"whole", 0o600)
    assert (tmp_path / "state.json").read_bytes() == b"whole"


def test_write_atomic_file_is_never_more_open_than_its_mode_while_written(tmp_path, monkeypatch):
    """A 0600 file (the round robin's state, the config cache) is not readable by others at
    any moment, not even while its temp file is being written."""
    import os as _os

    seen = []
    real_write = _os.write

    def write(fd, data):
        seen.append(_os.fstat(fd).st_mode & 0o777)
        return real_write(fd, data)

    monkeypatch.setattr("gpuhook.fsutil.os.write", write)
    write_atomic(str(tmp_path / "private"), b"secret", 0o600)
    assert seen and all(m & 0o077 == 0 for m in seen)


def test_write_atomic_puts_its_temp_file_beside_the_target(tmp_path, monkeypatch):
    """The rename is atomic only within one filesystem: the temp file is in the target's
    directory, wherever the process's working directory is (here: another filesystem)."""
    if os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the test's directory")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as elsewhere:
        monkeypatch.chdir(elsewhere)
        write_atomic(str(tmp_path / "config.json"), b"{}")
        assert os.listdir(elsewhere) == []
    assert (tmp_path / "config.json").read_bytes() == b"{}"


def test_write_atomic_writes_the_file_its_path_names_through_a_link_and_dotdot(tmp_path):
    """A path through a link then ".." (a bundle given as `link/..`) names, as runc and the
    read before the write see it, the link target's parent, not the directory of the link:
    the new file goes there, and the other directory's file of that name is left alone."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "link").symlink_to(tmp_path / "real" / "sub")
    (tmp_path / "real" / "config.json").write_text("old")
    (tmp_path / "other" / "config.json").write_text("someone else's")
    path = str(tmp_path / "other" / "link" / ".." / "config.json")
    with open(path) as f:
        assert f.read() == "old"  # the file the kernel names by that path
    write_atomic(path, b"new", sync_dir=False)
    assert (tmp_path / "real" / "config.json").read_text() == "new"
    assert (tmp_path / "other" / "config.json").read_text() == "someone else's"


# -- flock_within ------------------------------------------------------------------------


def test_flock_within_waits_for_a_lock_let_go_and_gives_up_on_one_held(tmp_path):
    """The lock another open file holds: had once it is let go within the time, not had when
    it is held past it."""
    import fcntl
    import threading

    from gpuhook.fsutil import flock_within

    path = tmp_path / "lock"
    path.touch()
    holder, waiter = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        assert not flock_within(waiter, 0.1, 0.01)
        threading.Timer(0.1, fcntl.flock, (holder, fcntl.LOCK_UN)).start()
        assert flock_within(waiter, 5, 0.01)
        assert not flock_within(holder, 0, 0)  # now the waiter's
    finally:
        os.close(holder)
        os.close(waiter)


# -- durability: what is fsynced, and when (a stubbed fsync sees it; only a crash would otherwise) --


def fsyncs(monkeypatch, path) -> list:
    """os.fsync recorded: ("file", its size, what `path` held then) or ("dir", its inode)."""
    seen, real = [], os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            seen.append(("dir", st.st_ino))
        else:
            with open(path, "rb") as f:
                seen.append(("file", st.st_size, f.read()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_the_data_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    """By default the new file's data reaches the disk while the old file is still in place,
    then the directory holding the rename: a crash leaves the old file or the whole new one."""
    path = tmp_path / "config.json"
    path.write_bytes(b"old")
    seen = fsyncs(monkeypatch, path)
    write_atomic(str(path), b"new data")
    assert seen == [("file", 8, b"old"), ("dir", tmp_path.stat().st_ino)]
    assert path.read_bytes() == b"new data"


def test_the_named_way_fsyncs_the_same(tmp_path, monkeypatch, no_tmpfile):
    """Without /proc the unnamed file was written (and fsynced) before the link failed: the
    named one is fsynced all the same."""
    path = tmp_path / "config.json"
    path.write_bytes(b"old")
    seen = fsyncs(monkeypatch, path)
    write_atomic(str(path), b"new data")
    files = 2 if no_tmpfile == "no /proc" else 1
    assert seen == [("file", 8, b"old")] * files + [("dir", tmp_path.stat().st_ino)]
    assert path.read_bytes() == b"new data"


def test_sync_dir_false_leaves_the_directory_and_sync_false_leaves_everything(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    seen = fsyncs(monkeypatch, path)
    write_atomic(str(path), b"new", sync_dir=False)
    assert seen == [("file", 3, b"old")]
    seen.clear()
    write_atomic(str(path), b"newer", sync_dir=False, sync=False)
    assert seen == [] and path.read_bytes() == b"newer"
