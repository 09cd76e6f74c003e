"""Kubernetes node affinity, as the scheduler evaluates it (k8s.io/component-helpers
scheduling/corev1/nodeaffinity and apimachinery's labels.Requirement), for the tests that ask
"where would this pod go" of the labels the agent writes. Written once, here.

- a requirement: In (the label is there and its value is one of `values`), NotIn (the label is
  missing, or its value is none of them), Exists, DoesNotExist, Gt / Lt (the label is there, an
  integer, greater / less than the one value); In and NotIn need values, Exists and
  DoesNotExist none, Gt and Lt exactly one integer: anything else is a ValueError, as the API
  server refuses such a pod;
- a term: every matchExpressions requirement (and matchFields on metadata.name) holds; an empty
  term matches nothing;
- required terms: any one term matching makes the node eligible (none given: every node), and
  pod.spec.nodeSelector (with a RuntimeClass's scheduling.nodeSelector merged in, as the
  RuntimeClass admission controller does) must match exactly;
- preferred terms: the node's score is the sum of the weights of the terms it matches (a weight
  is 1 to 100, as the API server checks; an empty term is skipped); the scheduler normalises
  scores across nodes, which keeps their order.
"""

from __future__ import annotations


def _requirement(req: dict, labels: dict[str, str]) -> bool:
    op, key, values = req["operator"], req["key"], list(req.get("values") or [])
    if op in ("In", "NotIn"):
        if not values:
            raise ValueError(f"{key} {op}: values must be non-empty")
        return (labels.get(key) in values) if op == "In" else (key not in labels or labels[key] not in values)
    if op in ("Exists", "DoesNotExist"):
        if values:
            raise ValueError(f"{key} {op}: values must be empty")
        return (key in labels) is (op == "Exists")
    if op in ("Gt", "Lt"):
        if len(values) != 1:
            raise ValueError(f"{key} {op}: exactly one value")
        bound = int(values[0])  # ValueError when it is not an integer, as the API server says
        try:
            have = int(labels[key])
        except (KeyError, ValueError):
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"{key}: unknown operator {op!r}")


def term_matches(term: dict, labels: dict[str, str], name: str = "node") -> bool:
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not exprs and not fields:
        return False
    for f in fields:
        if f["key"] != "metadata.name" or f["operator"] not in ("In", "NotIn"):
            raise ValueError(f"matchFields: {f['key']} {f['operator']} is not supported by Kubernetes")
    return all(_requirement(r, labels) for r in exprs) and all(
        _requirement({**f, "key": "metadata.name"}, {"metadata.name": name}) for f in fields
    )


def eligible(pod_spec: dict, labels: dict[str, str], runtime_class: dict | None = None, name: str = "node") -> bool:
    """May the scheduler put a pod with this spec on a node with these labels (taints aside)?"""
    selector = dict(pod_spec.get("nodeSelector") or {})
    if runtime_class is not None:
        selector.update((runtime_class.get("scheduling") or {}).get("nodeSelector") or {})
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(term_matches(t, labels, name) for t in required.get("nodeSelectorTerms") or [])


def preference(pod_spec: dict, labels: dict[str, str], name: str = "node") -> int:
    """The node's node-affinity score for this pod: the weights of the preferred terms it matches."""
    preferred = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or []
    score = 0
    for p in preferred:
        if not 1 <= p["weight"] <= 100:
            raise ValueError(f"weight {p['weight']}: must be 1 to 100")
        term = p.get("preference") or {}
        if term.get("matchExpressions") or term.get("matchFields"):
            score += p["weight"] if term_matches(term, labels, name) else 0
    return score
