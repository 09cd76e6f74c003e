"""Readers shared by the vendor probes: /proc/devices, sysfs `dev` files, device nodes."""

import os
import stat as _stat

from ..inventory import Node
from .host import Host


def is_uint(s: str) -> bool:
    """ASCII digits only (str.isdigit() also takes '²', which int() refuses)."""
    return s.isascii() and s.isdigit()


def numbered(name: str, prefix: str) -> int | None:
    """N of a name that is `prefix` then the digits of N ("nvidia3", "nvidia" -> 3); else None."""
    if name.startswith(prefix) and is_uint(name[len(prefix) :]):
        return int(name[len(prefix) :])
    return None


def numbered_names(names, prefix: str) -> list[tuple[int, str]]:
    """(N, name) of the names that are `prefix` then N, in the order of N."""
    return sorted((n, name) for name in names if (n := numbered(name, prefix)) is not None)


def char_majors(host: Host) -> dict[str, list[int]]:
    """/proc/devices character section: driver name -> majors (a name may repeat)."""
    cached = host.memo.get("char_majors")
    if cached is not None:
        return cached
    out: dict[str, list[int]] = {}
    host.memo["char_majors"] = out
    text = host.read_text("/proc/devices", quiet=True)
    if text is None:
        return out
    in_char = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Character devices"):
            in_char = True
            continue
        if line.startswith("Block devices"):
            break
        if not in_char or not line:
            continue
        num, _, name = line.partition(" ")
        if is_uint(num) and name:
            out.setdefault(name.strip(), []).append(int(num))
    return out


def first_major(majors: dict[str, list[int]], *names: str) -> int | None:
    for name in names:
        if majors.get(name):
            return majors[name][0]
    return None


def parse_dev(text: str) -> tuple[int, int] | None:
    """A sysfs `dev` file's content, "MAJOR:MINOR\n"; None when malformed."""
    major, sep, minor = text.strip().partition(":")
    if sep and is_uint(major) and is_uint(minor):
        return int(major), int(minor)
    return None


def device_node(
    host: Host, path: str, major: int | None, minor: int | None, type_: str = "c", *, lazy: bool = False
) -> Node | None:
    """The node at `path`.

    A real device node on the host wins (its own major/minor, mode and owner). Otherwise
    the driver-reported numbers are used: for a node that is missing when `lazy` (the
    driver creates it on first use, runc creates it in the container), or for a path that
    is not a device node at all (fake hosts and captures use empty files).
    """
    st = host.lstat(path)
    if st is not None and (_stat.S_ISCHR(st.st_mode) or _stat.S_ISBLK(st.st_mode)):
        return Node(
            path,
            "c" if _stat.S_ISCHR(st.st_mode) else "b",
            os.major(st.st_rdev),
            os.minor(st.st_rdev),
            _stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
            True,
        )
    if major is None or minor is None:
        if st is not None:
            host.warn(f"{path}: not a device node and no driver-reported number, skipped")
        return None
    if st is None and not lazy:
        return None
    return Node(path, type_, major, minor, None, None, None, st is not None)


def read_hex(host: Host, path: str) -> int | None:
    text = host.read_text(path, quiet=True)
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        host.warn(f"{path}: not a hex number: {text.strip()[:40]!r}")
        return None


def uevent(host: Host, path: str) -> dict[str, str]:
    text = host.read_text(path, quiet=True) or ""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out
