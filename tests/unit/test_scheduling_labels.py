"""gpu.type, the scheduling label users already write (the node config's vendor_label): what the
agent writes on each kind of node, through the API and the NFD feature file; who owns it (the
API server's managedFields: the agent never removes nor overwrites a gpu.type it did not set);
renamed and turned off; and the example Deployment's preferred node affinity, evaluated against
those labels by Kubernetes' rules (tests/node_affinity.py)."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import REPO
from conftest import plan_on
from gpuhook import config, defaults, log
from gpuhook.agent import core as agent_mod, kubeclient, labels
from gpuhook.inventory import Inventory
from gpuhook.plan import Request
from gpuhook.probe import probe
from fakes import fakehost
from node_affinity import eligible, preference, term_matches
from conftest import INTEL, NV

yaml = pytest.importorskip("yaml", reason="PyYAML (pip install kubernetes-validate brings it)")

KEY = defaults.VENDOR_LABEL
EXAMPLE = os.path.join(REPO, "daemonset", "examples", "worker-deployment.yaml")
RUNTIME_CLASS = os.path.join(REPO, "daemonset", "runtimeclass.yaml")


def make_kind(root: str, kind: str) -> None:
    """The fake nodes: NVIDIA, AMD, Intel, mixed (NVIDIA + an Intel iGPU), CPU-only, and an
    NVIDIA node of the GPU Operator whose driver root (/run/nvidia/driver) is not there yet."""
    if kind == "driver-root-not-yet":
        fakehost.gpu_operator(fakehost.FakeHost(root, mknod=False), installed=False)
    else:
        fakehost.build(root, {"mixed": "nvidia+intel", "cpu": "cpu"}.get(kind, kind), mknod=False)


# kind -> the gpu.type the agent must write (None: no gpu.type at all)
KINDS = {"nvidia": "nvidia", "amd": "amd", "intel": "intel", "mixed": "nvidia", "cpu": None,
         "driver-root-not-yet": None}


def run_agent(tmp_path, root: str, api, vendor_label: str | None = None) -> tuple[dict, dict]:
    """`gpuhook agent --once` on that node, with the fake API: (the Node's labels, the NFD file's)."""
    opts = agent_mod.Options(root=root, spec_root=root, once=True, install=False, udev=False,
                             cdi_dir=str(tmp_path / "cdi"), nfd_dir=str(tmp_path / "nfd"),
                             ready_file=str(tmp_path / "ready"), ldconfig="/sbin/ldconfig", pod_events=False,
                             vendor_label=vendor_label)
    assert agent_mod.Agent(opts, kube=api.client(), log=log.get()).run() == 0
    with open(tmp_path / "nfd" / labels.NFD_FILE) as f:
        return api.labels, labels.parse_nfd(f.read())


@pytest.fixture
def node_kind(tmp_path, fake_api, logs):
    """node_kind(kind) -> (the Node's labels, the NFD file's) after the agent ran there (once a kind)."""
    done: dict[str, tuple[dict, dict]] = {}

    def make(kind: str) -> tuple[dict, dict]:
        if kind not in done:
            root = str(tmp_path / kind)
            make_kind(root, kind)
            d = tmp_path / f"run-{kind}"
            d.mkdir()
            done[kind] = run_agent(d, root, fake_api(node=f"node-{kind}"))
        return done[kind]
    return make


# -- what the agent writes ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_gpu_type_on_each_kind_of_node_through_both_paths(node_kind, tmp_path, kind):
    api_labels, nfd = node_kind(kind)
    want = KINDS[kind]
    for got in (api_labels, nfd):
        assert got.get(KEY) == want, (kind, got)
        # the same vendor as gpuhook.dev/accelerator, and only when that names one
        assert got["gpuhook.dev/accelerator"] == (want or "none")
        assert [k for k in got if not k.startswith(labels.PREFIX) and k != "kubernetes.io/hostname"] == (
            [KEY] if want else [])
    assert {k: v for k, v in api_labels.items() if k != "kubernetes.io/hostname"} == nfd
    if kind == "driver-root-not-yet":
        assert nfd["gpuhook.dev/nvidia.unusable"] == "no-libcuda"  # the GPUs are there, not usable yet
    # the vendor a gpu-optional container's GPUHOOK_ACCELERATOR names first, on that node
    planned = plan_on(probe(str(tmp_path / kind)), Request({}, {}, None), "/sbin/ldconfig")
    assert (planned.vendors or (None,))[0] == want


def test_gpu_type_appears_when_the_driver_root_is_filled_in(tmp_path, fake_api, logs):
    """The GPU Operator's driver container finishes: gpu.type appears at the next probe."""
    root = str(tmp_path / "node")
    fh = fakehost.FakeHost(root, mknod=False)
    fakehost.gpu_operator(fh, installed=False)
    api = fake_api()
    before, _ = run_agent(tmp_path, root, api)
    assert KEY not in before
    fakehost.operator_driver_root(fh, "550.54.14")
    fh.file(fakehost.OPERATOR_READY, "")
    after, nfd = run_agent(tmp_path, root, api)
    assert after[KEY] == nfd[KEY] == "nvidia" == after["gpuhook.dev/accelerator"]


def test_node_labels_derive_gpu_type_from_the_primary_vendor():
    assert labels.node_labels(Inventory("/", (NV, INTEL)), vendor_label=KEY)[KEY] == "nvidia"
    assert labels.node_labels(Inventory("/", (INTEL,)), vendor_label=KEY)[KEY] == "intel"
    assert KEY not in labels.node_labels(Inventory("/", ()), vendor_label=KEY)
    assert KEY not in labels.node_labels(Inventory("/", (NV, INTEL)))  # off: ""
    # a key the node config would refuse is never written, whoever passes it
    for bad in ("kubernetes.io/gpu", "gpuhook.dev/gpu.type", "no spaces", "x" * 64):
        assert set(labels.node_labels(Inventory("/", (NV,)), vendor_label=bad)) == set(
            labels.node_labels(Inventory("/", (NV,))))


# -- the node config ------------------------------------------------------------------------------

def write_config(root: str, text: str) -> None:
    os.makedirs(os.path.join(root, "etc", "gpuhook"), exist_ok=True)
    with open(os.path.join(root, defaults.CONFIG_FILE.lstrip("/")), "w") as f:
        f.write(text)


def test_the_node_config_renames_and_turns_off_gpu_type(tmp_path, fake_api, logs, monkeypatch):
    """vendor_label is read again at each probe: renamed, the agent sets the new key and removes
    its old one (API and NFD file alike); turned off, it removes it. The operator's own labels
    outside gpuhook.dev/ stay."""
    monkeypatch.delenv("GPUHOOK_CONFIG", raising=False)
    root = str(tmp_path / "node")
    make_kind(root, "amd")
    api = fake_api(labels={"kubernetes.io/hostname": "node-1", "team": "ml"})
    got, nfd = run_agent(tmp_path, root, api)
    assert got[KEY] == nfd[KEY] == "amd"
    write_config(root, 'vendor_label = "example.com/gpu-vendor"\n')
    got, nfd = run_agent(tmp_path, root, api)
    assert KEY not in got and KEY not in nfd
    assert got["example.com/gpu-vendor"] == nfd["example.com/gpu-vendor"] == "amd"
    write_config(root, 'vendor_label = ""\n')
    got, nfd = run_agent(tmp_path, root, api)
    assert [k for k in got if not k.startswith(labels.PREFIX)] == ["kubernetes.io/hostname", "team"]
    assert all(k.startswith(labels.PREFIX) for k in nfd)
    # an invalid one: the default, as for every key of the node config
    write_config(root, 'vendor_label = "node-role.kubernetes.io/gpu"\n')
    got, _ = run_agent(tmp_path, root, api)
    assert got[KEY] == "amd" and "node-role.kubernetes.io/gpu" not in got


# -- who owns gpu.type: the API server's managedFields ----------------------------------------------

def test_the_agent_removes_its_own_gpu_type_when_the_gpu_goes(fake_api):
    api = fake_api()
    client = api.client()
    labels.sync_node_labels(client, labels.node_labels(Inventory("/", (NV,)), True, KEY))
    assert api.labels[KEY] == "nvidia"
    # the fake API records each change under the ?fieldManager= the real client sends: kubeclient.py's
    # name and labels.AGENT_NAME are the same, or this fails
    assert labels.owned_labels(api.node) >= {KEY, "gpuhook.dev/accelerator"}
    synced = labels.sync_node_labels(client, labels.node_labels(Inventory("/", ()), True, KEY))
    assert KEY not in api.labels and KEY in synced.removed and synced.patch[KEY] is None
    assert api.labels["kubernetes.io/hostname"] == "node-1"


def test_a_gpu_type_somebody_else_set_is_never_removed_nor_overwritten(fake_api):
    api = fake_api()
    api.label("kubectl-label", {KEY: "a100"})  # `kubectl label node node-1 gpu.type=a100`
    client = api.client()
    synced = labels.sync_node_labels(client, labels.node_labels(Inventory("/", (NV,)), True, KEY))
    assert api.labels[KEY] == "a100" and synced.foreign == {KEY: "a100"} and KEY not in synced.patch
    assert api.labels["gpuhook.dev/accelerator"] == "nvidia"  # the rest is synced all the same
    synced = labels.sync_node_labels(client, labels.node_labels(Inventory("/", ()), True, KEY))
    assert api.labels[KEY] == "a100" and KEY not in synced.removed  # the GPU went: still theirs
    # the same value set by hand first: the agent changes nothing, and never owns it
    api2 = fake_api(node="node-2")
    api2.label("kubectl-label", {KEY: "nvidia"})
    labels.sync_node_labels(api2.client(), labels.node_labels(Inventory("/", (NV,)), True, KEY))
    labels.sync_node_labels(api2.client(), labels.node_labels(Inventory("/", ()), True, KEY))
    assert api2.labels[KEY] == "nvidia"


def test_an_operator_overwriting_the_agents_gpu_type_takes_it_over(fake_api):
    api = fake_api()
    client = api.client()
    want = labels.node_labels(Inventory("/", (NV,)), True, KEY)
    labels.sync_node_labels(client, want)
    api.label("kubectl-label", {KEY: "h100"})  # kubectl label --overwrite
    assert KEY not in labels.owned_labels(api.node)
    assert labels.sync_node_labels(client, want).foreign == {KEY: "h100"}
    assert api.labels[KEY] == "h100"  # no tug of war
    api.label("kubectl-label", {KEY: None})  # the operator removes it: the agent's again
    labels.sync_node_labels(client, want)
    assert api.labels[KEY] == "nvidia" and KEY in labels.owned_labels(api.node)


def test_foreign_gpu_type_is_logged_once(tmp_path, fake_api, logs):
    root = str(tmp_path / "node")
    make_kind(root, "nvidia")
    api = fake_api()
    api.label("kubectl-label", {KEY: "a100"})
    run_agent(tmp_path, root, api)
    (rec,) = [r for r in logs() if r.get("event") == "labels.not_ours"]
    assert rec["labels"] == {KEY: "a100"} and rec["wanted"] == {KEY: "nvidia"}
    assert api.labels[KEY] == "a100"


class Denying:
    """The API client, with an admission policy that refuses any patch touching `key`."""

    def __init__(self, client, key: str):
        self.client, self.key, self.patches = client, key, []

    def get_node(self):
        return self.client.get_node()

    def patch_labels(self, patch):
        self.patches.append(dict(patch))
        if self.key in patch:
            raise kubeclient.KubeError("PATCH /api/v1/nodes/node-1: HTTP 422: denied by gpuhook-own-node-labels", 422)
        return self.client.patch_labels(patch)


def test_a_renamed_key_the_policy_no_longer_allows_never_holds_back_the_rest(fake_api):
    """Renamed before the policy lists the new key's predecessor (step 1 skipped): the old
    key's removal is its own patch; the others go through, and the error names the key."""
    api = fake_api()
    labels.sync_node_labels(api.client(), labels.node_labels(Inventory("/", (NV,)), True, KEY))
    denying = Denying(api.client(), KEY)
    with pytest.raises(kubeclient.KubeError, match=r"removing the agent's label gpu\.type: .*HTTP 422") as e:
        labels.sync_node_labels(denying, labels.node_labels(Inventory("/", (NV, INTEL)), True, "example.com/gpu"))
    assert e.value.status == 422
    assert api.labels["example.com/gpu"] == "nvidia" and api.labels["gpuhook.dev/accelerator.intel"] == "true"
    assert api.labels[KEY] == "nvidia"  # still there: the policy said no
    assert denying.patches[-1] == {KEY: None}


def test_owned_labels_reads_only_the_agents_label_fields():
    node = {"metadata": {"managedFields": [
        {"manager": labels.AGENT_NAME, "operation": "Update",
         "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:gpu.type": {}, "f:gpuhook.dev/x": {}},
                                     "f:annotations": {"f:a": {}}}}},
        {"manager": labels.AGENT_NAME, "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:metadata": {"f:labels": {"f:status-thing": {}}}}},
        {"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}},
        {"manager": labels.AGENT_NAME, "fieldsV1": "garbage"}, "garbage", {"manager": labels.AGENT_NAME}]}}
    assert labels.owned_labels(node) == {"gpu.type", "gpuhook.dev/x"}
    assert labels.owned_labels({}) == set() and labels.owned_labels({"metadata": {"managedFields": None}}) == set()


# -- the example Deployment, scheduled ------------------------------------------------------------

def load(path: str) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def test_the_example_deployment_prefers_gpu_nodes_and_keeps_cpu_nodes_eligible(node_kind):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")
    (deployment,) = load(EXAMPLE)
    (runtime_class,) = load(RUNTIME_CLASS)
    for doc in (deployment, runtime_class):
        kv.validate(doc, kv.latest_version(), strict=True)
    spec = deployment["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == runtime_class["metadata"]["name"] == "gpu-optional"
    assert "nvidia.com/gpu" not in json.dumps(deployment) and "amd.com/gpu" not in json.dumps(deployment)
    (term,) = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["preference"]["matchExpressions"][0]["key"] == KEY
    scores = {}
    for kind in KINDS:
        node_labels, nfd = node_kind(kind)
        assert eligible(spec, node_labels, runtime_class), kind  # every kind may run it
        scores[kind] = preference(spec, node_labels)
    gpu = {k for k, v in KINDS.items() if v}
    assert min(scores[k] for k in gpu) > max(scores[k] for k in KINDS if k not in gpu), scores
    assert scores == {k: term["weight"] if k in gpu else 0 for k in KINDS}
    # the other operators on the same labels, by Kubernetes' rules: Exists says the same as In
    # here; NotIn and DoesNotExist also match the nodes without the label
    by = {}
    for op, values in (("Exists", None), ("NotIn", ["nvidia"]), ("DoesNotExist", None)):
        req = {"key": KEY, "operator": op, **({"values": values} if values else {})}
        by[op] = {k for k in KINDS if term_matches({"matchExpressions": [req]}, node_kind(k)[0])}
    assert by["Exists"] == gpu
    assert by["NotIn"] == {"amd", "intel", "cpu", "driver-root-not-yet"}
    assert by["DoesNotExist"] == {"cpu", "driver-root-not-yet"}


def test_readme_s_first_kubernetes_example_is_the_example_deployment():
    with open(os.path.join(REPO, "README.md")) as f:
        blocks = re.findall(r"^```yaml\n(.*?)^```", f.read(), re.M | re.S)
    kubernetes = [b for b in blocks if re.search(r"^apiVersion: ", b, re.M)]
    assert kubernetes and yaml.safe_load(kubernetes[0]) == load(EXAMPLE)[0]


# -- the node affinity helper itself -------------------------------------------------------------

@pytest.mark.parametrize("req, have, missing", [
    ({"operator": "In", "values": ["nvidia", "amd"]}, {"nvidia": True, "intel": False}, False),
    ({"operator": "NotIn", "values": ["nvidia"]}, {"nvidia": False, "intel": True}, True),
    ({"operator": "Exists"}, {"nvidia": True, "intel": True}, False),
    ({"operator": "DoesNotExist"}, {"nvidia": False, "intel": False}, True),
])
def test_requirements_by_kubernetes_rules(req, have, missing):
    for value, want in have.items():
        assert term_matches({"matchExpressions": [{"key": "k", **req}]}, {"k": value, "other": "x"}) is want
    assert term_matches({"matchExpressions": [{"key": "k", **req}]}, {"other": "x"}) is missing


def test_terms_and_invalid_requirements():
    both = {"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "In", "values": ["1"]}]}
    assert term_matches(both, {"a": "", "b": "1"}) and not term_matches(both, {"a": "", "b": "2"})
    assert not term_matches({}, {"a": "1"}) and not term_matches({"matchExpressions": []}, {})  # empty: nothing
    gt = {"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["2"]}]}
    assert term_matches(gt, {"n": "3"}) and not term_matches(gt, {"n": "2"}) and not term_matches(gt, {"n": "x"})
    for bad in ({"operator": "In"}, {"operator": "NotIn", "values": []}, {"operator": "Exists", "values": ["x"]},
                {"operator": "Gt", "values": ["1", "2"]}, {"operator": "Lt", "values": ["one"]}, {"operator": "Is"}):
        with pytest.raises(ValueError):
            term_matches({"matchExpressions": [{"key": "k", **bad}]}, {"k": "1"})
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 30, "preference": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}},
        {"weight": 20, "preference": {}},  # empty: skipped
        {"weight": 50, "preference": {"matchExpressions": [{"key": "b", "operator": "Exists"}]}}]}}}
    assert (preference(spec, {"a": "1", "b": "1"}), preference(spec, {"a": "1"}), preference(spec, {})) == (80, 30, 0)
    required = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}}
    assert eligible(required, {"a": "1"}) and eligible(required, {}, name="n2") and not eligible(required, {})
    rc = {"scheduling": {"nodeSelector": {"gpuhook.dev/runtime-ready": "true"}}}
    assert eligible({}, {"gpuhook.dev/runtime-ready": "true"}, rc) and not eligible({}, {}, rc)


def test_config_default_is_the_one_in_defaults():
    assert config.Config().vendor_label == KEY == "gpu.type"
