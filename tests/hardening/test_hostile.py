"""Hostile input, through the installed gpuhook-runtime and real runc (root).

What a tenant controls: the image (its rootfs, its env) and the pod (annotations, env).
Whatever they put there, no gpuhook code runs theirs, nothing on the host outside the
container is created, changed or read because of it, and the container starts as the node
policy says (or fails with the real runtime's own error). What the node admin controls (the
node config) may be broken: containers still start, and the log says why. See SECURITY.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import is_root, needs_runc, records, requires, wrapper_path
from gpuhook.probe import ldcache
from fakes.hostwatch import Watch, snapshot, tree

pytestmark = needs_runc

HAVE_GCC = bool(shutil.which("gcc"))

def host_secrets(tmp_path) -> str:
    """Sentinel files and directories on the host, outside any container."""
    s = str(tmp_path / "host-secrets")
    files = {
        "ld.so.cache": b"SENTINEL ld.so.cache: never read, never replaced\n",
        "conf.d/evil.conf": f"{s}/libdir\n".encode(),
        "libdir/libsecret.so.1": b"SENTINEL library\n",
        "bindir/nvidia-smi": b"#!/bin/sh\necho SENTINEL binary\n",
        "secret.toml": b'fail_mode = "closed"\nruntime = "/nonexistent"\n',
        "etcdir/ld.so.conf": b"SENTINEL etc\n",
    }
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(s, rel)), exist_ok=True)
        with open(os.path.join(s, rel), "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(s, "emptydir"), exist_ok=True)
    return s


def log_lines_are_whole_json(path: str, max_len: int = 64 << 10) -> list[dict]:
    """Every line of the gpuhook log is one JSON object of bounded size."""
    with open(path, "rb") as f:
        data = f.read()
    assert data.endswith(b"\n"), "the log does not end with a whole line"
    out = []
    for line in data.split(b"\n")[:-1]:
        assert len(line) <= max_len, f"a log line of {len(line)} bytes: a pod can bloat the node log"
        rec = json.loads(line)
        assert isinstance(rec, dict) and rec.get("event") == "create", line[:200]
        out.append(rec)
    return out


def set_env(bundle_dir: str, env: list[str]) -> None:
    path = os.path.join(bundle_dir, "config.json")
    with open(path) as f:
        spec = json.load(f)
    spec["process"]["env"] = env
    with open(path, "w") as f:
        json.dump(spec, f)


# -- the image's env and files never reach gpuhook's hook ---------------------------------

EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
/* Loaded into any process: append that process's executable to MARKER (a host path). */
__attribute__((constructor)) static void gpuhook_evil(void) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
        if (n < 0) n = 0;
        exe[n++] = '\n';
        write(fd, exe, n);
        close(fd);
    }
}
unsigned int la_version(unsigned int v) { return v; } /* also a valid LD_AUDIT module */
"""

FAKE_TOOL = '#!/bin/sh\necho "$0 $*" >> {marker}\necho "$0 $*" >> /gpuhook-evil-ran\n'


@requires(HAVE_GCC, "needs gcc to build the image's shared object")
def test_image_env_and_tools_never_run_in_the_hook(make_host, runtime, tmp_path):
    """LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ENV, BASH_ENV and PATH of the image point at
    a shared object and fake `sh`/`ldconfig` in its rootfs (by /proc/self/cwd, which is the
    rootfs while createContainer hooks run, and by absolute host path). The ld-cache hook
    runs as root on the host before pivot_root: none of them may load or run in it."""
    root = make_host("nvidia", mknod=True, gpus=2)
    rt = runtime(root)
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    rootfs = os.path.join(b, "rootfs")
    markers = tmp_path / "markers"
    markers.mkdir()
    marker = str(markers / "evil-ran")
    evil_dir = os.path.join(rootfs, "evil")
    os.makedirs(evil_dir)
    src = str(tmp_path / "evil.c")
    with open(src, "w") as f:
        f.write(EVIL_C)
    so = os.path.join(evil_dir, "libgpuhookevil.so")
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", so, src], check=True,
                   capture_output=True)
    shutil.copy(so, os.path.join(rootfs, "evil.so"))
    with open(os.path.join(rootfs, "evilrc"), "w") as f:
        f.write(f"echo rc >> {marker}\n")
    for rel in ("evilbin/sh", "evilbin/ldconfig", "evilbin/ldconfig.real", "usr/local/sbin/ldconfig",
                "usr/local/bin/sh", "sbin/ldconfig", "sbin/ldconfig.real", "usr/sbin/ldconfig"):
        p = os.path.join(rootfs, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(FAKE_TOOL.format(marker=marker))
        os.chmod(p, 0o755)
    cwd = "/proc/self/cwd"
    set_env(b, [
        f"PATH={cwd}/evilbin:{rootfs}/evilbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"LD_PRELOAD={cwd}/evil.so {rootfs}/evil.so libgpuhookevil.so",
        f"LD_LIBRARY_PATH={cwd}/evil:{rootfs}/evil",
        f"LD_AUDIT={cwd}/evil.so",
        f"ENV={cwd}/evilrc", f"BASH_ENV={cwd}/evilrc",
    ])
    r = rt.run(b, "evil-env")
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and "accel=nvidia" in r.stdout, r.stdout
    ran = open(marker).read() if os.path.exists(marker) else ""
    assert not ran, f"the image's code ran on the host as root in: {ran.split()}"
    assert not os.path.exists(os.path.join(rootfs, "gpuhook-evil-ran")), "an image tool ran in the hook"
    # the hook did run (the node's ldconfig refreshed the container's cache), with an
    # explicit environment of its own
    with open(os.path.join(rootfs, "etc", "ld.so.cache"), "rb") as f:
        assert "libcuda.so.1" in ldcache.lookup(ldcache.parse(f.read()))
    with open(os.path.join(b, "config.json")) as f:
        hooks = json.load(f)["hooks"]["createContainer"]
    assert len(hooks) == 1 and "env" in hooks[0], hooks
    assert not [e for e in hooks[0]["env"] if e.split("=")[0] in ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "ENV", "BASH_ENV")]
    assert records(rt, "evil-env")[-1]["decision"] == "injected"


# -- links in the image that point at host paths ------------------------------------------

@pytest.mark.parametrize("style", ["absolute", "relative"])
def test_image_links_to_host_paths_touch_nothing_on_the_host(make_host, runtime, tmp_path, style):
    """/etc/ld.so.cache, /etc/ld.so.conf.d, /usr/lib/x86_64-linux-gnu (where the driver
    libraries are mounted) and /usr/bin (where nvidia-smi is mounted) of the image are
    links to sentinel files and directories on the host, as `/abs/path` or `../../../abs/path`.
    Nothing there is opened, read, written, created or removed; the container starts."""
    root = make_host("nvidia", mknod=True, gpus=2)
    rt = runtime(root)
    s = host_secrets(tmp_path)
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=$GPUHOOK_ACCELERATOR"])
    rootfs = os.path.join(b, "rootfs")
    with open(os.path.join(rootfs, "etc", "ld.so.conf"), "w") as f:
        f.write("include /etc/ld.so.conf.d/*.conf\n")
    links = {"etc/ld.so.cache": f"{s}/ld.so.cache", "etc/ld.so.conf.d": f"{s}/conf.d",
             "usr/lib/x86_64-linux-gnu": f"{s}/libdir", "usr/bin": f"{s}/bindir",
             "usr/lib64": f"{s}/emptydir", "etc/ld.so.preload": f"{s}/ld.so.cache"}
    for rel, target in links.items():
        link = os.path.join(rootfs, rel)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if style == "relative":  # climbs to the host's / when resolved on the host
            depth = len([p for p in os.path.dirname(link).split("/") if p])
            target = "../" * depth + target.lstrip("/")
            assert os.path.realpath(link.rsplit("/", 1)[0] + "/" + target) == os.path.realpath(links[rel])
        os.symlink(target, link)
    before = snapshot(s)
    watch = Watch(tree(s))
    try:
        r = rt.run(b, f"links-{style}")
        events = watch.events()
    finally:
        watch.close()
    assert not events, f"host paths touched through the image's links: {events}"
    assert snapshot(s) == before
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and "accel=nvidia" in r.stdout, r.stdout
    assert records(rt, f"links-{style}")[-1]["decision"] == "injected"
    # the container's own cache was refreshed, inside the rootfs
    with open(os.path.join(rootfs, "etc", "ld.so.cache"), "rb") as f:
        assert "libcuda.so.1" in ldcache.lookup(ldcache.parse(f.read()))


# -- annotations ----------------------------------------------------------------------------

MB = 1 << 20


def _annotation_cases(secret: str) -> dict[str, dict[str, str]]:
    up = "../" * 12
    return {
        "traversal": {
            "gpuhook.dev/vendors": up + secret.lstrip("/"),
            "gpuhook.dev/max-gpus": up + "etc/passwd",
            "gpuhook.dev/config": secret,
            "gpuhook.dev/policy": f"/proc/self/root{secret}",
            "gpuhook.dev/inject": up + "true",
            "gpuhook.dev/" + up + secret.lstrip("/"): "1",
        },
        "huge": {
            "gpuhook.dev/inject": "t" * MB,
            "gpuhook.dev/vendors": "nvidia," * (MB // 7),
            "gpuhook.dev/max-gpus": "9" * MB,
            "example.com/blob": "y" * MB,
        },
        "unknown": {**{f"gpuhook.dev/unknown-{i}": str(i) for i in range(200)},
                    "gpuhook.dev/": "", "": "", "gpuhook.dev/INJECT": "false", "GPUHOOK.DEV/inject": "false",
                    "gpuhook.dev/inject\u0000": "false", "gpuhook.dev/inject ": "false"},
        "surrogates": {"gpuhook.dev/inject": "\ud800false", "gpuhook.dev/vendors": "nvidia\udfff",
                       "gpuhook.dev/max-gpus": "\udc801", "gpuhook.dev/\ud800": "\udc80\udc80"},
        "injection": {
            "gpuhook.dev/vendors": 'nvidia"}\n{"event":"create","decision":"declined"}\n',
            "gpuhook.dev/max-gpus": '1\nfail_mode = "closed"\nruntime = "/nonexistent"\n[policy]\n',
            "gpuhook.dev/inject": 'true"\nlog_file = "/etc/passwd',
            "gpuhook.dev/gpus": "nvidia\u0000../../etc/shadow",
            "gpuhook.dev/nul": "\u0000",
        },
    }


# the sets that name no policy key in a form gpuhook could act on: the node's policy applies
NODE_POLICY_ONLY = {"unknown"}


@pytest.mark.parametrize("case", ["traversal", "huge", "unknown", "surrogates", "injection"])
def test_hostile_annotations(make_host, runtime, tmp_path, case):
    """Path traversal, 1 MB values, unknown keys, lone surrogates (what non-UTF-8 becomes in
    JSON text) and JSON/TOML injection in pod annotations: no crash, the container starts,
    one whole JSON log line with a decision, and no host path they name is read."""
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    rt = runtime(root)
    s = host_secrets(tmp_path)
    annotations = _annotation_cases(f"{s}/secret.toml")[case]
    # json.dump (ensure_ascii) writes lone surrogates as \udXXX escapes, as a CRI runtime may
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo accel=${GPUHOOK_ACCELERATOR:-none}"],
                  annotations=annotations)
    if case == "surrogates":
        assert "\\ud800" in open(os.path.join(b, "config.json")).read()
    before = snapshot(s)
    watch = Watch(tree(s))
    try:
        r = rt.run(b, f"ann-{case}", timeout=60)
        events = watch.events()
    finally:
        watch.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "started" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr
    assert not events, f"host paths named by annotations were touched: {events}"
    assert snapshot(s) == before
    recs = [x for x in log_lines_are_whole_json(rt.log) if x.get("container_id") == f"ann-{case}"]
    assert len(recs) == 1, recs
    decision = recs[0]["decision"]
    assert decision in ("injected", "declined"), recs[0]
    assert ("accel=nvidia" in r.stdout) == (decision == "injected"), (decision, r.stdout)
    if case in NODE_POLICY_ONLY:
        assert decision == "injected"


# -- config.json that gpuhook cannot or must not edit ----------------------------------------

def _spec_text(args=("/bin/busybox", "sh", "-c", "echo started; echo accel=${GPUHOOK_ACCELERATOR:-none}"), **kw) -> str:
    from fakes import bundle

    return json.dumps(bundle.spec(list(args), **kw), indent=1)


def _mutate(path: tuple, value):
    def make() -> bytes:
        from fakes import bundle

        spec = bundle.spec(["/bin/busybox", "sh", "-c", "echo started"])
        node = spec
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = value
        return json.dumps(spec).encode()
    return make


def _duplicate_keys() -> bytes:
    text = _spec_text()
    # a second "process" (Go merges the two, Python keeps the last: gpuhook must not pick one)
    # and a second "hostname"
    return text.replace('"hostname": "gpuhook"', '"hostname": "gpuhook", "hostname": "other"', 1).replace(
        '"process": {', '"process": {"args": ["/bin/busybox", "sh", "-c", "echo first"]}, "process": {', 1).encode()


BAD_SPECS = {
    "malformed": lambda: _spec_text().encode()[:700],
    "empty": lambda: b"",
    "whitespace": lambda: b"  \n",
    "not-an-object": lambda: b'["ociVersion", "1.0.2"]',
    "invalid-utf8": lambda: _spec_text().replace('"gpuhook"', '"gpu\\u00e9"').encode().replace(b"\\u00e9", b"\xff\xfe"),
    "nan": lambda: _spec_text().replace('"hard": 1024', '"hard": NaN').encode(),
    "trailing-garbage": lambda: _spec_text().encode() + b"\n{}",
    "deep-nesting": lambda: b'{"x": ' + b"[" * 200000 + b"]" * 200000 + b"}",
    "duplicate-keys": _duplicate_keys,
    "huge-50MB": lambda: _spec_text(annotations={"example.com/blob": "x" * (50 * MB)}).encode(),
    "devices-not-a-list": _mutate(("linux", "devices"), "/dev/nvidia0"),
    "device-not-an-object": _mutate(("linux", "devices"), ["/dev/nvidia0"]),
    "env-not-a-list": _mutate(("process", "env"), {"PATH": "/bin"}),
    "env-item-not-a-string": _mutate(("process", "env"), ["PATH=/bin", 7]),
    "mounts-not-a-list": _mutate(("mounts",), {"destination": "/x"}),
    "mount-not-an-object": _mutate(("mounts",), ["/proc"]),
    "rules-not-a-list": _mutate(("linux", "resources", "devices"), {"allow": False}),
    "rule-not-an-object": _mutate(("linux", "resources", "devices"), ["deny"]),
    "hooks-not-an-object": _mutate(("hooks",), ["/bin/true"]),
    "hook-stage-not-a-list": _mutate(("hooks",), {"createContainer": {"path": "/bin/true"}}),
    "process-not-an-object": _mutate(("process",), "sh"),
    "linux-not-an-object": _mutate(("linux",), ["x"]),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_config_json_is_left_to_the_real_runtime(make_host, runtime, case):
    """gpuhook never rewrites a config.json it cannot read exactly as the real runtime
    would: the file stays byte for byte (same inode), the log says error, and runc either
    reports its own error or starts the container unmodified."""
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["true"])
    path = os.path.join(b, "config.json")
    data = BAD_SPECS[case]()
    with open(path, "wb") as f:
        f.write(data)
    ino = os.lstat(path).st_ino
    r = rt.run(b, f"spec-{case}", timeout=60)
    with open(path, "rb") as f:
        assert f.read() == data, "gpuhook rewrote a config.json it must leave alone"
    assert os.lstat(path).st_ino == ino
    assert sorted(os.listdir(b)) == ["config.json", "rootfs"], "a temp file was left in the bundle"
    assert "Traceback" not in r.stderr
    recs = records(rt, f"spec-{case}")
    assert len(recs) == 1 and recs[0]["decision"] == "error" and recs[0]["error"], recs
    assert "accel=nvidia" not in r.stdout
    if r.returncode != 0:  # the real runtime's own words, on stderr or in its --log
        runc_log = rt.tmp / f"spec-{case}.runc.log"
        said = r.stderr + (runc_log.read_text() if runc_log.exists() else "")
        assert said.strip() and "gpuhook" not in said, said[-2000:]
    else:
        assert "started" in r.stdout


def test_config_json_symlink_is_not_followed(make_host, runtime, tmp_path):
    """A config.json that is a link (to a host file) is neither read nor replaced."""
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started"])
    target = str(tmp_path / "elsewhere.json")
    shutil.move(os.path.join(b, "config.json"), target)
    os.symlink(target, os.path.join(b, "config.json"))
    before = open(target, "rb").read(), os.stat(target).st_ino
    rt.run(b, "spec-link")
    assert os.path.islink(os.path.join(b, "config.json"))
    assert (open(target, "rb").read(), os.stat(target).st_ino) == before
    assert records(rt, "spec-link")[-1]["decision"] == "error"


def test_config_json_fifo_never_hangs_the_create(make_host, runtime, tmp_path):
    """A config.json that is a FIFO with no writer: opened non-blocking, refused as not a
    regular file, the create goes on to the runtime (here /bin/true: runc itself would wait
    on the FIFO, its own business)."""
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root, runtime="/bin/true")
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started"])
    os.unlink(os.path.join(b, "config.json"))
    os.mkfifo(os.path.join(b, "config.json"))
    rt.run(b, "spec-fifo", timeout=20)  # subprocess.TimeoutExpired if it hung
    rec = records(rt, "spec-fifo")[-1]
    assert rec["decision"] == "error" and "not a regular file" in rec["error"], rec


# -- a broken node config: fail open, and say why ------------------------------------------

def _write(path, data: bytes, mode: int = 0o644) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


NODE_CONFIGS = {
    # name: (make(path), what the log must say, or None where the defaults are no error)
    "missing": (lambda p: None, None),
    "empty": (lambda p: _write(p, b""), None),
    "mode-000": (lambda p: _write(p, b'fail_mode = "open"\n', 0o000), None if is_root() else "cannot read"),
    "not-toml": (lambda p: _write(p, b"this is { not toml\n"), "invalid TOML"),
    "bad-string": (lambda p: _write(p, b'runtime = "runc\nlog_file = 7\n'), "invalid TOML"),
    "not-utf8": (lambda p: _write(p, b'runtime = "\xff\xfe"\n'), "not UTF-8"),
    "nul-in-value": (lambda p: _write(p, b'log_file = "/var/log/gpuhook\\u0000.log"\nruntime = "ru\\u0000nc"\n'), "NUL"),
    "wrong-types": (lambda p: _write(p, b"runtime = 5\nfail_mode = [1]\nprobe_cache_ttl = nan\n"), "expected a string"),
    "directory": (lambda p: os.mkdir(p), "not a regular file"),
    "fifo": (lambda p: os.mkfifo(p), "not a regular file"),
    "dangling-link": (lambda p: os.symlink("/nonexistent/gpuhook.toml", p), None),
}


@requires(bool(shutil.which("unshare")), "needs unshare (util-linux)")
@pytest.mark.parametrize("case", sorted(NODE_CONFIGS))
def test_broken_node_config_fails_open(runtime, tmp_path, case):
    """Missing, empty, unreadable (a directory, a FIFO: it must not hang), invalid or
    wrong-typed node config: the container starts, and the log (at the default path, since
    the config that moves it is unusable) says why. The default /var/log is replaced by a
    private bind mount for the test."""
    rt = runtime("/")
    make, says = NODE_CONFIGS[case]
    os.unlink(rt.config)
    make(rt.config)
    varlog = tmp_path / "varlog"
    varlog.mkdir()
    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started"])
    cid = f"cfg-{case}"
    rt.ids.append(cid)
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
           'mount --bind "$0" /var/log && exec "$@"', str(varlog),
           wrapper_path(), "--root", rt.state, "run", "--bundle", b, cid]
    try:
        r = subprocess.run(cmd, env=rt.env, capture_output=True, text=True, errors="replace", timeout=20,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpuhook-runtime hung on a node config that is a {case}")
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout and "Traceback" not in r.stderr
    log = varlog / "gpuhook.log"
    assert log.exists(), "no log line at the default path"
    recs = [x for x in log_lines_are_whole_json(str(log)) if x.get("container_id") == cid]
    assert len(recs) == 1 and recs[0]["decision"] in ("no-gpu", "injected"), recs
    if says:
        warnings = " ".join(recs[0].get("warnings", []))
        assert says in warnings and rt.config in warnings, recs[0]


# -- the cache directory is trusted only for what gpuhook itself wrote ---------------------

def test_planted_cache_files_are_not_trusted(make_host, runtime, tmp_path, monkeypatch):
    """Cache files in GPUHOOK_CACHE_DIR that root did not write (a cache dir in a place a
    user can write) are ignored: a planted config cache naming another runtime, and a planted
    probe result naming another device. Control: the same files owned by root are used."""
    from gpuhook import config as gconfig
    from gpuhook.probe import cache as pcache

    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root)
    marker = tmp_path / "evil-runtime-ran"
    evil = tmp_path / "evil-runtime"
    evil.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec runc \"$@\"\n")
    evil.chmod(0o755)
    cache_dir = rt.env["GPUHOOK_CACHE_DIR"]
    os.makedirs(cache_dir)
    os.chown(cache_dir, 65534, 65534)  # a directory some user made first
    os.chmod(cache_dir, 0o755)
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", cache_dir)
    st = os.stat(rt.config)
    key = [os.path.abspath(rt.config), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    files = {
        gconfig._cache_file(key): {"key": key, "errors": [],
                                   "config": {"host_root": root, "log_file": rt.log, "runtime": str(evil)}},
    }
    import time

    from gpuhook.probe import probe

    inv = probe(root).to_plain()
    inv["vendors"][0]["devices"][0]["id"] = "PLANTED"
    files[pcache._file(cache_dir, root)] = {"fingerprint": pcache.fingerprint(root), "time": time.time(),
                                            "dirs": [], "dir_stats": [], "inventory": inv}

    def plant(owner: int, mode: int) -> None:
        for path, record in files.items():
            with open(path, "w") as f:
                json.dump(record, f)
            os.chown(path, owner, owner)
            os.chmod(path, mode)

    b = rt.bundle("b", ["/bin/busybox", "sh", "-c", "echo started; echo devices=$GPUHOOK_DEVICES"])
    plant(65534, 0o644)
    r = rt.run(b, "planted")
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "a runtime named by a planted cache file ran as root"
    assert "started" in r.stdout and "PLANTED" not in r.stdout and "devices=nvidia:GPU-" in r.stdout, r.stdout
    # the control: written by root, the same records are what gpuhook uses (so the test
    # above would see them if ownership were not checked)
    b2 = rt.bundle("b2", ["/bin/busybox", "sh", "-c", "echo started; echo devices=$GPUHOOK_DEVICES"])
    plant(0, 0o600)
    r = rt.run(b2, "rootowned")
    assert r.returncode == 0, r.stderr
    assert marker.exists() and "PLANTED" in r.stdout, r.stdout
