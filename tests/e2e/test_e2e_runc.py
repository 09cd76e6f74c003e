"""Real containers through gpuhook-runtime and real runc, on fake GPU hosts (root)."""

from __future__ import annotations

import hashlib
import json
import os

from conftest import needs_runc, nodes_of
from fakes import fakehost
from gpuhook.probe import ldcache

pytestmark = needs_runc

SHOW = ("for n in /dev/nvidia* /dev/kfd /dev/dri/*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=$GPUHOOK_ACCELERATOR; echo devices=$GPUHOOK_DEVICES; "
        "for n in /dev/nvidia0 /dev/kfd /dev/dri/renderD128; do [ -e $n ] && { cat $n >/dev/null 2>/tmp/err; echo open $n: $(cat /tmp/err); }; done; "
        "grep -E 'libcuda|libnvidia-ml' /proc/self/mountinfo | while read a b c d e f g; do echo mount $e $f; done; "
        "grep -c libcuda.so.1 /etc/ld.so.cache; "
        # -lcuda as GNU ld looks for it on Debian's x86_64: the first libcuda.so on its path
        "for d in /usr/local/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/local/lib /lib /usr/lib; "
        "do [ -e $d/libcuda.so ] && { stat -L -c 'lcuda %n %d:%i' $d/libcuda.so $d/libcuda.so.1; break; }; done; true")


def test_nvidia_8_gpus(make_host, runtime):
    root = make_host("nvidia", mknod=True)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, "nv8")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    # Device Minors are reversed against the indices: /dev/nvidiaN carries minor N
    for minor in range(8):
        assert nodes[f"/dev/nvidia{minor}"] == (195, minor)
    assert nodes["/dev/nvidiactl"] == (195, 255)
    assert nodes["/dev/nvidia-uvm"] == (510, 0)
    assert nodes["/dev/nvidia-uvm-tools"] == (510, 1)
    # the cgroup lets the container open the node: no driver behind it means ENXIO, not EPERM
    assert "open /dev/nvidia0: cat: can't open '/dev/nvidia0': No such device or address" in r.stdout
    assert "accel=nvidia" in r.stdout
    assert r.stdout.count("devices=nvidia:GPU-") == 1 and r.stdout.count(",nvidia:GPU-") == 7
    mounts = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("mount ")]
    assert {m[0] for m in mounts} == {"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14",
                                      "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14",
                                      "/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so"}
    assert all(m[1].split(",")[0] == "ro" for m in mounts), mounts
    # a -lcuda link finds libcuda.so, and it is the very file libcuda.so.1 names
    lcuda = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("lcuda ")]
    assert [p for p, _ in lcuda] == ["/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    assert lcuda[0][1] == lcuda[1][1], lcuda
    # the createContainer hook refreshed the container's ld cache
    with open(os.path.join(b, "rootfs", "etc", "ld.so.cache"), "rb") as f:
        names = ldcache.lookup(ldcache.parse(f.read()))
    assert names["libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert os.readlink(os.path.join(b, "rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1")) == "libcuda.so.550.54.14"
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected" and rec["container_id"] == "nv8" and rec["vendors"] == ["nvidia"]
    assert "runtime_server" not in rec  # no server here: a fresh interpreter made it


def test_without_cgroup_rule_open_is_eperm(make_host, runtime):
    """The control for the ENXIO check above: runc alone, node listed but no allow rule."""
    root = make_host("nvidia", mknod=True)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", "cat /dev/nvidia0 2>&1; true"])
    with open(os.path.join(b, "config.json")) as f:
        spec = json.load(f)
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    with open(os.path.join(b, "config.json"), "w") as f:
        json.dump(spec, f)
    r = rt.run(b, "nocg", binary="runc")
    assert "Operation not permitted" in r.stdout, r.stdout + r.stderr


def test_uvm_not_created_yet_is_still_given(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=1, uvm_node=False, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, "uvm")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert nodes["/dev/nvidia-uvm"] == (510, 0)
    assert nodes["/dev/nvidia0"] == (195, 0)


def test_amd(make_host, runtime):
    root = make_host("amd", mknod=True)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, "amd")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert nodes["/dev/kfd"] == (235, 0)
    assert nodes["/dev/dri/renderD128"] == (226, 128)
    assert nodes["/dev/dri/renderD129"] == (226, 129)
    assert nodes["/dev/dri/card1"] == (226, 1)
    assert "accel=amd" in r.stdout
    assert "open /dev/kfd: cat: can't open '/dev/kfd': No such device or address" in r.stdout


def test_cpu_only_leaves_config_untouched(make_host, runtime):
    root = make_host("cpu")
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}; ls /dev"])
    path = os.path.join(b, "config.json")
    before = open(path, "rb").read(), os.stat(path).st_ino
    r = rt.run(b, "cpu")
    assert r.returncode == 0, r.stderr
    assert "accel=none" in r.stdout
    assert (open(path, "rb").read(), os.stat(path).st_ino) == before
    assert rt.log_records()[-1]["decision"] == "no-gpu"


def test_display_only_chips_are_cpu_only(tmp_path, runtime):
    """An ASPEED BMC (card0 only: the front decides alone) and a virtio-gpu with a render
    node (Python starts, probes, and finds no GPU): both leave config.json as it was."""
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=True)
    fakehost.bmc_only(fh)
    fh.drm_gpu("0000:00:05.0", 0x1AF4, 0x1050, "virtio-pci", card=1, render=128)
    for name in ("bmc-only", "bmc-virtio"):
        if name == "bmc-only":
            host = str(tmp_path / "bmc")
            fakehost.bmc_only(fakehost.FakeHost(host, mknod=True))
        else:
            host = fh.root
        rt = runtime(host)
        b = rt.bundle(f"b-{name}", ["sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}; ls /dev/dri 2>&1; true"])
        digest = hashlib.sha256(open(os.path.join(b, "config.json"), "rb").read()).hexdigest()
        r = rt.run(b, name)
        assert r.returncode == 0, r.stderr
        assert "accel=none" in r.stdout and "No such file" in r.stdout
        assert hashlib.sha256(open(os.path.join(b, "config.json"), "rb").read()).hexdigest() == digest
        assert rt.log_records()[-1]["decision"] == "no-gpu"


def test_sandbox_container_left_alone(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}"],
                  annotations={"io.kubernetes.cri.container-type": "sandbox"})
    before = open(os.path.join(b, "config.json"), "rb").read()
    r = rt.run(b, "pause")
    assert r.returncode == 0, r.stderr
    assert "accel=none" in r.stdout
    assert open(os.path.join(b, "config.json"), "rb").read() == before
    assert rt.log_records()[-1]["decision"] == "sandbox"


def test_fail_open_on_broken_host_and_closed_refuses(make_host, runtime, tmp_path):
    """An internal error (here: linux.devices of the wrong type, which gpuhook cannot
    edit) leaves config.json to the real runtime in fail-open; fail-closed refuses the
    create with one clear line."""
    root = make_host("nvidia", mknod=True, gpus=1, libs=False)
    for mode, ok in (("open", True), ("closed", False)):
        rt = runtime(root, fail_mode=mode)
        b = rt.bundle(f"b-{mode}", ["sh", "-c", "echo started"])
        path = os.path.join(b, "config.json")
        spec = json.load(open(path))
        spec["linux"]["devices"] = "not-a-list"  # gpuhook cannot edit this; runc would reject it
        json.dump(spec, open(path, "w"))
        r = rt.run(b, f"f{mode}")
        rec = rt.log_records()[-1]
        if ok:
            assert rec["decision"] == "error" and rec["error"]
            assert "gpuhook-runtime" not in r.stderr
        else:
            assert r.returncode != 0
            assert "gpuhook-runtime: GPU injection failed" in r.stderr


def test_nvidia_8_gpus_through_the_runtime_server(make_host, runtime, tmp_path):
    """The same container with the node's runtime server running (`gpuhook runtime-server`,
    as gpuhook-runtime.socket starts it): the same nodes, cgroup rules and libraries; the log
    line says the server made them."""
    import signal
    import subprocess
    import sys

    from fakes import runtime_server

    root = make_host("nvidia", mknod=True)
    rt = runtime(root)
    srv = runtime_server.start([sys.executable, "-m", "gpuhook", "runtime-server"], rt.env, cwd=tmp_path,
                               stderr=subprocess.PIPE, text=True)
    try:
        b = rt.bundle("b", ["sh", "-c", SHOW])
        r = rt.run(b, "nv8s")
        assert r.returncode == 0, r.stderr
        nodes = nodes_of(r.stdout)
        assert all(nodes[f"/dev/nvidia{m}"] == (195, m) for m in range(8))
        assert "open /dev/nvidia0: cat: can't open '/dev/nvidia0': No such device or address" in r.stdout
        assert "accel=nvidia" in r.stdout
        rec = rt.log_records()[-1]
        assert rec["decision"] == "injected" and rec.get("runtime_server") is True, rec
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=10)
