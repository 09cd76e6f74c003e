"""daemonset/gpu-optional-admission.yaml and daemonset/node-restriction.yaml, evaluated: every CEL expression of the policies runs
in a CEL implementation (cel-python) against pods that must be admitted and pods that must be
refused, with the variables the API server gives a ValidatingAdmissionPolicy (object,
oldObject, namespaceObject, request: tests/admission_cel.py). The manifests are validated
against the Kubernetes schemas (kubernetes-validate)."""

from __future__ import annotations

import os

import pytest

from admission_cel import AGENT, NODE_POLICY, admit, cel, docs, policy
from conftest import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML (pip install kubernetes-validate brings it)")


def ns(name: str, labels: dict | None = None) -> dict:
    meta = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def pod(runtime_class: str | None = "gpu-optional", annotations: dict | None = None, labels: dict | None = None,
        node: str | None = None, namespace: str = "ml") -> dict:
    meta = {"name": "worker", "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    spec = {"containers": [{"name": "c", "image": "busybox"}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


OPTED_IN = ns("ml", {"gpuhook.dev/gpu-optional": "allowed", "team": "ml"})


# -- who may use gpu-optional -------------------------------------------------------------------

def test_gpu_optional_is_admitted_in_an_opted_in_namespace():
    assert admit("gpuhook-gpu-optional", "CREATE", pod(), namespace=OPTED_IN) == []
    narrowing = {"gpuhook.dev/inject": "false", "gpuhook.dev/vendors": "nvidia", "gpuhook.dev/max-gpus": "1",
                 "prometheus.io/scrape": "true"}
    assert admit("gpuhook-gpu-optional", "CREATE", pod(annotations=narrowing), namespace=OPTED_IN) == []


@pytest.mark.parametrize("namespace", [ns("team-b"), ns("team-b", {}), ns("team-b", {"gpuhook.dev/gpu-optional": "true"}),
                                       ns("team-b", {"gpuhook.dev/gpu-optional": "Allowed", "x": "y"})])
def test_gpu_optional_is_refused_elsewhere_with_how_to_opt_in(namespace):
    assert admit("gpuhook-gpu-optional", "CREATE", pod(namespace="team-b"), namespace=namespace) == [
        "runtimeClassName gpu-optional is not allowed in namespace team-b; a cluster admin opts it in with: "
        "kubectl label namespace team-b gpuhook.dev/gpu-optional=allowed"]


def test_the_static_message_says_the_same():
    v = policy("gpuhook-gpu-optional")["spec"]["validations"][0]
    assert "kubectl label namespace NAME gpuhook.dev/gpu-optional=allowed" in " ".join(v["message"].split())


@pytest.mark.parametrize("runtime_class", [None, "runc", "kata", "gpu-optional-x"])
def test_other_pods_are_not_looked_at(runtime_class):
    assert admit("gpuhook-gpu-optional", "CREATE", pod(runtime_class, annotations={"gpuhook.dev/x": "1"}),
                 namespace=ns("team-b")) == []


@pytest.mark.parametrize("key", ["gpuhook.dev/share", "gpuhook.dev/accelerator", "gpuhook.dev/"])
def test_an_unknown_gpuhook_annotation_is_refused(key):
    assert admit("gpuhook-gpu-optional", "CREATE", pod(annotations={key: "all"}), namespace=OPTED_IN) == [
        "a gpu-optional pod may set only the gpuhook.dev/ annotations gpuhook.dev/inject, gpuhook.dev/vendors "
        "and gpuhook.dev/max-gpus"]


def test_two_refusals_at_once_name_the_first():
    assert admit("gpuhook-gpu-optional", "CREATE", pod(annotations={"gpuhook.dev/x": ""}), namespace=ns("b")) == [
        "runtimeClassName gpu-optional is not allowed in namespace b; a cluster admin opts it in with: "
        "kubectl label namespace b gpuhook.dev/gpu-optional=allowed"]


RUNTIME_KEYS = ["a gpu-optional pod may not set io.kubernetes.* annotations nor io.container.manager: the container "
                "runtime writes them"]
UNKNOWN = ["a gpu-optional pod may set only the gpuhook.dev/ annotations gpuhook.dev/inject, gpuhook.dev/vendors "
           "and gpuhook.dev/max-gpus"]


@pytest.mark.parametrize("key", ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.cri.sandbox-namespace",
                                 "io.kubernetes.pod.uid", "io.kubernetes.pod.name", "io.kubernetes.container.name",
                                 "io.kubernetes.cri-o.Labels", "io.container.manager"])
def test_a_gpu_optional_pod_may_not_name_its_own_pod(key):
    """The keys the CRI runtime names the pod by (CRI-O copies pod annotations into the spec)."""
    assert admit("gpuhook-gpu-optional", "CREATE", pod(annotations={key: "x"}), namespace=OPTED_IN) == RUNTIME_KEYS
    assert admit("gpuhook-gpu-optional", "CREATE", pod(None, annotations={key: "x"}), namespace=OPTED_IN) == []
    assert admit("gpuhook-gpu-optional", "CREATE", pod(annotations={"kubernetes.io/x": "1", "io.k8s/y": "2"}),
                 namespace=OPTED_IN) == []


@pytest.mark.parametrize("resource", ["pods", "pods/status"])
@pytest.mark.parametrize("key,refusal", [("gpuhook.dev/share", UNKNOWN), ("io.kubernetes.pod.uid", RUNTIME_KEYS),
                                         ("io.container.manager", RUNTIME_KEYS)])
def test_the_annotation_rules_hold_at_update_too(resource, key, refusal):
    old = pod(annotations={"a": "1"}, node="n1")
    new = pod(annotations={"a": "1", key: "v"}, node="n1")
    assert admit("gpuhook-gpu-optional", "UPDATE", new, old, namespace=OPTED_IN, resource=resource) == refusal
    changed = pod(annotations={"a": "1", key: "w"}, node="n1")
    assert admit("gpuhook-gpu-optional", "UPDATE", changed, new, namespace=OPTED_IN, resource=resource) == refusal
    # one the pod already had (admitted before the policy), unchanged: the pod can still be updated
    assert admit("gpuhook-gpu-optional", "UPDATE", pod(annotations={"a": "2", key: "v"}, node="n1"), new,
                 namespace=OPTED_IN, resource=resource) == []
    # the namespace's opt-in is checked at CREATE only
    assert admit("gpuhook-gpu-optional", "UPDATE", pod(annotations={"gpuhook.dev/inject": "false"}, node="n1"), old,
                 namespace=ns("ml"), resource=resource) == []


# -- the pod label gpuhook.dev/accelerator is the agent's ---------------------------------------

LABEL = "gpuhook-pod-accelerator-label"


def test_no_pod_is_created_with_the_accelerator_label():
    for rc in ("gpu-optional", None):
        assert admit(LABEL, "CREATE", pod(rc, labels={"gpuhook.dev/accelerator": "nvidia"})) == [
            "the pod label gpuhook.dev/accelerator is set by the gpuhook agent only"]
    assert admit(LABEL, "CREATE", pod(labels={"app": "x"})) == []
    assert admit(LABEL, "CREATE", pod()) == []


@pytest.mark.parametrize("resource", ["pods", "pods/status"])
def test_the_accelerator_label_is_guarded_through_the_status_subresource_too(resource):
    old = pod(labels={"app": "x"}, node="n1")
    new = pod(labels={"app": "x", "gpuhook.dev/accelerator": "nvidia"}, node="n1")
    assert admit(LABEL, "UPDATE", new, old, user="system:node:n1", resource=resource) == [
        "the pod label gpuhook.dev/accelerator is set by the gpuhook agent only"]
    assert admit(LABEL, "UPDATE", old, new, user="alice", resource=resource) != []


def test_only_the_agent_changes_the_accelerator_label():
    old = pod(labels={"app": "x"}, node="n1")
    new = pod(labels={"app": "x", "gpuhook.dev/accelerator": "cpu"}, node="n1")
    assert admit(LABEL, "UPDATE", new, old, user="alice") != []
    assert admit(LABEL, "UPDATE", old, new, user="alice") != []  # nor removes it
    assert admit(LABEL, "UPDATE", new, old, user=AGENT, node="n1") == []
    # other updates of a labelled pod are not looked at
    assert admit(LABEL, "UPDATE", pod(labels={"gpuhook.dev/accelerator": "cpu", "b": "1"}),
                 pod(labels={"gpuhook.dev/accelerator": "cpu"}), user="alice") == []


# -- the agent: pods of its own node, one label, its own events ------------------------------------

AGENT_POLICY = "gpuhook-agent-pods"
EVENTS_POLICY = "gpuhook-agent-events"  # one policy per kind: the apiserver type-checks each against its kinds


def test_the_agent_labels_a_pod_of_its_own_node():
    old = pod(labels={"app": "x"}, node="n1", annotations={"a": "1"})
    new = pod(labels={"app": "x", "gpuhook.dev/accelerator": "nvidia"}, node="n1", annotations={"a": "1"})
    assert admit(AGENT_POLICY, "UPDATE", new, old, user=AGENT, node="n1") == []
    assert admit(AGENT_POLICY, "UPDATE", pod(node="n1", labels={"gpuhook.dev/accelerator": "cpu"}), pod(node="n1"),
                 user=AGENT, node="n1") == []
    # somebody else's update is not this policy's business
    assert admit(AGENT_POLICY, "UPDATE", pod(node="n2", labels={"x": "y"}), pod(node="n2"), user="alice") == []


def test_the_agent_may_not_touch_another_nodes_pod():
    new = pod(labels={"gpuhook.dev/accelerator": "nvidia"}, node="n2")
    assert admit(AGENT_POLICY, "UPDATE", new, pod(node="n2"), user=AGENT, node="n1") == [
        "gpuhook may only change pods on the node its own pod runs on"]
    # an unscheduled pod, a token without a node name
    assert admit(AGENT_POLICY, "UPDATE", pod(labels={"gpuhook.dev/accelerator": "cpu"}), pod(), user=AGENT, node="n1") != []
    assert admit(AGENT_POLICY, "UPDATE", new, pod(node="n2"), user=AGENT) != []


@pytest.mark.parametrize("change", ["label", "remove-label", "annotation", "spec", "owner", "finalizer"])
def test_the_agent_may_change_nothing_else(change):
    old = pod(labels={"app": "x"}, annotations={"a": "1"}, node="n1")
    new = pod(labels={"app": "x", "gpuhook.dev/accelerator": "cpu"}, annotations={"a": "1"}, node="n1")
    if change == "label":
        new["metadata"]["labels"]["app"] = "y"
    elif change == "remove-label":
        del new["metadata"]["labels"]["app"]
    elif change == "annotation":
        new["metadata"]["annotations"]["gpuhook.dev/inject"] = "false"
    elif change == "spec":
        new["spec"]["containers"][0]["image"] = "evil"
    elif change == "owner":
        new["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}]
    else:
        new["metadata"]["finalizers"] = ["x/y"]
    assert admit(AGENT_POLICY, "UPDATE", new, old, user=AGENT, node="n1") == [
        "gpuhook may only change the pod label gpuhook.dev/accelerator"]


def event(instance="n1", kind="Pod", component="gpuhook.dev/agent") -> dict:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ml"},
            "involvedObject": {"kind": kind, "name": "worker", "namespace": "ml"}, "reason": "GPUsInjected",
            "reportingComponent": component, "reportingInstance": instance}


def node_event(name="n1", reason="GPUInventory", namespace="default") -> dict:
    e = event(kind="Node")
    e["metadata"]["namespace"] = namespace
    e["involvedObject"] = {"kind": "Node", "name": name}
    e["reason"] = reason
    return e


EVENT_MSG = ["gpuhook's events are about pods and its own node, with gpuhook's reasons, reported by the agent of "
             "its own node"]
UPDATE_MSG = ["gpuhook may only update its own events, and there only how often and when they were seen"]


def test_the_agents_events_name_its_own_node():
    assert admit(EVENTS_POLICY, "CREATE", event(), user=AGENT, node="n1", resource="events") == []
    assert admit(EVENTS_POLICY, "UPDATE", node_event(), node_event(), user=AGENT, node="n1",
                 resource="events") == []
    msg = EVENT_MSG
    assert admit(EVENTS_POLICY, "CREATE", event("n2"), user=AGENT, node="n1", resource="events") == msg
    assert admit(EVENTS_POLICY, "CREATE", event(kind="Secret"), user=AGENT, node="n1", resource="events") == msg
    assert admit(EVENTS_POLICY, "CREATE", event(component="kubelet"), user=AGENT, node="n1", resource="events") == msg
    assert admit(EVENTS_POLICY, "CREATE", event(), user=AGENT, resource="events") == msg


def _policy_reasons() -> dict:
    """The reasons the events validation admits, by involvedObject.kind, read from its text."""
    import re

    text = " ".join(v["expression"] for v in policy(EVENTS_POLICY)["spec"]["validations"])
    return {kind: tuple(re.findall(r'"([A-Za-z]+)"', names))
            for kind, names in re.findall(r'object\.involvedObject\.kind == "(\w+)" &&\s*object\.reason in \[([^\]]*)\]',
                                          text)}


def test_the_agents_event_reasons_are_gpuhooks_one_list():
    from gpuhook.agent import kube

    assert _policy_reasons() == kube.EVENT_REASONS
    for reason in kube.EVENT_REASONS["Pod"]:
        assert admit(EVENTS_POLICY, "CREATE", dict(event(), reason=reason), user=AGENT, node="n1", resource="events") == []
    for reason in kube.EVENT_REASONS["Node"]:
        assert admit(EVENTS_POLICY, "CREATE", node_event(reason=reason), user=AGENT, node="n1", resource="events") == []
    for bad in (dict(event(), reason="BackOff"), dict(event(), reason="GPUInventory"), dict(event(), reason=""),
                {k: v for k, v in event().items() if k != "reason"}, node_event(reason="GPUsInjected"),
                node_event(name="n2"), node_event(namespace="ml"),
                dict(event(), involvedObject={"kind": "Pod", "name": "etcd", "namespace": "kube-system"})):
        assert admit(EVENTS_POLICY, "CREATE", bad, user=AGENT, node="n1", resource="events") == EVENT_MSG, bad


def test_the_agent_updates_only_its_own_events_and_only_their_count():
    mine = dict(event(), message="container app got 1 GPU", type="Normal", count=1)
    again = dict(mine, count=2, lastTimestamp="2026-01-01T00:00:01Z", series={"count": 2})
    assert admit(EVENTS_POLICY, "UPDATE", again, mine, user=AGENT, node="n1", resource="events") == []
    # a kubelet's Event rewritten into the agent's (core/v1 Event updates skip immutability checks)
    kubelets = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ml"},
                "involvedObject": {"kind": "Pod", "name": "worker", "namespace": "ml"}, "reason": "BackOff",
                "message": "Back-off restarting failed container", "type": "Warning",
                "reportingComponent": "kubelet", "reportingInstance": "n1"}
    assert admit(EVENTS_POLICY, "UPDATE", dict(mine, reason="RanOnCPU"), kubelets, user=AGENT, node="n1",
                 resource="events") == UPDATE_MSG
    for change in ({"reason": "RanOnCPU"}, {"message": "something else"}, {"type": "Warning"},
                   {"involvedObject": {"kind": "Pod", "name": "victim", "namespace": "ml"}},
                   {"metadata": {"name": "e", "namespace": "ml", "finalizers": ["x/y"]}}):
        assert admit(EVENTS_POLICY, "UPDATE", dict(again, **change), mine, user=AGENT, node="n1",
                     resource="events") == UPDATE_MSG, change
    other_node = dict(mine, reportingInstance="n2")
    assert admit(EVENTS_POLICY, "UPDATE", again, other_node, user=AGENT, node="n1", resource="events") == UPDATE_MSG


# -- the manifests -------------------------------------------------------------------------------

def test_the_manifests_are_valid_and_bound():
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")
    all_docs = docs()
    for d in all_docs:
        kv.validate(d, kv.latest_version(), strict=True)
    policies = {d["metadata"]["name"] for d in all_docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d for d in all_docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == set(bindings) == {"gpuhook-gpu-optional", LABEL, AGENT_POLICY, EVENTS_POLICY,
                                         "gpuhook-own-node-labels", "gpuhook-own-resourceslices"}
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings.values())
    assert all(policy(p)["spec"]["failurePolicy"] == "Fail" for p in policies)
    with open(os.path.join(REPO, "daemonset", "kustomization.yaml")) as f:
        resources = yaml.safe_load(f)["resources"]
    assert "gpu-optional-admission.yaml" in resources and "node-restriction.yaml" in resources


# -- the agent on Nodes (node-restriction.yaml) --------------------------------------------

def node(name: str = "gpu-1", labels: dict | None = None, taints: list | None = None, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}, **meta},
            "spec": {"taints": taints} if taints else {}}


def node_update(old: dict, new: dict, user: str = AGENT, own: str | None = "gpu-1") -> list[str]:
    return admit("gpuhook-own-node-labels", "UPDATE", new, old=old, user=user, node=own, resource="nodes")


def test_the_agent_changes_only_gpuhook_labels_of_its_own_node():
    old = node(labels={"kubernetes.io/hostname": "gpu-1", "gpuhook.dev/accelerator": "none"})
    ok = node(labels={"kubernetes.io/hostname": "gpu-1", "gpuhook.dev/accelerator": "nvidia", "gpuhook.dev/gpu.count": "8"})
    assert node_update(old, ok) == []
    assert node_update(node("gpu-2"), node("gpu-2", labels={"gpuhook.dev/x": "1"})) == [
        "gpuhook may only change the node its own pod runs on"]
    assert node_update(old, ok, own=None) == ["gpuhook may only change the node its own pod runs on"]
    only_labels = ["gpuhook may only change gpuhook.dev/ labels and the vendorLabels"]
    assert node_update(old, node(labels={"kubernetes.io/hostname": "evil", "gpuhook.dev/accelerator": "none"})) == only_labels
    assert node_update(old, node(labels={"gpuhook.dev/accelerator": "none"})) == only_labels  # a label removed
    assert node_update(old, node(labels=old["metadata"]["labels"], taints=[{"key": "k", "effect": "NoSchedule"}])) == only_labels
    assert node_update(old, node(labels=old["metadata"]["labels"], finalizers=["x"])) == only_labels
    assert node_update(old, node(labels=old["metadata"]["labels"], ownerReferences=[{"name": "x"}])) == only_labels
    # another user (the kubelet, an admin) is not this policy's business
    assert node_update(old, node(labels={}), user="system:node:gpu-1") == []


# -- the one label outside gpuhook.dev/: vendor_label (gpu.type) ---------------------------------

NODE_RESTRICTION = "gpuhook-own-node-labels"
ONLY_LABELS = ["gpuhook may only change gpuhook.dev/ labels and the vendorLabels"]


def vendor_labels(spec: dict | None = None) -> list[str]:
    spec = spec or policy(NODE_RESTRICTION)["spec"]
    (var,) = [v for v in spec["variables"] if v["name"] == "vendorLabels"]
    return list(cel(var["expression"], {}))


def overlay(value: str) -> dict:
    """The policy's spec after the kustomize patch its header documents, with `value`:
    the patch is read from that comment, so the documented overlay is what is tested."""
    with open(NODE_POLICY) as f:
        text = f.read()
    lines = text[text.index("#   patches:"):].splitlines()
    block = "\n".join(line[len("#   "):] for line in lines if line.startswith("#   ") or line == "#")
    (patch,) = yaml.safe_load(block)["patches"]
    assert patch["target"] == {"kind": "ValidatingAdmissionPolicy", "name": NODE_RESTRICTION}
    (op,) = yaml.safe_load(patch["patch"])
    assert op["op"] == "replace" and op["path"].startswith("/spec/")
    spec = policy(NODE_RESTRICTION)["spec"]
    target = spec
    *parents, last = op["path"].split("/")[2:]
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    target[int(last) if isinstance(target, list) else last] = value
    return spec


def test_the_policy_allows_the_node_configs_default_vendor_label():
    from gpuhook import config, defaults

    assert vendor_labels() == [defaults.VENDOR_LABEL] == [config.Config().vendor_label]


def test_the_agent_sets_changes_and_removes_gpu_type():
    bare = node(labels={"kubernetes.io/hostname": "gpu-1", "gpuhook.dev/accelerator": "none"})
    nvidia = node(labels={"kubernetes.io/hostname": "gpu-1", "gpuhook.dev/accelerator": "nvidia", "gpu.type": "nvidia"})
    amd = node(labels={"kubernetes.io/hostname": "gpu-1", "gpuhook.dev/accelerator": "amd", "gpu.type": "amd"})
    assert node_update(bare, nvidia) == []  # set
    assert node_update(nvidia, amd) == []  # changed
    assert node_update(amd, bare) == []  # removed: the GPU went
    # any other key outside gpuhook.dev/ stays out of reach, set or removed
    for key in ("gpu.vendor", "node-role.kubernetes.io/gpu", "gpu.type.evil", "x/gpu.type"):
        evil = node(labels={**nvidia["metadata"]["labels"], key: "nvidia"})
        assert node_update(nvidia, evil) == ONLY_LABELS, key
        assert node_update(evil, nvidia) == ONLY_LABELS, key
    # a node somebody else labels gpu.type is not this policy's business
    assert node_update(bare, nvidia, user="system:serviceaccount:kube-system:other") == []


def test_a_renamed_vendor_label_as_the_policy_header_says():
    bare = node(labels={"gpuhook.dev/accelerator": "nvidia"})
    old_key = node(labels={"gpuhook.dev/accelerator": "nvidia", "gpu.type": "nvidia"})
    both = node(labels={"gpuhook.dev/accelerator": "nvidia", "gpu.type": "nvidia", "example.com/gpu-vendor": "nvidia"})
    new_key = node(labels={"gpuhook.dev/accelerator": "nvidia", "example.com/gpu-vendor": "nvidia"})
    step1 = overlay('["gpu.type", "example.com/gpu-vendor"]')
    assert vendor_labels(step1) == ["gpu.type", "example.com/gpu-vendor"]
    upd = lambda old, new, spec: admit(NODE_RESTRICTION, "UPDATE", new, old=old, user=AGENT, node="gpu-1",  # noqa: E731
                                       resource="nodes", spec=spec)
    # step 1, both keys listed: the agent with the new vendor_label sets it and removes the old one
    assert upd(old_key, both, step1) == [] and upd(both, new_key, step1) == [] and upd(old_key, new_key, step1) == []
    # step 3, the new key alone: the old one is out of the agent's reach again
    step3 = overlay('["example.com/gpu-vendor"]')
    assert upd(new_key, bare, step3) == []
    assert upd(bare, old_key, step3) == ONLY_LABELS and upd(old_key, bare, step3) == ONLY_LABELS
    # turned off: no key outside gpuhook.dev/
    off = overlay("[]")
    assert upd(bare, old_key, off) == ONLY_LABELS and upd(bare, new_key, off) == ONLY_LABELS
    assert upd(bare, node(labels={"gpuhook.dev/accelerator": "amd"}), off) == []
