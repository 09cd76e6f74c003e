"""daemonset/dra/ and daemonset/examples/gpu-or-none-claim.yaml: valid resource.k8s.io/v1 (the
1.37 schemas, strict), the DeviceClasses' selectors choosing exactly the GPUs / exactly `none`
of what the driver publishes, the example asking for a GPU first, then none."""

from __future__ import annotations

import os

import pytest

from conftest import REPO
from gpuhook.cli import build_parser
from gpuhook.dra import DRIVER, PLUGINS_DIR, PLUGINS_REGISTRY, slices
from fakes import fakehost
from dra_api import published
from manifests import load_yaml

kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")
celpy = pytest.importorskip("celpy", reason="pip install cel-python (in the test extras)")

DRA = os.path.join(REPO, "daemonset", "dra")
EXAMPLE = os.path.join(REPO, "daemonset", "examples", "gpu-or-none-claim.yaml")
K8S = "1.37.0"


def _docs() -> list[dict]:
    (k,) = load_yaml(os.path.join(DRA, "kustomization.yaml"))
    assert sorted(k["resources"]) == sorted(n for n in os.listdir(DRA) if n != "kustomization.yaml")
    return [d for res in k["resources"] for d in load_yaml(os.path.join(DRA, res))]


def _published(tmp_path, build) -> tuple[slices.Published, ...]:
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    build(fh)
    return published(fh.root)


def _invalid(docs: list[dict]) -> list[str]:
    """What the 1.37 schemas (strict: no field they do not have) say against each document."""
    out = []
    for d in docs:
        try:
            kv.validate(d, K8S, strict=True)
        except kv.ValidationError as e:
            out.append(f"{d['kind']} {d['metadata'].get('name')}: {e.message}")
    return out


def test_the_manifests_and_the_example_are_valid():
    assert _invalid(_docs() + load_yaml(EXAMPLE)) == []


@pytest.mark.parametrize(
    "build",
    [fakehost.nvidia, fakehost.amd_mi300, fakehost.cpu_only, fakehost.amd, fakehost.intel],
    ids=["nvidia", "mi300", "cpu", "amd", "intel"],
)
def test_the_published_slices_are_valid(tmp_path, build):
    out = slices.resource_slices("node-1", _published(tmp_path, build), 1)
    assert _invalid(out) == []
    if build in (fakehost.amd, fakehost.intel):  # the memory capacity too
        assert any("capacity" in d for d in out[0]["spec"]["devices"])
    out[0]["spec"]["devices"][-1]["allowMultipleAlocations"] = True  # a field name the API does not have
    assert len(_invalid(out)) == 1


def _selects(expression: str, device: dict) -> bool:
    """A DeviceClass's CEL selector over one published device, as the scheduler sees it:
    device.driver, device.attributes[<domain>][<name>] (the value itself)."""
    attrs = {name: next(iter(value.values())) for name, value in device["attributes"].items()}
    env = celpy.Environment()
    prog = env.program(env.compile(expression))
    result = prog.evaluate({"device": celpy.json_to_cel({"driver": DRIVER, "attributes": {DRIVER: attrs}})})
    assert isinstance(result, celpy.celtypes.BoolType), result  # an error is not a choice
    return bool(result)


def test_the_device_classes_choose_gpus_and_none(tmp_path):
    classes = {
        d["metadata"]["name"]: d["spec"]["selectors"][0]["cel"]["expression"]
        for d in _docs()
        if d["kind"] == "DeviceClass"
    }
    assert set(classes) == {"gpu.gpuhook.dev", "none.gpuhook.dev"}
    devices = _published(tmp_path, lambda fh: (fakehost.nvidia(fh, gpus=2), fakehost.intel(fh, dgpu=False)))
    gpus = [p.name for p in devices if _selects(classes["gpu.gpuhook.dev"], p.device)]
    nones = [p.name for p in devices if _selects(classes["none.gpuhook.dev"], p.device)]
    assert gpus == [p.name for p in devices if p.name != slices.NONE] and len(gpus) == 3
    assert nones == [slices.NONE]


def test_the_example_asks_for_a_gpu_then_none():
    template, pod = load_yaml(EXAMPLE)
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert [(s["deviceClassName"], s["count"]) for s in request["firstAvailable"]] == [
        ("gpu.gpuhook.dev", 1),
        ("none.gpuhook.dev", 1),
    ]
    assert pod["spec"]["resourceClaims"] == [
        {"name": request["name"], "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": request["name"]}]


def test_the_daemonset_runs_the_driver_where_the_kubelet_looks():
    (ds,) = [d for d in _docs() if d["kind"] == "DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(c["args"])
    assert args.func.__name__ == "cmd_dra"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {args.plugins_dir, args.registry_dir, args.cdi_dir} <= mounts
    assert (args.plugins_dir, args.registry_dir) == (PLUGINS_DIR, PLUGINS_REGISTRY)
    paths = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    host_of = {m["mountPath"]: paths[m["name"]] for m in c["volumeMounts"]}
    assert host_of[PLUGINS_DIR] == PLUGINS_DIR and host_of[PLUGINS_REGISTRY] == PLUGINS_REGISTRY  # the kubelet's view
    # the host's network: the API reached without the pod network (tests/cluster/test_dra_real.py
    # found a driver on the pod network that could not reach the apiserver, so no node had `none`)
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "ports" not in c


def test_the_rbac_allows_the_calls_the_driver_makes_and_no_other():
    """list, apply (a patch; a create when the slice is new), delete ResourceSlices; get the
    ResourceClaims it prepares (tests/cluster/test_dra_slices_real.py: these and no more)."""
    (role,) = [d for d in _docs() if d["kind"] == "ClusterRole"]
    allowed = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert allowed == {
        ("resourceslices", "list"),
        ("resourceslices", "create"),
        ("resourceslices", "patch"),
        ("resourceslices", "delete"),
        ("resourceclaims", "get"),
    }


def test_the_driver_and_the_agent_write_the_cdi_specs_alike():
    """The two DaemonSets keep the same CDI directory of the node: the same --cdi-format and
    --max-cdi-version, or they would rewrite each other's files every round."""
    (agent,) = [d for d in load_yaml(os.path.join(REPO, "daemonset", "daemonset.yaml")) if d["kind"] == "DaemonSet"]
    (dra,) = [d for d in _docs() if d["kind"] == "DaemonSet"]

    def cdi_of(ds: dict) -> tuple:
        c = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["command"] == ["gpuhook"])
        args = build_parser().parse_args(c["args"])
        return args.cdi_format, args.max_cdi_version

    assert cdi_of(agent) == cdi_of(dra)
