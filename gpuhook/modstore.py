"""The host bundle's one-file module store: the compiled code of gpuhook's runtime modules.

A plain import of a module looks for it along sys.path (a stat and a directory listing per
directory), then opens and reads its .pyc: for the ~20 modules a create imports, most of a
millisecond on a slow node, on every container start. The host bundle (install/build.py)
also writes FILE next to gpuhook/__init__.py: the code of the modules the runtime may
import (those of the package but its other front ends, FRONT_ENDS), and a finder first on
sys.meta_path (install()) serves them from it, each with one pread. It also knows where the
stdlib's extension modules that gpuhook imports are (lib-dynload/_json...so: found there
without a search of sys.path, loaded as a plain import loads them). The entry that installs
it is gpuhook/startup.py.

The store holds exactly the code of the bundle's own .pyc files (the same marshalled bytes,
their header checked at build time), so a module served from it is the one a plain import
would load, with the same __file__, __path__ and __cached__. Like those unchecked .pyc files
(a .py changed without them runs the old code) it is part of the build: .pyc files changed
in a bundle without writing the store again (install/build.py: write_store) are not run. Layout, all of it written by
write() and read by read() only:

    the interpreter's importlib MAGIC_NUMBER (4 bytes)
    the index's length in bytes (4 bytes, little-endian)
    the index: one "name kind path pyc offset length" line per module (ASCII): kind m (a
      module), p (a package) or x (an extension module: no code here, pyc "-"); its files
      relative to the directory that holds site-packages/ (the base); offset and length of
      its code in the code blob
    the code blob: each module's marshalled code object

A store of another interpreter (another MAGIC_NUMBER), one that is missing, unreadable or
malformed, and any module it does not hold, whose code does not load or whose file is not
there (an extension module) mean plain imports: the store only ever makes a create cheaper,
never breaks one. Builtins and os only (os is frozen, and the runtime's anyway): this runs
before anything else of gpuhook's.
"""

import marshal
import os
import sys

FILE = "create-modules.bin"
# subpackages the runtime never imports (tests/unit/test_modstore.py checks a real create)
FRONT_ENDS = ("cli", "agent", "install", "testing")
# importlib's own, without importing importlib (None: not CPython's import system; no store)
_bootstrap = sys.modules.get("_frozen_importlib_external")
_MAGIC = getattr(_bootstrap, "MAGIC_NUMBER", None)
_ModuleSpec = type(sys.__spec__)
KINDS = ("m", "p", "x")


class Store:
    """A meta path finder and loader for the modules of one store file, read from `fd` one
    module at a time (pread: a create reads only the code it runs, into memory it reuses)."""

    def __init__(self, base: str, fd: int, index: dict):
        self.base = base  # the directory that holds site-packages/, with a trailing "/"
        self.fd = fd  # close-on-exec: it goes with the exec of the real runtime
        self.index = index  # name: (kind, path, pyc, offset, length)

    def find_spec(self, name, path=None, target=None):
        entry = self.index.get(name)
        if entry is None:
            return None
        kind, rel, pyc, offset, length = entry
        origin = self.base + rel
        if kind == "x":
            if not os.path.isfile(origin):
                return None
            spec = _ModuleSpec(name, _bootstrap.ExtensionFileLoader(name, origin), origin=origin)
            spec.has_location = True
            return spec
        try:
            data = os.pread(self.fd, length, offset)
            code = marshal.loads(data) if len(data) == length else None
        except (OSError, ValueError, EOFError, TypeError):
            code = None
        if type(code) is not _CodeType:
            return None  # a plain import, then
        spec = _ModuleSpec(name, self, origin=origin, is_package=kind == "p")
        spec.has_location = True
        spec.cached = self.base + pyc
        if kind == "p":
            spec.submodule_search_locations = [origin.rpartition("/")[0]]
        spec.loader_state = code
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        code = module.__spec__.loader_state
        module.__spec__.loader_state = None
        exec(code, module.__dict__)


def read(path: str, base: str) -> "Store | None":
    """The store in `path`, its files under `base`; None when it is not one this interpreter
    can use."""
    fd = -1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        head = os.pread(fd, 8, 0)
        if _MAGIC is None or head[:4] != _MAGIC or len(head) != 8:
            raise ValueError("not a module store of this interpreter")
        size = int.from_bytes(head[4:8], "little")
        start = 8 + size
        end = os.fstat(fd).st_size
        index = {}
        for line in os.pread(fd, size, 8).decode("ascii").splitlines():
            name, kind, rel, pyc, offset, length = line.split(" ")
            if kind not in KINDS or kind != "x" and not (name == "gpuhook" or name.startswith("gpuhook.")):
                raise ValueError(f"not a gpuhook module: {name}")
            if int(offset) < 0 or int(length) < 0 or start + int(offset) + int(length) > end:
                raise ValueError(f"{name}: out of the file")
            index[name] = (kind, rel, pyc, start + int(offset), int(length))
    except Exception:  # noqa: BLE001  (whatever is wrong with it, a store only costs plain imports)
        if fd >= 0:
            os.close(fd)
        return None
    return Store(base if base.endswith("/") else base + "/", fd, index)


_CodeType = type(read.__code__)  # types.CodeType, without importing types


def install(path: str, base: str) -> bool:
    """Put the store in `path` first on sys.meta_path; False (plain imports) when there is
    none this interpreter can use."""
    store = read(path, base)
    if store is None:
        return False
    sys.meta_path.insert(0, store)
    return True


def write(path: str, base: str, modules: dict[str, tuple[str, str, bytes]], extensions: dict[str, str]) -> None:
    """Write the store of `modules` (name: (its .py and .pyc files under `base`, its
    marshalled code)) and `extensions` (name: its file under `base`), byte for byte the same
    for the same modules. Build time (install/build.py)."""
    lines, blob = [], bytearray()
    prefix = base.rstrip("/") + "/"
    entries: dict[str, tuple[str, str, str | None, bytes]]
    entries = {n: ("p" if f.endswith("/__init__.py") else "m", f, pyc, c) for n, (f, pyc, c) in modules.items()}
    entries.update((n, ("x", f, None, b"")) for n, f in extensions.items())
    for name in sorted(entries):
        kind, file, pyc, code = entries[name]
        for p in (file, pyc or prefix):
            if not p.startswith(prefix) or " " in p or "\n" in p:
                raise ValueError(f"module store: {p} is not a plain path under {prefix}")
        rel = file[len(prefix) :]
        lines.append(f"{name} {kind} {rel} {pyc[len(prefix) :] if pyc else '-'} {len(blob)} {len(code)}\n")
        blob += code
    if _MAGIC is None:
        raise ValueError("module store: this interpreter has no importlib MAGIC_NUMBER")
    index = "".join(lines).encode("ascii")
    with open(path + ".tmp", "wb") as f:
        f.write(_MAGIC + len(index).to_bytes(4, "little") + index + blob)
    os.replace(path + ".tmp", path)  # a new file: never one linked into another bundle, written over
