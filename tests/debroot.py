"""Debian roots for the tests: another release's userland, built once per machine.

A root is a `debootstrap --variant=minbase` tree cached outside the checkout
(/var/cache/gpuhook-test/<release>, or $GPUHOOK_TEST_ROOTS/<release>), rebuilt when it is
missing or stale: no stamp, a stamp for another package list, a key file gone, or older than
its release's age limit (sid moves every day, a stable release hardly at all). Builders and
users share one lock file per release: a rebuild never pulls a root from under a run.

Two users:
- `python3 tests/debroot.py suite` (`make test-other-release`): the whole suite, as CI runs
  it, in the other Debian release (12 <-> 13), with a real root (pivot_root) and its own PID
  namespace, so that every daemon the tests start dies with it.
- tests/e2e/test_sid_runtimes.py: the runtimes of Debian sid (containerd 2.x, runc 1.3, ...)
  started inside a sid root (`enter_argv`).

Where Debian's archive cannot be reached, `ensure` raises RootUnavailable with one line that
says so: the caller fails with it, never skips. The roots are test fixtures; gpuhook never
installs one on a node.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

CACHE = os.environ.get("GPUHOOK_TEST_ROOTS", "/var/cache/gpuhook-test")
MIRROR = os.environ.get("GPUHOOK_DEBIAN_MIRROR", "http://deb.debian.org/debian")
STAMP = ".gpuhook-root.json"
FORMAT = 1  # bump when what `ensure` puts into a root changes
DAY = 86400
MAX_AGE = {"sid": 7 * DAY, "unstable": 7 * DAY}
STABLE_MAX_AGE = 30 * DAY
# the other release of each Debian the suite runs on
OTHER_RELEASE = {"bookworm": "trixie", "trixie": "bookworm"}
# what the suite needs in a root besides the Makefile's APT_PACKAGES (passed in by make)
SUITE_PACKAGES = ("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "make", "git",
                  "ca-certificates", "busybox-static", "libc-bin",
                  "openssl", "curl", "xz-utils")  # the last three: tests that skip without them
HOST_FILES = ("/etc/resolv.conf", "/etc/ssl/certs/ca-certificates.crt")  # DNS, and pip's trust store
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RootUnavailable(RuntimeError):
    """A root could not be had; str() is one line for the user."""


def _lock(release: str, mode: int):
    os.makedirs(CACHE, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(CACHE, f".{release}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, mode)
    return fd


def path_of(release: str) -> str:
    return os.path.join(CACHE, release)


def _stamp(root: str) -> dict | None:
    try:
        with open(os.path.join(root, STAMP)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stale_reason(release: str, include: tuple[str, ...], must_have: tuple[str, ...] = (),
                 apt: tuple[str, ...] = ()) -> str | None:
    """Why the cached root of `release` cannot serve (None: it can)."""
    root = path_of(release)
    stamp = _stamp(root)
    if stamp is None:
        return "missing"
    if stamp.get("format") != FORMAT or stamp.get("release") != release:
        return "built by another version of tests/debroot.py"
    for field, wanted in (("include", include), ("apt", apt)):
        if set(wanted) - set(stamp.get(field, [])):
            return "built without " + " ".join(sorted(set(wanted) - set(stamp.get(field, []))))
    age = time.time() - float(stamp.get("built", 0))
    if age > MAX_AGE.get(release, STABLE_MAX_AGE):
        return f"built {age / DAY:.0f} days ago"
    for rel in ("usr/bin/apt-get", *must_have):
        if not os.path.lexists(os.path.join(root, rel.lstrip("/"))):
            return f"{rel} is gone"
    return None


def archive_reachable(release: str, timeout: float = 20) -> str | None:
    """None when the archive answers for `release`, else why not (one line)."""
    url = f"{MIRROR}/dists/{release}/Release"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            r.read(64)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"Debian's archive cannot be reached ({url}: {getattr(e, 'reason', e)})"
    return None


def _build(release: str, include: tuple[str, ...], apt: tuple[str, ...], log) -> None:
    root = path_of(release)
    why = archive_reachable(release)
    if why:
        raise RootUnavailable(f"cannot build the Debian {release} root: {why}")
    if shutil.which("debootstrap") is None:
        raise RootUnavailable(f"cannot build the Debian {release} root: no debootstrap "
                              "(apt-get install debootstrap)")
    new = f"{root}.new"
    _remove_tree(new)
    log(f"debootstrap {release} into {new} ({len(include)} packages; a few minutes)")
    including = ["--include=" + ",".join(sorted(set(include)))] if include else []  # none: no option
    r = subprocess.run(["debootstrap", "--variant=minbase", *including, release, new, MIRROR],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
        _remove_tree(new)
        raise RootUnavailable(f"cannot build the Debian {release} root: debootstrap exited "
                              f"{r.returncode}: {last}")
    # a sid Release file can be past its Valid-Until on these machines
    with open(os.path.join(new, "etc/apt/apt.conf.d/99gpuhook-test"), "w") as f:
        f.write('Acquire::Check-Valid-Until "false";\n')
    hosts = os.path.join(new, "etc/hosts")
    if not os.path.exists(hosts):  # containerd's RunPodSandbox opens it
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost\n")
    os.makedirs(os.path.join(new, ".oldroot"), exist_ok=True)
    if apt:
        # through apt-get inside, as `make deps` installs them on a machine (Recommends too:
        # trixie's docker.io brings its `docker` command, docker-cli, only that way); no
        # service starts (policy-rc.d), and whatever a postinst starts dies with the namespace
        log(f"apt-get install in {new}: {' '.join(apt)}")
        copy_host_files(new)
        policy = os.path.join(new, "usr/sbin/policy-rc.d")
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
        r = subprocess.run(enter_argv(new, "apt-get update -qq && apt-get install -y -qq " + shlex.join(apt),
                                      env={"DEBIAN_FRONTEND": "noninteractive"}),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True)
        os.unlink(policy)
        if r.returncode != 0:
            last = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
            _remove_tree(new)
            raise RootUnavailable(f"cannot build the Debian {release} root: apt-get install exited "
                                  f"{r.returncode}: {last}")
    with open(os.path.join(new, STAMP), "w") as f:
        json.dump({"format": FORMAT, "release": release, "include": sorted(set(include)),
                   "apt": sorted(set(apt)), "built": time.time(), "mirror": MIRROR}, f)
    old = f"{root}.old"
    _remove_tree(old)
    if os.path.lexists(root):
        os.rename(root, old)
    os.rename(new, root)
    _remove_tree(old)


def _remove_tree(path: str) -> None:
    if os.path.lexists(path):
        # nothing is mounted under a root outside a run (the runs mount in their own namespace)
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)


@contextlib.contextmanager
def ensure(release: str, include: tuple[str, ...], *, apt: tuple[str, ...] = (), must_have: tuple[str, ...] = (),
           exclusive: bool = False, log=lambda msg: print(f"debroot: {msg}", file=sys.stderr, flush=True)):
    """The cached root of `release` with `include` (debootstrap's --include) and `apt`
    (apt-get install inside, with Recommends) installed, (re)built when stale; held (shared,
    or exclusive when the caller changes the root) until the block ends. Blocks of one process
    share its one shared hold (flock locks belong to an open file: a second lock of the same
    process on another would wait for the first forever), closed when the last ends."""
    key = path_of(release)  # the root's place (a test may point CACHE elsewhere), not its name
    held = _HELD.get(key)
    if held and not exclusive:
        why = stale_reason(release, include, must_have, apt)
        if why:
            raise RootUnavailable(f"the Debian {release} root is held by this process and {why}: "
                                  "it cannot be rebuilt under itself")
        held[1] += 1
        try:
            yield key
        finally:
            _release(key)
        return
    # shared first: a root that can serve is only read, so two processes each holding one root
    # and asking for the other's never wait on each other; exclusive only to build one
    fd = _lock(release, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        why = stale_reason(release, include, must_have, apt)
        if why and not exclusive:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (a flock conversion is not atomic: check again)
            why = stale_reason(release, include, must_have, apt)
        if why:
            log(f"the {release} root at {path_of(release)} is {why}: building it")
            _build(release, include, apt, log)
            why = stale_reason(release, include, must_have, apt)
            if why:
                raise RootUnavailable(f"the Debian {release} root is still unusable after a build: {why}")
    except BaseException:
        os.close(fd)
        raise
    if exclusive:
        try:
            yield path_of(release)
        finally:
            os.close(fd)
        return
    fcntl.flock(fd, fcntl.LOCK_SH)
    _HELD[key] = [fd, 1]
    try:
        yield key
    finally:
        _release(key)


# release -> [fd, blocks]: the shared holds of this process (ensure)
_HELD: dict[str, list[int]] = {}  # a root's path -> [the open file of its shared lock, holders]


def _release(key: str) -> None:
    held = _HELD[key]
    held[1] -= 1
    if held[1] == 0:
        del _HELD[key]
        os.close(held[0])


def copy_host_files(root: str) -> None:
    """The host's DNS and CA bundle, so that pip (and apt) work inside."""
    for src in HOST_FILES:
        if os.path.exists(src):
            dst = os.path.join(root, src.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.lexists(dst):
                os.unlink(dst)  # a link into the root's own tree would be followed by copy
            shutil.copy(src, dst)


def enter_argv(root: str, inner: str, *, pid_namespace: bool = True, binds: tuple[tuple[str, str], ...] = (),
               env: dict[str, str] | None = None) -> list[str]:
    """argv that runs the shell command `inner` with `root` as its real root (pivot_root,
    not a chroot: runc's own pivot_root would leave a container on the host's /), in a
    private mount namespace (and a new PID namespace: everything started inside dies with
    its first process). /proc, /sys, /dev, a fresh /run and /tmp; `binds` (host dir, path in
    root) mounted after those, e.g. a host directory as /run to reach a daemon's socket."""
    r = shlex.quote(root)
    pre = [f"mount --rbind /sys {r}/sys", f"mount --rbind /dev {r}/dev"]
    # /proc first: umount reads /proc/self/mountinfo, and fails without it (the old root
    # would stay reachable at /.oldroot); any failure here stops the run
    post = ["mount -t proc proc /proc", "umount -l /.oldroot", "mount -t tmpfs tmpfs /run",
            "mount -t tmpfs tmpfs /tmp"]
    for i, (host, inside) in enumerate(binds):
        q = shlex.quote(inside)
        pre.append(f"mkdir -p {r}/.binds/{i} && mount --bind {shlex.quote(host)} {r}/.binds/{i}")
        post.append(f"mkdir -p {q} && mount --move /.binds/{i} {q}")
    environ = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **(env or {})}
    inner_env = " ".join(f"{k}={shlex.quote(v)}" for k, v in environ.items())
    stage2 = " && ".join(post) + f" && exec env -i {inner_env} /bin/sh -c {shlex.quote(inner)}"
    stage1 = " && ".join([*pre, f"mount --rbind {r} {r}", f"cd {r}", "pivot_root . .oldroot",
                          f"exec /bin/sh -c {shlex.quote(stage2)}"])
    flags = ["-m", "--propagation", "private"] + (["-p", "-f"] if pid_namespace else [])
    return ["unshare", *flags, "/bin/sh", "-c", stage1]


@contextlib.contextmanager
def overlay(lower: str, where: str):
    """A writable view of the root `lower` at WHERE/root (upper and work dirs beside it), for
    one test: the cached root itself is never written. Unmounted at the end."""
    merged, upper, work = (os.path.join(where, n) for n in ("root", "upper", "work"))
    for d in (merged, upper, work):
        os.makedirs(d, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "gpuhook-test-root", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", merged], check=True)
    try:
        yield merged
    finally:
        subprocess.run(["umount", "-l", merged], check=False)


# ---------------------------------------------------------------------------------------------
# make test-other-release


def host_release() -> str:
    try:
        with open("/etc/os-release") as f:
            fields = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return ""
    return fields.get("VERSION_CODENAME", "").strip('"')


def suite(checkout: str, release: str | None, apt_packages: tuple[str, ...]) -> int:
    if os.geteuid() != 0:
        print("test-other-release: needs root (debootstrap, mounts, pivot_root)", file=sys.stderr)
        return 2
    here = host_release()
    release = release or OTHER_RELEASE.get(here)
    if not release:
        print(f"test-other-release: no other release known for this host's Debian ({here or 'none'}); "
              "set RELEASE=<codename>", file=sys.stderr)
        return 2
    checkout = os.path.realpath(checkout)
    shared = os.path.join(os.path.dirname(checkout), "shared")
    try:
        with ensure(release, SUITE_PACKAGES, apt=apt_packages, must_have=("usr/bin/python3", "usr/bin/git"),
                    exclusive=True) as root:
            copy_host_files(root)
            src = os.path.join(root, "src")
            for name in ("gpuhook", "shared"):
                _remove_tree(os.path.join(src, name))
            os.makedirs(src, exist_ok=True)
            # the committed tree, as CI would see it
            subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", checkout, os.path.join(src, "gpuhook")],
                           check=True)
            if os.path.isdir(shared):
                shutil.copytree(shared, os.path.join(src, "shared"), symlinks=True)
            head = subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h %s"],
                                  capture_output=True, text=True).stdout.strip()
            print(f"test-other-release: CI=true bash .ci/run in Debian {release} ({root}) at {head}",
                  file=sys.stderr, flush=True)
            # the machine's cache at the same path inside: the suite's own roots (sid) are
            # built once per machine, not once per release
            argv = enter_argv(root, "cd /src/gpuhook && bash .ci/run", binds=((CACHE, CACHE),),
                              env={"CI": "true", "GPUHOOK_TEST_ROOTS": CACHE})
            return subprocess.run(argv, stdin=subprocess.DEVNULL).returncode
    except RootUnavailable as e:
        print(f"test-other-release: {e}", file=sys.stderr)
        return 1


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="tests/debroot.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("suite", help="run CI=true bash .ci/run in the other Debian release")
    s.add_argument("--release", default=os.environ.get("RELEASE") or None)
    s.add_argument("--checkout", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    s.add_argument("--apt-packages", default=os.environ.get("APT_PACKAGES", ""))
    a = p.parse_args(argv)
    return suite(a.checkout, a.release, tuple(a.apt_packages.split()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
