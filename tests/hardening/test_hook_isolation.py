"""The createContainer hooks reach nothing of the host, magic links included (SECURITY.md).

A createContainer hook runs as root, in the container's mount namespace, before pivot_root,
with the container's /proc already mounted in the rootfs. A chroot (`ldconfig -r`) does not
stop procfs magic links: /proc/1/root inside it is the root of the container's init, which
is the node's / at that moment. Hostile images here point every path ldconfig opens (its aux
cache directory, ld.so.conf directories and includes, /etc itself, where the cache and its
temp file go) at host sentinel directories through each kind of magic link. Through real runc
(gpuhook-runtime) and through podman with gpuhook's CDI spec: the sentinels stay exactly as
they were (listing, content, mtime, inotify), and the container starts with the driver
libraries in its ld cache.

test_a_chroot_alone_lets_them_through builds gpuhook-hook with its isolation compiled out
(a chroot, as `ldconfig -r` did) and runs the same images: the sentinels change. That is
what makes the tests above able to fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import NO_CONFIG, gpuhook, needs_runc, records, requires
from conftest import plan_on
from gpuhook.probe.nodestate import find_ldconfig
from fakes import bundle as oci_bundle
from gpuhook import hook, spec as ocispec
from gpuhook import logline
from gpuhook.plan import request_from_spec
from gpuhook.probe import ldcache, probe
from fakes.hostwatch import Watch, snapshot, tree
from podman_cdi import PODMAN

pytestmark = needs_runc

# Each kind of magic link that could lead a path opened inside the rootfs to the host. Under a
# chroot, /proc/1/* are runc init's (its root and cwd are the node's); /proc/self and
# /proc/thread-self are ldconfig's own; fd links are whatever the processes hold open.
MAGIC = {
    "proc-1-root": "/proc/1/root",
    "proc-2-root": "/proc/2/root",
    "proc-self-root": "/proc/self/root",
    "proc-thread-self-root": "/proc/thread-self/root",
    "proc-1-cwd": "/proc/1/cwd" + "/.." * 24,
    "proc-self-cwd": "/proc/self/cwd" + "/.." * 24,
}
FD_LINKS = [f"{base}/{n}" for base in ("/proc/self/fd", "/dev/fd", "/proc/1/fd", "/proc/thread-self/fd")
            for n in range(12)]
# What each hostile image aims at, as (path in the image, how it points at the host)
TARGETS = ("auxcache", "ldsoconf", "include", "etc", "fds")


def host_sentinels(tmp_path, magic: str) -> str:
    """Host directories a hostile image aims at, with a real library (ldconfig would make its
    soname link there) and a conf file that an include would read (naming the library's
    directory through the same magic link)."""
    s = str(tmp_path / "host-sentinels")
    for d in ("auxdir", "libdir", "confdir", "etcdir"):
        os.makedirs(os.path.join(s, d))
    lib = ldcache_lib()
    shutil.copy(lib, os.path.join(s, "libdir", "libsentinel.so.7.1"))
    with open(os.path.join(s, "confdir", "evil.conf"), "w") as f:
        f.write(f"{magic}{s}/libdir\n")
    with open(os.path.join(s, "etcdir", "ld.so.conf"), "w") as f:
        f.write(f"{s}/libdir\n")
    return s


def ldcache_lib() -> str:
    """A real shared object with a soname (libz.so.1), renamed: ldconfig makes its soname link."""
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"):
        p = os.path.join(d, "libz.so.1")
        if os.path.exists(p):
            return os.path.realpath(p)
    raise AssertionError("no libz.so.1 on this machine")


def hostile_rootfs(rootfs: str, s: str, magic: str, target: str) -> None:
    """Make the image's `target` path lead to host sentinel `s` through `magic`."""
    host = lambda rel: magic + s + "/" + rel  # noqa: E731
    etc = os.path.join(rootfs, "etc")
    if target == "auxcache":  # ldconfig writes <aux cache dir>/aux-cache
        os.makedirs(os.path.join(rootfs, "var", "cache"), exist_ok=True)
        os.symlink(host("auxdir"), os.path.join(rootfs, "var", "cache", "ldconfig"))
    elif target == "ldsoconf":  # ldconfig scans the directory and makes soname links in it
        with open(os.path.join(etc, "ld.so.conf"), "w") as f:
            f.write(host("libdir") + "\n")
    elif target == "fds":  # whatever the processes hold open, as directories and includes
        with open(os.path.join(etc, "ld.so.conf"), "w") as f:
            f.writelines(f"{p}\ninclude {p}\n" for p in FD_LINKS)
    elif target == "include":
        with open(os.path.join(etc, "ld.so.conf"), "w") as f:
            f.write(f"include {host('confdir')}/*.conf\n")
    elif target == "etc":  # /etc/ld.so.cache~ is written and renamed in the host directory
        shutil.rmtree(etc)
        os.symlink(host("etcdir"), etc)


def check_untouched(s: str, before: dict, events: list[str], context: str) -> None:
    assert not events, f"{context}: host paths touched: {events}"
    after = snapshot(s)
    assert after == before, f"{context}: the host changed: " + ", ".join(
        sorted(set(after) ^ set(before)) or [p for p in after if after[p] != before.get(p)])


def cache_of(rootfs: str) -> dict:
    with open(os.path.join(rootfs, "etc", "ld.so.cache"), "rb") as f:
        return ldcache.lookup(ldcache.parse(f.read()))


CASES = [(m, t) for m in sorted(MAGIC) for t in TARGETS if t != "fds"] + [("proc-1-root", "fds")]


@pytest.mark.parametrize("magic,target", CASES)
def test_hostile_images_reach_nothing_of_the_host(make_host, runtime, tmp_path, magic, target):
    root = make_host("nvidia", mknod=True, gpus=2)
    rt = runtime(root)
    s = host_sentinels(tmp_path, MAGIC[magic])
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    rootfs = os.path.join(b, "rootfs")
    hostile_rootfs(rootfs, s, MAGIC[magic], target)
    before = snapshot(s)
    watch = Watch(tree(s))
    try:
        cid = f"magic-{magic}-{target}"
        r = rt.run(b, cid)
        events = watch.events()
    finally:
        watch.close()
    check_untouched(s, before, events, f"{magic} as {target}")
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and "accel=nvidia" in r.stdout, r.stdout + r.stderr
    recs = records(rt, cid)
    assert [r["decision"] for r in recs if r["event"] == "create"] == ["injected"]
    if target != "etc":  # the image's own /etc took the cache, with the driver libraries
        found = cache_of(rootfs)
        assert "libcuda.so.1" in found and "libz.so.1" not in found, sorted(found)
        assert [r for r in recs if r["event"] == hook.EVENT] == []
    else:  # /etc leads nowhere in the isolated root: ldconfig fails there, the container starts
        assert [(r["kind"], r["outcome"]) for r in recs if r["event"] == hook.EVENT] == [(hook.LDCACHE, "failed")]


def _run_unisolated(b: str, root: str, helper: str, cid: str, state: str) -> subprocess.CompletedProcess:
    """What gpuhook-runtime does (plan + spec.apply), with another gpuhook-hook, then runc."""
    path = os.path.join(b, "config.json")
    with open(path) as f:
        spec = json.load(f)
    edits = plan_on(probe(root), request_from_spec(spec, b), find_ldconfig(), helper=helper).edits
    assert [h.kind for h in edits.hooks] == [hook.LDCACHE]
    with open(path, "w") as f:
        json.dump(ocispec.apply(spec, edits), f)
    return subprocess.run(["runc", "--root", state, "run", "--bundle", b, cid], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@requires(bool(shutil.which("gcc")), "needs gcc to build gpuhook-hook without its isolation")
def test_a_chroot_alone_lets_them_through(make_host, tmp_path):
    """The removal check, automated: gpuhook-hook built with its isolation compiled out (a
    chroot only) lets the images above write in the host's directories."""
    src = os.path.join(os.path.dirname(hook.__file__), "gpuhook-hook.c")
    unsafe = str(tmp_path / "gpuhook-hook-chroot-only")
    subprocess.run(["gcc", "-static", "-O2", "-DGPUHOOK_TEST_WITHOUT_ISOLATION", "-o", unsafe, src],
                   check=True, capture_output=True)
    root = make_host("nvidia", mknod=True, gpus=2)
    state = str(tmp_path / "runc-state")
    escaped = {}
    for magic, target in (("proc-1-root", "auxcache"), ("proc-1-root", "ldsoconf"),
                          ("proc-1-root", "include"), ("proc-1-root", "etc")):
        s = host_sentinels(tmp_path / f"{magic}-{target}", MAGIC[magic])
        b = str(tmp_path / f"b-{magic}-{target}")
        oci_bundle.make_bundle(b, ["/bin/busybox", "true"])
        hostile_rootfs(os.path.join(b, "rootfs"), s, MAGIC[magic], target)
        before = snapshot(s)
        cid = f"unisolated-{target}"
        try:
            _run_unisolated(b, root, unsafe, cid, state)
        finally:
            subprocess.run(["runc", "--root", state, "delete", "--force", cid], capture_output=True)
        after = snapshot(s)
        escaped[target] = sorted(p[len(s):] for p in set(after) | set(before) if after.get(p) != before.get(p))
    # the aux cache lands in a host directory of the image's choosing; ldconfig makes links
    # among the host's libraries; the cache itself is written in a host directory
    assert "/auxdir/aux-cache" in escaped["auxcache"], escaped
    assert "/libdir/libz.so.1" in escaped["ldsoconf"], escaped
    assert "/libdir/libz.so.1" in escaped["include"], escaped
    assert "/etcdir/ld.so.cache" in escaped["etc"], escaped


def test_the_helper_refuses_a_dynamic_or_script_ldconfig(tmp_path):
    """After the pivot a dynamic ldconfig would load the image's loader and libc, a script the
    image's interpreter: as root. The helper checks before it isolates anything."""
    rootfs = tmp_path / "rootfs"
    oci_bundle.make_rootfs(str(rootfs))
    script = tmp_path / "ldconfig.sh"
    script.write_text("#!/bin/sh\ntouch /ran\n")
    script.chmod(0o755)
    for fake in (str(script), "/bin/true" if os.path.exists("/bin/true") else shutil.which("true")):
        r = subprocess.run([hook.package_helper(), hook.LDCACHE, str(rootfs), fake, "/usr/lib"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and "not a static ELF executable" in r.stderr, (fake, r.stderr)
    assert not (rootfs / "ran").exists()


# A static stand-in for ldconfig that syncs as ldconfig does before its rename, on a pipe:
# the kernel answers EINVAL there, so it exits 0 only when its syncs never reach the kernel.
SYNCS = r"""
#include <unistd.h>
int main(void) {
    int p[2];
    if (pipe(p) < 0)
        return 2;
    if (fsync(p[1]) != 0)
        return 3;
    return fdatasync(p[1]) != 0 ? 4 : 0;
}
"""


@requires(bool(shutil.which("gcc")), "needs gcc to build the stand-in")
def test_ldconfigs_syncs_are_answered_without_the_disk(tmp_path):
    """ldconfig fsyncs its new cache before the rename: on the node's disk that was most of the
    hook's time, for durability a container's writable layer does not need. The helper answers
    fsync and fdatasync with 0 for ldconfig (a seccomp filter); the stand-in, run as it is,
    shows that its syncs fail when they reach the kernel."""
    src, fake = tmp_path / "syncs.c", tmp_path / "ldconfig"
    src.write_text(SYNCS)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(fake), str(src)], check=True, capture_output=True)
    assert subprocess.run([str(fake)]).returncode == 3
    rootfs = tmp_path / "rootfs"
    oci_bundle.make_rootfs(str(rootfs))
    r = subprocess.run([hook.package_helper(), hook.LDCACHE, str(rootfs), str(fake), "/usr/lib"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stderr == "", r.stderr


# -- the container root from the OCI state (hook.ROOTFS_FROM_STATE: CDI specs, the NRI plugin) --

def _state_run(tmp_path, marker: str, state: str, config_text: str | None, root_path: str = "rootfs"):
    """The helper with ROOTFS_FROM_STATE, `state` on stdin, the bundle's config.json
    `config_text` (None: none written): (its result, the roots the marker ldconfig ran in)."""
    bundle = tmp_path / "bundle"
    for d in (bundle / "rootfs", tmp_path / "decoy" / "rootfs", tmp_path / "abs" / "merged"):
        d.mkdir(parents=True, exist_ok=True)
        (d / "found").unlink(missing_ok=True)
    if config_text is not None:
        (bundle / "config.json").write_text(config_text)
    r = subprocess.run([hook.package_helper(), hook.LDCACHE, hook.ROOTFS_FROM_STATE, marker, "/usr/lib"],
                       input=state.replace("@BUNDLE@", str(bundle)), capture_output=True, text=True, timeout=10)
    found = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.glob("**/found"))
    return r, found


STATE = '{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"@BUNDLE@","annotations":{}}'


@pytest.mark.parametrize("case", ["relative", "absolute (CRI-O's layout)", "env look-alike first",
                                  "annotations before root", "a nested root elsewhere", "state annotations first"])
def test_the_root_is_the_one_the_runtime_wrote(tmp_path, marker_ldconfig, case):
    """Every string a tenant sets (env, args, annotations, in the state or the config) is a value
    skipped whole: only the top-level "bundle" of the state and the top-level root.path of its
    config.json are taken, whatever comes before them."""
    decoy = str(tmp_path / "decoy" / "rootfs")
    state, root = STATE, "rootfs"
    config: dict = {"ociVersion": "1.2.0"}
    if case == "absolute (CRI-O's layout)":
        root = str(tmp_path / "abs" / "merged")
    elif case == "env look-alike first":
        config["process"] = {"env": [f'X="root":{{"path":"{decoy}"}}', "Y=}}]]\\\""], "args": ["{", "["]}
    elif case == "annotations before root":
        config["annotations"] = {"root": json.dumps({"path": decoy}), "bundle": decoy}
    elif case == "a nested root elsewhere":
        config["linux"] = {"root": {"path": decoy}, "x": [[{"root": {"path": decoy}}], 1.5e3, True, None]}
    else:
        state = ('{"annotations":{"bundle":"' + str(tmp_path / "decoy") + '","id":"x"},"ociVersion":"1.0.2",'
                 '"id":"c1","bundle":"@BUNDLE@"}')
    config["root"] = {"path": root, "readonly": False}
    config["mounts"] = [{"destination": "/root", "source": decoy}]
    r, found = _state_run(tmp_path, marker_ldconfig, state, json.dumps(config, indent=1))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert found == (["abs/merged"] if root.startswith("/") else ["bundle/rootfs"])


@pytest.mark.parametrize("case", ["no bundle", "a relative bundle", "a bundle with an escape", "no config.json",
                                  "config.json a link", "config.json cut short", "no root", "root.path empty",
                                  "root.path not a string", "not JSON"])
def test_no_root_the_runtime_wrote_is_one_line_and_the_container_starts(tmp_path, marker_ldconfig, case):
    """Whatever is missing or not as the runtime writes it: nothing of any root is touched, one
    line (and the node log's), exit 0."""
    state, config = STATE, json.dumps({"ociVersion": "1.2.0", "root": {"path": "rootfs"}})
    if case == "no bundle":
        state = '{"ociVersion":"1.0.2","id":"c1","annotations":{"bundle":"@BUNDLE@"}}'
    elif case == "a relative bundle":
        state = STATE.replace("@BUNDLE@", "bundle")
    elif case == "a bundle with an escape":
        state = STATE.replace("@BUNDLE@", "@BUNDLE@\\u002f")
    elif case == "no config.json":
        config = None
    elif case == "config.json a link":
        (tmp_path / "elsewhere.json").write_text(json.dumps({"root": {"path": str(tmp_path / "decoy" / "rootfs")}}))
        (tmp_path / "bundle").mkdir()
        (tmp_path / "bundle" / "config.json").symlink_to(tmp_path / "elsewhere.json")
        config = None
    elif case == "config.json cut short":
        config = '{"ociVersion":"1.2.0","process":{"env":["A=1"'
    elif case == "no root":
        config = json.dumps({"ociVersion": "1.2.0", "linux": {"root": {"path": "rootfs"}}})
    elif case == "root.path empty":
        config = json.dumps({"root": {"path": ""}})
    elif case == "root.path not a string":
        config = json.dumps({"root": {"path": ["rootfs"]}})
    else:
        state = "not json"
    r, found = _state_run(tmp_path, marker_ldconfig, state, config)
    assert r.returncode == 0 and found == [], (r.stderr, found)
    (line,) = r.stderr.splitlines()
    assert line.startswith("gpuhook: gpuhook-ldcache: ") and line.endswith("; skipped"), line


_json = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.dictionaries(st.sampled_from(["process", "annotations", "linux", "hooks", "mounts", "x"]), _json,
                              max_size=4),
       after=st.dictionaries(st.sampled_from(["hostname", "domainname", "y"]), _json, max_size=2),
       env=st.lists(st.text(), max_size=4), indent=st.sampled_from([None, 0, 2]))
def test_any_json_around_the_root_leaves_it_found(tmp_path, marker_ldconfig, before, after, env, indent):
    """Generated config.json (what a runtime manager could write: any values, any text in the
    tenant's strings, escapes and brackets included) around the real root: the helper finds
    exactly the root json.loads finds."""
    process = before.get("process")
    config = {**before, "process": {**(process if isinstance(process, dict) else {}), "env": env},
              "root": {"path": "rootfs", "readonly": True}, **after}
    text = json.dumps(config, indent=indent, ensure_ascii=False)
    assert json.loads(text)["root"]["path"] == "rootfs"
    r, found = _state_run(tmp_path, marker_ldconfig, STATE, text)
    assert r.returncode == 0 and r.stderr == "" and found == ["bundle/rootfs"], (text, r.stderr, found)


@pytest.mark.parametrize("argv", [[], ["ldcache"], ["ldcache", "relative", "/sbin/ldconfig", "/x"],
                                  ["bypath", "/r", "name"], ["bypath", "/r", "../x", "../card0"],
                                  ["bypath", "/r", "pci-1-card", "/etc/passwd"], ["nope", "/r", "a", "b"]])
def test_the_helper_refuses_bad_command_lines(argv):
    """One line that says so, and exit 0: a hook of gpuhook's own that is wrong never stops the
    container (runc fails the create on a hook's non-zero exit)."""
    r = subprocess.run([hook.package_helper(), *argv], capture_output=True, text=True, timeout=10)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 1 and lines[0].endswith("skipped"), r.stderr


# -- the CDI form (podman, containerd with CDI) ---------------------------------------------

@requires(bool(shutil.which("podman")), "needs podman (make test installs it)")
# (podman itself refuses a rootfs whose /etc leads nowhere: it writes /etc/hosts there)
@pytest.mark.parametrize("magic,target", [("proc-1-root", t) for t in TARGETS if t != "etc"]
                         + [("proc-2-root", "auxcache"), ("proc-1-cwd", "ldsoconf")])
def test_hostile_images_through_the_cdi_spec(make_host, tmp_path, cdi_specs, magic, target):
    """The CDI spec's hook finds the rootfs in the OCI state, then runs the same isolated
    helper: podman runs the hostile images with gpuhook.dev/gpu=all, nothing on the host
    changes, and the container's ld cache lists the driver libraries."""
    root = make_host("nvidia", mknod=True, gpus=2)
    out = tmp_path / "cdi"
    r = gpuhook("cdi", "generate", "--root", root, "--spec-root", root, "--output-dir", str(out),
                "--ldconfig", find_ldconfig() or "/sbin/ldconfig", "--kind", "gpu", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    text = (out / "gpuhook.dev-gpu.yaml").read_text()
    assert hook.NAME in text and hook.LDCACHE in text
    cdi_specs([str(out / "gpuhook.dev-gpu.yaml")])
    s = host_sentinels(tmp_path, MAGIC[magic])
    rootfs = str(tmp_path / "rootfs")
    oci_bundle.make_rootfs(rootfs)
    hostile_rootfs(rootfs, s, MAGIC[magic], target)
    before = snapshot(s)
    watch = Watch(tree(s))
    try:
        r = subprocess.run(PODMAN + ["--device", "gpuhook.dev/gpu=all", "--rootfs", rootfs, "sh", "-c",
                                     "echo accel=$GPUHOOK_ACCELERATOR"],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        events = watch.events()
    finally:
        watch.close()
    check_untouched(s, before, events, f"{magic} as {target}, through CDI")
    assert r.returncode == 0 and "accel=nvidia" in r.stdout, r.stderr
    found = cache_of(rootfs)
    assert "libcuda.so.1" in found and "libz.so.1" not in found, sorted(found)


def test_ldconfig_failing_never_stops_the_container(make_host, runtime):
    """An image whose /etc cannot take the cache (a directory where ldconfig writes its temp
    file): the helper says so, and the container starts, without the libraries in its cache."""
    root = make_host("nvidia", mknod=True, gpus=2)
    rt = runtime(root)
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    os.makedirs(os.path.join(b, "rootfs", "etc", "ld.so.cache~"))
    r = rt.run(b, "ldconfig-fails")
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and "accel=nvidia" in r.stdout, r.stdout
    assert not os.path.exists(os.path.join(b, "rootfs", "etc", "ld.so.cache"))


def test_the_helper_says_why_ldconfig_failed(tmp_path):
    rootfs = tmp_path / "rootfs"
    oci_bundle.make_rootfs(str(rootfs))
    (rootfs / "etc" / "ld.so.cache~").mkdir()
    r = subprocess.run([hook.package_helper(), hook.LDCACHE, str(rootfs), find_ldconfig(), "/usr/lib"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and f"ldconfig in {rootfs} failed" in r.stderr, r.stderr


def test_no_compiler_no_helper_and_one_line_that_says_so(tmp_path):
    """pip install builds the helper (setup.py -> build.sh): without a C compiler it fails
    with one line that says what to install, and leaves no half-written binary."""
    out = tmp_path / "gpuhook-hook"
    r = subprocess.run(["sh", os.path.join(os.path.dirname(hook.__file__), "build.sh"), str(out)],
                       env=dict(os.environ, CC="/nonexistent/cc"), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "needs a C compiler" in r.stderr.splitlines()[-1], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_volumes_in_the_container_are_not_written_by_the_hook(make_host, runtime, tmp_path):
    """A read-write bind mount in the container (a volume, a hostPath, gpuhook's own MPS
    directory) is the host's directory: the image's links and ld.so.conf aim ldconfig at it
    (its aux cache, a library directory to make soname links in). The helper makes every
    mount but the rootfs itself read-only in its namespace: nothing appears there, and the
    container still starts with its cache refreshed."""
    root = make_host("nvidia", mknod=True, gpus=2)
    rt = runtime(root)
    s = host_sentinels(tmp_path, "")
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    rootfs = os.path.join(b, "rootfs")
    with open(os.path.join(b, "config.json")) as f:
        spec = json.load(f)
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": s, "options": ["rbind", "rw"]})
    with open(os.path.join(b, "config.json"), "w") as f:
        json.dump(spec, f)
    os.makedirs(os.path.join(rootfs, "var", "cache"))
    os.symlink("/data/auxdir", os.path.join(rootfs, "var", "cache", "ldconfig"))
    with open(os.path.join(rootfs, "etc", "ld.so.conf"), "w") as f:
        f.write("/data/libdir\n")
    before = snapshot(s)
    watch = Watch(tree(s))
    try:
        r = rt.run(b, "volume-aimed")
        events = [e for e in watch.events() if not e.startswith(("open ", "access ", "close_nowrite "))]
    finally:
        watch.close()
    check_untouched(s, before, events, "a read-write volume in the container")
    assert r.returncode == 0 and "accel=nvidia" in r.stdout, r.stderr
    assert "libcuda.so.1" in cache_of(rootfs)


# -- the hook's outcome in the node log (issue 20 item 5) -----------------------------------

def _hook_records(rt, cid: str) -> list[dict]:
    return [r for r in rt.log_records() if r.get("event") == hook.EVENT and r.get("container_id") == cid]


@pytest.mark.parametrize("conf", ["fifo", "includes-itself"])
def test_a_hook_that_could_not_fill_the_ld_cache_says_so_in_the_node_log(make_host, runtime, conf):
    """An image whose ld.so.conf is a FIFO, or includes itself, keeps ldconfig busy until the
    helper's deadline; the container starts without the driver libraries in its cache. runc
    drops the hook's stderr when it exits 0: the node log's line (and `gpuhook log`) says so,
    for this container, beside its create line."""
    root = make_host("nvidia", mknod=True, gpus=1)
    rt = runtime(root)
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    etc = os.path.join(b, "rootfs", "etc")
    if conf == "fifo":
        if os.path.lexists(os.path.join(etc, "ld.so.conf")):
            os.unlink(os.path.join(etc, "ld.so.conf"))
        os.mkfifo(os.path.join(etc, "ld.so.conf"))
    else:  # each file includes itself and its neighbour: 2^depth includes (until EMFILE at ~1000)
        with open(os.path.join(etc, "ld.so.conf"), "w") as f:
            f.write("include /etc/ld.so.conf.d/*.conf\n")
        os.makedirs(os.path.join(etc, "ld.so.conf.d"), exist_ok=True)
        for name in ("a.conf", "b.conf"):
            with open(os.path.join(etc, "ld.so.conf.d", name), "w") as f:
                f.write("include /etc/ld.so.conf.d/*.conf\n")
    cid = f"ldconf-{conf}"
    r = rt.run(b, cid, timeout=60)
    assert r.returncode == 0 and "accel=nvidia" in r.stdout, r.stdout + r.stderr
    creates = [x for x in records(rt, cid) if x.get("event") == "create"]
    assert [x["decision"] for x in creates] == ["injected"]
    (line,) = _hook_records(rt, cid)
    assert line["kind"] == hook.LDCACHE and line["outcome"] == "timeout", line
    assert "driver libraries need LD_LIBRARY_PATH" in line["error"], line
    # gpuhook log: the create's row says the ld cache was not updated
    shown = gpuhook("log", "--file", rt.log, "--wide", timeout=30)
    row = [x for x in shown.stdout.splitlines() if cid in x]
    assert shown.returncode == 0 and len(row) == 1, shown.stdout + shown.stderr
    assert f"ldcache {line['outcome']}" in row[0] and "LD_LIBRARY_PATH" in row[0], row
    js = gpuhook("log", "--file", rt.log, "--json", timeout=30)
    (rec,) = [json.loads(x) for x in js.stdout.splitlines() if json.loads(x).get("container_id") == cid]
    assert rec["event"] == "create" and [h["outcome"] for h in rec["hook_errors"]] == [line["outcome"]], rec


def test_a_hook_that_did_its_work_writes_no_line(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=1)
    rt = runtime(root)
    r = rt.run(rt.bundle("b", ["/bin/busybox", "true"]), "ldcache-fine")
    assert r.returncode == 0, r.stderr
    assert [x["event"] for x in records(rt, "ldcache-fine")] == ["create"]


def _helper(argv, log: str, stdin: bytes = b"", cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([hook.package_helper(), *argv], input=stdin, capture_output=True, timeout=60,
                          env=dict(x.split("=", 1) for x in hook.env(log)), cwd=cwd)


def test_the_helpers_log_line_is_escaped_bounded_and_names_the_states_id(tmp_path):
    """The container id is the OCI state's top-level "id" (what the runtime wrote), never an
    "id" among the pod's annotations; quotes, newlines and non-ASCII bytes are escaped; the
    error is cut at 1000 characters; the line is one JSON object."""
    log = str(tmp_path / "gpuhook.log")
    state = json.dumps({"ociVersion": "1.0.2", "id": "abc-123", "status": "creating", "pid": 1,
                        "bundle": "/b", "annotations": {"id": "PLANTED", "x": "\"id\":\"PLANTED2\""}})
    bad = "relative\"\n\x01é" + "x" * 3000
    r = _helper(["bypath", "/r", bad, "../card0"], log, state.encode())
    assert r.returncode == 0
    # annotations first: still the top-level id; an id with a quote: escaped
    state2 = '{"annotations":{"id":"PLANTED"},"ociVersion":"1.0.2","id":"we\\"ird"}'
    _helper(["bypath", "/r", "../x", "../card0"], log, state2.encode())
    _helper(["nope"], log, b"not json")
    with open(log, "rb") as f:
        raw = f.read()
    lines = raw.decode("ascii").splitlines()  # every byte above 0x7e escaped
    assert len(lines) == 3
    recs = [json.loads(x) for x in lines]
    assert [x["event"] for x in recs] == [hook.EVENT] * 3 and [x["outcome"] for x in recs] == ["refused"] * 3
    assert recs[0]["container_id"] == "abc-123" and recs[0]["kind"] == hook.BYPATH
    assert len(recs[0]["error"]) <= 1000 and "relative\"\n\x01" in recs[0]["error"]
    assert recs[1]["container_id"] is None  # an id with an escape is not taken
    assert recs[2]["container_id"] is None and recs[2]["kind"] == "unknown"


def test_the_helpers_line_that_does_not_fit_leaves_nothing_for_the_next_to_join(full_disk):
    """gpuhook-hook's line on a full disk (logline.h, as the front's): the bytes that fit are
    undone (a blank line), stderr says so; the next line, once there is room, is whole."""
    log = os.path.join(full_disk.path, "gpuhook.log")
    full_disk.pad(log, slack=20)
    full_disk.fill()
    before = os.path.getsize(log)
    r = _helper(["nope"], log, b"not json")  # a bad command line: one "refused" line
    with open(log, "rb") as f:
        assert f.read()[before:] == b" " * 19 + b"\n"
    said_as = re.escape(logline.CANNOT_WRITE_LOG % (log, logline.SHORT_WRITE % (20, 999))).replace("999", r"\d+")
    assert len([x for x in r.stderr.decode().splitlines() if re.search(said_as, x)]) == 1, r.stderr
    full_disk.free()
    _helper(["nope"], log, b"not json")
    with open(log) as f:
        lines = [x for x in f.read().splitlines() if x.strip()]
    assert [json.loads(x)["event"] for x in lines] == ["pad", hook.EVENT]


@pytest.mark.parametrize("what", ["link", "fifo", "directory"])
def test_the_helper_never_writes_a_log_through_a_link_or_into_a_fifo(tmp_path, what):
    target = tmp_path / "elsewhere"
    target.write_text("")
    log = tmp_path / "gpuhook.log"
    if what == "link":
        log.symlink_to(target)
    elif what == "fifo":
        os.mkfifo(log)
    else:
        log.mkdir()
    r = _helper(["ldcache", "relative", "/sbin/ldconfig", "/x"], str(log))
    assert r.returncode == 0 and b"skipped" in r.stderr
    assert target.read_text() == ""
    if what == "link":
        assert log.is_symlink()


def test_the_log_is_opened_before_the_pivot(tmp_path):
    """The log file is the host's: opened before anything of the image is looked at, it is
    written after the pivot into the rootfs, where that path does not exist."""
    rootfs = tmp_path / "rootfs"
    oci_bundle.make_rootfs(str(rootfs))
    (rootfs / "etc" / "ld.so.cache~").mkdir()  # ldconfig fails, after the pivot
    log = str(tmp_path / "gpuhook.log")
    r = _helper(["ldcache", str(rootfs), find_ldconfig(), "/usr/lib"], log, b'{"id":"c1"}')
    assert r.returncode == 0 and b"failed" in r.stderr, r.stderr
    with open(log) as f:
        (rec,) = [json.loads(x) for x in f]
    assert rec["outcome"] == "failed" and rec["container_id"] == "c1" and str(rootfs) in rec["error"]
    assert not (rootfs / tmp_path.relative_to("/")).exists()
