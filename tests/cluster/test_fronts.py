"""Both of gpuhook's fronts in one real cluster: the session's NVIDIA node runs the DaemonSet as
shipped (`--front wrapper`: gpuhook-runtime is the handler's runtime), and a second NVIDIA node
runs a copy of it with `--front nri` (gpuhook's NRI plugin in containerd; the handler a plain
runc). An operator's split: the second node registers with gpuhook.dev/install=false (the
shipped DaemonSet leaves it: its documented opt-out) and FRONT_LABEL=nri (the copy's node
affinity). The same gpu-optional pod on each gets the same devices, libraries and env."""

from __future__ import annotations

import copy
import os
import tomllib

import yaml

import node
from containerd_harness import IMAGE_NAME
from cluster_demo import REPO
from kubelet import SHOW

# not under gpuhook.dev/: the agent owns that prefix on its node and removes the keys it did not set
FRONT_LABEL = "example.com/gpuhook-front"
NRI = node.NodeSpec("node-nvidia-nri", "nvidia", 4,
                    labels=(("gpuhook.dev/install", "false"), (FRONT_LABEL, "nri")))
NAMESPACE = "gh-fronts"


def nri_daemonset(c: node.Cluster) -> dict:
    """The shipped DaemonSet (daemonset/ as kustomize renders it) as `gpuhook-nri`: --front nri,
    on nodes labelled FRONT_LABEL=nri."""
    docs = [d for d in yaml.safe_load_all(c.kubectl("kustomize", os.path.join(REPO, "daemonset")).stdout) if d]
    (ds,) = [copy.deepcopy(d) for d in docs if d["kind"] == "DaemonSet"]
    ds["metadata"]["name"] = "gpuhook-nri"
    ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "gpuhook-nri"
    tpl = ds["spec"]["template"]
    tpl["metadata"]["labels"]["app.kubernetes.io/name"] = "gpuhook-nri"
    (container,) = tpl["spec"]["containers"]
    args = container["args"]
    args[args.index("--front") + 1] = "nri"
    (term,) = tpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    term["matchExpressions"] = [e for e in term["matchExpressions"] if e["key"] != "gpuhook.dev/install"]
    term["matchExpressions"].append({"key": FRONT_LABEL, "operator": "In", "values": ["nri"]})
    return ds


def show_pod(name: str, on: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runtimeClassName": "gpu-optional", "restartPolicy": "Never",
                     "nodeSelector": {"kubernetes.io/hostname": on},
                     "containers": [{"name": "show", "image": IMAGE_NAME, "command": ["sh", "-c", SHOW]}]}}


def pod_output(c: node.Cluster, name: str) -> str:
    def done():
        phase = c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").body.get("status", {}).get("phase")
        return phase in ("Succeeded", "Failed") and phase
    assert c.wait(done, 120, f"pod {name} done") == "Succeeded"
    return c.kubectl("logs", "-n", NAMESPACE, name).stdout


def test_wrapper_and_nri_nodes_give_a_pod_the_same(gpuhook_installed):
    c = gpuhook_installed
    c.kubectl("apply", "-f", "-", input=yaml.safe_dump(nri_daemonset(c)))
    try:
        c.add(NRI)
        c.wait_ready(NRI.name)
        c.wait(lambda: node.pod_ready(next((p for p in c.pods(node.AGENT_NAMESPACE, "app.kubernetes.io/name=gpuhook-nri")
                                            if p["spec"].get("nodeName") == NRI.name), {})), 240,
               "the gpuhook-nri pod Ready on the NRI node")
        c.wait(lambda: c.labels(NRI.name).get("gpuhook.dev/runtime-ready") == "true", 60, "the NRI node runtime-ready")
        assert not [p for p in c.pods(node.AGENT_NAMESPACE, node.AGENT_SELECTOR) if p["spec"].get("nodeName") == NRI.name]
        # the handlers the two agents installed: gpuhook-runtime on one, runc itself (NRI edits) on the other
        handlers = {}
        for spec in (node.NVIDIA, NRI):
            with open(os.path.join(c.nodes[spec.name].upper, "etc", "containerd", "config.toml"), "rb") as f:
                rt = tomllib.load(f)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
            handlers[spec.name] = rt["gpu-optional"].get("options", {}).get("BinaryName", "")
        print("handlers:", handlers)
        assert handlers[node.NVIDIA.name].endswith("gpuhook-runtime") and handlers[NRI.name] == "", handlers
        c.kubectl("create", "namespace", NAMESPACE)
        c.kubectl("label", "namespace", NAMESPACE, "gpuhook.dev/gpu-optional=allowed")
        outs = {}
        for spec, name in ((node.NVIDIA, "via-wrapper"), (NRI, "via-nri")):
            c.kubectl("apply", "-f", "-", input=yaml.safe_dump(show_pod(name, spec.name)))
            outs[name] = pod_output(c, name)
            print(f"--- {name} on {spec.name}:\n{outs[name]}")
        # the same, line for line (the two libcuda mounts are listed in the order they were made)
        assert sorted(outs["via-wrapper"].splitlines()) == sorted(outs["via-nri"].splitlines())
        assert "accel=nvidia" in outs["via-nri"] and outs["via-nri"].count("node /dev/nvidia") >= 8
    finally:
        c.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
        c.kubectl("delete", "daemonset", "-n", node.AGENT_NAMESPACE, "gpuhook-nri", "--ignore-not-found", check=False)
        if NRI.name in c.nodes:
            c.remove(NRI.name)
