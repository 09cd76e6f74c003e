"""The seed's outage on a real cluster (tests/cluster/node.py, the scenario in cluster_demo.py): three
nodes, NVIDIA, AMD and CPU-only, gpuhook installed as operators install it, then the seed's
Deployment through the failure of its GPU nodes."""

from __future__ import annotations

import os
import re
import time

import cluster_demo as demo
import node
import versions
from conftest import is_root, requires


def test_three_nodes_and_gpuhook_installed_by_its_daemonset(gpuhook_installed):
    """`kubectl apply -k daemonset/` and nothing else: on each node the DaemonSet's pod (run by
    the real kubelet) installed the handler into that node's containerd config and restarted
    it (through the node's systemctl); the GPU nodes carry gpu.type and their vendor's labels,
    the CPU node neither; the agent reported each GPU node's inventory in an Event."""
    import tomllib

    from gpuhook.install import core

    c = gpuhook_installed
    assert c.get("runtimeclass", "gpu-optional")["handler"] == "gpu-optional"
    # the runtimes, as each kubelet reports its own: the built containerd on one node, sid's elsewhere
    for spec in node.NODES:
        info = c.cp.api("GET", f"/api/v1/nodes/{spec.name}").body["status"]["nodeInfo"]
        print(spec.name, info["kubeletVersion"], info["containerRuntimeVersion"],
              c.nodes[spec.name].enter("runc --version").stdout.splitlines()[0])
        assert info["kubeletVersion"] == versions.KUBERNETES_VERSION
        built = spec.name == node.BUILT_RUNTIME_NODE
        assert info["containerRuntimeVersion"].startswith(
            f"containerd://{versions.CONTAINERD_VERSION.lstrip('v')}" if built else "containerd://2.1."), info
        if built:
            assert c.nodes[spec.name].enter("runc --version").stdout.startswith(
                f"runc version {versions.RUNC_VERSION.lstrip('v')}\n")
    for spec in node.NODES:
        n = c.nodes[spec.name]
        with open(os.path.join(n.upper, "etc", "containerd", "config.toml"), "rb") as f:
            runtimes = tomllib.load(f)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        assert runtimes["gpu-optional"]["options"]["BinaryName"] == core.BINARY, spec.name
        with open(n.log("containerd")) as f:
            starts = f.read().count("--- ") - 1  # start lines; the last exit line is not there yet
        assert starts >= 2, f"{spec.name}: containerd was not restarted by the agent"
        labels = c.labels(spec.name)
        ours = {k: v for k, v in labels.items() if k.startswith("gpuhook.dev/") or k == "gpu.type"}
        print(spec.name, ours)
        assert labels["gpuhook.dev/runtime-ready"] == "true"
        if spec.host == "cpu":
            assert "gpu.type" not in labels and labels["gpuhook.dev/accelerator"] == "none", ours
            assert not any(k.startswith(("gpuhook.dev/nvidia", "gpuhook.dev/amd")) for k in labels), ours
        else:
            assert labels["gpu.type"] == spec.host == labels["gpuhook.dev/accelerator"], ours
    assert c.labels(node.NVIDIA.name)["gpuhook.dev/gpu.count"] == "8"
    events = c.get("events", "-n", "default")["items"]
    agent = [e for e in events if e.get("reportingComponent") == "gpuhook.dev/agent"]
    for e in agent:
        print("event:", e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"], e.get("message", "")[:100])
    for spec in (node.NVIDIA, node.AMD):
        assert any(e["involvedObject"] == {**e["involvedObject"], "kind": "Node", "name": spec.name}
                   and e["reason"] == "GPUInventory" for e in agent), (spec.name, agent)


def test_the_seeds_outage(gpuhook_installed):
    """`make cluster-demo`'s replay, checked at each of its moments; its timeline and summary
    are what this test prints."""
    c = gpuhook_installed

    def check(o: demo.Outage, moment: str) -> None:
        live = o.running(demo.WORKER)
        if moment == demo.DEPLOYED:
            placed = {p["spec"]["nodeName"]: (p, acc) for p, acc in live}
            assert node.NVIDIA.name in placed, placed
            pod, acc = placed[node.NVIDIA.name]
            assert acc == "nvidia"
            ls = c.kubectl("exec", "-n", demo.NAMESPACE, pod["metadata"]["name"], "--", "sh", "-c",
                           "ls /dev/nvidia*").stdout
            # all the GPUs but those the kubelet allocated to other pods, the mistake's among them
            # (share = "unallocated", the default: gpuhook reads the kubelet's checkpoint)
            allocated = c.nodes[node.NVIDIA.name].checkpoint()
            mistake = next(p for p, _ in o.running(demo.MISTAKE))["metadata"]["uid"]
            held = {o.plugin.devices[i] for ids in allocated.values() for i in ids}
            assert len(allocated[mistake]) == 1 and "/dev/nvidiactl" in ls, (allocated, ls)
            assert set(re.findall(r"/dev/nvidia[0-9]+", ls)) == set(o.plugin.devices.values()) - held, (allocated, ls)
        elif moment == demo.NVIDIA_FAILED:
            # the replacement went where gpu.type still says a GPU is (beside the AMD node's own replica)
            assert [(p["spec"]["nodeName"], acc) for p, acc in live] == [(node.AMD.name, "amd")] * len(live), live
            ls = c.kubectl("exec", "-n", demo.NAMESPACE, live[0][0]["metadata"]["name"], "--", "ls", "/dev/dri").stdout
            assert "renderD128" in ls, ls
            # the mistake's pod: Pending, and the scheduler says why
            assert "Insufficient nvidia.com/gpu" in o.mistake_message, o.mistake_message
        elif moment == demo.AMD_FAILED:
            assert [(p["spec"]["nodeName"], acc) for p, acc in live] == [(node.CPU.name, "none: running on CPU")] * len(
                live
            )
            for p, _ in live:
                ls = c.kubectl("exec", "-n", demo.NAMESPACE, p["metadata"]["name"], "--", "sh", "-c",
                               "ls /dev; ls /dev/dri /dev/kfd 2>&1 || true").stdout
                assert "nvidia" not in ls and "renderD" not in ls, ls
        elif moment == demo.NVIDIA_BACK:
            # the NVIDIA node back (the AMD node still down): a new replica goes there, not to the
            # CPU node (the manifest's preference ranks NVIDIA and AMD alike, so only one is back)
            p, acc = o.new
            assert (p["spec"]["nodeName"], acc) == (node.NVIDIA.name, "nvidia")
        seen.append(moment)

    seen: list[str] = []
    o = demo.replay(c, check=check)
    assert seen == [demo.DEPLOYED, demo.NVIDIA_FAILED, demo.AMD_FAILED, demo.NVIDIA_BACK]
    assert [s for s in o.steps if s.what.startswith("pending: ")], "the mistake's Pending went on the timeline"
    lines = demo.summary(o)
    print("\n".join(lines))
    assert lines[0].startswith(f"the NVIDIA node failed at 0.0 s: the worker's replacement ran on {node.AMD.name} (amd)")
    assert f"replacement ran on {node.CPU.name} (none: running on CPU)" in lines[1], lines
    assert "Insufficient nvidia.com/gpu" in lines[2], lines


@requires(is_root(), "needs root (a PID namespace, cgroups)")
def test_the_next_run_removes_what_a_killed_run_left(tmp_path):
    """A run killed from outside leaves its node inits (each with its PID namespace), the
    cgroups under node.CGROUP and node.BASE: cleanup_leftovers (the start of every run) removes
    them. Here under names of this test's own, so that a cluster of this session is untouched."""
    import subprocess
    import uuid

    mark, cgroup = f"gh-test-mark-{uuid.uuid4().hex[:8]}", f"gh-test-cgroup-{uuid.uuid4().hex[:8]}"
    base = tmp_path / "base"
    (base / "nodes" / "x").mkdir(parents=True)
    init = subprocess.Popen(["unshare", "-p", "-f", "sh", "-c", "sleep 300 & wait", mark], start_new_session=True)
    pids_dir = os.path.join(node.CGROUP_FS, "pids", cgroup, "node-x", "kubepods")
    os.makedirs(pids_dir)
    deadline = time.monotonic() + 10
    while len(node.marked_pids(mark)) < 2 and time.monotonic() < deadline:  # unshare and its sh (and a fork)
        time.sleep(0.05)
    assert len(node.marked_pids(mark)) >= 2
    found = node.cleanup_leftovers(mark, str(base), cgroup)
    assert init.wait(10) is not None
    assert node.marked_pids(mark) == [] and not os.path.exists(os.path.join(node.CGROUP_FS, "pids", cgroup))
    assert not base.exists() and len(found) == 3, found
