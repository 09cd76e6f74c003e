"""The Kubernetes manifests of daemonset/ as the tests read them: each YAML file's documents
(load_yaml) and what `kustomize build daemonset/` yields (kustomize), without kustomize."""

from __future__ import annotations

import os

import pytest

from conftest import REPO

DAEMONSET = os.path.join(REPO, "daemonset")


def load_yaml(path) -> list[dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML (pip install kubernetes-validate brings it)")
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomize() -> list[dict]:
    """What `kustomize build daemonset/` yields, for the fields this kustomization uses:
    every resource listed exists and parses; namespace, images and labels applied."""
    (k,) = load_yaml(os.path.join(DAEMONSET, "kustomization.yaml"))
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    assert set(k) <= {"apiVersion", "kind", "namespace", "resources", "images", "labels"}, set(k)
    out = []
    for res in k["resources"]:
        path = os.path.join(DAEMONSET, res)
        assert os.path.isfile(path), f"{res} listed in kustomization.yaml does not exist"
        out += load_yaml(path)
    images = {i["name"]: i for i in k.get("images", [])}
    for doc in out:
        if "namespace" in k and doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "RuntimeClass",
                                                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            doc["metadata"]["namespace"] = k["namespace"]  # kustomize overrides explicit ones too
        for pairs in k.get("labels", []):
            doc["metadata"].setdefault("labels", {}).update(pairs["pairs"])
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            name = c["image"].split(":")[0]
            assert name in images, f"image {c['image']} has no images: entry"
            c["image"] = f"{images[name].get('newName', name)}:{images[name]['newTag']}"
    return out
