"""Vendor depth and per-pod policy through gpuhook-runtime and real runc, on fake GPU hosts
with real device nodes (root): what the container itself sees."""

from __future__ import annotations

import json
import os
import subprocess

from conftest import needs_runc, nodes_of, wrapper_path
from fakes import fakehost

pytestmark = needs_runc

V = "550.54.14"
LIB = "/usr/lib/x86_64-linux-gnu"
NODES = ("for n in /dev/nvidia* /dev/nvidia-caps/* /dev/nvidia-caps-imex-channels/* /dev/kfd /dev/dri/*; do "
         "[ -c $n ] && stat -c 'node %n %t:%T %F' $n; done; true; ")
MOUNTS = "while read a b c d e f g; do echo mount $e $f; done < /proc/self/mountinfo; "


def mounts_of(out: str) -> dict[str, str]:
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("mount ")}


def gpus_of(nodes: dict) -> list[str]:
    return sorted(p for p in nodes if p[11:].isdigit() and p.startswith("/dev/nvidia"))


def edit_spec(bundle_dir: str, change) -> None:
    path = os.path.join(bundle_dir, "config.json")
    with open(path) as f:
        spec = json.load(f)
    change(spec)
    with open(path, "w") as f:
        json.dump(spec, f)


# -- NVIDIA depth ------------------------------------------------------------------------------

def test_capability_utility_in_the_container(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=2, stale="470.82.01")
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + MOUNTS + "nvidia-smi; true"], env=["NVIDIA_DRIVER_CAPABILITIES=utility"])
    r = rt.run(b, "util")
    assert r.returncode == 0, r.stderr
    m = mounts_of(r.stdout)
    assert m[f"{LIB}/libnvidia-ml.so.{V}"].startswith("ro") and "/usr/bin/nvidia-smi" in m
    assert not any("libcuda" in p for p in m)
    assert "fake nvidia-smi" in r.stdout  # the node's tool runs in the container
    assert gpus_of(nodes_of(r.stdout)) == ["/dev/nvidia0", "/dev/nvidia1"]


def test_stale_driver_library_is_not_mounted(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=1, stale="470.82.01")
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", MOUNTS + "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1"])
    r = rt.run(b, "stale")
    assert r.returncode == 0, r.stderr
    m = mounts_of(r.stdout)
    assert f"{LIB}/libcuda.so.{V}" in m and not any("470" in p for p in m)
    assert f"libcuda.so.{V}" in r.stdout  # the container's ld cache hook linked the running version


def test_mig_nvswitch_imex_firmware_and_sockets_in_the_container(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=2, mig=True, nvswitch=2, imex_channels=2, firmware=True,
                     persistenced=True, fabricmanager=True, mps=True)
    rt = runtime(root, mps_pipe_dir="/tmp/nvidia-mps")  # MPS is opt-in
    b = rt.bundle("b", ["sh", "-c", NODES + MOUNTS +
                        f"cat /lib/firmware/nvidia/{V}/gsp_ga10x.bin | wc -c; "
                        "[ -S /run/nvidia-persistenced/socket ] && echo persistenced-socket; "
                        "[ -S /run/nvidia-fabricmanager/socket ] && echo fm-socket; "
                        "[ -p /tmp/nvidia-mps/control ] && echo mps-control; "
                        "ls /lib/firmware/nvidia; true"])
    r = rt.run(b, "full")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    # GPU index 0 has Device Minor 1: gpu1/gi1 = 147 (ci0 148), gpu1/gi2 = 156 (ci0 157, ci1 158)
    assert {p for p in nodes if "nvidia-caps/" in p} == {f"/dev/nvidia-caps/nvidia-cap{m}" for m in (147, 148, 156, 157, 158)}
    assert nodes["/dev/nvidia-caps/nvidia-cap147"] == (235, 147)
    assert nodes["/dev/nvidia-nvswitchctl"] == (511, 255) and nodes["/dev/nvidia-nvswitch1"] == (511, 1)
    assert nodes["/dev/nvidia-caps-imex-channels/channel1"] == (234, 1)
    assert "persistenced-socket" in r.stdout and "fm-socket" in r.stdout and "mps-control" in r.stdout
    m = mounts_of(r.stdout)
    assert m[f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin"].startswith("ro")
    assert r.stdout.count("535.104.05") == 0  # another version's firmware stays out
    assert not m["/tmp/nvidia-mps"].startswith("ro")


# -- AMD, Intel --------------------------------------------------------------------------------

def test_mi300_partitions_and_render_group_for_a_non_root_container(make_host, runtime):
    root = make_host("amd_mi300", mknod=True, partitions=8, render_gid=4242, video_gid=4343)
    rt = runtime(root)
    script = (NODES + "echo groups $(id -G); "
              "for n in /dev/kfd /dev/dri/renderD128 /dev/dri/renderD135; do "
              "echo open $n: $(cat $n 2>&1 >/dev/null | head -1); done; true")
    b = rt.bundle("b", ["sh", "-c", script])
    edit_spec(b, lambda s: s["process"].update(user={"uid": 1000, "gid": 1000}))
    r = rt.run(b, "mi300")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert sorted(p for p in nodes if "renderD" in p) == [f"/dev/dri/renderD{128 + i}" for i in range(8)]
    assert nodes["/dev/kfd"] == (235, 0) and not any("card" in p for p in nodes)
    assert "4242" in r.stdout.split("groups ")[1].split()
    for line in (x for x in r.stdout.splitlines() if x.startswith("open ")):
        assert "Permission denied" not in line and "Operation not permitted" not in line, line


def test_intel_by_path_links_in_the_container(make_host, runtime):
    root = make_host("intel", mknod=True)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", "for l in /dev/dri/by-path/*; do echo link $l $(readlink $l); "
                                    "[ -c $l ] && echo char $l; done; true"])
    r = rt.run(b, "bypath")
    assert r.returncode == 0, r.stderr
    links = {line.split()[1]: line.split()[2] for line in r.stdout.splitlines() if line.startswith("link ")}
    assert links == {"/dev/dri/by-path/pci-0000:00:02.0-card": "../card0",
                     "/dev/dri/by-path/pci-0000:00:02.0-render": "../renderD128",
                     "/dev/dri/by-path/pci-0000:03:00.0-card": "../card1",
                     "/dev/dri/by-path/pci-0000:03:00.0-render": "../renderD129"}
    assert r.stdout.count("char ") == 4  # each link leads to the node in the container


def test_intel_sriov_vfs_in_the_container(make_host, runtime):
    root = make_host("intel_sriov", mknod=True, vfs=2)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + "ls /dev/dri/by-path; echo devices=$GPUHOOK_DEVICES"])
    r = rt.run(b, "sriov")
    assert r.returncode == 0, r.stderr
    assert sorted(nodes_of(r.stdout)) == ["/dev/dri/card2", "/dev/dri/card3", "/dev/dri/renderD130", "/dev/dri/renderD131"]
    assert "pci-0000:03:00.1-render" in r.stdout and "pci-0000:03:00.0" not in r.stdout
    assert "devices=intel:0000:03:00.1,intel:0000:03:00.2" in r.stdout


# -- pod annotations -------------------------------------------------------------------------------

def test_inject_false_through_runc(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + "echo accel=${GPUHOOK_ACCELERATOR:-none}"],
                  annotations={"gpuhook.dev/inject": "false"})
    before = open(os.path.join(b, "config.json"), "rb").read()
    r = rt.run(b, "optout")
    assert r.returncode == 0, r.stderr
    assert "accel=none" in r.stdout and nodes_of(r.stdout) == {}
    assert open(os.path.join(b, "config.json"), "rb").read() == before
    assert rt.log_records()[-1]["decision"] == "declined"


def test_vendors_through_runc(make_host, runtime):
    root = make_host("nvidia+intel", mknod=True)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + "echo accel=$GPUHOOK_ACCELERATOR"],
                  annotations={"gpuhook.dev/vendors": "intel"})
    r = rt.run(b, "intel-only")
    assert r.returncode == 0, r.stderr
    assert sorted(nodes_of(r.stdout)) == ["/dev/dri/card0", "/dev/dri/renderD128"]
    assert "accel=intel" in r.stdout
    assert rt.log_records()[-1]["vendors"] == ["intel"]


def test_max_gpus_through_runc(make_host, runtime):
    root = make_host("nvidia", mknod=True, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + "echo devices=$GPUHOOK_DEVICES"], annotations={"gpuhook.dev/max-gpus": "2"})
    r = rt.run(b, "two")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert len(gpus_of(nodes)) == 2 and "/dev/nvidiactl" in nodes
    assert r.stdout.split("devices=")[1].count("nvidia:GPU-") == 2


def test_invalid_annotation_starts_as_node_policy_and_logs_why(make_host, runtime):
    root = make_host("nvidia", mknod=True, gpus=2, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES], annotations={"gpuhook.dev/max-gpus": "../../etc/passwd",
                                                         "gpuhook.dev/hostPath": "/etc"})
    r = rt.run(b, "bad")
    assert r.returncode == 0, r.stderr
    assert len(gpus_of(nodes_of(r.stdout))) == 2
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected"
    assert any("max-gpus" in w and "not a whole number" in w for w in rec["warnings"])
    assert any("hostPath" in w for w in rec["warnings"])


def test_round_robin_4_containers_over_8_gpus_through_runc(make_host, runtime):
    root = make_host("nvidia", mknod=True, libs=False)
    rt = runtime(root)
    given = []
    for i in range(4):
        b = rt.bundle(f"b{i}", ["sh", "-c", NODES], annotations={"gpuhook.dev/max-gpus": "1"})
        r = rt.run(b, f"rr{i}")
        assert r.returncode == 0, r.stderr
        given += gpus_of(nodes_of(r.stdout))
    assert len(given) == 4 and len(set(given)) == 4, given


def test_round_robin_16_concurrent_creates_through_runc(make_host, runtime):
    root = make_host("nvidia", mknod=True, libs=False)
    rt = runtime(root)
    procs = []
    for i in range(16):
        b = rt.bundle(f"b{i}", ["true"], annotations={"gpuhook.dev/max-gpus": "1"})
        rt.ids.append(f"cc{i}")
        procs.append(subprocess.Popen([wrapper_path(), "--root", rt.state, "run", "--bundle", b, f"cc{i}"],
                                      env=rt.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    recs = [r for r in rt.log_records() if r["container_id"].startswith("cc")]
    assert len(recs) == 16 and all(r["decision"] == "injected" for r in recs)
    given = [gpus_of(r["nodes"] and {n: 0 for n in r["nodes"]}) for r in recs]
    assert all(len(g) == 1 for g in given)
    counts = {}
    for (g,) in given:
        counts[g] = counts.get(g, 0) + 1
    assert len(counts) == 8 and set(counts.values()) == {2}, counts


# -- device plugins, share = "unallocated" ----------------------------------------------------------

def test_device_plugin_gpu_in_the_spec_gets_no_other_nvidia_gpu(make_host, runtime):
    root = make_host("nvidia", mknod=True, libs=False)
    rt = runtime(root)
    b = rt.bundle("b", ["sh", "-c", NODES + "echo devices=$GPUHOOK_DEVICES"])

    def plugin(spec):  # what a device plugin's Allocate (or CDI) put there
        spec["linux"]["devices"] = [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2}]
        spec["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": 195, "minor": 2, "access": "rwm"})
    edit_spec(b, plugin)
    r = rt.run(b, "plugin")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert gpus_of(nodes) == ["/dev/nvidia2"]
    assert "/dev/nvidiactl" in nodes and "/dev/nvidia-uvm" in nodes  # what that GPU needs
    assert r.stdout.split("devices=")[1].strip().count("nvidia:GPU-") == 1


def test_share_unallocated_honours_the_kubelet_checkpoint(make_host, runtime):
    root = make_host("nvidia", mknod=True, libs=False)  # index i is /dev/nvidia(7-i)
    fh = fakehost.FakeHost(root)
    uuids = [f"GPU-{i:08x}-1111-2222-3333-{0x444444444444 + i:012x}" for i in range(8)]
    fh.file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", json.dumps({
        "Data": {"PodDeviceEntries": [
            {"PodUID": "other-pod", "ContainerName": "train", "ResourceName": "nvidia.com/gpu",
             "DeviceIDs": {"0": uuids[:3], "1": uuids[4:7]}, "AllocResp": "CgA="}],
            "RegisteredDevices": {"nvidia.com/gpu": uuids}},
        "Checksum": 2288412734}))
    rt = runtime(root, share="unallocated")
    b = rt.bundle("b", ["sh", "-c", NODES], annotations={"io.kubernetes.cri.sandbox-uid": "this-pod"})
    r = rt.run(b, "unalloc")
    assert r.returncode == 0, r.stderr
    assert gpus_of(nodes_of(r.stdout)) == ["/dev/nvidia0", "/dev/nvidia4"]  # indices 7 and 3
