"""Real containers through containerd's runc shim (`ctr run --runc-binary gpuhook-runtime`), on
fake GPU hosts: what a node with containerd and gpuhook gives a container (root)."""

from __future__ import annotations

import base64
import os

from conftest import needs_containerd, nodes_of, wrapper_path
from containerd_harness import IMAGE_NAME
from gpuhook.probe import ldcache
from gpuhook.runtime import exec as execenv

pytestmark = needs_containerd

NS = "gpuhook-test"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
# What the container shows of itself; the ld cache goes out base64 between markers.
SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; "
        "cat /dev/nvidia0 >/dev/null 2>/tmp/err && echo open ok || echo open: $(cat /tmp/err); "
        "grep -E 'libcuda|libnvidia-ml' /proc/self/mountinfo | while read a b c d e f g; do echo mount $e $f; done; "
        "if [ -e /etc/ld.so.cache ]; then echo ldcache-begin; base64 /etc/ld.so.cache; echo ldcache-end; "
        "else echo ldcache-none; fi; true")


def ld_cache_of(out: str) -> dict[str, str] | None:
    """The container's /etc/ld.so.cache, soname -> path (None when it has none)."""
    lines = out.splitlines()
    if "ldcache-begin" not in lines:
        return None
    data = base64.b64decode("".join(lines[lines.index("ldcache-begin") + 1:lines.index("ldcache-end")]))
    return ldcache.lookup(ldcache.parse(data))


def test_ctr_nvidia_8_gpus(make_host, runtime, containerd):
    root = make_host("nvidia", mknod=True)
    rt = runtime(root)
    c = containerd(rt, namespace=NS)
    r = c.run(NS, IMAGE_NAME, "nv8", ["sh", "-c", SHOW], runc_binary=wrapper_path())
    assert r.returncode == 0, r.stderr + c.log_tail()
    out = r.stdout
    nodes = nodes_of(out)
    for minor in range(8):
        assert nodes[f"/dev/nvidia{minor}"] == (195, minor)
    assert nodes["/dev/nvidiactl"] == (195, 255)
    assert nodes["/dev/nvidia-uvm"] == (510, 0)
    # the device cgroup lets the container open the node; no driver behind it: ENXIO, not EPERM
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in out
    assert "accel=nvidia" in out
    assert out.count("devices=nvidia:GPU-") == 1 and out.count(",nvidia:GPU-") == 7
    mounts = [line.split()[1:] for line in out.splitlines() if line.startswith("mount ")]
    # each library at its own name and at its development name (-lcuda)
    assert {m[0] for m in mounts} == {f"{LIBDIR}/libcuda.so.550.54.14", f"{LIBDIR}/libnvidia-ml.so.550.54.14",
                                      f"{LIBDIR}/libcuda.so", f"{LIBDIR}/libnvidia-ml.so"}
    assert all(m[1].split(",")[0] == "ro" for m in mounts), mounts
    # the createContainer hook ran ldconfig in the container's rootfs
    cache = ld_cache_of(out)
    assert cache is not None, out
    assert cache["libcuda.so.1"] == f"{LIBDIR}/libcuda.so.1"
    creates = [rec for rec in rt.log_records() if rec["container_id"] == "nv8"]
    assert len(creates) == 1, rt.log_records()
    rec = creates[0]
    assert rec["decision"] == "injected" and rec["vendors"] == ["nvidia"]
    # the bundle the shim handed over: containerd's own state directory
    assert rec["bundle"] == os.path.join(c.state, "io.containerd.runtime.v2.task", NS, "nv8")
    assert len(rec["nodes"]) >= 10 and rec["hooks"] == 1


def test_ctr_cpu_only_host_gets_nothing(make_host, runtime, containerd):
    root = make_host("cpu")
    rt = runtime(root)
    c = containerd(rt, namespace=NS)
    r = c.run(NS, IMAGE_NAME, "cpu", ["sh", "-c", SHOW], runc_binary=wrapper_path())
    assert r.returncode == 0, r.stderr + c.log_tail()
    out = r.stdout
    assert nodes_of(out) == {}
    assert "accel=none" in out and "devices=none" in out
    assert "open: cat: can't open '/dev/nvidia0': No such file or directory" in out
    assert "mount " not in out
    assert "ldcache-none" in out  # no hook ran: the image has no ld cache of its own
    creates = [rec for rec in rt.log_records() if rec["container_id"] == "cpu"]
    assert [rec["decision"] for rec in creates] == ["no-gpu"]


def test_ctr_plain_runc_on_gpu_host_gets_nothing(make_host, runtime, containerd):
    """The control: the same containerd and host, without gpuhook-runtime in the path."""
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root)
    c = containerd(rt, namespace=NS)
    r = c.run(NS, IMAGE_NAME, "plain", ["sh", "-c", SHOW])
    assert r.returncode == 0, r.stderr + c.log_tail()
    assert nodes_of(r.stdout) == {} and "accel=none" in r.stdout
    assert rt.log_records() == []


def test_ctr_task_exec_sees_the_env_gpuhook_added(make_host, runtime, containerd):
    """`ctr task exec`: containerd hands the shim its own copy of the process (no GPUHOOK_*);
    the wrapper adds what it recorded at create. The record outlives the task's delete (runc's
    alone) until the next injecting create under the same root sweeps it."""
    import time

    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    c = containerd(rt, namespace=NS)
    c.cgroup_parents.append("/" + NS)
    opts = ["--runc-root", c.runc_root, "--fifo-dir", os.path.join(c.base, "fifo"), "--runc-binary", wrapper_path()]
    c.ctr("run", "-d", *opts, IMAGE_NAME, "exec-me", "sleep", "600", namespace=NS)
    r = c.ctr("task", "exec", "--exec-id", "e1", "--fifo-dir", os.path.join(c.base, "fifo"), "exec-me",
              "sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; "
              "stat -c '%t:%T' /dev/nvidia1", namespace=NS, check=False)
    assert r.returncode == 0, r.stderr + c.log_tail()
    out = r.stdout.split()
    assert out[0] == "accel=nvidia" and out[1].count("nvidia:GPU-") == 2 and out[2] == "c3:1", out
    key = os.path.join(c.runc_root, NS).replace("/", "%2F")
    records = os.path.join(rt.env["GPUHOOK_CACHE_DIR"], "exec", key)
    assert os.listdir(records) == ["exec-me"]
    def remove(cid: str) -> None:
        c.ctr("task", "kill", "-s", "SIGKILL", cid, namespace=NS)
        deadline = time.monotonic() + 20
        while "STOPPED" not in c.ctr("task", "ls", namespace=NS).stdout and time.monotonic() < deadline:
            time.sleep(0.05)
        c.ctr("task", "delete", cid, namespace=NS)
        c.ctr("containers", "delete", cid, namespace=NS)

    remove("exec-me")
    assert os.listdir(records) == ["exec-me"]
    old = os.stat(os.path.join(records, "exec-me")).st_mtime - execenv.SWEEP_AFTER_S - 1
    os.utime(os.path.join(records, "exec-me"), (old, old))  # as if a minute had passed
    c.ctr("run", "-d", *opts, IMAGE_NAME, "exec-me-2", "sleep", "600", namespace=NS)
    assert os.listdir(records) == ["exec-me-2"]
    remove("exec-me-2")
