"""The real cluster's fixtures (tests/cluster/): the control plane of controlplane.py, started
once per session; gpuhook's manifests applied to it with its own kubectl; the Nodes, namespaces
and pods the admission and RBAC tests act on, and the agent's credentials. As root (make test)
a cluster that cannot be had (no Go, no module proxy, a daemon that does not come up) fails the
tests with one line; elsewhere they skip."""

from __future__ import annotations

import os
import sys
import time

import pytest

# tests/cluster is a package (its conftest must not be the module `conftest` that the other
# test modules import from tests/); its harness modules are imported by their bare names
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import controlplane  # noqa: E402
import gobuild

REQUIRE = os.environ.get("GPUHOOK_REQUIRE_E2E") == "1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT_NS, AGENT_SA = "gpuhook-system", "gpuhook"
AGENT = f"system:serviceaccount:{AGENT_NS}:{AGENT_SA}"
NODE_NAME = "authentication.kubernetes.io/node-name"
# Node objects with no kubelet behind them (the admission and RBAC tests need Nodes, not
# nodes): the agent's own and another
OWN_NODE, OTHER_NODE = "gh-fake-1", "gh-fake-2"
OPTED_IN, NOT_OPTED_IN = "gh-ml", "gh-team-b"
# every test pod tolerates everything: the short outage timers (controlplane.Timers) would
# evict it from a Node whose kubelet never reports within seconds
TOLERATE_ALL = [{"operator": "Exists"}]


@pytest.fixture(scope="session")
def control_plane():
    """A started controlplane.ControlPlane (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler of versions.KUBERNETES_VERSION), stopped at the end of the session."""
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("the cluster tests need root (a bridge, the daemons)", pytrace=False)
        pytest.skip("the cluster tests need root (make test runs them as root)")
    cp = controlplane.ControlPlane()
    why = None
    try:
        cp.start()
    except (gobuild.Unavailable, controlplane.ControlPlaneError) as e:
        why = f"no control plane: {e}"
    if why:  # outside the except: the one line, without the exception it came from
        pytest.fail(why, pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
    assert controlplane.leftovers() == [], "the control plane left these behind"


def eventually(check, timeout: float = 60, what: str = "") -> None:
    """Call check() until it returns true; fail after timeout (what the cluster's caches and
    controllers take to catch up)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what or check}"
        time.sleep(0.5)


def pod_body(name: str, namespace: str, runtime_class: str | None = "gpu-optional", *, node: str | None = OWN_NODE,
             labels: dict | None = None, annotations: dict | None = None, sa: str | None = None) -> dict:
    """A pod for the admission tests: on `node` (no kubelet: it stays Pending there), or
    unscheduled (node None: a nodeSelector that matches no Node keeps it so)."""
    meta: dict = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}], "tolerations": TOLERATE_ALL,
                  "automountServiceAccountToken": False}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if node:
        spec["nodeName"] = node
    else:
        spec["nodeSelector"] = {"gpuhook.dev/test": "no-such-node"}
    if sa:
        spec["serviceAccountName"] = sa
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def ensure(cp: controlplane.ControlPlane, path: str, body: dict) -> dict:
    """POST body to path as cluster-admin; the object (201), or the one already there (409)."""
    r = cp.api("POST", path, body)
    if r.status == 409:
        r = cp.api("GET", f"{path}/{body['metadata']['name']}")
    assert r.status in (200, 201), r
    return r.body


@pytest.fixture(scope="session")
def gpuhook_applied(control_plane):
    """`kubectl apply -k daemonset/` with the cluster's own kubectl (what README tells an
    admin), its output; returned once its admission policies are enforced (the
    apiserver's policy informers take a moment): each refuses a dry-run request it must."""
    cp = control_plane
    out = cp.kubectl("apply", "-k", os.path.join(REPO, "daemonset")).stdout
    for name in (OWN_NODE, OTHER_NODE):
        ensure(cp, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    ensure(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": OPTED_IN, "labels": {"gpuhook.dev/gpu-optional": "allowed"}}})
    ensure(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NOT_OPTED_IN}})
    for ns in (OPTED_IN, NOT_OPTED_IN, AGENT_NS):  # the ServiceAccount admission plugin wants them
        eventually(lambda ns=ns: cp.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default").status == 200,
                   what=f"the default ServiceAccount of {ns}")

    def refused(path, body, method="POST", **kw):
        r = cp.api(method, path + "?dryRun=All", body, **kw)
        return r.status in (403, 422) and "ValidatingAdmissionPolicy" in r.message

    eventually(lambda: refused(f"/api/v1/namespaces/{NOT_OPTED_IN}/pods", pod_body("probe", NOT_OPTED_IN)),
               what="gpuhook-gpu-optional enforced")
    eventually(lambda: refused(f"/api/v1/namespaces/{OPTED_IN}/pods",
                               pod_body("probe", OPTED_IN, None, labels={"gpuhook.dev/accelerator": "cpu"})),
               what="gpuhook-pod-accelerator-label enforced")
    agent = dict(user=AGENT, extra={NODE_NAME: [OWN_NODE]})
    eventually(lambda: refused(f"/api/v1/nodes/{OTHER_NODE}", {"metadata": {"labels": {"gpuhook.dev/x": "1"}}},
                               "PATCH", content_type="application/merge-patch+json", **agent),
               what="gpuhook-own-node-labels enforced")
    eventually(lambda: refused(f"/api/v1/namespaces/{OPTED_IN}/events",
                               {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "probe"},
                                "involvedObject": {"kind": "Secret", "name": "x", "namespace": OPTED_IN},
                                "reason": "GPUsInjected"}, **agent),
               what="gpuhook-agent-events enforced")
    return out


@pytest.fixture(scope="session")
def agent_pod(control_plane, gpuhook_applied):
    """A pod of the agent's ServiceAccount on OWN_NODE (as the DaemonSet's would be): what
    its bound token names."""
    body = pod_body("agent-probe", AGENT_NS, None, sa=AGENT_SA)
    ensure(control_plane, f"/api/v1/namespaces/{AGENT_NS}/pods", body)
    return body["metadata"]["name"]


@pytest.fixture(scope="session")
def agent_token(control_plane, agent_pod):
    """The agent's token as the kubelet gets it for the DaemonSet's pod (TokenRequest bound to
    the pod): the apiserver writes OWN_NODE into it."""
    return control_plane.agent_token(AGENT_NS, AGENT_SA, agent_pod)


@pytest.fixture(scope="session")
def agent_api(control_plane, agent_token):
    """gpuhook's own API client (gpuhook.agent.kube.KubeAPI) as the agent on OWN_NODE, with
    the bound token: the calls the agent makes, made by its code."""
    from gpuhook.agent import kube

    api = kube.KubeAPI(control_plane.server, token=agent_token, node=OWN_NODE, ca_file=control_plane.ca_cert)
    yield api
    api.close()


# the nodes, and gpuhook installed on them by its DaemonSet (tests/cluster/node.py)
from node import cluster, gpuhook_installed  # noqa: E402, F401
