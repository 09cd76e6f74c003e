"""Proof that nothing read or wrote a host path, for the hostile-input tests: every inotify
event on given paths (Watch), and a snapshot of a tree to compare before and after."""

from __future__ import annotations

import ctypes
import os

IN_ALL_EVENTS = 0x00000FFF  # access, modify, attrib, close, open, move, create, delete, *_self
IN_DONT_FOLLOW = 0x02000000
_IN_NAMES = {
    0x1: "access",
    0x2: "modify",
    0x4: "attrib",
    0x8: "close_write",
    0x10: "close_nowrite",
    0x20: "open",
    0x40: "moved_from",
    0x80: "moved_to",
    0x100: "create",
    0x200: "delete",
    0x400: "delete_self",
    0x800: "move_self",
}


class Watch:
    """Every inotify event (open, read, write, attribute change, create, delete, move) on the
    given host paths, whoever causes it and through whatever mount or link."""

    def __init__(self, paths: list[str]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.paths = {}
        for p in paths:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(p), IN_ALL_EVENTS | IN_DONT_FOLLOW)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self.paths[wd] = p

    def events(self) -> list[str]:
        out = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            i = 0
            while i < len(buf):
                wd, mask, _cookie, n = (
                    int.from_bytes(buf[i : i + 4], "little", signed=True),
                    int.from_bytes(buf[i + 4 : i + 8], "little"),
                    0,
                    int.from_bytes(buf[i + 12 : i + 16], "little"),
                )
                name = buf[i + 16 : i + 16 + n].rstrip(b"\0").decode("utf-8", "replace")
                kinds = ",".join(v for k, v in _IN_NAMES.items() if mask & k)
                if kinds:
                    out.append(f"{kinds} {os.path.join(self.paths.get(wd, '?'), name)}")
                i += 16 + n
        return out

    def close(self) -> None:
        os.close(self.fd)


def tree(root: str) -> list[str]:
    """root and everything under it (links not followed)."""
    out = [root]
    for d, dirs, files in os.walk(root):
        out += [os.path.join(d, x) for x in dirs + files]
    return out


def snapshot(root: str) -> dict:
    """Type, inode, size, mtime, ctime and content (files) or listing (dirs) of a host tree."""
    snap = {}
    for p in tree(root):
        st = os.lstat(p)
        body: list[str] | bytes
        if os.path.isdir(p):
            body = sorted(os.listdir(p))
        else:
            with open(p, "rb") as f:
                body = f.read()
        snap[p] = (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, body)
    return snap
