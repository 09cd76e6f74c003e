"""share = "unallocated" against the real kubelet's device manager: a device plugin of the tests'
own (deviceplugin.py, over the kubelet's real gRPC API) advertises the NVIDIA node's 8 GPUs as
nvidia.com/gpu, a pod takes 2, and a gpu-optional pod on that node gets exactly the other 6,
read from the checkpoint the kubelet itself wrote. Once the 2-GPU pod is deleted its GPUs are
given again within the agent's round (AGENT_ROUND), though the kubelet's checkpoint lists it
until the kubelet next allocates: the agent found it gone through the kubelet's pod-resources
API (gpuhook/agent/podres.py)."""

from __future__ import annotations

import json
import os
import tempfile

import yaml

import node
from containerd_harness import IMAGE_NAME
from gpuhook import defaults
from gpuhook.probe import nodestate

NAMESPACE = "gh-checkpoint"
# a node of this test's own: the kubelet keeps a gone pod's devices in its checkpoint until its
# next allocation, which would hold GPUs back from the other tests' pods on a shared node
NODE = node.NodeSpec("node-nvidia-ckpt", "nvidia", 5)
LIST = "ls /dev | grep -E '^nvidia[0-9]+$' | sort"
AGENT_ROUND = 30 + 1 + 30  # the DaemonSet's agent: --interval (30 s) + --debounce (1 s), and slack


def gone_file(n: node.Node) -> list[str]:
    """The uids the node's agent found gone (probe/nodestate.py GONE_FILE), [] before it wrote any."""
    try:
        with open(n.path(nodestate.GONE_FILE)) as f:
            return json.load(f)["gone"]
    except FileNotFoundError:
        return []


def pod(name: str, gpus: int | None = None, command: str = LIST) -> dict:
    spec: dict = {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE.name},
                  "containers": [{"name": "c", "image": IMAGE_NAME, "command": ["sh", "-c", command]}]}
    if gpus is None:
        spec["runtimeClassName"] = "gpu-optional"
    else:
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def status(c: node.Cluster, name: str) -> dict:
    return c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").body


def gpus_seen(c: node.Cluster, name: str) -> set[str]:
    """The /dev/nvidiaN a finished pod listed."""
    def done():
        phase = status(c, name).get("status", {}).get("phase")
        return phase in ("Succeeded", "Failed") and phase
    assert c.wait(done, 120, f"pod {name} done") == "Succeeded"
    return {"/dev/" + n for n in c.kubectl("logs", "-n", NAMESPACE, name).stdout.split()}


def test_gpu_optional_pod_gets_the_gpus_the_kubelet_did_not_allocate(gpuhook_installed):
    import deviceplugin

    c = gpuhook_installed
    nv = c.add(NODE)
    c.wait_ready(NODE.name)
    node.wait_installed(c, names=(NODE.name,))
    config = nv.path(defaults.CONFIG_FILE)  # written through the node's root (its overlay)
    os.makedirs(os.path.dirname(config), exist_ok=True)
    with open(config, "w") as f:
        f.write('share = "unallocated"\n')
    plugin = deviceplugin.DevicePlugin(nv.var("lib", "kubelet", "device-plugins"), nv.gpus(),
                                       tempfile.mkdtemp(prefix="gh-dp-"))
    try:
        plugin.start()
        c.wait(lambda: c.cp.api("GET", f"/api/v1/nodes/{NODE.name}").body["status"]
               .get("allocatable", {}).get("nvidia.com/gpu") == "8", 60, "nvidia.com/gpu: 8 allocatable")
        every = set(plugin.devices.values())
        c.kubectl("create", "namespace", NAMESPACE)
        c.kubectl("label", "namespace", NAMESPACE, "gpuhook.dev/gpu-optional=allowed")
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("takes-two", gpus=2, command=LIST + "; sleep 3600")))
        c.wait(lambda: status(c, "takes-two").get("status", {}).get("phase") == "Running", 120, "takes-two running")
        uid = status(c, "takes-two")["metadata"]["uid"]
        written = nv.checkpoint()
        print("the kubelet's checkpoint:", written)
        assert sorted(written[uid]) == sorted(plugin.allocations[-1]) and len(written[uid]) == 2
        two = {plugin.devices[i] for i in written[uid]}
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("optional-1")))
        seen = gpus_seen(c, "optional-1")
        print("the gpu-optional pod got:", sorted(seen), "held back:", sorted(two))
        assert seen == every - two and len(seen) == 6
        # the 2-GPU pod goes. The kubelet keeps its entry in the checkpoint until it next
        # allocates (its device manager drops a gone pod's devices then, not at deletion); the
        # agent finds it gone (the kubelet's pod-resources List, its pod directory) within its
        # round, and the next gpu-optional pod gets every GPU though the checkpoint still lists it
        c.kubectl("delete", "pod", "-n", NAMESPACE, "takes-two", "--wait=true", "--timeout=90s")
        assert uid in nv.checkpoint()
        c.wait(lambda: uid in gone_file(nv), AGENT_ROUND, "the agent found takes-two gone")
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("optional-2")))
        seen2 = gpus_seen(c, "optional-2")
        print("after takes-two went:", sorted(seen2), "gone:", gone_file(nv))
        assert seen2 == every and uid in nv.checkpoint()
        # the next allocation (a pod taking one GPU) rewrites the checkpoint without the gone pod:
        # the next gpu-optional pod gets every GPU but the new pod's one (the freed two among them,
        # unless the new pod took one of those), the new pod's held back though it is running
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("takes-one", gpus=1, command="sleep 3600")))
        c.wait(lambda: status(c, "takes-one").get("status", {}).get("phase") == "Running", 120, "takes-one running")
        now = nv.checkpoint()
        one = {plugin.devices[i] for i in now[status(c, "takes-one")["metadata"]["uid"]]}
        assert uid not in now and len(one) == 1, now
        c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod("optional-3")))
        seen3 = gpus_seen(c, "optional-3")
        print("after the next allocation:", sorted(seen3), "checkpoint:", now)
        assert seen3 == every - one and len(seen3) == 7 and len(two - one - seen3) == 0
    finally:
        plugin.stop()
        c.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
        c.remove(NODE.name)
