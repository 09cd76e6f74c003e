"""The admission policies' CEL run by cel-python as the API server runs a
ValidatingAdmissionPolicy (tests/unit/test_admission.py, test_dra_admission.py): the policies of
daemonset/ and daemonset/dra/, and admit(), one request under one policy."""

from __future__ import annotations

import os

import pytest

from conftest import REPO

celpy = pytest.importorskip("celpy", reason="pip install cel-python (in the test extras)")
yaml = pytest.importorskip("yaml", reason="PyYAML (pip install kubernetes-validate brings it)")

PATH = os.path.join(REPO, "daemonset", "gpu-optional-admission.yaml")
NODE_POLICY = os.path.join(REPO, "daemonset", "node-restriction.yaml")
SLICE_POLICY = os.path.join(REPO, "daemonset", "dra", "resourceslice-restriction.yaml")
AGENT = "system:serviceaccount:gpuhook-system:gpuhook"
NODE_NAME = "authentication.kubernetes.io/node-name"


def docs() -> list[dict]:
    out = []
    for path in (PATH, NODE_POLICY, SLICE_POLICY):
        with open(path) as f:
            out += [d for d in yaml.safe_load_all(f) if d]
    return out


def policy(name: str) -> dict:
    return next(d for d in docs() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


_env = celpy.Environment()


def cel(expr: str, act: dict):
    return _env.program(_env.compile(expr)).evaluate(act)


def admit(name: str, operation: str, obj: dict, old: dict | None = None, namespace: dict | None = None,
          user: str = "alice", node: str | None = None, resource: str = "pods", spec: dict | None = None) -> list[str]:
    """What the API server does with one request under one policy (`spec`: the policy's
    spec as an overlay changed it): [] when admitted, else the message of the first failed
    validation (messageExpression first), as kube-apiserver says it: it stops there
    (tests/cluster/test_admission_real.py)."""
    spec = spec or policy(name)["spec"]
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(operation in r["operations"] and resource in r["resources"] for r in rules):
        return []
    # a rule's "pods" matches no subresource request ("pods/status" must be listed); the
    # request's resource is "pods" all the same (the subresource is request.subResource)
    resource = resource.partition("/")[0]
    # a user with no extra has none at all (kube-apiserver: "no such key: extra")
    user_info = {"username": user, **({"extra": {NODE_NAME: [node]}} if node else {})}
    act = {k: celpy.json_to_cel(v) for k, v in {
        "object": obj, "oldObject": old, "namespaceObject": namespace,
        "request": {"operation": operation, "userInfo": user_info,
                    "resource": {"group": "", "version": "v1", "resource": resource}}}.items()}
    if spec.get("variables"):  # in order: each may use those before it
        act["variables"] = celpy.celtypes.MapType()
        for var in spec["variables"]:
            act["variables"][celpy.celtypes.StringType(var["name"])] = cel(var["expression"], act)
    for cond in spec.get("matchConditions", []):
        result = cel(cond["expression"], act)
        assert isinstance(result, celpy.celtypes.BoolType), (cond["name"], result)
        if not result:
            return []
    for v in spec["validations"]:
        result = cel(v["expression"], act)
        assert isinstance(result, celpy.celtypes.BoolType), (v["expression"], result)  # an error is not a result
        if not result:
            return [str(cel(v["messageExpression"], act)) if "messageExpression" in v else " ".join(v["message"].split())]
    return []
