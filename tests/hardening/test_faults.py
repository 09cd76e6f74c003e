"""Faults on the create path: the wrapper killed at any moment, stale temp files of killed
writers, a full disk, a real runtime that is missing or cannot run. Nothing is lost (config.json
is the old or the new whole file, never a torn one) and nothing stops the next create."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from conftest import is_root, needs_runc, nodes_of, requires, wrapper_path
from fakes.front import parse_cache_file, prime
from fakes import bundle
from gpuhook.fsutil import write_atomic

SHOW = ("echo started; echo accel=${GPUHOOK_ACCELERATOR:-none}; "
        "for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T' $n; done; true")


def all_gpus(out: str, gpus: int) -> bool:
    nodes = nodes_of(out)
    return all(nodes.get(f"/dev/nvidia{m}") == (195, m) for m in range(gpus)) and \
        nodes.get("/dev/nvidiactl") == (195, 255)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def put(path, data: bytes) -> None:
    """The test's own (non-atomic) write: nothing else runs while it writes."""
    with open(path, "wb") as f:
        f.write(data)


def cache_files_parse(cache_dir: str) -> list[str]:
    """Every cache file and exec record (not the hidden temp files of writers) is whole JSON."""
    names = []
    for d, _, files in sorted(os.walk(cache_dir)):
        for name in sorted(files):
            if not name.startswith("."):
                parse_cache_file(name, read(os.path.join(d, name)))
                names.append(os.path.relpath(os.path.join(d, name), cache_dir))
    return names


def log_lines_parse(path: str) -> int:
    if not os.path.exists(path):
        return 0
    data = read(path)
    assert not data or data.endswith(b"\n"), "a torn last log line"
    lines = data.splitlines()
    for line in lines:
        assert isinstance(json.loads(line), dict), line
    return len(lines)


# -- SIGKILL of the real wrapper at random moments -----------------------------------------

@needs_runc
def test_sigkill_at_random_moments_leaves_old_or_new_config(make_host, runtime, tmp_path):
    """The installed gpuhook-runtime (front, Python, write, exec) SIGKILLed 120 times at
    random moments over the whole of a create: every time config.json is the old or the new
    whole file, the caches parse, the log has only whole lines; then a create through real
    runc on the same bundle, among whatever the killed ones left, injects all GPUs."""
    root = make_host("nvidia", mknod=True, gpus=8)
    rt = runtime(root, runtime="/bin/true")  # the kills target gpuhook, not runc
    b = rt.bundle("b", ["sh", "-c", SHOW])
    path = os.path.join(b, "config.json")
    old = read(path)
    argv = [wrapper_path(), "--root", rt.state, "create", "--bundle", b, "killed"]
    cache_dir = rt.env["GPUHOOK_CACHE_DIR"]
    took = []
    for _ in range(3):  # what gpuhook writes, and how long a whole create takes
        put(path, old)
        shutil.rmtree(cache_dir, ignore_errors=True)
        t = time.monotonic()
        subprocess.run(argv, env=rt.env, check=True, capture_output=True)
        took.append(time.monotonic() - t)
    new = read(path)
    assert new != old and json.loads(new)["hooks"]["createContainer"]
    window = max(0.030, 1.3 * max(took))
    rng = random.Random(5)
    seen = {"old": 0, "new": 0}
    for i in range(120):
        put(path, old)
        if i % 2:
            shutil.rmtree(cache_dir, ignore_errors=True)  # half the time the caches are written too
        p = subprocess.Popen(argv, env=rt.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, window))
        p.send_signal(signal.SIGKILL)
        p.wait()
        data = read(path)
        assert data in (old, new), f"kill {i}: config.json is neither the old nor the new file: {data[:200]!r}"
        seen["old" if data == old else "new"] += 1
        cache_files_parse(cache_dir)
        log_lines_parse(rt.log)
    assert seen["old"] and seen["new"], f"the kills never landed on one side of the rename: {seen}"
    # the next create, among the leftovers, through real runc
    rt2 = runtime(root)
    put(path, old)
    r = rt2.run(b, "after-kills")
    assert r.returncode == 0, r.stderr
    assert all_gpus(r.stdout, 8) and "accel=nvidia" in r.stdout, r.stdout
    assert rt2.log_records()[-1]["decision"] == "injected"


# -- SIGKILL at every step of the write, deterministically --------------------------------

# every os call the create path makes to write a file (config.json, the caches, the log)
WRITE_CALLS = ("open", "write", "fchmod", "fsync", "close", "rename", "replace", "unlink", "mkdir",
               "ftruncate", "truncate")


def _create_killed_at(n: int, argv: list[str], env: dict) -> int:
    """Fork; the child runs gpuhook.runtime.main() and SIGKILLs itself on its n-th os write
    call. Returns the child's wait status."""
    from gpuhook import runtime

    pid = os.fork()
    if pid == 0:
        try:
            os.environ.update(env)
            count = [0]
            for name in WRITE_CALLS:
                real = getattr(os, name, None)
                if real is None:
                    continue

                def call(*a, _real=real, **k):
                    count[0] += 1
                    if count[0] == n:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return _real(*a, **k)
                setattr(os, name, call)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            runtime.main(argv)  # ends in exec of the "runtime" /bin/true
        finally:
            os._exit(3)
    return os.waitpid(pid, 0)[1]


@requires(bool(shutil.which("gcc") and shutil.which("ldconfig")), "needs gcc and ldconfig for the fake driver libraries")
def test_sigkill_at_every_write_step(make_host, tmp_path):
    """The create path SIGKILLed at its 1st, 2nd, ... os call that writes (open, write,
    fchmod, fsync, close, rename, unlink...), until a create runs through: at each point
    config.json is the old or the new whole file, no cache file is torn, no log line torn."""
    root = make_host("nvidia", mknod=False, gpus=2)
    b = str(tmp_path / "b")
    bundle.make_bundle(b, ["sh"])
    path = os.path.join(b, "config.json")
    old = read(path)
    cfg = tmp_path / "gpuhook.toml"
    log = str(tmp_path / "gpuhook.log")
    cfg.write_text(f'host_root = "{root}"\nlog_file = "{log}"\nruntime = "/bin/true"\n')
    cache_dir = str(tmp_path / "cache")
    env = {"GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": cache_dir}
    argv = ["create", "--bundle", b, "x"]
    assert _create_killed_at(10**9, argv, env) == 0
    new = read(path)
    assert new != old
    outcomes = []
    for n in range(1, 500):
        put(path, old)
        shutil.rmtree(cache_dir, ignore_errors=True)
        status = _create_killed_at(n, argv, env)
        data = read(path)
        assert data in (old, new), f"killed at write call {n}: config.json torn: {data[:200]!r}"
        outcomes.append("old" if data == old else "new")
        cache_files_parse(cache_dir)
        log_lines_parse(log)
        if os.WIFEXITED(status):
            assert os.WEXITSTATUS(status) == 0
            break
        assert os.WTERMSIG(status) == signal.SIGKILL
    else:
        pytest.fail("the create never ran through")
    assert "old" in outcomes and outcomes[-1] == "new", outcomes


# -- stale temp files of killed writers -----------------------------------------------------

def test_stale_temp_file_of_the_same_pid_does_not_block_the_write(tmp_path):
    """A killed writer whose pid is this process's now (pid reuse, or pid 1 of another pid
    namespace) left its temp file: the write still happens, and the stale file is not
    taken for ours."""
    path = tmp_path / "config.json"
    path.write_bytes(b"{}")
    stale = tmp_path / f".config.json.gpuhook-{os.getpid()}.tmp"
    stale.write_bytes(b"stale")
    write_atomic(str(path), b'{"new":1}', 0o644, sync_dir=False)
    assert path.read_bytes() == b'{"new":1}'
    assert stale.read_bytes() == b"stale"


@needs_runc
@requires(bool(shutil.which("unshare")), "needs unshare (util-linux)")
def test_stale_temp_files_of_pid_1_do_not_block_the_next_create(make_host, runtime, tmp_path):
    """In a new pid namespace the wrapper is pid 1, and so was the killed one before it: its
    temp files beside config.json and in the cache directory do not stop the injection."""
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    cache_dir = rt.env["GPUHOOK_CACHE_DIR"]
    os.makedirs(cache_dir, mode=0o700)
    from gpuhook import config as gconfig
    from gpuhook.probe import cache as pcache

    st = os.stat(rt.config)
    old_env = os.environ.get("GPUHOOK_CACHE_DIR")
    os.environ["GPUHOOK_CACHE_DIR"] = cache_dir
    try:
        config_cache = gconfig._cache_file([os.path.abspath(rt.config), st.st_ino, st.st_size,
                                            st.st_mtime_ns, st.st_ctime_ns])
    finally:
        if old_env is None:
            del os.environ["GPUHOOK_CACHE_DIR"]
        else:
            os.environ["GPUHOOK_CACHE_DIR"] = old_env
    for target in (os.path.join(b, "config.json"), config_cache, pcache._file(cache_dir, root)):
        d, name = os.path.split(target)
        for pid in (1, 2, 3):
            with open(os.path.join(d, f".{name}.gpuhook-{pid}.tmp"), "w") as f:
                f.write("{\"stale\": tru")
    rt.ids.append("pid1")
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--", wrapper_path(), "--root", rt.state, "run",
                        "--bundle", b, "pid1"], env=rt.env, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected", rec
    assert all_gpus(r.stdout, 2), r.stdout
    assert sorted(cache_files_parse(cache_dir))  # written despite the stale temp files


# -- a full disk ----------------------------------------------------------------------------

def _fill(directory: str) -> None:
    """Use up every byte of the file system under `directory`."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)


@needs_runc
@pytest.mark.parametrize("log_where", ["log-elsewhere", "log-on-full-disk"])
def test_disk_full_keeps_the_old_config_and_starts_the_container(make_host, runtime, tmp_path, log_where):
    """The bundle (and the caches, and in one case the log) on a small tmpfs filled to the
    last byte: gpuhook cannot write config.json; the old one stays whole (same inode, no temp
    file left), the container starts unmodified (fail open), and a log that cannot be
    written does not crash anything."""
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(small)], check=True)
    try:
        rt = runtime(root)
        log = str(small / "gpuhook.log") if log_where == "log-on-full-disk" else rt.log
        with open(rt.config, "w") as f:
            f.write(f'host_root = "{root}"\nlog_file = "{log}"\n')
        rt.env["GPUHOOK_CACHE_DIR"] = str(small / "cache")
        b = str(small / "b")
        bundle.make_bundle(b, ["sh", "-c", SHOW])
        path = os.path.join(b, "config.json")
        before = read(path), os.stat(path).st_ino
        _fill(str(small))
        with pytest.raises(OSError):  # really full
            with open(small / "probe", "wb") as f:
                f.write(b"x" * 4096)
                f.flush()
        os.unlink(small / "probe")
        r = rt.run(b, f"full-{log_where}")
        assert r.returncode == 0, r.stderr
        assert "started" in r.stdout and "accel=none" in r.stdout, r.stdout
        assert "Traceback" not in r.stderr
        assert (read(path), os.stat(path).st_ino) == before
        assert sorted(os.listdir(b)) == ["config.json", "rootfs"]
        if log_where == "log-elsewhere":
            rec = rt.log_records()[-1]
            assert rec["decision"] == "error" and "No space left" in rec["error"], rec
    finally:
        subprocess.run(["runc", "--root", str(tmp_path / "runc-state"), "delete", "--force", f"full-{log_where}"],
                       capture_output=True)
        subprocess.run(["umount", "-l", str(small)], check=False)


# -- the real runtime missing, or not runnable ---------------------------------------------

def _runtime_value(kind: str, tmp_path) -> str:
    if kind == "missing-path":
        return "/nonexistent/runc"
    if kind == "not-on-path":
        return "gpuhook-no-such-runtime"
    if kind == "directory":
        d = tmp_path / "rt-dir"
        d.mkdir()
        return str(d)
    p = tmp_path / f"rt-{kind}"
    if kind == "not-executable":
        p.write_text('#!/bin/sh\nexec runc "$@"\n')
        p.chmod(0o644)
    else:  # bad-interpreter: executable, but execve fails
        p.write_text("#!/nonexistent/interpreter\n")
        p.chmod(0o755)
    return str(p)


@needs_runc
@pytest.mark.parametrize("front", ["sh-create", "sh-pass-through", "python-create", "python-slow-config"])
@pytest.mark.parametrize("kind", ["missing-path", "not-on-path", "directory", "not-executable", "bad-interpreter"])
def test_real_runtime_missing_or_not_runnable(make_host, runtime, tmp_path, kind, front):
    """One clear line on stderr, exit status 127, whichever front decides (the front on a
    CPU node or for a pass-through command; Python on a GPU node, or when the config is one
    the front leaves to Python); never a traceback."""
    root = make_host("cpu" if front.startswith("sh") else "nvidia", mknod=True, **({} if front.startswith("sh") else {"gpus": 1, "libs": False}))
    value = _runtime_value(kind, tmp_path)
    rt = runtime(root, runtime=value)
    if front == "python-slow-config":  # a quoted key, and no front file yet: Python decides everything
        with open(rt.config) as f:
            text = f.read()
        with open(rt.config, "w") as f:
            f.write(text.replace("runtime =", '"runtime" ='))
    else:  # as an earlier Python run leaves it: the front decides what it can alone
        prime(rt.config, rt.env["GPUHOOK_CACHE_DIR"])
    b = rt.bundle("b", ["true"])
    if front == "sh-pass-through":
        argv = [wrapper_path(), "--root", rt.state, "state", "nothing"]
    else:
        argv = [wrapper_path(), "--root", rt.state, "create", "--bundle", b, "rt"]
    r = subprocess.run(argv, env=rt.env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 127, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert os.path.basename(value) in lines[0] or "runc or crun" in lines[0], lines[0]


# -- a cached probe naming a file that is gone (issue 24 item 5) ----------------------------

@needs_runc
@pytest.mark.parametrize("how", ["removed", "removed-mtime-restored"])
def test_a_library_gone_since_the_cached_probe_never_fails_a_create(make_host, runtime, how):
    """The video library is in <libdir>/vdpau, which the probe cache's fingerprint does not
    name. A create caches the probe; the library goes (its directory's mtime set back, too);
    the next create through real runc starts, with the other driver files mounted. Without
    the check, runc fails it on the bind mount of a missing file."""
    from fakes import fakehost

    root = make_host("nvidia", mknod=True, gpus=1, video=True)
    rt = runtime(root)
    env = ["NVIDIA_DRIVER_CAPABILITIES=utility,compute,video"]
    show = "echo started; ls /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/vdpau 2>/dev/null; true"
    r = rt.run(rt.bundle("first", ["sh", "-c", show], env=env), "first")
    assert r.returncode == 0 and "libvdpau_nvidia.so.550" in r.stdout, r.stdout + r.stderr
    lib = os.path.realpath(root + fakehost.HOST_LIBDIR + "/vdpau/libvdpau_nvidia.so.1")
    d = os.path.dirname(lib)
    st = os.stat(d)
    os.unlink(lib)
    if how == "removed-mtime-restored":
        os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = rt.run(rt.bundle("second", ["sh", "-c", show], env=env), "second")
    assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr
    assert "libnvcuvid.so.550" in r.stdout and "libvdpau_nvidia.so.550" not in r.stdout, r.stdout
    assert rt.log_records()[-1]["decision"] == "injected"
