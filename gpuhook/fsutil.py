"""File primitives, the base layer every other module may import (it imports only the stdlib):
write a whole file or nothing (write_atomic, write_named) and take a lock with a deadline
(flock_within). On the per-container path: stdlib only, nothing imported that is not used.
"""

import errno
import os


def _write_all(fd: int, data: bytes, mode: int, sync: bool) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fchmod(fd, mode)
    if sync:
        os.fsync(fd)


def _unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def write_named(dfd: int, name: str, data: bytes, mode: int, sync: bool = True) -> None:
    """<dfd>/name, the whole file or nothing, through a temp file with a name from the start
    (write_atomic's way where O_TMPFILE is not to be had, and the exec records'). A random
    part besides the pid: a temp file left by a killed writer whose pid is now another's (or
    the same pid in another pid namespace) must not make every write fail."""
    for attempt in range(8):
        tmp = f".{name}.gpuhook-{os.getpid()}-{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            break
        except FileExistsError:
            if attempt == 7:
                raise
    try:
        try:
            _write_all(fd, data, mode, sync)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise


def write_atomic(path: str, data: bytes, mode: int | None = None, sync_dir: bool = True, sync: bool = True) -> None:
    """Write a whole file or nothing: temp file beside it, fsync, rename, and fsync the
    directory too when the rename itself must survive a crash (node config, not a bundle:
    a bundle does not outlive a node crash). sync=False: no fsync at all, for a file that
    never outlives the process reading it (an exec's process file); readers still see the
    old file or the new one.

    The temp file has no name while it is written (O_TMPFILE): a writer killed then (the
    fresh interpreter or the runtime server, SIGKILL, OOM) leaves nothing behind. It gets
    one, .<name>.gpuhook.tmp, only for the rename, and the next write of the same file
    takes that name over: a writer killed between the two calls leaves a whole new file
    there, which the next writer (the front's fallback to Python after a server died)
    removes. Where the filesystem has no O_TMPFILE, or there is no /proc to link it from (a
    bare chroot), a named temp file as before."""
    d = os.path.dirname(path) or "."  # as the kernel reads it: never normalised ("link/.." is not ".")
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            write_named(dfd, os.path.basename(path), data, mode, sync)
        else:
            try:
                _write_all(fd, data, mode, sync)
                linked = _link_into_place(fd, dfd, os.path.basename(path))
            finally:
                os.close(fd)
            if not linked:  # no /proc (a bare chroot): the named way
                write_named(dfd, os.path.basename(path), data, mode, sync)
        if sync_dir:
            os.fsync(dfd)
    finally:
        os.close(dfd)


def _link_into_place(fd: int, dfd: int, name: str) -> bool:
    """The unnamed file fd as <dfd>/name: linked as .<name>.gpuhook.tmp, renamed over name.
    False when there is no /proc/self/fd to link it from (nothing written then)."""
    tmp = f".{name}.gpuhook.tmp"
    for _attempt in range(8):
        try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: O_TMPFILE's way to a name
            os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=dfd, follow_symlinks=True)
        except FileExistsError:  # a killed writer's (a whole file), or a writer's now: ours wins
            _unlink(tmp, dfd)
            continue
        except FileNotFoundError:
            return False
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return True
        except FileNotFoundError:  # another writer took the name over between the two calls
            continue
        except BaseException:
            _unlink(tmp, dfd)
            raise
    raise FileExistsError(f"{tmp}: taken over again and again")


def flock_within(fd: int, seconds: float, interval: float) -> bool:
    """An exclusive flock on fd, tried every `interval` s for up to `seconds`; False if not had."""
    import fcntl
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(interval)
