"""Who a container belongs to, read only from the keys the node's own CRI runtime writes
(issue 26.1). config.json as CRI-O 1.28 and containerd 1.6 write it (tests/fixtures/cri-config-json,
shapes and order of writing from their sources): CRI-O copies every pod annotation into the
spec, then the kubelet's labels (io.kubernetes.pod.*) and its own keys over them; containerd
passes the handler's allowed pod annotations through, then writes io.kubernetes.cri.* over them.
A pod that names itself another pod (the victim's uid, namespace, name) must get neither the
victim's GPUs nor the agent's Events and label on the victim."""

from __future__ import annotations

import json
import os

import pytest

from conftest import FIXTURES
from conftest import plan_on
from gpuhook.config import Config
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.plan import policy, request_from_spec

REAL = {"pod_namespace": "ml", "pod_name": "trainer-0", "pod_uid": "0b7c3e5a-9d1f-4c2b-8e6a-1f3d5b7c9e0a",
        "container_name": "worker"}
VICTIM_UID = "7d2e4f60-1a3b-4c5d-8e9f-0a1b2c3d4e5f"
# what a tenant writes into its pod's metadata.annotations to pass as kube-system/etcd-node-1
FORGED = {
    "io.kubernetes.cri.sandbox-uid": VICTIM_UID, "io.kubernetes.cri.sandbox-namespace": "kube-system",
    "io.kubernetes.cri.sandbox-name": "etcd-node-1", "io.kubernetes.cri.container-name": "etcd",
    "io.kubernetes.pod.uid": VICTIM_UID, "io.kubernetes.pod.namespace": "kube-system",
    "io.kubernetes.pod.name": "etcd-node-1", "io.kubernetes.container.name": "etcd",
}


def spec_of(runtime: str) -> dict:
    with open(os.path.join(FIXTURES, "cri-config-json", f"{runtime}-container.json")) as f:
        return json.load(f)


def as_written(runtime: str, pod_annotations: dict, passthrough=("gpuhook.dev/*",)) -> dict:
    """The spec the runtime writes for a pod with these annotations, in its order of writing."""
    spec = spec_of(runtime)
    own = spec["annotations"]
    if runtime == "crio":
        spec["annotations"] = {**pod_annotations, **own}  # every pod annotation, then its own over them
    else:
        allowed = {k: v for k, v in pod_annotations.items()
                   if any(k == p or (p.endswith("*") and k.startswith(p[:-1])) for p in passthrough)}
        spec["annotations"] = {**allowed, **own}
    return spec


@pytest.mark.parametrize("runtime", ["crio", "containerd"])
def test_the_pod_is_the_one_the_runtime_says(runtime):
    assert policy.pod_of(spec_of(runtime)["annotations"]) == REAL
    forged = as_written(runtime, FORGED, passthrough=("*",))  # even a handler that passes everything
    assert policy.pod_of(forged["annotations"]) == REAL
    assert policy.pod_uid(forged["annotations"]) == REAL["pod_uid"]


def test_on_crio_containerds_keys_mean_nothing():
    ann = as_written("crio", {"io.kubernetes.cri.sandbox-uid": VICTIM_UID})["annotations"]
    assert ann["io.kubernetes.cri.sandbox-uid"] == VICTIM_UID  # CRI-O did copy it
    assert policy.pod_uid(ann) == REAL["pod_uid"]
    # without CRI-O's marker (Docker, podman, runc, a spec of no CRI runtime) CRI-O's keys mean nothing
    bare = {k: v for k, v in ann.items() if k != "io.container.manager"}
    assert policy.pod_of(bare) == {"pod_uid": VICTIM_UID}
    assert policy.pod_of({"io.kubernetes.pod.uid": VICTIM_UID, "io.container.manager": "libpod"}) == {}


@pytest.mark.parametrize("runtime", ["crio", "containerd"])
def test_a_pod_naming_itself_another_does_not_get_its_gpu(tmp_path, runtime):
    """The victim holds GPU-1 (kubelet checkpoint); the tenant forges the victim's uid: GPU-1 stays held back."""
    root = str(tmp_path)
    ckpt = os.path.join(root, "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
    os.makedirs(os.path.dirname(ckpt))
    with open(ckpt, "w") as f:
        json.dump({"Data": {"PodDeviceEntries": [{"PodUID": VICTIM_UID, "ContainerName": "etcd",
                                                  "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": ["GPU-1"]},
                                                  "AllocResp": "CgA="}],
                            "RegisteredDevices": {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}}, "Checksum": 1}, f)
    nv = VendorInventory("nvidia", tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{i}", "c", 195, i),))
                                         for i in range(2)), (Node("/dev/nvidiactl", "c", 195, 255),),
                         (Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "libcuda.so.1", "compute"),), (),
                         "550.54.14")
    spec = as_written(runtime, FORGED, passthrough=("*",))
    spec["root"] = {"path": "rootfs"}
    planned = plan_on(Inventory(root, (nv,)), request_from_spec(spec, None), config=Config(share="unallocated"))
    assert planned.devices == ("nvidia:GPU-0",)
    assert [h.device for h in planned.held_back] == ["nvidia:GPU-1"]


def test_the_agent_reads_the_pod_of_a_bundle_the_same_way(tmp_path):
    """The C front's no-gpu line has no pod: the agent reads it from the bundle, by the same rule."""
    from gpuhook.agent import podevents

    bundle = tmp_path / "run/containers/storage/overlay-containers/4f6a/userdata"
    bundle.mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(as_written("crio", FORGED)))

    class Kube:
        node = "node-1"

    r = podevents.PodReporter(Kube(), None, root=str(tmp_path))
    rec = r._from_bundle({"event": "create", "decision": "no-gpu", "bundle": "/" + str(bundle.relative_to(tmp_path))})
    assert {k: rec[k] for k in REAL} == REAL


def test_each_runtimes_pod_keys_are_the_create_lines():
    """pod_of's fields, from either runtime's annotations, are the line's pod keys (logline.POD_KEYS)
    and fields of the record that writes them: the names are written in two places, held equal here."""
    from gpuhook import logline

    assert tuple(policy.POD_ANNOTATIONS_CRIO) == tuple(policy.POD_ANNOTATIONS_CONTAINERD) == logline.POD_KEYS
    assert set(logline.POD_KEYS) <= set(logline.CreateRecord.__annotations__)
