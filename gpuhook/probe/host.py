"""Every read of a host file goes through a Host.

A Host is a directory that stands for the node's `/`: the real root in production,
a fake tree in tests and dry runs. Paths are given as they are seen on the node
("/proc/devices") and are resolved inside the root, the way chroot would: a symlink
can never lead out of it. Missing or unreadable files give None (and a warning where
the file was expected); nothing here raises on bad host content.
"""

import os
import stat as _stat

from ..record import Record

_MAX_LINKS = 40
_MAX_READ = 1 << 20
MISSING = "missing"
LOOP = "too many links"


class Walked(Record):
    """Where a walk of a node path under a root stopped. done: the components resolved, from
    the root down; rest: what was left when it stopped (the one not there first). stop: None
    when every component resolved, MISSING (error: lstat's), LOOP, or what its check said.
    escaped: a link climbed above the root. last: the lstat of the last component resolved."""

    done: "list[str]"
    rest: "list[str]"
    stop: "str | None" = None
    escaped: bool = False
    last: "os.stat_result | None" = None
    error: "OSError | None" = None

    __slots__ = ()


def walk(root: str, path: str, check=None) -> "Walked":
    """Resolve the node path `path` under `root` the way chroot would: one component at a
    time with lstat, every link followed inside the root (at most _MAX_LINKS). check(node
    path, lstat, more), when given, sees each component found (a link before it is followed;
    more: components follow it) and stops the walk with a reason, or None to go on."""
    base = "" if root == "/" else root.rstrip("/")
    parts = [p for p in path.split("/") if p and p != "."]
    done: list[str] = []
    links, escaped, last = 0, False, None
    while parts:
        name = parts.pop(0)
        if name == "..":
            if done:
                done.pop()
            elif links:
                escaped = True
            continue
        shown = "/" + "/".join(done + [name])
        try:
            st = os.lstat(base + shown)
        except OSError as e:
            return Walked(done, [name, *parts], MISSING, escaped, last, e)
        is_link = _stat.S_ISLNK(st.st_mode)
        links += is_link
        why = LOOP if links > _MAX_LINKS else check(shown, st, bool(parts)) if check else None
        if why:
            return Walked(done, [name, *parts], why, escaped, last)
        if is_link:
            target = os.readlink(base + shown)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        done.append(name)
        last = st
    return Walked(done, [], None, escaped, last)


class Host:
    __slots__ = ("root", "warnings", "memo", "options")

    def __init__(self, root: str = "/", options: dict | None = None) -> None:
        self.root = os.path.abspath(root)
        self.warnings: list[str] = []
        self.memo: dict = {}  # results that several vendor probes share (e.g. /proc/devices)
        self.options: dict = options or {}  # node settings for the vendor probes (nvidia_driver_root)

    # -- paths ---------------------------------------------------------------
    def resolve(self, path: str) -> str:
        """Node path -> real path under root, following links as if chrooted."""
        if self.root == "/":
            return os.path.realpath(path)
        return self._walk(path)[0]

    def escapes(self, path: str) -> bool:
        """Does a link on the way to `path` climb above the root (`..` past it)? resolve()
        keeps such a path inside the root, as chroot would; a caller that names a directory
        of the node (a driver root) refuses it instead. Never true for the root `/`."""
        return self.root != "/" and self._walk(path)[1]

    def _walk(self, path: str) -> tuple[str, bool]:
        w = walk(self.root, path)
        # a missing component, or too many links: the rest is kept literal, '..' normalised
        return self._join(w.done + w.rest), w.escaped

    def _join(self, parts: list[str]) -> str:
        out: list[str] = []
        for p in parts:
            if p == "..":
                if out:
                    out.pop()
            elif p and p != ".":
                out.append(p)
        return (self.root.rstrip("/") + "/" + "/".join(out)) if out else self.root

    def node_path(self, real: str) -> str:
        """Real path under root -> the path as the node sees it."""
        if self.root == "/":
            return real
        rel = os.path.relpath(real, self.root)
        return "/" if rel == "." else "/" + rel

    def realpath(self, path: str) -> str:
        """Node path -> node path with every link resolved (inside root)."""
        return self.node_path(self.resolve(path))

    # -- reads ---------------------------------------------------------------
    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def read_bytes(self, path: str, limit: int = _MAX_READ, quiet: bool = False) -> bytes | None:
        try:
            with open(self.resolve(path), "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            return None
        except OSError as e:
            if not quiet:
                self.warn(f"cannot read {path}: {e.strerror or e}")
            return None
        if len(data) > limit:
            if not quiet:
                self.warn(f"{path}: larger than {limit} bytes, ignored")
            return None
        return data

    def read_text(self, path: str, limit: int = _MAX_READ, quiet: bool = False) -> str | None:
        data = self.read_bytes(path, limit, quiet)
        if data is None:
            return None
        return data.decode("utf-8", "replace")

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.resolve(path)))
        except OSError:
            return []

    def lstat(self, path: str) -> os.stat_result | None:
        """lstat of the final component (the links before it are resolved)."""
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return os.lstat(self.resolve(parent or "/") + "/" + name)
        except OSError:
            return None

    def stat(self, path: str) -> os.stat_result | None:
        try:
            return os.stat(self.resolve(path))
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def is_dir(self, path: str) -> bool:
        st = self.stat(path)
        return st is not None and _stat.S_ISDIR(st.st_mode)

    def readlink(self, path: str) -> str | None:
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            return os.readlink(self.resolve(parent or "/") + "/" + name)
        except OSError:
            return None
