"""Tests for gpuhook.probe.ldcache: real caches, ldconfig-made caches, hand-built ones."""

import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from gpuhook.probe import ldcache
from gpuhook.probe.ldcache import Entry, LdCacheError, lookup, machine_flags, parse

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
NVIDIA_CACHE = os.path.join(HERE, "fixtures", "nvidia-ctk-rootfs-1", "etc", "ld.so.cache")
LDCONFIG = shutil.which("ldconfig") or next(
    (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None)
GCC = shutil.which("gcc")

X8664 = 0x0300
LIBC6 = 0x0003
NATIVE = "<" if sys.byteorder == "little" else ">"

# ---------------------------------------------------------------------------
# A cache writer of our own, following the layouts in glibc's dl-cache.h.
# Entries are (name: bytes, path: bytes, flags: int, hwcap: int).


def _strtab(entries, first):
    """String table for entries; offsets of each (key, value) counted from `first`."""
    table = bytearray()
    offsets = []
    for name, path, _flags, _hwcap in entries:
        key = first + len(table)
        table += name + b"\0"
        value = first + len(table)
        table += path + b"\0"
        offsets.append((key, value))
    return bytes(table), offsets


def build_new(entries, order=NATIVE, endian=None, tail=b""):
    """New format: 48-byte header, 24-byte entries, strings counted from the header."""
    first = 48 + 24 * len(entries)
    table, offsets = _strtab(entries, first)
    if endian is None:
        endian = 2 if order == "<" else 3
    header = b"glibc-ld.so.cache1.1" + struct.pack(
        order + "IIB3xI12x", len(entries), len(table), endian, 0)
    assert len(header) == 48
    body = b"".join(struct.pack(order + "iIIIQ", e[2], k, v, 0, e[3])
                    for e, (k, v) in zip(entries, offsets))
    return header + body + table + tail


def build_old(entries):
    """Old format: 16-byte header, 12-byte entries, strings counted from the entries' end."""
    table, offsets = _strtab(entries, 0)
    header = b"ld.so-1.7.0\0" + struct.pack("=I", len(entries))
    body = b"".join(struct.pack("=iII", e[2], k, v) for e, (k, v) in zip(entries, offsets))
    return header + body + table


def build_compat(entries, old_entries=None, align=8):
    """Old part whose string area starts (aligned) with a whole new part."""
    old = entries if old_entries is None else old_entries
    end = 16 + 12 * len(old)
    pad = -end % align
    new = build_new(entries)
    # the old strings live after the new part; their offsets count from `end`
    table, offsets = _strtab(old, pad + len(new))
    header = b"ld.so-1.7.0\0" + struct.pack("=I", len(old))
    body = b"".join(struct.pack("=iII", e[2], k, v) for e, (k, v) in zip(old, offsets))
    return header + body + b"\0" * pad + new + table


def as_entries(raw):
    return [Entry(n.decode("utf-8", "surrogateescape"), p.decode("utf-8", "surrogateescape"),
                  f, h) for n, p, f, h in raw]


SAMPLE = [
    (b"libcuda.so.1", b"/usr/lib/x86_64-linux-gnu/libcuda.so.1", LIBC6 | X8664, 0),
    (b"libcuda.so", b"/usr/lib/x86_64-linux-gnu/libcuda.so", LIBC6 | X8664, 0),
    (b"libcuda.so.1", b"/usr/lib/i386-linux-gnu/libcuda.so.1", LIBC6, 0),
    (b"libfoo.so.1", b"/opt/v2/libfoo.so.1", LIBC6 | X8664, (1 << 62) | 1),
    (b"libfoo.so.1", b"/opt/libfoo.so.1", LIBC6 | X8664, 0),
    (b"libaarch.so.1", b"/usr/lib/aarch64-linux-gnu/libaarch.so.1", LIBC6 | 0x0A00, 0),
    (b"libold.so.5", b"/usr/lib/libold.so.5", 0x0002 | X8664, 0),
    (b"libnonutf\xff.so", b"/lib/\xe9t\xe9.so", LIBC6 | X8664, 0),
]


# ---------------------------------------------------------------------------
# ldconfig -p


_LINE = re.compile(r"^\t(.*?) \((.*)\) => (.*)$")
_ARCH = {0: "", 0x0100: ",64bit", 0x0200: ",IA-64", 0x0300: ",x86-64", 0x0400: ",64bit",
         0x0500: ",64bit", 0x0800: ",x32", 0x0900: ",hard-float", 0x0A00: ",AArch64",
         0x0B00: ",soft-float", 0x1000: ",double-float"}


def ldconfig_print(cache_path):
    """[(name, description, path)] and the announced count, from `ldconfig -C cache -p`."""
    out = subprocess.run([LDCONFIG, "-C", cache_path, "-p"], check=True,
                         capture_output=True).stdout.decode("utf-8", "surrogateescape")
    lines = out.splitlines()
    count = int(re.match(r"(\d+) libs found in cache", lines[0]).group(1))
    rows = [_LINE.match(line).groups() for line in lines[1:] if line.startswith("\t")]
    return rows, count


_TYPE_LABELS = {}


def ldconfig_type_labels():
    """{flag type: the word this glibc's `ldconfig -p` prints for it}, asked of ldconfig
    itself with a cache of our own writer (not the parser under test) holding one entry per
    type. The words differ by release: glibc 2.36 (Debian 12) prints libc4, ELF, libc5,
    libc6; 2.41 (Debian 13) prints "unknown or unsupported flag" for all but libc6."""
    if not _TYPE_LABELS:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "types.cache")
            with open(path, "wb") as f:
                f.write(build_new([(b"libtype%d.so" % t, b"/t/libtype%d.so" % t, t, 0) for t in range(4)]))
            rows, _count = ldconfig_print(path)
        _TYPE_LABELS.update({int(n[len("libtype"):-len(".so")]): desc for n, desc, _p in rows})
        assert sorted(_TYPE_LABELS) == [0, 1, 2, 3], rows
    # what lookup relies on: libc6 entries are told apart from every other type
    assert _TYPE_LABELS[3] == "libc6" and "libc6" not in (_TYPE_LABELS[t] for t in (0, 1, 2)), _TYPE_LABELS
    return _TYPE_LABELS


def assert_matches_ldconfig(entries, cache_path):
    rows, count = ldconfig_print(cache_path)
    assert len(entries) == count == len(rows)
    assert [(e.name, e.path) for e in entries] == [(n, p) for n, _d, p in rows]
    labels = ldconfig_type_labels()
    for e, (_n, desc, _p) in zip(entries, rows):
        expected = labels.get(e.flags & 0xFF, "unknown") + _ARCH.get(e.flags & 0xFF00, "?")
        assert desc == expected or desc.startswith(expected + ","), (e, desc)


# ---------------------------------------------------------------------------
# Real files


@pytest.mark.skipif(LDCONFIG is None or not os.path.isfile("/etc/ld.so.cache"),
                    reason="no ldconfig or no /etc/ld.so.cache")
def test_host_cache_matches_ldconfig_p():
    with open("/etc/ld.so.cache", "rb") as f:
        data = f.read()
    entries = parse(data)
    assert entries, "the host cache is not empty"
    assert_matches_ldconfig(entries, "/etc/ld.so.cache")
    # and the plain `ldconfig -p` the brief names gives the same (name, path) set
    out = subprocess.run([LDCONFIG, "-p"], check=True, capture_output=True).stdout
    pairs = {m.group(1, 3) for m in map(_LINE.match, out.decode("utf-8", "surrogateescape")
                                        .splitlines()) if m}
    assert {(e.name, e.path) for e in entries} == pairs
    if data.startswith(b"glibc-ld.so.cache1.1"):
        assert len(entries) == struct.unpack_from("=I", data, 20)[0]


@pytest.mark.skipif(LDCONFIG is None or not os.path.isfile("/etc/ld.so.cache"),
                    reason="no ldconfig or no /etc/ld.so.cache")
def test_host_cache_lookup_finds_libc():
    with open("/etc/ld.so.cache", "rb") as f:
        table = lookup(parse(f.read()))
    assert "libc.so.6" in table
    assert os.path.basename(table["libc.so.6"]).startswith("libc.so.6")


def test_nvidia_ctk_fixture():
    with open(NVIDIA_CACHE, "rb") as f:
        data = f.read()
    entries = parse(data)
    assert len(entries) == 743
    # a multilib host: x86-64, x32 (0x0800), i386 (no arch bits) and two plain-ELF entries
    counts = {}
    for e in entries:
        counts[e.flags] = counts.get(e.flags, 0) + 1
    assert counts == {LIBC6 | X8664: 651, LIBC6 | 0x0800: 46, LIBC6: 44, 0x0001: 2}
    assert all(e.hwcap == 0 for e in entries)
    table = lookup(entries, "x86_64")
    assert len(table) == 651
    # the x32 entry comes first in the file; the x86-64 one must win for x86_64
    assert [e.path for e in entries if e.name == "libutil.so.1"][0] == "/libx32/libutil.so.1"
    assert table["libutil.so.1"] == "/lib/x86_64-linux-gnu/libutil.so.1"
    assert lookup(entries, "i686")["libutil.so.1"] == "/lib32/libutil.so.1"
    assert "ld-linux.so.2" not in lookup(entries, "i686")  # FLAG_ELF, not libc6
    assert table["libcuda.so.1"] == "/lib/x86_64-linux-gnu/libcuda.so.1"
    assert table["libnvidia-ml.so.1"] == "/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert table["libnvcuvid.so.1"] == "/lib/x86_64-linux-gnu/libnvcuvid.so.1"
    assert lookup(entries, "aarch64") == {}
    if LDCONFIG is not None:
        assert_matches_ldconfig(entries, NVIDIA_CACHE)


# ---------------------------------------------------------------------------
# Caches written by the real ldconfig


def _glibc_version():
    try:
        return tuple(int(x) for x in os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2])
    except (ValueError, OSError, IndexError, AttributeError):
        return (0, 0)


def _multiarch():
    try:
        out = subprocess.run([GCC, "-print-multiarch"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    return out.strip() or "lib64"


@pytest.fixture(scope="module")
def ld_root(tmp_path_factory):
    if GCC is None or LDCONFIG is None:
        pytest.skip("gcc or ldconfig not installed")
    root = tmp_path_factory.mktemp("ldroot")
    src = root / "foo.c"
    src.write_text("int gpuhook_test(void) { return 1; }\n")
    libdir = root / "usr" / "lib" / _multiarch()
    optdir = root / "opt" / "gpuhook"
    hwdir = optdir / "glibc-hwcaps" / "x86-64-v2"
    for d in (libdir, optdir, hwdir, root / "etc"):
        d.mkdir(parents=True, exist_ok=True)

    def cc(soname, out):
        subprocess.run([GCC, "-shared", "-fPIC", "-Wl,-soname," + soname, "-o", str(out), str(src)],
                       check=True)

    cc("libfoo.so.1", libdir / "libfoo.so.1.2.3")
    os.symlink("libfoo.so.1.2.3", libdir / "libfoo.so")  # linker name -> also cached
    cc("libbar.so.2", optdir / "libbar.so.2.0")
    if platform.machine() == "x86_64":
        cc("libbar.so.2", hwdir / "libbar.so.2.0")
    (root / "etc" / "ld.so.conf").write_text("/%s\n/opt/gpuhook\n" % libdir.relative_to(root))
    return root, "/" + str(libdir.relative_to(root))


@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_ldconfig_written_cache(ld_root, fmt):
    root, libdir = ld_root
    cache = root / "etc" / "ld.so.cache"
    if cache.exists():
        cache.unlink()
    proc = subprocess.run([LDCONFIG, "-r", str(root), "-c", fmt], capture_output=True, text=True)
    if proc.returncode != 0 and "chroot" in proc.stderr:  # not root / no CAP_SYS_CHROOT
        pytest.skip("ldconfig -r cannot chroot here: " + proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    data = cache.read_bytes()
    head = data[:20]
    if fmt == "new":
        assert head.startswith(b"glibc-ld.so.cache1.1")
    else:
        assert head.startswith(b"ld.so-1.7.0")
        assert (b"glibc-ld.so.cache1.1" in data) == (fmt == "compat")

    entries = parse(data)
    assert_matches_ldconfig(entries, str(cache))
    pairs = {(e.name, e.path) for e in entries}
    assert ("libfoo.so.1", libdir + "/libfoo.so.1") in pairs
    assert ("libfoo.so", libdir + "/libfoo.so") in pairs
    assert ("libbar.so.2", "/opt/gpuhook/libbar.so.2") in pairs
    flags = machine_flags()
    if flags is not None:
        assert all(e.flags == LIBC6 | flags for e in entries)

    hwcaps = [e for e in entries if "/glibc-hwcaps/" in e.path]
    if platform.machine() == "x86_64" and _glibc_version() >= (2, 33):  # glibc-hwcaps: 2.33+
        assert [e.path for e in hwcaps] == ["/opt/gpuhook/glibc-hwcaps/x86-64-v2/libbar.so.2.0"]
        # the old format has no hwcap field; the new one marks glibc-hwcaps entries (bit 62)
        assert hwcaps[0].hwcap >> 62 == (0 if fmt == "old" else 1)
    assert all(e.hwcap == 0 for e in entries if e not in hwcaps)

    table = lookup(entries)
    assert table["libfoo.so.1"] == libdir + "/libfoo.so.1"
    assert table["libfoo.so"] == libdir + "/libfoo.so"
    # glibc sorts glibc-hwcaps entries first for a name; lookup keeps the first one
    assert table["libbar.so.2"] == (hwcaps[0].path if hwcaps else "/opt/gpuhook/libbar.so.2")
    assert lookup(entries, "aarch64" if platform.machine() != "aarch64" else "x86_64") == {}


# ---------------------------------------------------------------------------
# Hand-built files


def test_build_new_round_trip():
    assert parse(build_new(SAMPLE)) == as_entries(SAMPLE)


def test_foreign_endianness_flag_is_honoured():
    other = ">" if NATIVE == "<" else "<"
    assert parse(build_new(SAMPLE, order=other)) == as_entries(SAMPLE)
    # flag 0 (written before the flag existed) means native order
    assert parse(build_new(SAMPLE, endian=0)) == as_entries(SAMPLE)


def test_old_format():
    data = build_old(SAMPLE)
    entries = parse(data)
    assert [(e.name, e.path, e.flags) for e in entries] == \
        [(e.name, e.path, e.flags) for e in as_entries(SAMPLE)]
    assert all(e.hwcap == 0 for e in entries)
    # strings count from the end of the entries: one more entry shifts everything
    assert parse(build_old(SAMPLE[:3]))[2].path == "/usr/lib/i386-linux-gnu/libcuda.so.1"


def test_old_format_string_area_holding_no_new_magic():
    # an odd count leaves the string area 4 bytes off 8-byte alignment: still plain old
    raw = SAMPLE[:3]
    assert (16 + 12 * len(raw)) % 8 == 4
    assert [e.path for e in parse(build_old(raw))] == [r[1].decode() for r in raw]


@pytest.mark.parametrize("n_old", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("align", [8, 4])
def test_compat_prefers_new_part(n_old, align):
    old = [(b"libold%d.so" % i, b"/old/libold%d.so" % i, LIBC6 | X8664, 0) for i in range(n_old)]
    data = build_compat(SAMPLE, old_entries=old, align=align)
    assert parse(data) == as_entries(SAMPLE)
    # the same old part with the new part's magic broken is read as old format
    broken = data.replace(b"glibc-ld.so.cache1.1", b"glibc-ld.so.cache9.9")
    assert [(e.name, e.path) for e in parse(broken)] == \
        [(n.decode(), p.decode()) for n, p, _f, _h in old]


def test_compat_same_entries_both_parts():
    raw = [r for r in SAMPLE if r[3] == 0]
    assert parse(build_compat(raw)) == as_entries(raw)


def test_empty_caches():
    assert parse(build_new([])) == []
    assert parse(build_old([])) == []
    assert parse(build_compat([])) == []


def test_bytes_like_input():
    data = build_new(SAMPLE)
    assert parse(bytearray(data)) == parse(memoryview(data)) == parse(data)


# ---------------------------------------------------------------------------
# Malformed input


def _put(data, offset, fmt, value):
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


MALFORMED = {
    "empty": b"",
    "bad magic": b"hello world, not a cache at all........................",
    "new magic only": b"glibc-ld.so.cache1.1",
    "old magic only": b"ld.so-1.7.0",
    "old header cut": b"ld.so-1.7.0\0\1\0",
    "new header cut": build_new(SAMPLE)[:47],
    "new nlibs absurd": _put(build_new(SAMPLE), 20, "=I", 0xFFFFFFFF),
    "new nlibs one too many": _put(build_new([]), 20, "=I", 1),
    "old nlibs absurd": _put(build_old(SAMPLE), 12, "=I", 0xFFFFFFFF),
    "new key out of range": _put(build_new(SAMPLE), 48 + 4, "=I", 10 ** 6),
    "new value out of range": _put(build_new(SAMPLE), 48 + 8, "=I", 0xFFFFFFFF),
    "old key out of range": _put(build_old(SAMPLE), 16 + 4, "=I", 10 ** 6),
    "new string not terminated": build_new(SAMPLE)[:-1],
    "old string not terminated": build_old(SAMPLE)[:-1],
    "new entries cut": build_new(SAMPLE)[:48 + 24 * len(SAMPLE) - 1],
    "old entries cut": build_old(SAMPLE)[:16 + 12 * len(SAMPLE) - 1],
    "endianness invalid": build_new(SAMPLE, endian=1),
    "compat new part cut": build_compat(SAMPLE)[:16 + 12 * len(SAMPLE) + 40],
    "compat new part cut before its flags": build_compat(SAMPLE)[:16 + 12 * len(SAMPLE) + 24],
    "string too long": build_new([(b"x" * 5000, b"/p", LIBC6, 0)]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_raises_ldcacheerror(name):
    with pytest.raises(LdCacheError):
        parse(MALFORMED[name])


def test_ldcacheerror_is_valueerror():
    assert issubclass(LdCacheError, ValueError)


def test_foreign_order_without_flag_is_rejected_cleanly():
    # a big-endian file claiming "unset" endianness reads its counts byte-swapped
    other = ">" if NATIVE == "<" else "<"
    with pytest.raises(LdCacheError):
        parse(build_new(SAMPLE, order=other, endian=0))


# The NVIDIA probe warns "/etc/ld.so.cache: <this>; searching the usual directories": the line
# an operator reads says what is wrong with the file.
@pytest.mark.parametrize("name, says", [
    ("bad magic", "not an ld.so.cache: bad magic"),
    ("old header cut", "truncated old-format header"),
    ("new header cut", "truncated new-format header"),
    ("compat new part cut before its flags", "truncated new-format header"),
    ("endianness invalid", "cache is flagged invalid (endianness 1)"),
    ("new nlibs absurd", f"new-format nlibs 4294967295 does not fit in {len(MALFORMED['new nlibs absurd'])} bytes"),
])
def test_malformed_says_what_is_wrong(name, says):
    with pytest.raises(LdCacheError) as e:
        parse(MALFORMED[name])
    assert str(e.value) == says


def test_offsets_past_2_gib_are_out_of_range_not_counted_from_the_end():
    """A key or value offset of 2**31 or more is past any cache; read as a negative number it
    would name a string near the end of the file instead (the file ends in a NUL)."""
    new = _put(build_new(SAMPLE), 48 + 8, "=I", 0xFFFFFFFF)  # the first entry's path
    for prefixes in (None, (b"libcuda.so",)):  # the probe's way decodes only its rows
        with pytest.raises(LdCacheError):
            parse(new, prefixes)
    old = _put(build_old(SAMPLE), 16 + 4, "=I", 0xFFFFFFFF)  # the first entry's name
    assert old.endswith(b"\0")
    with pytest.raises(LdCacheError):
        parse(old)


def test_a_new_part_not_at_the_aligned_end_is_not_read():
    """glibc's loader looks for a compat cache's new part only at the old entries' end rounded
    up to 8 (or at it): a new magic 8 bytes further into the string area is a string."""
    raw = SAMPLE[:2]
    assert (16 + 12 * len(raw)) % 8 == 0
    old = build_old(raw)
    end = 16 + 12 * len(raw)
    # the string area: "libpad\0\0" (8 bytes), a whole new part, the old strings
    data = old[:end] + b"libpad\0\0" + build_new(SAMPLE) + old[end:]
    data = _put(data, 16 + 4, "=I", 0)  # both old entries: "libpad" => ""
    data = _put(data, 16 + 8, "=I", 7)
    data = _put(data, 16 + 12 + 4, "=I", 0)
    data = _put(data, 16 + 12 + 8, "=I", 7)
    assert data.startswith(b"glibc-ld.so.cache1.1", end + 8)
    assert [(e.name, e.path) for e in parse(data)] == [("libpad", ""), ("libpad", "")]


# ---------------------------------------------------------------------------
# machine_flags / lookup


@pytest.mark.parametrize("machine, flags", [
    ("x86_64", 0x0300), ("AMD64", 0x0300), ("aarch64", 0x0A00), ("arm64", 0x0A00),
    ("ppc64le", 0x0500), ("s390x", 0x0400), ("i686", 0), ("i386", 0), ("riscv64", 0x1000),
    ("armv7l", None), ("mips", None), ("", None), ("weird", None),
])
def test_machine_flags(machine, flags):
    assert machine_flags(machine) == flags


def test_machine_flags_default_is_this_machine():
    assert machine_flags() == machine_flags(platform.machine())
    if platform.machine() == "x86_64":
        assert machine_flags() == 0x0300


def test_lookup_filters_and_keeps_first():
    entries = as_entries(SAMPLE)
    x86 = lookup(entries, "x86_64")
    assert x86 == {
        "libcuda.so.1": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "libcuda.so": "/usr/lib/x86_64-linux-gnu/libcuda.so",
        "libfoo.so.1": "/opt/v2/libfoo.so.1",  # first of the two
        "libnonutf\udcff.so": "/lib/\udce9t\udce9.so",
    }  # libc5-typed libold and the aarch64/i386 entries are gone
    assert lookup(entries, "i686") == {"libcuda.so.1": "/usr/lib/i386-linux-gnu/libcuda.so.1"}
    assert lookup(entries, "aarch64") == {
        "libaarch.so.1": "/usr/lib/aarch64-linux-gnu/libaarch.so.1"}
    # unknown arch bits: all libc6 entries, first per name
    anyarch = lookup(entries, "armv7l")
    assert anyarch["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert "libaarch.so.1" in anyarch and "libold.so.5" not in anyarch
    assert lookup(entries) == lookup(entries, platform.machine())
    assert lookup([]) == {}


def test_lookup_first_wins_even_if_later_differs():
    entries = [Entry("liba.so.1", "/first", LIBC6 | X8664, 0),
               Entry("liba.so.1", "/second", LIBC6 | X8664, 0)]
    assert lookup(entries, "x86_64") == {"liba.so.1": "/first"}
    assert lookup(entries[::-1], "x86_64") == {"liba.so.1": "/second"}


def test_entry_is_a_slotted_namedtuple():
    e = Entry("n", "p", 3, 0)
    assert e == ("n", "p", 3, 0) and e.path == "p"
    assert Entry.__slots__ == ()
    with pytest.raises(AttributeError):
        e.extra = 1


# ---------------------------------------------------------------------------
# Properties

names = st.binary(min_size=0, max_size=40).filter(lambda b: b"\0" not in b)
raw_entries = st.lists(st.tuples(
    names, names,
    st.integers(-2 ** 31, 2 ** 31 - 1),
    st.integers(0, 2 ** 64 - 1)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(raw_entries, st.sampled_from(["<", ">"]))
def test_round_trip_new(raw, order):
    assert parse(build_new(raw, order=order)) == as_entries(raw)


@settings(max_examples=200, deadline=None)
@given(raw_entries)
def test_round_trip_old(raw):
    data = build_old(raw)
    # the format's own ambiguity: a string area starting with the new magic reads as compat
    assume(b"glibc-ld.so.cache1.1" not in data[16 + 12 * len(raw):][:24])
    assert parse(data) == as_entries([(n, p, f, 0) for n, p, f, _h in raw])


@settings(max_examples=200, deadline=None)
@given(raw_entries, raw_entries, st.sampled_from([4, 8]))
def test_round_trip_compat(raw, old, align):
    assert parse(build_compat(raw, old_entries=old, align=align)) == as_entries(raw)


@settings(max_examples=300, deadline=None)
@given(raw_entries, st.sampled_from(["<", ">", "="]), st.lists(names.filter(bool), min_size=1, max_size=3))
def test_prefixes_select_what_the_full_parse_has(raw, order, prefixes):
    """parse(data, prefixes) reads only the rows whose name may start with a prefix (found
    by where the prefixes are in the data): the same rows as the whole parse, filtered."""
    # "=": written before the endianness flag existed (0): native order
    data = build_new(raw, endian=0) if order == "=" else build_new(raw, order=order)
    whole = parse(data)
    assert parse(data, tuple(prefixes)) == [e for e in whole if e.name.encode("utf-8", "surrogateescape").startswith(
        tuple(prefixes))]


def _check(data):
    try:
        out = parse(data)
    except LdCacheError:
        return None
    assert isinstance(out, list)
    for e in out:
        assert type(e) is Entry
        assert isinstance(e.name, str) and isinstance(e.path, str)
        assert isinstance(e.flags, int) and isinstance(e.hwcap, int)
    return out


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    _check(data)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([b"glibc-ld.so.cache1.1", b"ld.so-1.7.0\0"]), st.binary(max_size=300))
def test_arbitrary_bytes_after_magic(magic, rest):
    _check(magic + rest)


VALID = [build_new(SAMPLE), build_old(SAMPLE), build_compat(SAMPLE),
         build_compat(SAMPLE[:3], align=4)]
if os.path.isfile(NVIDIA_CACHE):
    with open(NVIDIA_CACHE, "rb") as _f:
        VALID.append(_f.read()[:4096])  # a real header + entries, strings mostly cut


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.data())
def test_mutated_valid_caches(data, draw):
    buf = bytearray(data)
    for _ in range(draw.draw(st.integers(0, 6))):
        kind = draw.draw(st.sampled_from(["byte", "u32", "insert", "delete"]))
        pos = draw.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "byte" and buf:
            buf[pos] = draw.draw(st.integers(0, 255))
        elif kind == "u32" and len(buf) >= 4:
            pos -= pos % 4
            pos = min(pos, len(buf) - 4)
            value = draw.draw(st.one_of(st.integers(0, 2 ** 32 - 1),
                                        st.integers(0, len(buf) + 64)))
            struct.pack_into("=I", buf, pos, value)
        elif kind == "insert":
            buf[pos:pos] = draw.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[pos:pos + draw.draw(st.integers(1, 8))]
    cut = draw.draw(st.integers(0, len(buf)))
    _check(bytes(buf[:cut]))
    _check(bytes(buf))


def test_prefixes_keep_only_the_names_asked_for_and_the_same_entries():
    """The NVIDIA probe reads only the names it looks for: the same entries as a full parse,
    filtered, from a real cache in each layout."""
    import tempfile

    for layout in ("new", "compat", "old"):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(f"{d}/etc")
            os.makedirs(f"{d}/lib")
            for lib in ("libz.so.1",):
                for src_dir in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64"):
                    if os.path.exists(f"{src_dir}/{lib}"):
                        shutil.copy(os.path.realpath(f"{src_dir}/{lib}"), f"{d}/lib/{lib}")
                        break
            with open(f"{d}/etc/ld.so.conf", "w") as f:
                f.write("/lib\n")
            subprocess.run(["ldconfig", "-r", d, "-c", layout, "-X"], check=True, capture_output=True)
            with open(f"{d}/etc/ld.so.cache", "rb") as f:
                data = f.read()
        full = ldcache.parse(data)
        assert [e for e in full if e.name.startswith("libz")] == ldcache.parse(data, (b"libz.so",)) != []
        assert ldcache.parse(data, (b"libcuda.so",)) == []
