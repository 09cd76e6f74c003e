"""spec.write_atomic where the unnamed temp file cannot be used: a filesystem without O_TMPFILE
(EOPNOTSUPP, EISDIR or EINVAL from the kernel) or a bare chroot without /proc to link it from.
Then a named temp file beside the target: still the whole file or nothing, with its mode,
nothing left behind, a name left by a killed writer never in the way."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from gpuhook import spec


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
    spec.write_atomic(str(target), data, 0o640)
    assert target.read_bytes() == data and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["config.json"]  # no temp file left
    spec.write_atomic(str(target), b"new", sync=False, sync_dir=False)  # the mode it has is kept
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["config.json"]


def test_the_named_way_replaces_a_link_never_writes_through_it(tmp_path, no_tmpfile):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "state.json"
    os.symlink(victim, target)
    spec.write_atomic(str(target), b"{}", 0o600)
    assert victim.read_text() == "keep" and not target.is_symlink() and target.read_bytes() == b"{}"


def test_the_named_way_gets_past_names_left_by_killed_writers(tmp_path, no_tmpfile, monkeypatch):
    """A temp name is taken (a killed writer's, the same pid in another pid namespace): the next
    random name is tried, up to eight in all; the names in the way are left as they are."""
    parts = iter([b"\x01" * 6] * 7 + [b"\x02" * 6])
    monkeypatch.setattr(os, "urandom", lambda n: next(parts))
    taken = tmp_path / f".f.gpuhook-{os.getpid()}-{'01' * 6}.tmp"
    taken.write_text("a killed writer's")
    spec.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert (tmp_path / "f").read_bytes() == b"data" and taken.read_text() == "a killed writer's"
    assert sorted(os.listdir(tmp_path)) == sorted(["f", taken.name])


def test_the_named_way_gives_up_after_eight_names_in_the_way(tmp_path, no_tmpfile, monkeypatch):
    monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
    taken = tmp_path / f".f.gpuhook-{os.getpid()}-{'01' * 6}.tmp"
    taken.write_text("x")
    with pytest.raises(FileExistsError):
        spec.write_atomic(str(tmp_path / "f"), b"data", 0o600)
    assert not (tmp_path / "f").exists() and os.listdir(tmp_path) == [taken.name]


def test_the_named_way_leaves_nothing_when_the_rename_fails(tmp_path, no_tmpfile):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")  # a non-empty directory in the target's place
    with pytest.raises(OSError):
        spec.write_atomic(str(tmp_path / "d"), b"data", 0o600)
    assert sorted(os.listdir(tmp_path)) == ["d"] and os.listdir(tmp_path / "d") == ["x"]


def test_a_filesystem_error_other_than_no_tmpfile_is_raised(tmp_path, monkeypatch):
    real_open = os.open

    def open_(path, flags, *a, **kw):
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(OSError) as e:
        spec.write_atomic(str(tmp_path / "f"), b"data", 0o600)
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
        spec.write_atomic(str(tmp_path / "secret"), b"data", 0o600)
    finally:
        os.umask(old)
    assert modes and set(modes) == {0o600}


def test_a_temp_name_left_by_a_writer_killed_before_its_rename_is_taken_over(tmp_path):
    """The unnamed temp file's way (O_TMPFILE): a writer killed between the link and the rename
    left .<name>.gpuhook.tmp, a whole file; the next write removes it and puts its own in place."""
    (tmp_path / ".f.gpuhook.tmp").write_bytes(b"a killed writer's whole file")
    spec.write_atomic(str(tmp_path / "f"), b"data", 0o600)
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
    spec.write_atomic(str(tmp_path / "f"), b"mine", 0o600)
    assert raced and (tmp_path / "f").read_bytes() == b"mine" and os.listdir(tmp_path) == ["f"]


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
    spec.write_atomic(str(path), b"new data")
    assert seen == [("file", 8, b"old"), ("dir", tmp_path.stat().st_ino)]
    assert path.read_bytes() == b"new data"


def test_the_named_way_fsyncs_the_same(tmp_path, monkeypatch, no_tmpfile):
    """Without /proc the unnamed file was written (and fsynced) before the link failed: the
    named one is fsynced all the same."""
    path = tmp_path / "config.json"
    path.write_bytes(b"old")
    seen = fsyncs(monkeypatch, path)
    spec.write_atomic(str(path), b"new data")
    files = 2 if no_tmpfile == "no /proc" else 1
    assert seen == [("file", 8, b"old")] * files + [("dir", tmp_path.stat().st_ino)]
    assert path.read_bytes() == b"new data"


def test_sync_dir_false_leaves_the_directory_and_sync_false_leaves_everything(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    seen = fsyncs(monkeypatch, path)
    spec.write_atomic(str(path), b"new", sync_dir=False)
    assert seen == [("file", 3, b"old")]
    seen.clear()
    spec.write_atomic(str(path), b"newer", sync_dir=False, sync=False)
    assert seen == [] and path.read_bytes() == b"newer"
