"""`docker exec` into a `--runtime gpu-optional` container sees the GPUHOOK_* env (root).

A dockerd of the test's own (its data-root, exec-root, pidfile, socket; no iptables, no
bridge, vfs), with `runtimes["gpu-optional"]` in the daemon.json this test writes, pointing
at the installed gpuhook-runtime; a busybox image made with `docker import`. dockerd builds
an exec'd process from its own copy of the spec, as containerd does: the wrapper adds what it
recorded at create.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import is_root, requires, wrapper_path
from gpuhook.testing import bundle

IMAGE = "localhost/gpuhook-exec-busybox:test"
RUN_DIR = "/run/docker"

needs_docker = requires(
    bool(is_root() and shutil.which("dockerd") and shutil.which("docker") and shutil.which("containerd")
         and bundle.find_busybox() and wrapper_path()),
    "needs root, Debian's docker.io (dockerd, docker, containerd), busybox-static and an installed gpuhook-runtime")

pytestmark = needs_docker


class Dockerd:
    def __init__(self, base, runtimes: dict):
        self.base = str(base)
        self.sock = os.path.join(self.base, "docker.sock")
        self.exec_root = os.path.join(self.base, "exec")
        self.data_root = os.path.join(self.base, "data")
        self.config = os.path.join(self.base, "daemon.json")
        os.makedirs(self.base, exist_ok=True)
        self.made_run_dir = not os.path.exists(RUN_DIR)  # dockerd makes /run/docker/plugins whatever its config
        with open(self.config, "w") as f:
            json.dump({"data-root": self.data_root, "exec-root": self.exec_root,
                       "pidfile": os.path.join(self.base, "docker.pid"), "hosts": [f"unix://{self.sock}"],
                       "iptables": False, "ip-masq": False, "bridge": "none", "storage-driver": "vfs",
                       "runtimes": runtimes}, f)
        self.proc = None

    def start(self, env: dict) -> None:
        self.log = open(os.path.join(self.base, "dockerd.log"), "ab")
        self.proc = subprocess.Popen(["dockerd", "--config-file", self.config], env=dict(os.environ, **env),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        with open(os.path.join(self.base, "dockerd.log"), "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def docker(self, *args, check=True, input=None, timeout=60) -> subprocess.CompletedProcess:
        r = subprocess.run(["docker", *args], env=dict(os.environ, DOCKER_HOST=f"unix://{self.sock}"),
                           capture_output=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {r.stderr.decode(errors='replace')}")
        return r

    def _ours(self) -> list[int]:
        """Processes started for this dockerd (its containerd, the shims): by the exec-root
        in their command line."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (self.proc is None or int(entry) != self.proc.pid):
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if self.exec_root.encode() in f.read():
                            found.append(int(entry))
                except OSError:
                    pass
        return found

    def cleanup(self) -> None:
        if self.proc is None:
            shutil.rmtree(self.base, ignore_errors=True)
            return
        r = self.docker("ps", "-aq", check=False)
        ids = r.stdout.decode().split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in self._ours():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f if line.split()[4].startswith(self.base + "/")]
        for mp in sorted(points, key=lambda p: p.count("/"), reverse=True):
            libc.umount2(mp.encode(), 2)  # MNT_DETACH
        shutil.rmtree(self.base, ignore_errors=True)
        if self.made_run_dir and not _other_dockerd():
            for d in (os.path.join(RUN_DIR, "plugins"), RUN_DIR):
                try:
                    os.rmdir(d)
                except OSError:
                    pass


def _other_dockerd() -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "dockerd":
                        return True
            except OSError:
                pass
    return False


@pytest.fixture
def dockerd(tmp_path, runtime, make_host):
    made = []

    def make(rt):
        env = {k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}
        # a short base: dockerd's containerd puts its sockets under exec-root, and a unix
        # socket path has at most 107 bytes
        d = Dockerd(tempfile.mkdtemp(prefix="gpuhook-dk-", dir="/tmp"), {"gpu-optional": {"path": wrapper_path()}})
        made.append(d)  # cleaned up even when it does not start
        d.start(env)
        rootfs = tmp_path / "rootfs"
        bundle.make_rootfs(str(rootfs))
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        d.docker("import", "-", IMAGE, input=tar)
        return d
    yield make
    for d in made:
        d.cleanup()


def test_docker_exec_sees_the_env_gpuhook_added(make_host, runtime, dockerd):
    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    d = dockerd(rt)
    cid = d.docker("run", "-d", "--runtime", "gpu-optional", "--network", "none", IMAGE,
                   "sleep", "600").stdout.decode().strip()
    show = "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; stat -c '%t:%T' /dev/nvidia1"
    out = d.docker("exec", cid, "sh", "-c", show).stdout.decode().split()
    assert out[0] == "accel=nvidia" and out[1].count("nvidia:GPU-") == 2 and out[2] == "c3:1", out
    records = [r for r in rt.log_records() if r["container_id"] == cid]
    assert [r["decision"] for r in records] == ["injected"]
    exec_dir = os.path.join(rt.env["GPUHOOK_CACHE_DIR"], "exec")
    (key,) = os.listdir(exec_dir)  # dockerd's runtime root for gpu-optional, moby namespace
    assert key.startswith(d.exec_root.replace("/", "%2F")) and os.listdir(os.path.join(exec_dir, key)) == [cid]
    # the default runtime (plain runc) on the same node: nothing
    plain = d.docker("run", "-d", "--network", "none", IMAGE, "sleep", "600").stdout.decode().strip()
    out = d.docker("exec", plain, "sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}").stdout.decode().split()
    assert out == ["accel=none"]
    d.docker("rm", "-f", cid, plain)
    assert os.listdir(os.path.join(exec_dir, key)) == []
