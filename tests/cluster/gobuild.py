"""Binaries of the real cluster built from the Go module proxy, cached by version.

`build(component)` returns the directory of a component's binaries (versions.COMPONENTS): from
the cache when they are there, else built by `go build` in the module under tests/cluster/build/
that pins it. The cache is keyed by the component's name, version and a digest of what decides
the build (its go.mod, go.sum, packages and flags): another version, or a changed pin, builds
into another directory; an unchanged one starts in milliseconds. The Go caches (GOMODCACHE,
GOCACHE) live beside it, so that a rebuild after a pin changed compiles only what changed. A
build goes into a temporary directory renamed into place when whole: a killed build leaves no
half-filled cache entry, and the next one removes what it left.

Where Go or the module proxy cannot be had, `build` raises Unavailable with one line that says
so: the cluster tests fail with it, never skip (as root).

The binaries are static (CGO_ENABLED=0, as Kubernetes' and etcd's own releases are), unless
their Component says cgo: what one Debian built runs in any other's root. `make
test-other-release` binds this cache into its root at the same path, so the other release runs
what the host built (the root has no Go).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from versions import COMPONENTS, Component

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = os.path.join(HERE, "build")  # one Go module per component: go.mod, go.sum, tools.go
CACHE = os.environ.get("GPUHOOK_TEST_ROOTS", "/var/cache/gpuhook-test")
BIN_CACHE = os.path.join(CACHE, "bin")
GO = os.environ.get("GPUHOOK_GO", "/usr/local/go/bin/go")
GO_ENV = {"GOMODCACHE": os.path.join(CACHE, "go", "mod"), "GOCACHE": os.path.join(CACHE, "go", "build")}
PROXY = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0].split("|")[0]
# -s -w: no symbol tables (a third of the size); -trimpath: no build machine's paths in them
FLAGS = ("-trimpath",)
STRIP = ("-s", "-w")
STAMP = ".built"  # written last inside a finished build: the cache entry is whole


class Unavailable(RuntimeError):
    """A component's binaries cannot be had; str() is one line for the user."""


def key(c: Component) -> str:
    """The cache entry's name: NAME-VERSION-DIGEST (what decides the build, digested)."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        with open(os.path.join(MODULES, c.module_dir, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    h.update(repr((c.module, c.version, c.packages, FLAGS, STRIP, c.ldflags, c.rename, c.tags, c.cgo)).encode())
    return f"{c.name}-{c.version}-{h.hexdigest()[:12]}"


def cached(c: Component) -> str | None:
    """The directory of a whole cached build of `c`, else None."""
    d = os.path.join(BIN_CACHE, key(c))
    return d if os.path.exists(os.path.join(d, STAMP)) else None


def proxy_reachable(module: str = "k8s.io/kubernetes", timeout: float = 20) -> str | None:
    """None when the Go module proxy answers for `module`, else why not (one line).
    GOPROXY=off or a file:// proxy: the go command is left to say."""
    if not PROXY.startswith(("http://", "https://")):
        return None
    escaped = "".join(f"!{ch.lower()}" if ch.isupper() else ch for ch in module)  # the proxy protocol's case-encoding
    url = f"{PROXY.rstrip('/')}/{escaped}/@v/list"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read(64)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"the Go module proxy cannot be reached ({url}: {getattr(e, 'reason', e)})"
    return None


@contextlib.contextmanager
def _locked(name: str):
    os.makedirs(BIN_CACHE, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(BIN_CACHE, f".{name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def go_build_argv(c: Component, out: str) -> list[str]:
    ldflags = " ".join((*STRIP, *c.ldflags))
    tags = ["-tags", ",".join(c.tags)] if c.tags else []
    return [GO, "build", *FLAGS, *tags, "-ldflags", ldflags, "-o", out + "/", *c.packages]


def build(c: Component | str, log=lambda msg: print(f"gobuild: {msg}", file=sys.stderr, flush=True)) -> str:
    """The directory holding c's binaries (c: a Component, or its name in versions.COMPONENTS),
    built first when the cache has none. Builders of one component wait on one lock: two runs
    never build it twice at once."""
    if isinstance(c, str):
        c = COMPONENTS[c]
    found = cached(c)
    if found:
        return found
    with _locked(c.name):
        found = cached(c)
        if found:  # another run built it while this one waited
            return found
        return _build(c, log)


def _build(c: Component, log) -> str:
    final = os.path.join(BIN_CACHE, key(c))
    if not os.access(GO, os.X_OK):
        raise Unavailable(f"cannot build {c.name} {c.version}: no Go toolchain at {GO} (set GPUHOOK_GO)")
    why = proxy_reachable(c.module)
    if why:
        raise Unavailable(f"cannot build {c.name} {c.version}: {why}")
    # what a killed build left (its temporary dirs), and an entry without its stamp
    for name in os.listdir(BIN_CACHE):
        if name.startswith(f".{c.name}-") and name.endswith(".tmp") or name == key(c):
            shutil.rmtree(os.path.join(BIN_CACHE, name), ignore_errors=True)
    tmp = os.path.join(BIN_CACHE, f".{key(c)}.{os.getpid()}.tmp")
    os.makedirs(tmp)
    env = dict(os.environ, **GO_ENV, CGO_ENABLED="1" if c.cgo else "0", PATH=os.path.dirname(GO) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("GOFLAGS", None)  # -mod=mod and the like would let go.sum change under the pin
    log(f"building {c.name} {c.version} ({len(c.packages)} commands) into {final}: "
        "minutes on 2 cores the first time (docs/testing.md), none after")
    started = time.monotonic()
    r = subprocess.run(go_build_argv(c, tmp), cwd=os.path.join(MODULES, c.module_dir), env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        last = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        raise Unavailable(f"cannot build {c.name} {c.version}: go build exited {r.returncode}: {last}")
    for old, new in c.rename:
        os.rename(os.path.join(tmp, old), os.path.join(tmp, new))
    with open(os.path.join(tmp, STAMP), "w") as f:
        f.write(f"{c.module} {c.version} built in {time.monotonic() - started:.0f} s\n")
    os.rename(tmp, final)
    log(f"built {c.name} {c.version} in {time.monotonic() - started:.0f} s")
    return final


def binary(component: str, name: str) -> str:
    """The path of one binary (`kubelet`, `etcd`, ...) of a component, built when missing."""
    path = os.path.join(build(component), name)
    if not os.access(path, os.X_OK):
        raise Unavailable(f"{component} {COMPONENTS[component].version} has no binary {name}")
    return path


if __name__ == "__main__":  # python3 tests/cluster/gobuild.py [NAME...]: build (or find) them
    for name in sys.argv[1:] or list(COMPONENTS):
        try:
            print(build(name))
        except Unavailable as e:
            print(f"gobuild: {e}", file=sys.stderr)
            sys.exit(1)
