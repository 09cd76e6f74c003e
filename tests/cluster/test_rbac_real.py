"""gpuhook's agent RBAC (daemonset/rbac.yaml) on a real kube-apiserver: `kubectl apply -k
daemonset/` with the cluster's own kubectl (versions.KUBERNETES_VERSION) creates everything and a
second apply changes nothing; the agent's ServiceAccount, with a token bound to a pod on its
node as the kubelet gets one, can do what the agent does and nothing outside its grant: another
node's labels, a pod in another namespace, anything it was not granted are refused, by RBAC or
by the admission policies where RBAC cannot say it (the test says which)."""

from __future__ import annotations

import pytest
import yaml
from cluster.conftest import AGENT, AGENT_NS, AGENT_SA, OPTED_IN, OTHER_NODE, OWN_NODE, REPO, ensure, pod_body

MERGE = "application/merge-patch+json"


def kustomized(cp) -> list[dict]:
    return [d for d in yaml.safe_load_all(cp.kubectl("kustomize", f"{REPO}/daemonset").stdout) if d]


def test_kubectl_apply_k_creates_every_object_and_a_second_apply_changes_nothing(control_plane, gpuhook_applied):
    cp = control_plane
    docs = kustomized(cp)
    created = {line.split()[0] for line in gpuhook_applied.splitlines() if line.strip()}
    # kubectl names each object kind.group/name: every object of the kustomization, applied
    for d in docs:
        group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
        name = f"{d['kind'].lower()}{'.' + group if group else ''}/{d['metadata']['name']}"
        assert name in created, (name, gpuhook_applied)
    generations = {n: cp.api("GET", p).body["metadata"]["generation"] for n, p in paths(docs).items()}
    again = cp.kubectl("apply", "-k", f"{REPO}/daemonset").stdout.splitlines()
    # nothing sent, nothing changed (the policies' rules write out the server's default scope:
    # without it kubectl sent every policy's rules again and said "configured")
    assert len(again) == len(docs) and [line for line in again if not line.endswith(" unchanged")] == [], again
    assert cp.kubectl("diff", "-k", f"{REPO}/daemonset", check=False).returncode == 0
    assert {n: cp.api("GET", p).body["metadata"]["generation"] for n, p in paths(docs).items()} == generations
    # and they are there as written: the agent's grant
    role = cp.api("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/gpuhook-node").body
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]


def paths(docs: list[dict]) -> dict[str, str]:
    """{kind/name: its API path} of the objects that have a generation (spec'd objects)."""
    plural = {"DaemonSet": "daemonsets", "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}
    out = {}
    for d in docs:
        if d["kind"] in plural:
            ns = f"namespaces/{d['metadata']['namespace']}/" if "namespace" in d["metadata"] else ""
            out[f"{d['kind']}/{d['metadata']['name']}"] = f"/apis/{d['apiVersion']}/{ns}{plural[d['kind']]}/{d['metadata']['name']}"
    return out


def can_i(cp, verb: str, resource: str, namespace: str | None = None, name: str | None = None,
          subresource: str | None = None) -> bool:
    """The apiserver's own answer (SubjectAccessReview) for the agent's ServiceAccount."""
    attrs = {"verb": verb, "resource": resource, "group": ""}
    for k, v in (("namespace", namespace), ("name", name), ("subresource", subresource)):
        if v:
            attrs[k] = v
    r = cp.api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": AGENT, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{AGENT_NS}",
                                           "system:authenticated"], "resourceAttributes": attrs}})
    assert r.status == 201, r
    return r.body["status"].get("allowed", False)


GRANTED = [("get", "nodes", None, None), ("patch", "nodes", None, None), ("get", "pods", OPTED_IN, None),
           ("patch", "pods", "kube-system", None), ("create", "events", "default", None),
           ("create", "events", OPTED_IN, None), ("patch", "events", OPTED_IN, None)]
REFUSED = [("list", "nodes", None, None), ("watch", "nodes", None, None), ("update", "nodes", None, None),
           ("delete", "nodes", None, None), ("patch", "nodes", None, "status"), ("create", "pods", OPTED_IN, None),
           ("delete", "pods", OPTED_IN, None), ("update", "pods", OPTED_IN, None), ("list", "pods", OPTED_IN, None),
           ("patch", "pods", OPTED_IN, "status"), ("create", "pods", OPTED_IN, "eviction"),
           ("get", "secrets", AGENT_NS, None), ("list", "secrets", "kube-system", None),
           ("get", "configmaps", "kube-system", None), ("delete", "events", OPTED_IN, None),
           ("update", "events", OPTED_IN, None), ("create", "serviceaccounts", AGENT_NS, "token")]


@pytest.mark.parametrize("verb,resource,namespace,sub", GRANTED)
def test_the_agent_is_granted_what_it_does(control_plane, gpuhook_applied, verb, resource, namespace, sub):
    assert can_i(control_plane, verb, resource, namespace, subresource=sub)


@pytest.mark.parametrize("verb,resource,namespace,sub", REFUSED)
def test_the_agent_is_granted_nothing_else(control_plane, gpuhook_applied, verb, resource, namespace, sub):
    assert not can_i(control_plane, verb, resource, namespace, subresource=sub)


def refused_by_rbac(r, verb: str, resource: str) -> None:
    assert r.status == 403, r
    assert f'User "{AGENT}" cannot {verb} resource "{resource}"' in r.message, r.message


def refused_by_policy(r, policy: str) -> None:
    assert r.status in (403, 422), r
    assert f"ValidatingAdmissionPolicy '{policy}'" in r.message, r.message


def test_the_agents_token_writes_its_own_node_and_nothing_of_another(control_plane, agent_token):
    """With the token: its own Node's gpuhook label is written (the grant works), another
    node's is refused, and so are the writes RBAC never granted."""
    cp = control_plane
    as_agent = {"token": agent_token}
    own = cp.api("PATCH", f"/api/v1/nodes/{OWN_NODE}", {"metadata": {"labels": {"gpuhook.dev/rbac-test": "1"}}},
                 content_type=MERGE, **as_agent)
    assert own.status == 200 and own.body["metadata"]["labels"]["gpuhook.dev/rbac-test"] == "1", own
    # another node's labels: RBAC grants "patch any node"; the policy keeps it to its own
    other = cp.api("PATCH", f"/api/v1/nodes/{OTHER_NODE}", {"metadata": {"labels": {"gpuhook.dev/rbac-test": "1"}}},
                   content_type=MERGE, **as_agent)
    refused_by_policy(other, "gpuhook-own-node-labels")
    assert "gpuhook.dev/rbac-test" not in cp.api("GET", f"/api/v1/nodes/{OTHER_NODE}").body["metadata"]["labels"]
    refused_by_rbac(cp.api("DELETE", f"/api/v1/nodes/{OTHER_NODE}", **as_agent), "delete", "nodes")
    refused_by_rbac(cp.api("GET", "/api/v1/nodes", **as_agent), "list", "nodes")
    refused_by_rbac(cp.api("PATCH", f"/api/v1/nodes/{OWN_NODE}/status", {"status": {"capacity": {"x": "1"}}},
                           content_type=MERGE, **as_agent), "patch", "nodes/status")


def test_the_agents_token_touches_no_pod_in_another_namespace(control_plane, agent_token):
    """A pod in another namespace (kube-system, on another node): RBAC lets the agent patch
    pods anywhere (it labels pods of any tenant on its node); the policy refuses a pod that is
    not on its node. Creating, deleting, evicting pods or reading secrets there: RBAC."""
    cp = control_plane
    as_agent = {"token": agent_token}
    victim = pod_body("gh-rbac-victim", "kube-system", None, node=OTHER_NODE)
    ensure(cp, "/api/v1/namespaces/kube-system/pods", victim)
    path = "/api/v1/namespaces/kube-system/pods/gh-rbac-victim"
    r = cp.api("PATCH", path, {"metadata": {"labels": {"gpuhook.dev/accelerator": "nvidia"}}}, content_type=MERGE,
               **as_agent)
    refused_by_policy(r, "gpuhook-agent-pods")
    r = cp.api("PATCH", path, {"metadata": {"labels": {"app": "evil"}}}, content_type=MERGE, **as_agent)
    refused_by_policy(r, "gpuhook-agent-pods")
    assert "app" not in cp.api("GET", path).body["metadata"].get("labels", {})
    refused_by_rbac(cp.api("POST", "/api/v1/namespaces/kube-system/pods", pod_body("gh-rbac-new", "kube-system", None),
                           **as_agent), "create", "pods")
    refused_by_rbac(cp.api("DELETE", path, **as_agent), "delete", "pods")
    refused_by_rbac(cp.api("GET", "/api/v1/namespaces/kube-system/secrets", **as_agent), "list", "secrets")
    refused_by_rbac(cp.api("POST", f"{path}/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                        "metadata": {"name": "gh-rbac-victim"}}, **as_agent),
                    "create", "pods/eviction")
    # a pod of its own node in that namespace: the one label, as the agent sets it
    mine = pod_body("gh-rbac-mine", "kube-system", None, node=OWN_NODE)
    ensure(cp, "/api/v1/namespaces/kube-system/pods", mine)
    r = cp.api("PATCH", "/api/v1/namespaces/kube-system/pods/gh-rbac-mine",
               {"metadata": {"labels": {"gpuhook.dev/accelerator": "cpu"}}}, content_type=MERGE, **as_agent)
    assert r.status == 200 and r.body["metadata"]["labels"]["gpuhook.dev/accelerator"] == "cpu", r


def test_impersonating_the_agent_is_the_same_as_its_token(control_plane, gpuhook_applied):
    """kubectl --as the agent's ServiceAccount (no node name: a token from a Secret would be
    so) is refused even on a node, by the policy's node check."""
    cp = control_plane
    r = cp.kubectl("label", "node", OWN_NODE, "gpuhook.dev/rbac-as=1", f"--as={AGENT}", check=False)
    assert r.returncode != 0 and "gpuhook may only change the node its own pod runs on" in r.stderr, r.stderr
    r = cp.kubectl("get", "secrets", "-n", AGENT_NS, f"--as={AGENT}", check=False)
    assert r.returncode != 0 and "forbidden" in r.stderr, r.stderr
    assert cp.kubectl("auth", "can-i", "patch", "nodes", f"--as={AGENT}").stdout.strip() == "yes"
    r = cp.kubectl("auth", "can-i", "delete", "pods", "-n", OPTED_IN, f"--as={AGENT}", check=False)
    assert r.stdout.strip() == "no"


def test_the_daemonset_runs_as_the_granted_serviceaccount(control_plane, gpuhook_applied):
    ds = control_plane.api("GET", f"/apis/apps/v1/namespaces/{AGENT_NS}/daemonsets/gpuhook").body
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == AGENT_SA
