"""Read glibc's /etc/ld.so.cache (the file ldconfig writes and `ldconfig -p` prints).

Three layouts exist, all written by ldconfig (`-c new|old|compat`):

* new (default since glibc 2.32): 48-byte header "glibc-ld.so.cache1.1", nlibs,
  len_strings, an endianness byte, extension offset; then nlibs 24-byte entries
  (int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap).
  key/value are offsets of NUL-terminated strings counted from the header start.
* old (libc5 / glibc < 2.2): 16-byte header "ld.so-1.7.0" + pad + uint32 nlibs,
  then nlibs 12-byte entries (int32 flags, uint32 key, uint32 value) whose
  string offsets count from the end of the entry array.
* compat: an old part whose string area begins (8-byte aligned) with a complete
  new part; the new part is the one read.

Only the entries are decoded; the extension directory (generator string,
glibc-hwcaps names) is ignored. parse() raises LdCacheError, and nothing else,
on any malformed input.
"""

import os  # loaded at interpreter start anyway
import struct
import sys
from ..record import Record

__all__ = ["LdCacheError", "Entry", "parse", "machine_flags", "lookup"]

_OLD_MAGIC = b"ld.so-1.7.0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = 16  # magic[11], 1 pad byte, uint32 nlibs
_OLD_ENTRY = 12
_NEW_HEADER = 48
_NEW_ENTRY = 24
_MAX_STRING = 4096  # PATH_MAX, NUL included: bounds the scan for each string
_HEAD = 5  # _keyed scans the data once per distinct head of this many bytes of the prefixes
_NATIVE = "<" if sys.byteorder == "little" else ">"  # the endianness flag's order that is this machine's

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00

# platform.machine() / uname -m -> ldconfig's arch bits (sysdeps/generic/ldconfig.h).
# Names whose ABI the machine name alone does not fix (arm hard/soft float,
# mips o32/n32/n64, x32) are left out: machine_flags() gives None for them.
_MACHINE_FLAGS = {
    "x86_64": 0x0300,
    "amd64": 0x0300,  # FLAG_X8664_LIB64
    "i386": 0,
    "i486": 0,
    "i586": 0,
    "i686": 0,
    "x86": 0,  # 32-bit x86: no arch bits
    "aarch64": 0x0A00,
    "arm64": 0x0A00,  # FLAG_AARCH64_LIB64
    "ppc64le": 0x0500,
    "ppc64": 0x0500,  # FLAG_POWERPC_LIB64
    "s390x": 0x0400,  # FLAG_S390_LIB64
    "sparc64": 0x0100,  # FLAG_SPARC_LIB64
    "ia64": 0x0200,  # FLAG_IA64_LIB64
    "riscv64": 0x1000,  # FLAG_RISCV_FLOAT_ABI_DOUBLE (lp64d, what distributions ship)
}


class LdCacheError(ValueError):
    """The bytes are not a well-formed ld.so.cache."""


class Entry(Record):
    """One cache entry: soname (or linker name), full path, ldconfig flags, hwcap."""

    name: str
    path: str
    flags: int
    hwcap: int

    __slots__ = ()


def parse(data: bytes, prefixes: "tuple[bytes, ...] | None" = None) -> "list[Entry]":
    """Entries of an ld.so.cache image, in file order (bytes-like input). prefixes: only the
    entries whose name starts with one of them (the others are not decoded, nor checked: a
    node's cache has thousands, the NVIDIA probe wants a few dozen)."""
    if not isinstance(data, bytes):
        data = memoryview(data).tobytes()
    if data.startswith(_NEW_MAGIC):
        return _parse_new(data, 0, prefixes)
    if not data.startswith(_OLD_MAGIC):
        raise LdCacheError("not an ld.so.cache: bad magic")
    if len(data) < _OLD_HEADER:
        raise LdCacheError("truncated old-format header")
    (nlibs,) = struct.unpack_from("=I", data, 12)
    end = _OLD_HEADER + nlibs * _OLD_ENTRY
    if end > len(data):
        raise LdCacheError(f"old-format nlibs {nlibs} does not fit in {len(data)} bytes")
    # compat: the new part sits at the start of the old string area, aligned to
    # alignof(struct cache_file_new): 8 on 64-bit ABIs, 4 (no padding) on others.
    for start in ((end + 7) & ~7, end):
        if data.startswith(_NEW_MAGIC, start):
            return _parse_new(data, start, prefixes)
    rows = struct.iter_unpack("=iII", data[_OLD_HEADER:end])
    return [
        Entry(_string(data, end, key), _string(data, end, value), flags, 0)
        for flags, key, value in rows
        if prefixes is None or data.startswith(prefixes, end + key)
    ]


def _parse_new(data, start, prefixes=None):
    if len(data) - start < _NEW_HEADER:
        raise LdCacheError("truncated new-format header")
    endian = data[start + 28] & 3
    if endian == 1:
        raise LdCacheError("cache is flagged invalid (endianness 1)")
    order = ("=", "=", "<", ">")[endian]  # 0: written before the flag existed
    (nlibs,) = struct.unpack_from(order + "I", data, start + 20)
    end = start + _NEW_HEADER + nlibs * _NEW_ENTRY
    if end > len(data):
        raise LdCacheError(f"new-format nlibs {nlibs} does not fit in {len(data)} bytes")
    if prefixes is not None and order in ("=", _NATIVE):
        rows = [
            struct.unpack_from(order + "iIIIQ", data, start + _NEW_HEADER + i * _NEW_ENTRY)
            for i in _keyed(data, start, end, prefixes)
        ]
    else:
        rows = struct.iter_unpack(order + "iIIIQ", data[start + _NEW_HEADER : end])
    return [
        Entry(_string(data, start, key), _string(data, start, value), flags, hwcap)
        for flags, key, value, _osversion, hwcap in rows
        if prefixes is None or data.startswith(prefixes, start + key)
    ]


def _keyed(data: bytes, start: int, end: int, prefixes: tuple[bytes, ...]) -> list[int]:
    """The indexes of the (native-order) new-format entries whose key may start with one of
    prefixes: where the prefixes are in the data is found first (one scan per head) (a few dozen places on a
    node's cache of thousands of entries), then every key is read in one go and compared
    with those places; the caller decodes only these rows (and checks them again)."""
    at = set()
    for head in {p[:_HEAD] for p in prefixes}:  # one scan per distinct head ("libnv", "libcu"...)
        i = data.find(head)
        while i >= 0:
            if data.startswith(prefixes, i):
                at.add(i - start)
            i = data.find(head, i + 1)
    if not at:
        return []
    keys = memoryview(data)[start + _NEW_HEADER : end].cast("I")[1 :: _NEW_ENTRY // 4].tolist()
    return [i for i, k in enumerate(keys) if k in at]


def _string(data, base, offset):
    pos = base + offset
    nul = data.find(b"\0", pos, pos + _MAX_STRING)  # -1 also when pos is past the end
    if nul < 0:
        raise LdCacheError(f"string offset {offset}: out of range or not NUL-terminated")
    return data[pos:nul].decode("utf-8", "surrogateescape")


def machine_flags(machine: "str | None" = None) -> "int | None":
    """Arch bits (flags & 0xff00) of native libraries for a uname -m style name, or None."""
    if machine is None:
        machine = os.uname().machine  # what platform.machine() returns, without its imports
    return _MACHINE_FLAGS.get(machine.lower())


def lookup(entries, machine: "str | None" = None) -> "dict[str, str]":
    """name -> path for libc6 entries of `machine` (None: this one); first entry wins.

    When the machine's arch bits are unknown, entries of every arch are accepted.
    """
    want = machine_flags(machine)
    found = {}
    for entry in entries:
        flags = entry.flags
        if (flags & FLAG_TYPE_MASK) != FLAG_ELF_LIBC6:
            continue
        if want is not None and (flags & FLAG_ARCH_MASK) != want:
            continue
        if entry.name not in found:
            found[entry.name] = entry.path
    return found
