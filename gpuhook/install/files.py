"""Files on the host: atomic writes, the state file, and the installed bundle.

The bundle (see build.py) carries `gpuhook-bundle.json` listing its files. Installing it
makes a new version directory beside the running one (unchanged files hard-linked, only what
changed written) and switches the node to it with one rename of a symlink: a container
create that runs during an upgrade sees the old bundle or the new one as a whole, never a mix
(the layout: VERSIONS below). A second install with the same bundle writes nothing. Every
other file (configs, backup, state) goes through gpuhook.fsutil.write_atomic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
from typing import Iterator

from .. import defaults
from ..fsutil import flock_within, write_atomic
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
    sweep(path)


def remove(path: str, what: str | None = None) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise InstallError(f"{what or path}: cannot remove it ({e.strerror or e})") from None
    sweep(path)


def _temps(d: str, base: str = "") -> list[str]:
    """The temp files write_atomic (and _replace_link) leave in `d` when killed before their
    rename: `.<base>.gpuhook.tmp` or `.<base>.gpuhook-<pid>[-<random>].tmp`, of one file
    `base` or of every file."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    head = f".{base}.gpuhook" if base else "."
    return [
        os.path.join(d, n)
        for n in names
        if n.startswith(head) and n.endswith(".tmp") and re.search(r"\.gpuhook(-[0-9a-f-]+)?\.tmp$", n)
    ]


def sweep(path: str) -> None:
    """Remove what killed writers of `path` left beside it. Only installers write the files
    install writes, one at a time (node_lock), so a temp file of one is a dead one's."""
    for tmp in _temps(os.path.dirname(path), os.path.basename(path)):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def sweep_dir(d: str) -> None:
    """Remove every writer's temp file in `d`, a directory only install writes."""
    for tmp in _temps(d):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# -- state ---------------------------------------------------------------------------


LOCK_WAIT = 120.0  # s an install waits for another one on the same node
LOCK_DIR = "/etc"


@contextlib.contextmanager
def node_lock(root: str, say) -> Iterator[None]:
    """One install or uninstall at a time on a node (the boot unit, the agent, an operator):
    an exclusive flock on the node's /etc (the node's / when it has none), a directory that
    is there before and after any install, so nothing is written for the lock, and every
    installer of the node, whatever its view of it (/ or /host), locks the same inode.
    Waited for up to LOCK_WAIT seconds."""
    d = host(root, LOCK_DIR) if os.path.isdir(host(root, LOCK_DIR)) else root
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise InstallError(f"{d}: cannot lock it ({e.strerror or e})") from None
    try:
        if not flock_within(fd, 0, 0):
            say("waiting for another gpuhook install or uninstall on this node to finish")
            if not flock_within(fd, LOCK_WAIT, 0.1):
                raise InstallError(
                    f"another gpuhook install or uninstall has held the node ({d}) for {LOCK_WAIT:.0f} s"
                )
        yield
    finally:
        os.close(fd)


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
        raise InstallError(
            f"{bundle}: not a gpuhook host bundle (no {MANIFEST}; build one with packaging/build-bundle.sh)"
        )
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


def is_installed(src: str, dst: str) -> bool:
    """True when the bundle `src` is the installed `dst` itself: `dst` (a package's plain
    directory, the .deb) or the version `dst` now runs (the bundled gpuhook runs from there)."""
    return same_dir(src, dst) or (
        os.path.islink(os.path.join(dst, CURRENT)) and same_dir(src, os.path.join(dst, CURRENT))
    )


# The installed bundle is versioned, so that an upgrade is atomic as a whole:
#
#   /opt/gpuhook/.versions/<content hash>/   one bundle, never written once in place
#   /opt/gpuhook/.current -> .versions/<h>   switched by one rename(2): the upgrade
#   /opt/gpuhook/bin -> .current/bin         one per top-level name of the bundle (bin, lib,
#   /opt/gpuhook/lib -> .current/lib         libexec, gpuhook-bundle.json); written once
#
# A new version's unchanged files are hard links to the previous version's (only what changed
# is written); every link is relative, so the tree works under a host root and bind mounts.
# The C front (/proc/self/exe) and bin/python3 (cd -P) resolve their own directory once, so one create runs
# one version's interpreter, libc and gpuhook whatever is switched meanwhile. The previous
# version stays (a create may still run from it); older ones go once retired RETIRE_GRACE s.
VERSIONS = defaults.BUNDLE_VERSIONS
CURRENT = ".current"
RETIRE_GRACE = 60.0


@dataclasses.dataclass
class Synced:
    files: int  # in the new bundle
    written: int  # copied (changed or new), links fixed included
    removed: int  # in the old bundle, not in the new one
    linked: int = 0  # unchanged: hard links to the previous version
    version: str = ""  # .versions/<this> is now current
    previous: str = ""  # the one it replaced (kept), "" when none
    pruned: tuple = ()  # older versions removed


def current_version(dst: str) -> str | None:
    """The directory of the version `dst` runs now (dst/.versions/<h>), None when `dst` is
    not a versioned install."""
    link = os.path.join(dst, CURRENT)
    try:
        target = os.readlink(link)
    except OSError:
        return None
    parts = target.split("/")
    if len(parts) != 2 or parts[0] != VERSIONS or parts[1] in ("", ".", ".."):
        return None
    path = os.path.join(dst, target)
    return path if os.path.isdir(path) and not os.path.islink(path) else None


def _legacy(dst: str) -> bool:
    """`dst` holds a bundle copied file by file (gpuhook before versions, or a package's)."""
    m = os.path.join(dst, MANIFEST)
    return os.path.isfile(m) and not os.path.islink(m)


def _tops(names) -> set[str]:
    return {rel.split("/", 1)[0] for rel in names}


def tree_hash(src: str, names: list[str]) -> str:
    """The bundle's content: every file's path, mode and bytes (or link target)."""
    h = hashlib.sha256()
    for rel in sorted(names):
        path = os.path.join(src, rel)
        st = os.lstat(path)
        h.update(rel.encode() + b"\0" + oct(st.st_mode).encode() + b"\0")
        if stat.S_ISLNK(st.st_mode):
            h.update(os.readlink(path).encode())
        else:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def sync_bundle(src: str, dst: str, dry_run: bool, grace: float | None = None) -> Synced:
    """Make `dst` run exactly the bundle `src`, switched as a whole (see VERSIONS above)."""
    try:
        return _sync(src, dst, dry_run, RETIRE_GRACE if grace is None else grace)
    except OSError as e:
        raise InstallError(f"{e.filename or dst}: cannot write it ({e.strerror or e})") from None


def _sync(src: str, dst: str, dry_run: bool, grace: float) -> Synced:
    names = manifest(src)["files"]
    if not dry_run and os.path.isdir(os.path.join(dst, VERSIONS)):
        _sweep_killed(dst)
    cur = current_version(dst)
    base = cur or (dst if _legacy(dst) else None)
    old_files: list[str] = []
    if base:
        try:
            old_files = manifest(base)["files"]
        except InstallError:
            old_files = []
    changed = {rel for rel in names if base is None or _differs(os.path.join(src, rel), os.path.join(base, rel))}
    removed = len(set(old_files) - set(names))
    tops = _tops(names)
    if cur and not changed and not removed:
        fixed = sum(1 for t in sorted(tops) if not _is_top_link(dst, t))
        if fixed and not dry_run:
            _top_links(dst, tops)
            if any(not os.path.islink(os.path.join(dst, t)) for t in tops if os.path.lexists(os.path.join(dst, t))):
                # a switch from a bundle copied file by file, stopped while its entries moved
                _retire_legacy(dst, [], tops)
        return Synced(len(names), fixed, 0, 0, os.path.basename(cur))
    if dry_run:
        return Synced(len(names), len(changed), removed, len(names) - len(changed))
    versions = os.path.join(dst, VERSIONS)
    os.makedirs(versions, mode=0o755, exist_ok=True)
    name = tree_hash(src, names)[:16]
    target = os.path.join(versions, name)
    if os.path.lexists(target) and not (
        target != cur and not any(_differs(os.path.join(src, rel), os.path.join(target, rel)) for rel in names)
    ):
        name = f"{name}-{time.time_ns()}"  # there but not this bundle (edited by hand?): a fresh one
        target = os.path.join(versions, name)
    written, linked = _copy_version(src, names, changed, base, target)
    previous = os.path.basename(cur) if cur else ""
    _top_links(dst, tops)  # new names first: they dangle until the switch
    _replace_link(f"{VERSIONS}/{name}", os.path.join(dst, CURRENT))  # the upgrade
    if cur:
        os.utime(cur)  # its retirement time, for the grace period
    if base == dst:
        previous = _retire_legacy(dst, old_files, tops)
    _drop_stale_links(dst, tops)
    pruned = _prune(versions, keep={name, previous}, grace=grace)
    return Synced(len(names), written, removed, linked, name, previous, tuple(pruned))


def _copy_version(src: str, names: list[str], changed: set[str], base: str | None, target: str) -> tuple[int, int]:
    """The bundle `src` as the version `target` (in a temporary directory renamed into place):
    a copy of each `changed` file, a hard link of the others to `base`'s; (written, linked).
    Nothing to write when `target` is already there (a version kept from before: a roll back)."""
    if os.path.lexists(target):
        return 0, len(names)
    written = linked = 0
    versions, name = os.path.split(target)
    tmp = os.path.join(versions, f".tmp-{name}-{os.getpid()}")
    if os.path.lexists(tmp):
        shutil.rmtree(tmp)
    try:
        for rel in names:
            out = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(out), mode=0o755, exist_ok=True)
            if rel in changed:
                _copy(os.path.join(src, rel), out)
                written += 1
            else:  # unchanged: there is a base it is unchanged from
                os.link(os.path.join(base or src, rel), out, follow_symlinks=False)
                linked += 1
        _flush(tmp)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written, linked


def _sweep_killed(dst: str) -> None:
    """What an install killed in here left: a version half copied (.versions/.tmp-*), the
    temp links of _replace_link, and an old bundle's entry that _retire_legacy had swapped out
    but not yet moved (back into its legacy version). Installs run one at a time
    (node_lock): these are dead ones'."""
    versions = os.path.join(dst, VERSIONS)
    for entry in os.listdir(versions):
        if entry.startswith(".tmp-"):
            _remove_any(os.path.join(versions, entry))
    legacy = _legacy_versions(versions)
    for tmp in _temps(dst):
        top = os.path.basename(tmp)[1:].rsplit(".gpuhook", 1)[0]
        if not os.path.islink(tmp) and legacy and not os.path.lexists(os.path.join(versions, legacy[-1], top)):
            os.rename(tmp, os.path.join(versions, legacy[-1], top))
        else:
            _remove_any(tmp)


def _legacy_versions(versions: str) -> list[str]:
    """The versions _retire_legacy made (legacy-<ns>), oldest first."""
    return sorted((e for e in os.listdir(versions) if e.startswith("legacy-")), key=lambda e: e.split("-")[-1])


def _remove_any(path: str) -> None:
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _is_top_link(dst: str, top: str) -> bool:
    try:
        return os.readlink(os.path.join(dst, top)) == f"{CURRENT}/{top}"
    except OSError:
        return False


def _replace_link(target: str, path: str) -> None:
    """`path` becomes a symlink to `target` in one rename (path must not be a directory)."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.gpuhook-{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _top_links(dst: str, tops: set[str]) -> None:
    """dst/<top> -> .current/<top> for each top-level name that is free (or already ours)."""
    for top in sorted(tops):
        path = os.path.join(dst, top)
        if not _is_top_link(dst, top) and (not os.path.lexists(path) or os.path.islink(path)):
            _replace_link(f"{CURRENT}/{top}", path)


def _retire_legacy(dst: str, old_files: list[str], tops: set[str]) -> str:
    """A bundle copied file by file into `dst` itself becomes an old version: each of its
    top-level entries is swapped for our link (renameat2 RENAME_EXCHANGE: one step per
    entry; this first move is atomic per top-level entry, not as a whole) and moved into
    .versions/legacy-<ns>/. That version's name."""
    versions = os.path.join(dst, VERSIONS)
    started = _legacy_versions(versions)
    # one stopped by a kill is finished in its own directory (the newest)
    name = started[-1] if started else f"legacy-{time.time_ns()}"
    keep = os.path.join(versions, name)
    os.makedirs(keep, mode=0o755, exist_ok=True)
    # the manifest first, bin/ last: an old front (bin/) then finds the new files throughout
    order = sorted((_tops(old_files) | tops) - {VERSIONS, CURRENT}, key=lambda t: (t == "bin", t != MANIFEST, t))
    for top in order:
        path = os.path.join(dst, top)
        if not os.path.lexists(path) or _is_top_link(dst, top):
            continue
        if top in tops:
            tmp = os.path.join(dst, f".{top}.gpuhook-{os.getpid()}.tmp")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(f"{CURRENT}/{top}", tmp)
            if _exchange(tmp, path):
                os.rename(tmp, os.path.join(keep, top))
                continue
            os.unlink(tmp)
            os.rename(path, os.path.join(keep, top))
            _replace_link(f"{CURRENT}/{top}", path)
        else:
            os.rename(path, os.path.join(keep, top))
    return name


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where that cannot be done."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _drop_stale_links(dst: str, tops: set[str]) -> None:
    """Our top-level links to names the new version lacks (they dangle now)."""
    for entry in os.listdir(dst):
        if entry not in tops and _is_top_link(dst, entry):
            os.unlink(os.path.join(dst, entry))


def _prune(versions: str, keep: set[str], grace: float) -> list[str]:
    """Remove the versions (and leftovers of an interrupted install) older than the previous
    one, once retired `grace` seconds; their names."""
    gone = []
    now = time.time()
    for entry in sorted(os.listdir(versions)):
        path = os.path.join(versions, entry)
        if entry in keep:
            continue
        try:
            if now - os.lstat(path).st_mtime < grace:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        gone.append(entry)
    return gone


def _copy(src: str, dst: str) -> None:
    """`src`'s content (or link) as the new file `dst`, with its mode."""
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
        return
    mode = stat.S_IMODE(st.st_mode)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(read(src) or b"")
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


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
    return not (
        stat.S_ISREG(dst_st.st_mode)
        and stat.S_IMODE(dst_st.st_mode) == stat.S_IMODE(st.st_mode)
        and dst_st.st_size == st.st_size
        and read(dst) == read(src)
    )


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


def versioned(dst: str) -> bool:
    """`dst` is (or was, half removed) a versioned install: only `gpuhook install` makes one."""
    return os.path.isdir(os.path.join(dst, VERSIONS)) or os.path.islink(os.path.join(dst, CURRENT))


def is_bundle(dst: str) -> bool:
    return os.path.exists(os.path.join(dst, MANIFEST))


def remove_bundle(dst: str) -> int:
    """Remove an installed bundle: our top-level links and the .current link first (no
    create starts from it any more), then every version, .versions last (until it is gone a
    killed removal is still recognisable, and running this again finishes it); a bundle copied
    file by file: the files its manifest lists, the manifest last. Then `dst` if empty. The
    number of files of the bundle it ran."""
    if not versioned(dst):
        return _remove_files(dst)
    cur = current_version(dst)
    n = len(manifest(cur)["files"]) if cur and os.path.exists(os.path.join(cur, MANIFEST)) else 0
    for entry in os.listdir(dst):
        if _is_top_link(dst, entry):
            remove(os.path.join(dst, entry))
    remove(os.path.join(dst, CURRENT))
    try:
        for tmp in _temps(dst):  # what a killed install or uninstall left in here
            _remove_any(tmp)
        shutil.rmtree(os.path.join(dst, VERSIONS))
    except FileNotFoundError:
        pass
    except OSError as e:
        raise InstallError(f"{e.filename or dst}: cannot remove it ({e.strerror or e})") from None
    try:
        os.rmdir(dst)
    except OSError:
        pass
    return n


def _remove_files(dst: str) -> int:
    files = manifest(dst)["files"]
    for rel in files:
        if rel != MANIFEST:
            remove(os.path.join(dst, rel))
    _prune_dirs(dst, [rel for rel in files if rel != MANIFEST])
    remove(os.path.join(dst, MANIFEST))  # last: until then running this again finishes it
    try:
        os.rmdir(dst)
    except OSError:
        pass
    return len(files)
