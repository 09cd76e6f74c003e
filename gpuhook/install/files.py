"""Files on the host: atomic writes, the state file, and the bundle copy.

The bundle (see build.py) carries `gpuhook-bundle.json` listing its files. Installing it
copies each file whose bytes or mode differ, each atomically (temp file + rename), so a
container create that runs during an upgrade sees every file whole, old or new; files of the
previous bundle that the new one lacks are removed afterwards. A second install with the same
bundle writes nothing. Every other file (configs, backup, state) goes through
gpuhook.spec.write_atomic.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys

from .. import defaults
from ..spec import write_atomic
from . import InstallError

MANIFEST = "gpuhook-bundle.json"
STATE_DIR = defaults.BACKUP_DIR
STATE = STATE_DIR + "/install-state.json"


def host(root: str, path: str) -> str:
    """The host's `path` as seen from here."""
    return os.path.join(root, path.lstrip("/"))


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def read(path: str, what: str | None = None) -> bytes | None:
    """A file's bytes, None when it does not exist; InstallError when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InstallError(f"{what or path}: cannot read it ({e.strerror or e})") from None


def write(path: str, data: bytes, mode: int | None = None, what: str | None = None) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_atomic(path, data, mode)
    except OSError as e:
        raise InstallError(f"{what or path}: cannot write it ({e.strerror or e})") from None


def remove(path: str, what: str | None = None) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise InstallError(f"{what or path}: cannot remove it ({e.strerror or e})") from None


# -- state ---------------------------------------------------------------------------

def load_state(root: str) -> dict:
    data = read(host(root, STATE), STATE)
    if data is None:
        return {}
    try:
        state = json.loads(data)
    except ValueError:
        raise InstallError(f"{STATE}: not valid JSON; move it away to start over") from None
    return state if isinstance(state, dict) else {}


def save_state(root: str, state: dict) -> None:
    write(host(root, STATE), (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(), 0o600, STATE)


def drop_state(root: str) -> None:
    remove(host(root, STATE), STATE)


# -- bundle --------------------------------------------------------------------------

def running_bundle() -> str | None:
    """The bundle this gpuhook runs from (the bundled interpreter's prefix), if any."""
    return sys.prefix if os.path.isfile(os.path.join(sys.prefix, MANIFEST)) else None


def manifest(bundle: str) -> dict:
    data = read(os.path.join(bundle, MANIFEST))
    if data is None:
        raise InstallError(f"{bundle}: not a gpuhook host bundle (no {MANIFEST}; build one with "
                           "packaging/build-bundle.sh)")
    try:
        m = json.loads(data)
        files = m["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise InstallError(f"{bundle}/{MANIFEST}: not a valid bundle manifest") from None
    for f in files:
        if f.startswith("/") or ".." in f.split("/"):
            raise InstallError(f"{bundle}/{MANIFEST}: bad path {f!r}")
    return m


def same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def sync_bundle(src: str, dst: str, dry_run: bool) -> tuple[int, int, int]:
    """Make `dst` hold exactly the bundle `src`: (files, written, removed).

    Each changed file is first written beside its target under a temporary name; one
    syncfs then makes them all durable (instead of ~1500 fsyncs: seconds on a real disk)
    before each is renamed over its target. The manifest goes last, with write_atomic."""
    new = manifest(src)
    old_files = []
    if os.path.exists(os.path.join(dst, MANIFEST)):
        try:
            old_files = manifest(dst)["files"]
        except InstallError:
            old_files = []
    staged: list[tuple[str, str]] = []
    written = 0
    try:
        for rel in new["files"]:
            if rel != MANIFEST and _differs(os.path.join(src, rel), os.path.join(dst, rel)):
                written += 1
                if not dry_run:
                    staged.append((_stage(os.path.join(src, rel), os.path.join(dst, rel)), os.path.join(dst, rel)))
        if staged:
            _flush(dst)
        for tmp, final in staged:
            os.replace(tmp, final)
    except OSError as e:
        raise InstallError(f"{e.filename or dst}: cannot write it ({e.strerror or e})") from None
    finally:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    gone = sorted(set(old_files) - set(new["files"]))
    if not dry_run:
        for rel in gone:
            remove(os.path.join(dst, rel))
        _prune_dirs(dst, gone)
    if _differs(os.path.join(src, MANIFEST), os.path.join(dst, MANIFEST)):  # last: the install is whole
        written += 1
        if not dry_run:
            write(os.path.join(dst, MANIFEST), read(os.path.join(src, MANIFEST)) or b"", 0o644)
    return len(new["files"]), written, len(gone)


def _flush(path: str) -> None:
    """Make what was written under `path` durable: syncfs(2) on that one filesystem,
    os.sync() where syncfs cannot be called."""
    try:
        import ctypes

        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError, ImportError):
        pass
    os.sync()


def _differs(src: str, dst: str) -> bool:
    """True when `dst` is not already `src`: same kind, bytes (or link target) and mode."""
    try:
        st = os.lstat(src)
    except OSError as e:
        raise InstallError(f"bundle file {src}: {e.strerror or e}") from None
    try:
        dst_st = os.lstat(dst)
    except FileNotFoundError:
        return True
    except OSError as e:
        raise InstallError(f"{dst}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        return not stat.S_ISLNK(dst_st.st_mode) or os.readlink(dst) != os.readlink(src)
    return not (stat.S_ISREG(dst_st.st_mode) and stat.S_IMODE(dst_st.st_mode) == stat.S_IMODE(st.st_mode)
                and dst_st.st_size == st.st_size and read(dst) == read(src))


def _stage(src: str, dst: str) -> str:
    """Write `src`'s content (or link) beside `dst` under a temporary name; that name."""
    os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
    tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.gpuhook-{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), tmp)
        return tmp
    mode = stat.S_IMODE(st.st_mode)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(read(src) or b"")
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return tmp


def _prune_dirs(dst: str, removed: list[str]) -> None:
    """Remove the directories that `removed` files left empty (never `dst` itself)."""
    dirs = {os.path.dirname(rel) for rel in removed}
    for d in sorted({p for rel in dirs for p in _parents(rel)}, key=len, reverse=True):
        try:
            os.rmdir(os.path.join(dst, d))
        except OSError:
            pass


def _parents(rel: str):
    while rel:
        yield rel
        rel = os.path.dirname(rel)


def remove_bundle(dst: str) -> int:
    """Remove an installed bundle's files (those its manifest lists) and then `dst` if empty."""
    files = manifest(dst)["files"]
    for rel in files:
        if rel != MANIFEST:
            remove(os.path.join(dst, rel))
    remove(os.path.join(dst, MANIFEST))
    _prune_dirs(dst, files)
    try:
        os.rmdir(dst)
    except OSError:
        pass
    return len(files)
