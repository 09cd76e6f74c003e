"""Build the host bundle: gpuhook for a node that has no Python (packaging/build-bundle.sh).

A relocatable copy of the interpreter this runs on, its stdlib, gpuhook and gpuhook's
dependencies, and every shared library they load, glibc's dynamic loader and libc included:

    bin/gpuhook-runtime      the C front (containerd's BinaryName, CRI-O's runtime_path)
    bin/python3              sh: the bundled loader runs the bundled interpreter
    libexec/ld.so            the bundled loader (lib/ld-linux-*.so.*) under one name on every arch
    bin/gpuhook              sh: the gpuhook CLI (install, uninstall, probe...)
    libexec/python3          the interpreter (ELF)
    lib/ld-linux-*.so.*, lib/libc.so.6, ...
    lib/python3.X/           the stdlib (no tests, tkinter, idle...) and lib-dynload
    lib/python3.X/site-packages/   gpuhook and its dependencies
    gpuhook-bundle.json      what was built, and every file (install copies exactly these)

bin/python3 starts the interpreter through the bundled loader (`ld.so --library-path`), so
nothing is taken from the host's libc: the bundle runs on any Linux of its architecture
whatever its glibc version, and the library path does not leak into the runtime that
gpuhook-runtime execs next. Python finds its stdlib next to itself (lib/python3.X/os.py above
libexec/), so the bundle can live anywhere; it is installed as /opt/gpuhook.

The C front runs `$here/../libexec/ld.so --library-path $here/../lib $here/../libexec/python3`
itself (what bin/python3 does, one exec sooner: LOADER, INTERPRETER) and puts
`$here/../lib/python3*/site-packages` first on sys.path. Modules are compiled ahead
(unchecked-hash .pyc): a container create never compiles, and copying keeps them valid.
"""

from __future__ import annotations

import compileall
import json
import os
import platform
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from typing import Callable

import gpuhook
from gpuhook import defaults, hook

# the bundle's layout: layout.py's (the C front and `gpuhook nri --root` read it too)
from gpuhook.layout import INTERPRETER, LIB, LOADER, SITE_PACKAGES, launch

from . import InstallError

PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
# stdlib parts a node never needs (and the static libpython, 25 MB on Debian)
SKIP_STDLIB = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "lib2to3",
    "ensurepip",
    "distutils",
    "pydoc_data",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "sitecustomize.py",
    "venv",
    "sqlite3",
    "curses",
    "dbm",
}
SKIP_STDLIB_PREFIX = ("config-",)
# extension modules left out: tests, and those that pull big libraries gpuhook never uses
# (_ssl and _hashlib stay: the agent talks HTTPS to the Kubernetes API)
SKIP_DYNLOAD = re.compile(
    r"^(_test|_xxtest|xxlimited|_ctypes_test|_tkinter|_sqlite3|readline|_curses"
    r"|_dbm|_gdbm|nis|ossaudiodev|_crypt)"
)


PYTHON_SH = f"""#!/bin/sh
# The bundled Python, run by the bundled dynamic loader and libc: nothing comes from the host.
# $here resolved once: loader, libraries and interpreter of one installed version.
here=$(cd -P -- "${{0%/*}}" && pwd -P)
exec {" ".join(w if w.startswith("-") else f'"{w}"' for w in launch("$here/.."))} "$@"
"""

GPUHOOK_SH = f"""#!/bin/sh
# gpuhook's CLI from the bundle (no Python needed on the host).
here=$(dirname "$(readlink -f "$0")")
exec "$here/python3" {" ".join(defaults.RUNTIME_FLAGS)} '{defaults.CLI_MAIN}' \\
    "$here/../{LIB}/{{py}}/{SITE_PACKAGES}" "$@"
"""


def _libs(paths: list[str]) -> tuple[dict[str, str], str]:
    """({soname: path} of every shared library `paths` need, the loader's file name), by ldd."""
    libs: dict[str, str] = {}
    loader = None
    for p in paths:
        out = subprocess.run(["ldd", p], capture_output=True, text=True).stdout
        for line in out.splitlines():
            line = line.strip()
            m = re.match(r"(\S+) => (/\S+) \(", line)
            if m:
                libs[m.group(1)] = m.group(2)
            elif line.startswith("/") and "=>" not in line:  # the dynamic loader itself
                path = line.split()[0]
                loader = os.path.basename(path)
                libs[loader] = path
            elif "not found" in line:
                raise InstallError(f"bundle build: {p} needs {line.split()[0]}, which is not on this machine")
    if loader is None:
        raise InstallError(
            "bundle build: the interpreter is not dynamically linked; this builder needs ldd's view of it"
        )
    return libs, loader


def _requirements(root: str) -> list[str]:
    """gpuhook's dependencies, from pyproject.toml next to the package (else its metadata)."""
    pyproject = os.path.join(root, "pyproject.toml")
    if os.path.exists(pyproject):
        with open(pyproject, "rb") as f:
            return list(tomllib.load(f)["project"].get("dependencies", []))
    try:
        reqs = metadata.requires("gpuhook")
    except metadata.PackageNotFoundError:
        reqs = None
    if reqs is None:
        raise InstallError(
            f"bundle build: gpuhook's dependencies are unknown: no pyproject.toml next to {root}/gpuhook "
            f"and no installed gpuhook metadata for {sys.executable} (pip install it)"
        )
    return [r for r in reqs if "extra ==" not in r]


def _wanted(req: str, extras: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]] | None:
    """(the distribution a requirement names, the extras it asks of it), or None when its
    marker excludes this Python. `extras`: those asked of the distribution that has this
    requirement (a requirement under `extra == "http2"` counts when http2 was asked)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        try:  # pip's copy: a venv made by `python -m venv` has pip but not packaging
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
        except ImportError:
            Requirement = None  # type: ignore[assignment,misc]
    if Requirement is None:  # no marker evaluation: only the extras are told apart
        name, _, marker = req.partition(";")
        found = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if found and found.group(1) not in extras or (not found and "extra" in marker):
            return None
        wanted = re.search(r"\[([^\]]*)\]", name)
        return (
            re.split(r"[<>=!~\[ (;]", name.strip(), maxsplit=1)[0],
            tuple(e.strip() for e in wanted.group(1).split(",") if e.strip()) if wanted else (),
        )
    r = Requirement(req)
    if r.marker is not None and not any(r.marker.evaluate({"extra": e}) for e in ("", *extras)):
        return None
    return r.name, tuple(sorted(r.extras))


def _distributions(reqs: list[str]) -> list[metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra or "") followed
    # (name, extras, whether a marker was on it: one not installed is then taken as excluded,
    # which matters only to the fallback parser, which cannot evaluate markers)
    todo = [(*w, ";" in r) for r, w in ((r, _wanted(r)) for r in reqs) if w]
    while todo:
        name, extras, marked = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        asked = tuple(e for e in ("", *extras) if (key, e) not in done)
        if not asked:
            continue
        done.update((key, e) for e in asked)
        dist = seen.get(key)
        if dist is None:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                if marked:
                    continue
                raise InstallError(
                    f"bundle build: {name} (a gpuhook dependency) is not installed for {sys.executable}"
                ) from None
            seen[key] = dist
        todo.extend((*w, ";" in r) for r, w in ((r, _wanted(r, extras)) for r in dist.requires or []) if w)
    return list(seen.values())


def _copy_tree(src: str, dst: str, skip) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        dirnames[:] = [d for d in dirnames if not skip(d)]
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for name in filenames:
            s = os.path.join(dirpath, name)
            if skip(name) or not os.path.exists(s):  # dangling links (Debian's sitecustomize)
                continue
            shutil.copy2(s, os.path.join(dst, rel, name))


def _build_program(pkg: str, out: str, src: str) -> None:
    """One of gpuhook's static programs (the hooks' helper, the runtime's front), as setup.py builds it."""
    r = subprocess.run(["sh", os.path.join(pkg, "hook", "build.sh"), out, src], capture_output=True, text=True)
    if r.returncode != 0:
        what = os.path.basename(out)
        raise InstallError("bundle build: " + (r.stderr.strip().splitlines() or [f"{what} did not build"])[-1])


def build(out: str, progress: Callable[[str], None] | None = None) -> dict:
    """Build the bundle in `out` (replaced when it exists); its manifest record. `progress`
    gets one line as each step starts."""
    say = progress or (lambda line: None)
    if shutil.which("ldd") is None:
        raise InstallError("bundle build: ldd not found (apt-get install libc-bin)")
    if os.path.exists(out):
        shutil.rmtree(out)
    pkg = os.path.dirname(os.path.abspath(gpuhook.__file__))
    exe = os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)
    pylib = os.path.join(out, LIB, PY)
    site = os.path.join(pylib, SITE_PACKAGES)
    _copy_stdlib(pylib, say)
    dists = _copy_packages(pkg, out, site, say)
    loader = _copy_interpreter(exe, out, say)
    _write_programs(pkg, out, site, say)
    _compile(out, pylib, say)
    record = {
        "gpuhook": gpuhook.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "libc": "-".join(platform.libc_ver()),
        # the interpreter's PT_INTERP (lib/<loader> is that file): where an image with no
        # distribution links the loader, so libexec/python3 also runs without bin/python3
        "loader": loader,
        "packages": sorted(f"{d.metadata['Name']}=={d.version}" for d in dists),
    }
    names = []
    for dirpath, _, filenames in os.walk(out):
        names += [os.path.relpath(os.path.join(dirpath, n), out) for n in filenames]
    record["files"] = sorted(names + ["gpuhook-bundle.json"])
    with open(os.path.join(out, "gpuhook-bundle.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record


def _copy_stdlib(pylib: str, say: Callable[[str], None]) -> None:
    """This Python's standard library, but what the bundle never runs (SKIP_STDLIB...)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    dynload = sysconfig.get_config_var("DESTSHARED") or os.path.join(stdlib, "lib-dynload")
    say(f"copying the standard library of Python {platform.python_version()} ({stdlib})")
    _copy_tree(
        stdlib,
        pylib,
        lambda n: (
            n in SKIP_STDLIB or n.startswith(SKIP_STDLIB_PREFIX) or n == "lib-dynload" or n.endswith((".pyc", ".pyo"))
        ),
    )
    os.makedirs(os.path.join(pylib, "lib-dynload"), exist_ok=True)
    for name in sorted(os.listdir(dynload)):
        if name.endswith(".so") and not SKIP_DYNLOAD.match(name):
            shutil.copy2(os.path.join(dynload, name), os.path.join(pylib, "lib-dynload", name))


def _copy_packages(pkg: str, out: str, site: str, say: Callable[[str], None]) -> list[metadata.Distribution]:
    """gpuhook (this package directory, whatever it holds) and its dependencies (from this
    Python) into site-packages; the distributions copied."""
    dists = _distributions(_requirements(os.path.dirname(pkg)))
    say(
        f"copying gpuhook {gpuhook.__version__} ({pkg}) and its dependencies: "
        + ", ".join(sorted(f"{d.metadata['Name']} {d.version}" for d in dists))
    )
    _copy_tree(pkg, os.path.join(site, "gpuhook"), lambda n: n == "__pycache__" or n.endswith(".pyc"))
    # the hooks' helper (gpuhook/hook/): built here when this gpuhook was not, and a copy at
    # libexec/ for the CDI specs, which name it by the bundle's path on the node
    helper = os.path.join(site, "gpuhook", "hook", hook.NAME)
    if not os.access(helper, os.X_OK):
        say("building gpuhook-hook (gpuhook/hook/build.sh)")
        _build_program(pkg, helper, helper + ".c")
    os.makedirs(os.path.join(out, os.path.dirname(hook.BUNDLE_PATH)), exist_ok=True)
    shutil.copy2(helper, os.path.join(out, hook.BUNDLE_PATH))
    for dist in dists:
        for pp in dist.files or []:
            skip = pp.parts[0] == ".." or "__pycache__" in pp.parts or pp.name.endswith(".pyc")
            if skip or pp.parts[0].startswith("gpuhook"):
                continue
            src = str(dist.locate_file(pp))
            if os.path.isfile(src):
                os.makedirs(os.path.join(site, os.path.dirname(str(pp))), exist_ok=True)
                shutil.copy2(src, os.path.join(site, str(pp)))
    return dists


def _copy_interpreter(exe: str, out: str, say: Callable[[str], None]) -> str:
    """The interpreter and every shared library anything in the bundle loads, glibc's
    included; the loader's path as the interpreter names it (its PT_INTERP)."""
    lib = os.path.join(out, "lib")
    os.makedirs(os.path.join(out, "libexec"), exist_ok=True)
    shutil.copy2(exe, os.path.join(out, INTERPRETER))
    objects = [exe] + [os.path.join(d, n) for d, _, names in os.walk(lib) for n in names if ".so" in n]
    say(f"copying the interpreter ({exe}) and the shared libraries of {len(objects)} objects, glibc's loader included")
    libs, loader = _libs(objects)
    for soname, path in sorted(libs.items()):
        shutil.copy2(path, os.path.join(lib, soname))  # follows links: the real file, named as asked
    shutil.copy2(os.path.join(lib, loader), os.path.join(out, LOADER))  # a copy: install copies files, not links
    return libs[loader]


def _write_programs(pkg: str, out: str, site: str, say: Callable[[str], None]) -> None:
    """bin/: python3 and gpuhook (scripts), and gpuhook-runtime, the runtime's front
    (gpuhook/runtime/gpuhook-runtime.c), built here when this gpuhook was not."""
    os.makedirs(os.path.join(out, "bin"))
    for name, text in (("python3", PYTHON_SH), ("gpuhook", GPUHOOK_SH.format(py=PY))):
        with open(os.path.join(out, "bin", name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(out, "bin", name), 0o755)
    front = os.path.join(site, "gpuhook", "runtime", "gpuhook-runtime")
    if not os.access(front, os.X_OK):
        say("building gpuhook-runtime (gpuhook/hook/build.sh)")
        _build_program(pkg, front, front + ".c")
    shutil.copy2(front, os.path.join(out, "bin", "gpuhook-runtime"))
    os.chmod(os.path.join(out, "bin", "gpuhook-runtime"), 0o755)


def _compile(out: str, pylib: str, say: Callable[[str], None]) -> None:
    """Every module compiled ahead, with the paths they will have on the node (for tracebacks)."""
    say(f"compiling {sum(n.endswith('.py') for _, _, names in os.walk(pylib) for n in names)} modules ahead")
    ok = compileall.compile_dir(
        pylib,
        quiet=2,
        workers=0,
        stripdir=out,
        prependdir=defaults.INSTALL_PREFIX,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    if not ok:
        print("build-bundle: some modules did not compile (left as source)", file=sys.stderr)


def describe(record: dict, out: str) -> str:
    """What a built bundle is, in one line: versions, file count, size."""
    size = sum(os.lstat(os.path.join(out, f)).st_size for f in record["files"])
    return (
        f"gpuhook {record['gpuhook']}, Python {record['python']} ({record['machine']}, {record['libc']}), "
        f"{len(record['files'])} files, {size / 1e6:.1f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpuhook.install.build OUT_DIR", file=sys.stderr)
        return 2
    out = os.path.abspath(args[0])
    try:
        record = build(out)
    except InstallError as e:
        print(f"build-bundle: {e}", file=sys.stderr)
        return 1
    print(f"bundle: {args[0]}: {describe(record, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
