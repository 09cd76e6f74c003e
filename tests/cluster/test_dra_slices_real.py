"""gpuhook's DRA driver against a real kube-apiserver (versions.KUBERNETES_VERSION), with the
credentials it has in its DaemonSet (the agent's ServiceAccount, a token bound to a pod on its
node) and daemonset/dra/'s RBAC and admission policy applied with the cluster's kubectl:

- the policy (resourceslice-restriction.yaml): the driver writes its own node's slices, and
  is refused another node's, another driver's, another node's slice name; the cases
  tests/unit/test_dra_admission.py evaluates with cel-python, the apiserver the judge here;
- the RBAC: the verbs the driver uses and no others (SubjectAccessReview);
- the driver's own code (publish.SlicePublisher, service.Service over a fake host's GPUs):
  a slice edited by an admin is put back in one round; a GPU that leaves the node leaves the
  slice in one round, and the pod its claim is reserved for (status written as an admin, as
  the scheduler would) gets a GPULost Event, which the agent's Event policy admits;
- a GPU's memory capacity (slices.quantity) comes back from the API server as written.

No kubelet: the Nodes are API objects (conftest.OWN_NODE, OTHER_NODE), the pods stay Pending.
tests/cluster/test_dra_real.py runs the driver under real kubelets."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest
from cluster.conftest import (
    AGENT,
    AGENT_NS,
    NODE_NAME,
    OPTED_IN,
    OTHER_NODE,
    OWN_NODE,
    REPO,
    ensure,
    eventually,
    pod_body,
)

from fakes import fakehost
from gpuhook.agent.kubeclient import KubeError
from gpuhook.dra import DRIVER, driver, publish, service, slices

POLICY = "gpuhook-own-resourceslices"
NOT_OWN = (
    "gpuhook may only write ResourceSlices of driver gpuhook.dev on the node its own pod runs on, in the pool "
    "named after that node"
)
NAMED = "gpuhook's ResourceSlices are named NODE-gpuhook.dev-NUMBER"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
GPU0 = "nvidia-gpu-00000000-1111-2222-3333-444444444444"
GPU1 = "nvidia-gpu-00000001-1111-2222-3333-444444444445"


def a_slice(node: str, name: str | None = None, driver_name: str = DRIVER) -> dict:
    (s,) = slices.resource_slices(node, (slices.none_device(),), 1)
    if name:
        s["metadata"]["name"] = name
    s["spec"]["driver"] = driver_name
    return s


@pytest.fixture(scope="module")
def dra_applied(control_plane, gpuhook_applied):
    """daemonset/dra/'s RBAC and ResourceSlice policy applied (not its DaemonSet: no kubelet
    here), returned once the policy is enforced."""
    cp = control_plane
    cp.kubectl(
        "apply",
        "-f",
        os.path.join(REPO, "daemonset", "dra", "rbac.yaml"),
        "-f",
        os.path.join(REPO, "daemonset", "dra", "resourceslice-restriction.yaml"),
    )

    def enforced():
        r = cp.api("POST", SLICES + "?dryRun=All", a_slice(OTHER_NODE), user=AGENT, extra={NODE_NAME: [OWN_NODE]})
        return r.status in (403, 422) and POLICY in r.message

    eventually(enforced, what=f"{POLICY} enforced")


def denied(r, message: str) -> None:
    assert r.status in (403, 422), r
    assert f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request" in r.message, r.message
    assert message in r.message, r.message


def gone(cp, name: str) -> None:
    cp.api("DELETE", f"{SLICES}/{name}")


def test_the_policy_type_checks_clean_in_the_apiserver(control_plane, dra_applied):
    path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{POLICY}"

    def checked():
        st = control_plane.api("GET", path).body
        return st.get("status", {}).get("observedGeneration") == st["metadata"]["generation"] and st

    eventually(checked, what=f"{POLICY} type-checked")
    st = control_plane.api("GET", path).body
    assert st["status"].get("typeChecking", {}).get("expressionWarnings", []) == [], st["status"]


def test_the_driver_writes_its_own_slices_and_no_other(control_plane, dra_applied, agent_token):
    """With the bound token: its own node's slice created, updated, deleted; another node's,
    another driver's, and a name of another node's slice refused, by the policy."""
    cp = control_plane
    as_agent = {"token": agent_token}
    mine = a_slice(OWN_NODE)
    name = mine["metadata"]["name"]
    gone(cp, name)
    r = cp.api("POST", SLICES, mine, **as_agent)
    assert r.status == 201, r
    r = cp.api(
        "PATCH", f"{SLICES}/{name}", {"spec": {"devices": []}}, content_type="application/merge-patch+json", **as_agent
    )
    assert r.status == 200 and r.body["spec"].get("devices", []) == [], r
    assert cp.api("DELETE", f"{SLICES}/{name}", **as_agent).status == 200

    denied(cp.api("POST", SLICES, a_slice(OTHER_NODE), **as_agent), NOT_OWN)
    denied(cp.api("POST", SLICES, a_slice(OWN_NODE, driver_name="gpu.nvidia.com"), **as_agent), NOT_OWN)
    # node OWN_NODE-gpuhook.dev's slice name, taken by OWN_NODE: that node's driver could never write it
    denied(cp.api("POST", SLICES, a_slice(OWN_NODE, f"{OWN_NODE}-{DRIVER}-{DRIVER}-0"), **as_agent), NAMED)

    # slices an admin (or another driver) made: another node's, another driver's on its own node
    theirs, vendor = a_slice(OTHER_NODE), a_slice(OWN_NODE, f"{OWN_NODE}-nvidia", "gpu.nvidia.com")
    for s in (theirs, vendor):
        ensure(cp, SLICES, s)
        path = f"{SLICES}/{s['metadata']['name']}"
        denied(cp.api("DELETE", path, **as_agent), NOT_OWN)
        denied(
            cp.api("PATCH", path, {"spec": {"devices": []}}, content_type="application/merge-patch+json", **as_agent),
            NOT_OWN,
        )
        assert cp.api("GET", path).body["spec"]["devices"], "a refused write changed nothing"
        gone(cp, s["metadata"]["name"])


def test_gpuhooks_own_client_is_refused_another_nodes_slice(control_plane, dra_applied, agent_api):
    """The driver's own call (a forced server-side apply) for another node: one KubeError."""
    with pytest.raises(KubeError) as e:
        agent_api.apply_resource_slice(a_slice(OTHER_NODE), publish.MANAGER)
    assert e.value.status in (403, 422) and POLICY in str(e.value), str(e.value)
    assert control_plane.api("GET", f"{SLICES}/{slices.slice_name(OTHER_NODE, 0)}").status == 404


def can_i(cp, verb: str, resource: str, namespace: str | None = None) -> bool:
    """The apiserver's own answer (SubjectAccessReview) for the agent's ServiceAccount;
    resource may name a subresource (resourceclaims/status)."""
    resource, _, sub = resource.partition("/")
    attrs = {"verb": verb, "resource": resource, "group": "resource.k8s.io"}
    for k, v in (("namespace", namespace), ("subresource", sub)):
        if v:
            attrs[k] = v
    r = cp.api(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": AGENT,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{AGENT_NS}", "system:authenticated"],
                "resourceAttributes": attrs,
            },
        },
    )
    assert r.status == 201, r
    return r.body["status"].get("allowed", False)


USED = [
    ("list", "resourceslices", None),
    ("create", "resourceslices", None),
    ("patch", "resourceslices", None),
    ("delete", "resourceslices", None),
    ("get", "resourceclaims", OPTED_IN),
]
UNUSED = [
    ("get", "resourceslices", None),
    ("watch", "resourceslices", None),
    ("update", "resourceslices", None),
    ("deletecollection", "resourceslices", None),
    ("list", "resourceclaims", OPTED_IN),
    ("update", "resourceclaims", OPTED_IN),
    ("update", "resourceclaims/status", OPTED_IN),
    ("create", "deviceclasses", None),
    ("delete", "deviceclasses", None),
    ("create", "resourceclaimtemplates", OPTED_IN),
]


def test_the_rbac_grants_what_the_driver_uses_and_nothing_else(control_plane, dra_applied):
    assert [v for v in USED if not can_i(control_plane, *v)] == []
    assert [v for v in UNUSED if can_i(control_plane, *v)] == []


# -- the driver's own loop with the agent's credentials ---------------------------------------


class _Log:
    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def __getattr__(self, level):
        return lambda event, **kw: self.lines.append((event, kw))


@pytest.fixture
def node_service(tmp_path, control_plane, dra_applied, agent_api):
    """service.Service of OWN_NODE over a fake host with 2 NVIDIA GPUs, with the agent's API
    client (its bound token); its slices removed before and after."""
    for i in range(2):
        gone(control_plane, slices.slice_name(OWN_NODE, i))
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=2)
    devices = publish.NodeDevices(fh.root, str(tmp_path / "cdi"), ldconfig=False, helper=False)
    drv = driver.Driver(
        OWN_NODE, driver.Checkpoint(str(tmp_path / "checkpoint.json")), agent_api.get_resource_claim, devices.table
    )
    log = _Log()
    svc = service.Service(OWN_NODE, devices, drv, agent_api, log, interval=1)
    yield svc, fh, log
    gone(control_plane, slices.slice_name(OWN_NODE, 0))


def names(cp) -> list[str]:
    r = cp.api("GET", f"{SLICES}/{slices.slice_name(OWN_NODE, 0)}")
    assert r.status == 200, r
    return [d["name"] for d in r.body["spec"]["devices"]]


def no_errors(log: _Log) -> None:
    assert [line for line in log.lines if line[0].endswith(".error")] == []


def test_a_slice_edited_by_someone_else_is_put_back_in_one_round(control_plane, node_service):
    cp = control_plane
    svc, _, log = node_service
    svc.round()
    no_errors(log)
    assert names(cp) == [GPU0, GPU1, "none"]
    path = f"{SLICES}/{slices.slice_name(OWN_NODE, 0)}"
    want = cp.api("GET", path).body["spec"]
    # an admin takes a GPU out and renames an attribute's value
    edited = dict(
        want,
        devices=[dict(want["devices"][0], attributes=dict(want["devices"][0]["attributes"], vendor={"string": "amd"}))]
        + want["devices"][2:],
    )
    r = cp.api("PUT", path, dict(cp.api("GET", path).body, spec=edited))
    assert r.status == 200 and [d["name"] for d in r.body["spec"]["devices"]] == [GPU0, "none"], r
    svc.round()
    no_errors(log)
    back = cp.api("GET", path).body["spec"]
    assert back["devices"] == want["devices"] and back["pool"] == want["pool"]  # the same generation: nothing new


def test_a_gpu_that_leaves_leaves_the_slice_and_its_pod_is_told(control_plane, node_service):
    """A claim allocated GPU0 and reserved for a pod (status written as the scheduler and the
    kubelet would), prepared by the driver; GPU0 leaves the fake host; one round: the slice
    lacks it, the pod has a GPULost Event from gpuhook's client, admitted by the Event policy."""
    cp = control_plane
    svc, fh, log = node_service
    svc.round()
    assert names(cp) == [GPU0, GPU1, "none"]
    pod = pod_body(f"dra-{uuid.uuid4().hex[:8]}", OPTED_IN, None, node=OWN_NODE)
    pod_uid = ensure(cp, f"/api/v1/namespaces/{OPTED_IN}/pods", pod)["metadata"]["uid"]
    claims = f"/apis/resource.k8s.io/v1/namespaces/{OPTED_IN}/resourceclaims"
    claim = ensure(
        cp,
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": pod["metadata"]["name"], "namespace": OPTED_IN},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuhook.dev"}}]}},
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": OWN_NODE, "device": GPU0}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod_uid}],
    }
    r = cp.api("PUT", f"{claims}/{claim['metadata']['name']}/status", claim)
    assert r.status == 200, r
    uid = claim["metadata"]["uid"]
    prepared = svc.driver.prepare(OPTED_IN, claim["metadata"]["name"], uid)
    assert [d["device"] for d in prepared] == [GPU0]

    shutil.rmtree(fh.p("/proc/driver/nvidia/gpus/0000:18:00.0"))
    svc.round()
    no_errors(log)
    assert names(cp) == [GPU1, "none"]
    events = cp.api("GET", f"/api/v1/namespaces/{OPTED_IN}/events?fieldSelector=involvedObject.uid={pod_uid}").body
    assert [(e["reason"], e["type"], e["involvedObject"]["name"], e["reportingInstance"]) for e in events["items"]] == [
        ("GPULost", "Warning", pod["metadata"]["name"], OWN_NODE)
    ]
    assert events["items"][0]["message"] == (
        f"{GPU0} left node {OWN_NODE}: ResourceClaim {OPTED_IN}/{claim['metadata']['name']} holds it"
    )
    svc.round()  # told once
    again = cp.api("GET", f"/api/v1/namespaces/{OPTED_IN}/events?fieldSelector=involvedObject.uid={pod_uid}").body
    assert len(again["items"]) == 1
    no_errors(log)


QUANTITIES = [fakehost.MI210_VRAM, fakehost.FLEX170_VRAM, 16 * 10**9, 1001 * 10**6, 10**9 + 1, 1023, 1024]


def test_memory_capacity_comes_back_as_written(control_plane, dra_applied, agent_api, tmp_path):
    """An AMD node's GPUs with their memory, published by the driver with the agent's token:
    the API server gives back the capacity as written (slices.quantity is its canonical form),
    and so does it for each quantity of the unit test's (a slice written as an admin)."""
    cp = control_plane
    gone(cp, slices.slice_name(OWN_NODE, 0))
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.amd(fh)
    devices = publish.NodeDevices(fh.root, str(tmp_path / "cdi"), ldconfig=False, helper=False).refresh()
    publish.SlicePublisher(agent_api, OWN_NODE).sync(devices)
    got = cp.api("GET", f"{SLICES}/{slices.slice_name(OWN_NODE, 0)}").body["spec"]["devices"]
    assert [d.get("capacity") for d in got] == [p.device.get("capacity") for p in devices]
    assert got[0]["capacity"] == {"memory": {"value": "65520Mi"}}
    gone(cp, slices.slice_name(OWN_NODE, 0))

    body = a_slice(OTHER_NODE, "gh-quantities")
    body["spec"]["devices"] = [
        {"name": f"d{i}", "capacity": {"memory": {"value": slices.quantity(n)}}} for i, n in enumerate(QUANTITIES)
    ]
    r = cp.api("POST", SLICES, body)
    assert r.status == 201, r
    assert [d["capacity"]["memory"]["value"] for d in r.body["spec"]["devices"]] == [
        slices.quantity(n) for n in QUANTITIES
    ]
    gone(cp, "gh-quantities")
