"""daemonset/gpu-optional-admission.yaml and daemonset/node-restriction.yaml enforced by a real
kube-apiserver (versions.KUBERNETES_VERSION): the cases tests/unit/test_admission.py evaluates
with cel-python, as requests the apiserver admits or refuses: the namespace opt-in, the
annotation allow-list at CREATE and UPDATE (through pods/status too), the pod label
gpuhook.dev/accelerator, the agent's pod labels and Events (made by gpuhook's own client with a
token bound to a pod on its node, the node name the apiserver writes into it) and its Node's
labels. Where cel-python and the apiserver could disagree, the apiserver is the judge here.

Requests that object validation refuses before admission runs (an annotation key with no
name, an Event whose involvedObject's namespace is not its own) are refused here all the same;
the test says which of the two refused them."""

from __future__ import annotations

import uuid

import pytest
import yaml
from cluster.conftest import (AGENT, AGENT_NS, NODE_NAME, NOT_OPTED_IN, OPTED_IN, OTHER_NODE, OWN_NODE, REPO, ensure,
                      eventually, pod_body)

MERGE = "application/merge-patch+json"
EVENTS_POLICY = "gpuhook-agent-events"
pytestmark = pytest.mark.usefixtures("gpuhook_applied")

NOT_ALLOWED = ("runtimeClassName gpu-optional is not allowed in namespace {ns}; a cluster admin opts it in with: "
               "kubectl label namespace {ns} gpuhook.dev/gpu-optional=allowed")
UNKNOWN = ("a gpu-optional pod may set only the gpuhook.dev/ annotations gpuhook.dev/inject, gpuhook.dev/vendors "
           "and gpuhook.dev/max-gpus")
RUNTIME_KEYS = ("a gpu-optional pod may not set io.kubernetes.* annotations nor io.container.manager: the container "
                "runtime writes them")
LABEL_MSG = "the pod label gpuhook.dev/accelerator is set by the gpuhook agent only"
OTHER_NODES_POD = "gpuhook may only change pods on the node its own pod runs on"
ONLY_THE_LABEL = "gpuhook may only change the pod label gpuhook.dev/accelerator"
EVENT_MSG = ("gpuhook's events are about pods and its own node, with gpuhook's reasons, reported by the agent of "
             "its own node")
UPDATE_MSG = "gpuhook may only update its own events, and there only how often and when they were seen"
OWN_NODE_ONLY = "gpuhook may only change the node its own pod runs on"
ONLY_LABELS = "gpuhook may only change gpuhook.dev/ labels and the vendorLabels"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def denied(r, policy: str, message: str) -> None:
    """The response is the apiserver's refusal by `policy` with `message` (its Status text is
    "ValidatingAdmissionPolicy 'P' with binding 'P' denied request: MESSAGE")."""
    assert r.status in (403, 422), r
    assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request" in r.message, r.message
    assert message in r.message, r.message


def create_pod(cp, namespace: str, *args, **kw):
    body = pod_body(unique("p"), namespace, *args, **kw)
    return cp.api("POST", f"/api/v1/namespaces/{namespace}/pods", body), body["metadata"]["name"]


def made(r) -> dict:
    assert r.status in (200, 201), r
    return r.body


def test_the_policies_type_check_clean_in_the_apiserver(control_plane):
    """The apiserver type-checks every expression against the resources' schemas (what
    cel-python cannot): no warning for any of gpuhook's policies."""
    names = ("gpuhook-gpu-optional", "gpuhook-pod-accelerator-label", "gpuhook-agent-pods", "gpuhook-agent-events",
             "gpuhook-own-node-labels")

    def checked(name):
        st = control_plane.api("GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}").body
        return st.get("status", {}).get("observedGeneration") == st["metadata"]["generation"]

    for name in names:
        eventually(lambda name=name: checked(name), what=f"{name} type-checked")
        st = control_plane.api("GET", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}").body
        warnings = st["status"].get("typeChecking", {}).get("expressionWarnings", [])
        # the events policy is also checked against events.k8s.io/v1's Event (an equivalent
        # resource: no involvedObject there), though such requests reach it converted to
        # core/v1 (test_an_event_through_events_k8s_io_is_judged_as_core_v1): those only
        assert [w for w in warnings if not (name == EVENTS_POLICY and w["warning"].startswith(
            "events.k8s.io/v1, Kind=Event: "))] == [], (name, st["status"])


# -- who may use gpu-optional -------------------------------------------------------------------

def test_gpu_optional_is_admitted_in_an_opted_in_namespace(control_plane):
    narrowing = {"gpuhook.dev/inject": "false", "gpuhook.dev/vendors": "nvidia", "gpuhook.dev/max-gpus": "1",
                 "prometheus.io/scrape": "true"}
    made(create_pod(control_plane, OPTED_IN)[0])
    made(create_pod(control_plane, OPTED_IN, annotations=narrowing)[0])


@pytest.mark.parametrize("labels", [None, {}, {"gpuhook.dev/gpu-optional": "true"},
                                    {"gpuhook.dev/gpu-optional": "Allowed", "x": "y"}])
def test_gpu_optional_is_refused_elsewhere_with_how_to_opt_in(control_plane, labels):
    cp = control_plane
    ns = unique("gh-nons")
    meta = {"name": ns} if labels is None else {"name": ns, "labels": labels}
    ensure(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    eventually(lambda: cp.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default").status == 200)
    r, _ = create_pod(cp, ns)
    denied(r, "gpuhook-gpu-optional", NOT_ALLOWED.format(ns=ns))
    cp.api("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.mark.parametrize("runtime_class", [None, "runc", "kata", "gpu-optional-x"])
def test_other_pods_are_not_looked_at(control_plane, runtime_class):
    if runtime_class:  # the RuntimeClass admission plugin wants the class to exist
        ensure(control_plane, "/apis/node.k8s.io/v1/runtimeclasses",
               {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class},
                "handler": runtime_class})
    made(create_pod(control_plane, NOT_OPTED_IN, runtime_class, annotations={"gpuhook.dev/x": "1"})[0])


@pytest.mark.parametrize("key", ["gpuhook.dev/share", "gpuhook.dev/accelerator"])
def test_an_unknown_gpuhook_annotation_is_refused(control_plane, key):
    r, _ = create_pod(control_plane, OPTED_IN, annotations={key: "all"})
    denied(r, "gpuhook-gpu-optional", UNKNOWN)


def test_an_annotation_key_with_no_name_is_refused_before_admission(control_plane):
    """cel-python's case "gpuhook.dev/" (refused by the policy there): the apiserver's object
    validation refuses the key first, as it does for any pod."""
    r, _ = create_pod(control_plane, OPTED_IN, annotations={"gpuhook.dev/": "all"})
    assert r.status == 422 and "metadata.annotations" in r.message and "ValidatingAdmissionPolicy" not in r.message, r


def test_two_refusals_at_once_name_the_first(control_plane):
    """The apiserver stops at a policy's first failed validation: the pod is refused with the
    opt-in's message alone (tests/unit/test_admission.py's model does the same)."""
    r, _ = create_pod(control_plane, NOT_OPTED_IN, annotations={"gpuhook.dev/x": ""})
    denied(r, "gpuhook-gpu-optional", NOT_ALLOWED.format(ns=NOT_OPTED_IN))
    assert UNKNOWN not in r.message and len(r.body["details"]["causes"]) == 1, r.body


@pytest.mark.parametrize("key", ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.cri.sandbox-namespace",
                                 "io.kubernetes.pod.uid", "io.kubernetes.pod.name", "io.kubernetes.container.name",
                                 "io.kubernetes.cri-o.Labels", "io.container.manager"])
def test_a_gpu_optional_pod_may_not_name_its_own_pod(control_plane, key):
    r, _ = create_pod(control_plane, OPTED_IN, annotations={key: "x"})
    denied(r, "gpuhook-gpu-optional", RUNTIME_KEYS)
    made(create_pod(control_plane, OPTED_IN, None, annotations={key: "x"})[0])
    made(create_pod(control_plane, OPTED_IN, annotations={"kubernetes.io/x": "1", "io.k8s/y": "2"})[0])


def patch(cp, path: str, body: dict, **kw):
    return cp.api("PATCH", path, body, content_type=MERGE, **kw)


@pytest.mark.parametrize("subresource", ["", "/status"])
@pytest.mark.parametrize("key,refusal", [("gpuhook.dev/share", UNKNOWN), ("io.kubernetes.pod.uid", RUNTIME_KEYS),
                                         ("io.container.manager", RUNTIME_KEYS)])
def test_the_annotation_rules_hold_at_update_too(control_plane, subresource, key, refusal):
    cp = control_plane
    r, name = create_pod(cp, OPTED_IN, annotations={"a": "1"})
    made(r)
    path = f"/api/v1/namespaces/{OPTED_IN}/pods/{name}{subresource}"
    denied(patch(cp, path, {"metadata": {"annotations": {key: "v"}}}), "gpuhook-gpu-optional", refusal)
    # the namespace's opt-in is checked at CREATE only
    made(patch(cp, path, {"metadata": {"annotations": {"gpuhook.dev/inject": "false"}}}))


def test_the_namespaces_opt_in_is_checked_at_create_only(control_plane):
    """A pod of a namespace opted out since: it is still updated (within the annotation rules)."""
    cp = control_plane
    ns = unique("gh-was-in")
    ensure(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": ns, "labels": {"gpuhook.dev/gpu-optional": "allowed"}}})
    eventually(lambda: cp.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default").status == 200)
    r, name = create_pod(cp, ns)
    made(r)
    made(patch(cp, f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {"gpuhook.dev/gpu-optional": None}}}))
    eventually(lambda: "ValidatingAdmissionPolicy" in create_pod(cp, ns)[0].message, what="the opt-out seen")
    for sub in ("", "/status"):
        made(patch(cp, f"/api/v1/namespaces/{ns}/pods/{name}{sub}",
                   {"metadata": {"annotations": {"gpuhook.dev/inject": "false", "x": sub or "main"}}}))
    cp.api("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
def admitted_before_the_policy(control_plane):
    """Pods that got a refused annotation while the policy was not bound (a pod admitted
    before gpuhook was installed): the binding removed, the pods made, the binding back."""
    cp = control_plane
    path = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/gpuhook-gpu-optional"
    binding = cp.api("GET", path).body
    assert cp.api("DELETE", path).status == 200
    keys = ("gpuhook.dev/share", "io.kubernetes.pod.uid", "io.container.manager")
    names = {}
    try:
        for key in keys:
            body = pod_body(unique("old"), OPTED_IN, annotations={"a": "1", key: "v"})
            eventually(lambda body=body: cp.api("POST", f"/api/v1/namespaces/{OPTED_IN}/pods", body).status == 201,
                       what="a pod made while the binding is gone")
            names[key] = body["metadata"]["name"]
    finally:
        binding = {k: binding[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": "gpuhook-gpu-optional"}}
        assert cp.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                      binding).status == 201
    probe = pod_body("probe", OPTED_IN, annotations={"gpuhook.dev/share": "x"})
    eventually(lambda: "ValidatingAdmissionPolicy" in cp.api("POST", f"/api/v1/namespaces/{OPTED_IN}/pods?dryRun=All",
                                                              probe).message, what="the binding enforced again")
    return names


@pytest.mark.parametrize("subresource", ["", "/status"])
@pytest.mark.parametrize("key,refusal", [("gpuhook.dev/share", UNKNOWN), ("io.kubernetes.pod.uid", RUNTIME_KEYS),
                                         ("io.container.manager", RUNTIME_KEYS)])
def test_an_annotation_the_pod_already_had_is_let_be(control_plane, admitted_before_the_policy, subresource, key,
                                                     refusal):
    path = f"/api/v1/namespaces/{OPTED_IN}/pods/{admitted_before_the_policy[key]}{subresource}"
    made(patch(control_plane, path, {"metadata": {"annotations": {"a": "2"}}}))  # unchanged: the pod can be updated
    denied(patch(control_plane, path, {"metadata": {"annotations": {key: "w"}}}), "gpuhook-gpu-optional", refusal)


# -- the pod label gpuhook.dev/accelerator is the agent's ---------------------------------------

LABEL = "gpuhook-pod-accelerator-label"


def test_no_pod_is_created_with_the_accelerator_label(control_plane):
    for rc in ("gpu-optional", None):
        r, _ = create_pod(control_plane, OPTED_IN, rc, labels={"gpuhook.dev/accelerator": "nvidia"})
        denied(r, LABEL, LABEL_MSG)
    made(create_pod(control_plane, OPTED_IN, labels={"app": "x"})[0])


@pytest.fixture(scope="module")
def alice(control_plane):
    """A tenant who may edit pods in OPTED_IN (the `edit` ClusterRole, bound there)."""
    ensure(control_plane, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OPTED_IN}/rolebindings",
           {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "alice-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})
    return {"user": "alice", "groups": ("system:authenticated",)}


@pytest.mark.parametrize("subresource", ["", "/status"])
def test_the_accelerator_label_is_guarded_through_the_status_subresource_too(control_plane, alice, subresource):
    cp = control_plane
    r, name = create_pod(cp, OPTED_IN, labels={"app": "x"})
    made(r)
    path = f"/api/v1/namespaces/{OPTED_IN}/pods/{name}{subresource}"
    # a tenant writes the pod; a controller of theirs its status (the kubelet cannot change
    # labels there at all: NodeRestriction refuses it first)
    who = alice if not subresource else {"user": "status-writer", "groups": ("system:authenticated",)}
    if subresource:
        ensure(cp, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OPTED_IN}/roles",
               {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "status-writer"},
                "rules": [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]})
        ensure(cp, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{OPTED_IN}/rolebindings",
               {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "status-writer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "status-writer"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "status-writer"}]})
        as_node = {"user": f"system:node:{OWN_NODE}", "groups": ("system:nodes", "system:authenticated")}
        r = patch(cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "nvidia"}}}, **as_node)
        assert r.status == 403 and "cannot update labels through pod status" in r.message, r
    eventually(lambda: "ValidatingAdmissionPolicy" in patch(
        cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "nvidia"}}}, **who).message, what="RBAC caught up")
    denied(patch(cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "nvidia"}}}, **who), LABEL, LABEL_MSG)
    # and cluster-admin alike: only the agent sets it
    denied(patch(cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "nvidia"}}}), LABEL, LABEL_MSG)
    made(patch(cp, path, {"metadata": {"labels": {"app": "y"}}}, **who))  # the same writer, another label


def test_only_the_agent_changes_the_accelerator_label(control_plane, alice, agent_api):
    cp = control_plane
    r, name = create_pod(cp, OPTED_IN, labels={"app": "x"})
    made(r)
    path = f"/api/v1/namespaces/{OPTED_IN}/pods/{name}"
    denied(patch(cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "cpu"}}}, **alice), LABEL, LABEL_MSG)
    got = agent_api.patch_pod_labels(OPTED_IN, name, {"gpuhook.dev/accelerator": "cpu"})
    assert got["metadata"]["labels"] == {"app": "x", "gpuhook.dev/accelerator": "cpu"}
    denied(patch(cp, path, {"metadata": {"labels": {"gpuhook.dev/accelerator": None}}}, **alice), LABEL,
           LABEL_MSG)  # nor removes it
    made(patch(cp, path, {"metadata": {"labels": {"b": "1"}}}, **alice))  # other updates are not looked at


# -- the agent: pods of its own node, one label, its own events ------------------------------------

AGENT_POLICY = "gpuhook-agent-pods"


def agent_error(fn, *args, **kw):
    """The KubeError gpuhook's client raises for a refused call."""
    from gpuhook.agent import kubeclient

    with pytest.raises(kubeclient.KubeError) as e:
        fn(*args, **kw)
    return e.value


def test_the_agent_labels_a_pod_of_its_own_node(control_plane, agent_api):
    r, name = create_pod(control_plane, OPTED_IN, labels={"app": "x"}, annotations={"a": "1"})
    made(r)
    got = agent_api.patch_pod_labels(OPTED_IN, name, {"gpuhook.dev/accelerator": "nvidia"})
    assert got["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia"
    assert agent_api.get_pod(OPTED_IN, name)["metadata"]["labels"] == {"app": "x", "gpuhook.dev/accelerator": "nvidia"}


@pytest.mark.parametrize("node", [OTHER_NODE, None])
def test_the_agent_may_not_touch_another_nodes_pod(control_plane, agent_api, node):
    r, name = create_pod(control_plane, OPTED_IN, node=node)
    made(r)
    e = agent_error(agent_api.patch_pod_labels, OPTED_IN, name, {"gpuhook.dev/accelerator": "nvidia"})
    assert e.status == 403 and OTHER_NODES_POD in str(e), e


def test_a_token_without_a_node_name_changes_no_pod(control_plane):
    r, name = create_pod(control_plane, OPTED_IN)
    made(r)
    # the agent's user with no node name (a token not bound to a pod: a legacy Secret's)
    r = patch(control_plane, f"/api/v1/namespaces/{OPTED_IN}/pods/{name}",
              {"metadata": {"labels": {"gpuhook.dev/accelerator": "cpu"}}}, user=AGENT)
    denied(r, AGENT_POLICY, OTHER_NODES_POD)


@pytest.mark.parametrize("change", ["label", "remove-label", "annotation", "spec", "owner", "finalizer"])
def test_the_agent_may_change_nothing_else(control_plane, agent_token, change):
    cp = control_plane
    r, name = create_pod(cp, OPTED_IN, labels={"app": "x"}, annotations={"a": "1"})
    made(r)
    body: dict = {"metadata": {"labels": {"gpuhook.dev/accelerator": "cpu"}}}
    if change == "label":
        body["metadata"]["labels"]["app"] = "y"
    elif change == "remove-label":
        body["metadata"]["labels"]["app"] = None
    elif change == "annotation":
        body["metadata"]["annotations"] = {"gpuhook.dev/inject": "false"}
    elif change == "spec":
        body["spec"] = {"containers": [{"name": "c", "image": "evil"}]}
    elif change == "owner":
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": OWN_NODE, "uid": "u"}]
    else:
        body["metadata"]["finalizers"] = ["x/y"]
    r = patch(cp, f"/api/v1/namespaces/{OPTED_IN}/pods/{name}", body, token=agent_token)
    denied(r, AGENT_POLICY, ONLY_THE_LABEL)


def test_the_agents_events_name_its_own_node(control_plane, agent_api, agent_token):
    from gpuhook.agent import kube

    r, name = create_pod(control_plane, OPTED_IN)
    uid = made(r)["metadata"]["uid"]
    for reason in kube.EVENT_REASONS["Pod"]:
        ev = agent_api.post_pod_event(OPTED_IN, name, uid, "c", reason, "container c got 1 GPU")
        assert ev["reportingInstance"] == OWN_NODE and ev["reason"] == reason
    node_uid = control_plane.api("GET", f"/api/v1/nodes/{OWN_NODE}").body["metadata"]["uid"]
    for reason in kube.EVENT_REASONS["Node"]:
        ev = agent_api.post_event(reason, "2 GPUs", node_uid=node_uid)
        assert ev["metadata"]["namespace"] == "default" and ev["involvedObject"]["name"] == OWN_NODE

    def event(**over):
        body = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "e-", "namespace": OPTED_IN},
                "involvedObject": {"kind": "Pod", "name": name, "namespace": OPTED_IN}, "reason": "GPUsInjected",
                "reportingComponent": "gpuhook.dev/agent", "reportingInstance": OWN_NODE, "action": "CreateContainer"}
        body.update(over)
        return body

    def post(body, namespace=OPTED_IN, **kw):
        return control_plane.api("POST", f"/api/v1/namespaces/{namespace}/events", body, **kw)

    made(post(event(), token=agent_token))
    for bad in (event(reportingInstance=OTHER_NODE), event(involvedObject={"kind": "Secret", "name": "s",
                                                                           "namespace": OPTED_IN}),
                event(reportingComponent="kubelet"), event(reason="BackOff"), event(reason="GPUInventory"),
                {k: v for k, v in event().items() if k != "reason"}):
        denied(post(bad, token=agent_token), EVENTS_POLICY, EVENT_MSG)
    denied(post(event(), user=AGENT), EVENTS_POLICY, EVENT_MSG)  # no node name
    node_event = dict(event(), involvedObject={"kind": "Node", "name": OTHER_NODE}, reason="GPUInventory")
    node_event["metadata"] = {"generateName": "e-", "namespace": "default"}
    denied(post(node_event, "default", token=agent_token), EVENTS_POLICY, EVENT_MSG)
    denied(post(dict(node_event, involvedObject={"kind": "Node", "name": OWN_NODE}, reason="GPUsInjected"), "default",
                token=agent_token), EVENTS_POLICY, EVENT_MSG)
    # cel-python's cases that object validation refuses first: a Node event outside `default`,
    # a Pod event about a pod of another namespace (involvedObject.namespace must be the Event's)
    for bad, ns in ((dict(node_event, involvedObject={"kind": "Node", "name": OWN_NODE},
                          metadata={"generateName": "e-", "namespace": OPTED_IN}), OPTED_IN),
                    (event(involvedObject={"kind": "Pod", "name": "etcd", "namespace": "kube-system"}), OPTED_IN)):
        r = post(bad, ns, token=agent_token)
        assert r.status == 422 and "involvedObject.namespace" in r.message, r


def test_the_agent_updates_only_its_own_events_and_only_their_count(control_plane, agent_api, agent_token):
    cp = control_plane
    r, name = create_pod(cp, OPTED_IN)
    uid = made(r)["metadata"]["uid"]
    mine = agent_api.post_pod_event(OPTED_IN, name, uid, "c", "GPUsInjected", "container c got 1 GPU")
    ev_name = mine["metadata"]["name"]
    again = agent_api.patch_event(OPTED_IN, ev_name, {"count": 2, "lastTimestamp": "2026-01-01T00:00:01Z"})
    assert again["count"] == 2
    path = f"/api/v1/namespaces/{OPTED_IN}/events/{ev_name}"
    for change in ({"reason": "RanOnCPU"}, {"message": "something else"}, {"type": "Warning"},
                   {"involvedObject": {"name": "victim"}}, {"metadata": {"finalizers": ["x/y"]}}):
        denied(patch(cp, path, change, token=agent_token), EVENTS_POLICY, UPDATE_MSG)
    # a kubelet's Event rewritten into the agent's (core/v1 Event updates skip immutability checks)
    kubelets = made(cp.api("POST", f"/api/v1/namespaces/{OPTED_IN}/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "k-"}, "reason": "BackOff",
        "involvedObject": {"kind": "Pod", "name": name, "namespace": OPTED_IN},
        "message": "Back-off restarting failed container", "type": "Warning", "reportingComponent": "kubelet",
        "reportingInstance": OWN_NODE, "action": "x"}))
    e = agent_error(agent_api.patch_event, OPTED_IN, kubelets["metadata"]["name"],
                    {"reason": "RanOnCPU", "reportingComponent": "gpuhook.dev/agent", "message": "hm"})
    assert e.status == 403 and UPDATE_MSG in str(e), e
    # the agent of another node's Event (as it wrote it): not this agent's to count
    theirs = made(cp.api("POST", f"/api/v1/namespaces/{OPTED_IN}/events", {
        "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "o-"}, "reason": "GPUsInjected",
        "involvedObject": {"kind": "Pod", "name": name, "namespace": OPTED_IN}, "message": "m", "type": "Normal",
        "reportingComponent": "gpuhook.dev/agent", "reportingInstance": OTHER_NODE, "action": "CreateContainer"}))
    e = agent_error(agent_api.patch_event, OPTED_IN, theirs["metadata"]["name"], {"count": 2})
    assert e.status == 403 and EVENT_MSG in str(e), e  # the first rule already: not reported by this node


# -- the agent on Nodes (node-restriction.yaml) --------------------------------------------

NODE_POLICY = "gpuhook-own-node-labels"


def node_labels(cp, name: str) -> dict:
    return cp.api("GET", f"/api/v1/nodes/{name}").body["metadata"].get("labels", {})


def test_the_agent_changes_only_gpuhook_labels_of_its_own_node(control_plane, agent_api, agent_token):
    cp = control_plane
    got = agent_api.patch_labels({"gpuhook.dev/accelerator": "nvidia", "gpuhook.dev/gpu.count": "8"})
    assert got["metadata"]["labels"]["gpuhook.dev/gpu.count"] == "8"
    agent_api.patch_labels({"gpuhook.dev/gpu.count": None})
    assert "gpuhook.dev/gpu.count" not in node_labels(cp, OWN_NODE)
    as_agent = {"token": agent_token}
    other = patch(cp, f"/api/v1/nodes/{OTHER_NODE}", {"metadata": {"labels": {"gpuhook.dev/x": "1"}}}, **as_agent)
    denied(other, NODE_POLICY, OWN_NODE_ONLY)
    no_node = patch(cp, f"/api/v1/nodes/{OWN_NODE}", {"metadata": {"labels": {"gpuhook.dev/x": "1"}}}, user=AGENT)
    denied(no_node, NODE_POLICY, OWN_NODE_ONLY)
    own = f"/api/v1/nodes/{OWN_NODE}"
    for body in ({"metadata": {"labels": {"kubernetes.io/hostname": "evil"}}},
                 {"metadata": {"labels": {"kubernetes.io/hostname": None}}},  # a label removed
                 {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                 {"spec": {"unschedulable": True}},  # cordon
                 {"metadata": {"finalizers": ["x/y"]}},
                 {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "u"}]}},
                 {"metadata": {"annotations": {"x": "y"}}}):
        denied(patch(cp, own, body, **as_agent), NODE_POLICY, ONLY_LABELS)
    # another user (the kubelet, an admin) is not this policy's business
    made(patch(cp, own, {"metadata": {"labels": {"gh-test": "admin"}}}))


def test_the_agent_sets_changes_and_removes_gpu_type(control_plane, agent_api, agent_token):
    cp = control_plane
    agent_api.patch_labels({"gpu.type": "nvidia"})
    assert node_labels(cp, OWN_NODE)["gpu.type"] == "nvidia"
    agent_api.patch_labels({"gpu.type": "amd"})
    agent_api.patch_labels({"gpu.type": None})
    assert "gpu.type" not in node_labels(cp, OWN_NODE)
    own = f"/api/v1/nodes/{OWN_NODE}"
    for key in ("gpu.vendor", "node-role.kubernetes.io/gpu", "gpu.type.evil", "x/gpu.type"):
        denied(patch(cp, own, {"metadata": {"labels": {key: "nvidia"}}}, token=agent_token), NODE_POLICY, ONLY_LABELS)
        made(patch(cp, own, {"metadata": {"labels": {key: "nvidia"}}}))  # an admin's
        denied(patch(cp, own, {"metadata": {"labels": {key: None}}}, token=agent_token), NODE_POLICY, ONLY_LABELS)
        made(patch(cp, own, {"metadata": {"labels": {key: None}}}))


def test_a_sync_removes_only_the_gpuhook_labels_the_agent_set(control_plane, agent_api):
    """gpuhook's own label sync (labels.sync_node_labels) by the agent's token, on the real
    apiserver's managedFields: a gpuhook.dev/ label an admin set stays, the agent's own that it
    no longer wants goes."""
    from gpuhook.agent import labels

    cp, own = control_plane, f"/api/v1/nodes/{OWN_NODE}"
    made(patch(cp, own, {"metadata": {"labels": {"gpuhook.dev/pool": "a"}}}))  # an admin's
    try:
        labels.sync_node_labels(agent_api, {"gpuhook.dev/accelerator": "nvidia", "gpuhook.dev/nvidia.count": "8"})
        synced = labels.sync_node_labels(agent_api, {"gpuhook.dev/accelerator": "none"})
        have = node_labels(cp, OWN_NODE)
        assert "gpuhook.dev/nvidia.count" in synced.removed and "gpuhook.dev/pool" not in synced.removed, synced
        assert have.get("gpuhook.dev/pool") == "a" and "gpuhook.dev/nvidia.count" not in have, have
    finally:
        made(patch(cp, own, {"metadata": {"labels": {"gpuhook.dev/pool": None, "gpuhook.dev/accelerator": None}}}))


def overlay_policy(cp, tmp_path, value: str | None = None) -> dict:
    """The node policy after the kustomize patch node-restriction.yaml's header documents
    (its value replaced by `value` when given), built by the cluster's own kubectl."""
    import shutil

    src = tmp_path / "daemonset"
    if not src.exists():
        shutil.copytree(f"{REPO}/daemonset", src)
    text = (src / "node-restriction.yaml").read_text()
    lines = text[text.index("#   patches:"):].splitlines()
    block = yaml.safe_load("\n".join(line[len("#   "):] for line in lines if line.startswith("#   ") or line == "#"))
    if value is not None:
        (op,) = yaml.safe_load(block["patches"][0]["patch"])
        block["patches"][0]["patch"] = yaml.safe_dump([dict(op, value=value)])
    overlay = tmp_path / "overlay"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["../daemonset"], **block}))
    out = cp.kubectl("kustomize", str(overlay)).stdout
    (pol,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "ValidatingAdmissionPolicy"
              and d["metadata"]["name"] == NODE_POLICY]
    return pol


def test_a_renamed_vendor_label_as_the_policy_header_says(control_plane, agent_token, tmp_path):
    """The three steps of a renamed vendor_label, the documented overlay applied to the real
    apiserver: both keys listed, then the new key alone; the manifests' own policy back after."""
    cp = control_plane
    own = f"/api/v1/nodes/{OWN_NODE}"
    step1 = overlay_policy(cp, tmp_path)
    assert step1["spec"]["variables"] == [{"name": "vendorLabels",
                                           "expression": '["gpu.type", "example.com/gpu-vendor"]'}]

    def agent_sets(key, value="nvidia"):
        return patch(cp, own + "?dryRun=All", {"metadata": {"labels": {key: value}}}, token=agent_token)

    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(step1))
        eventually(lambda: agent_sets("example.com/gpu-vendor").status == 200, what="step 1 enforced")
        assert agent_sets("gpu.type").status == 200  # both keys, while the agents move over
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(overlay_policy(cp, tmp_path, '["example.com/gpu-vendor"]')))
        eventually(lambda: agent_sets("gpu.type").status != 200, what="step 3 enforced")
        denied(agent_sets("gpu.type"), NODE_POLICY, ONLY_LABELS)  # the old key out of reach again
        assert agent_sets("example.com/gpu-vendor").status == 200
    finally:
        cp.kubectl("apply", "-k", f"{REPO}/daemonset")
        eventually(lambda: agent_sets("example.com/gpu-vendor").status != 200, what="the manifests' policy back")
    assert agent_sets("gpu.type").status == 200


def test_the_agent_namespace_pod_is_the_one_its_token_names(control_plane, agent_pod, agent_token):
    """The token the agent tests use is what a kubelet gets for the DaemonSet's pod: the
    apiserver's TokenReview says it is the agent, on OWN_NODE (the extra the policies read)."""
    r = control_plane.api("POST", "/apis/authentication.k8s.io/v1/tokenreviews",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                           "spec": {"token": agent_token}})
    status = made(r)["status"]
    assert status["authenticated"] is True and status["user"]["username"] == AGENT
    assert status["user"]["extra"][NODE_NAME] == [OWN_NODE]
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == [agent_pod]
    assert f"system:serviceaccounts:{AGENT_NS}" in status["user"]["groups"]


def test_an_event_through_events_k8s_io_is_judged_as_core_v1(control_plane, agent_token):
    """The events policy names core/v1 events; its default matchPolicy (Equivalent) gives it
    events.k8s.io/v1's requests too, converted: an agent that could write there (RBAC grants
    it none: granted here for the test) meets the same rules."""
    cp = control_plane
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    ensure(cp, f"{rbac}/clusterroles", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                        "metadata": {"name": "gh-test-new-events"},
                                        "rules": [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                                                   "verbs": ["create"]}]})
    ensure(cp, f"{rbac}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gh-test-new-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gh-test-new-events"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpuhook", "namespace": AGENT_NS}]})
    try:
        r, name = create_pod(cp, OPTED_IN)
        uid = made(r)["metadata"]["uid"]

        def post(reason):
            return cp.api("POST", f"/apis/events.k8s.io/v1/namespaces/{OPTED_IN}/events", {
                "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"generateName": "e-"},
                "eventTime": "2026-01-01T00:00:00.000000Z", "action": "CreateContainer", "type": "Normal",
                "regarding": {"kind": "Pod", "name": name, "namespace": OPTED_IN, "uid": uid}, "reason": reason,
                "reportingController": "gpuhook.dev/agent", "reportingInstance": OWN_NODE, "note": "n"},
                token=agent_token)

        eventually(lambda: post("GPUsInjected").status == 201, what="the agent's grant on events.k8s.io")
        denied(post("BackOff"), EVENTS_POLICY, EVENT_MSG)
    finally:
        cp.api("DELETE", f"{rbac}/clusterrolebindings/gh-test-new-events")
        cp.api("DELETE", f"{rbac}/clusterroles/gh-test-new-events")
