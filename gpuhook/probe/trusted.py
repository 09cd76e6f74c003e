"""A host directory gpuhook mounts read-write into containers (the MPS pipe directory): only
one that no non-root user owns, can write, or can swap for another.

trusted_dir(root, path) resolves the node path `path` under the host root `root` once, with
probe/host.py's walk (one component at a time with lstat, links inside the root: Host.resolve's
own), and checks every step on the way:

- every directory passed through, from the real `/` down (the host root's own ancestors
  too), and every link followed, is owned by root (or by gpuhook's own user, for tests run
  without root): nobody else can rename, replace or retarget it;
- a directory passed through is not writable by group or others, unless it is sticky (/tmp):
  there only an entry's owner (root, checked) can rename or remove it;
- the directory itself is a directory (no link: the path given to the runtime is the
  resolved one, with no link in it), owned by root, not writable by group or others,
  sticky or not, and holds an entry `control` (the MPS control daemon is there);
- after the walk, the path resolves again to the same directory (same device and inode):
  a swap during the walk is refused.

What the runtime then mounts is that resolved path, every component of which only root can
change; runc's own lookup of the source happens a few milliseconds later (see SECURITY.md:
a root process on the node can still swap it in between). Run on every create, never
cached: the probe cache does not hold it.
"""

import os
import stat

from ..probe.host import MISSING, walk


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid == 0 or st.st_uid == os.geteuid()


def _real_ancestors(real_root: str) -> "list[str]":
    """/, /a, /a/b for /a/b: the host root's own ancestors, and itself."""
    out, cur = ["/"], ""
    for part in [p for p in real_root.split("/") if p]:
        cur += "/" + part
        out.append(cur)
    return out


def _check_parent(path: str, st: os.stat_result) -> "str | None":
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if not _owner_ok(st):
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by group or others (mode {st.st_mode & 0o7777:04o})"
    return None


def trusted_dir(root: str, path: str) -> "tuple[str | None, str | None]":
    """(the real path to mount, None) or (None, why not). Never raises."""
    try:
        return _trusted_dir(os.path.abspath(root), path)
    except (OSError, ValueError) as e:
        return None, f"{path}: {e.strerror if isinstance(e, OSError) and e.strerror else e}"


def _trusted_dir(root: str, path: str) -> "tuple[str | None, str | None]":
    for anc in _real_ancestors(root):
        why = _check_parent(anc, os.lstat(anc))
        if why:
            return None, f"{path}: the host root's {why}"
    w = walk(root, path, _check_step)
    if w.stop == MISSING:
        if not isinstance(w.error, FileNotFoundError):
            raise w.error or OSError(path)
        return None, f"{path}: not there"
    if w.stop is not None:
        return None, f"{path}: {w.stop}"
    last, done = w.last, w.done
    if last is None or not done:
        return None, f"{path}: not a directory of its own"
    real = ("" if root == "/" else root.rstrip("/")) + "/" + "/".join(done)
    shown = "/" + "/".join(done)
    if not stat.S_ISDIR(last.st_mode):
        return None, f"{path}: {shown} is not a directory"
    if not _owner_ok(last):
        return None, f"{path}: {shown} is owned by uid {last.st_uid}, not root"
    if last.st_mode & 0o022:
        return None, f"{path}: {shown} is writable by group or others (mode {last.st_mode & 0o7777:04o})"
    try:
        os.lstat(real + "/control")
    except FileNotFoundError:
        return None, f"{path}: no MPS control daemon there (no {shown}/control)"
    again = os.stat(real)
    if (again.st_dev, again.st_ino) != (last.st_dev, last.st_ino):
        return None, f"{path}: changed while it was checked"
    return real, None


def _check_step(shown: str, st: os.stat_result, more: bool) -> "str | None":
    """Every link followed is root's; every directory passed through is _check_parent's."""
    if stat.S_ISLNK(st.st_mode):
        return None if _owner_ok(st) else f"the link {shown} is owned by uid {st.st_uid}, not root"
    return _check_parent(shown, st) if more else None
