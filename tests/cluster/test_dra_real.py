"""gpuhook's DRA driver (`gpuhook dra`, docs/dra.md) on the real cluster: `kubectl apply -k
daemonset/dra/` and the gpuhook-dra DaemonSet's pods, run by the real kubelets, register with
each kubelet and publish the nodes' ResourceSlices; the real scheduler allocates
daemonset/examples/gpu-or-none-claim.yaml's "one GPU, else none"; the kubelet prepares it
through the driver and containerd injects gpuhook's CDI devices.

The module adds a node of its own, NVIDIA with 2 GPUs (NV2), and cordons the shipped 8-GPU
node-nvidia while it runs, so that "the NVIDIA GPUs" are two. The pods prefer NVIDIA nodes
(gpu.type=nvidia, preferred affinity). All of it is undone at the end (the node removed, the
DRA manifests deleted, node-nvidia uncordoned): the modules after this one see the cluster as
they would without it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import time

import pytest
import yaml

import node
from cluster.conftest import REPO
from containerd_harness import IMAGE_NAME

NAMESPACE = "gh-dra"
NV2 = node.NodeSpec("node-nvidia-2", "nvidia-2", 6)
DRA_DIR = os.path.join(REPO, "daemonset", "dra")
EXAMPLE = os.path.join(REPO, "daemonset", "examples", "gpu-or-none-claim.yaml")
DRIVER = "gpuhook.dev"
DRA_NS, DRA_SELECTOR = "gpuhook-system", "app.kubernetes.io/name=gpuhook-dra"
RESOURCE = "/apis/resource.k8s.io/v1"
# what a claim pod prints: its accelerator, then the GPU device nodes it sees
SHOW = ('echo "accelerator=${GPUHOOK_ACCELERATOR-unset}"; '
        'for f in /dev/nvidia* /dev/dri/* /dev/kfd; do [ -e "$f" ] && echo "device=$f"; done; exec sleep 3600')
GPU_NODE = re.compile(r"^/dev/(nvidia[0-9]+|dri/.+)$")  # a GPU's own nodes (control nodes aside)
PREFER_NVIDIA = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 100, "preference": {"matchExpressions": [{"key": "gpu.type", "operator": "In", "values": ["nvidia"]}]}}]}}


def template() -> dict:
    """The example's ResourceClaimTemplate, as shipped."""
    with open(EXAMPLE) as f:
        (t,) = [d for d in yaml.safe_load_all(f) if d["kind"] == "ResourceClaimTemplate"]
    return t


def pod_spec(claim: dict | None = None, node_name: str | None = None) -> dict:
    """A pod that shows what it got, with the example's template (or `claim`: a
    resourceClaims entry)."""
    spec: dict = {
        "terminationGracePeriodSeconds": 1, "affinity": PREFER_NVIDIA,
        "resourceClaims": [claim or {"name": "gpu", "resourceClaimTemplateName": template()["metadata"]["name"]}],
        "containers": [{"name": "c", "image": IMAGE_NAME, "command": ["sh", "-c", SHOW],
                        "resources": {"claims": [{"name": (claim or {"name": "gpu"})["name"]}]}}]}
    if node_name:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return spec


def pod(name: str, **kw) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": dict(pod_spec(**kw), restartPolicy="Never")}


def apply(c: node.Cluster, *docs: dict) -> None:
    c.kubectl("apply", "-f", "-", input="---\n".join(yaml.safe_dump(d) for d in docs))


def get_pod(c: node.Cluster, name: str) -> dict:
    return c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").body


def running(p: dict) -> bool:
    return p.get("status", {}).get("phase") == "Running" and node.pod_ready(p)


def condition(p: dict, kind: str) -> dict:
    return next((x for x in p.get("status", {}).get("conditions", []) if x["type"] == kind), {})


def claim_of(c: node.Cluster, p: dict) -> dict:
    """The ResourceClaim the pod's `gpu` claim is (made from the template, or named)."""
    (st,) = p["status"]["resourceClaimStatuses"]
    return c.cp.api("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{st['resourceClaimName']}").body


def results(claim: dict) -> list[tuple[str, str, str]]:
    """(request, pool, device) of the claim's allocation, of gpuhook's driver."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [(r["request"], r["pool"], r["device"]) for r in alloc.get("devices", {}).get("results", [])
            if r["driver"] == DRIVER]


def shown(c: node.Cluster, name: str) -> tuple[str, set[str]]:
    """What the pod's container printed: its GPUHOOK_ACCELERATOR, and the GPUs' own device nodes it sees."""
    out = c.wait(lambda: c.kubectl("logs", "-n", NAMESPACE, name, check=False).stdout.strip(), 60, f"{name}'s output")
    lines = out.splitlines()
    acc = next(x.split("=", 1)[1] for x in lines if x.startswith("accelerator="))
    return acc, {x.split("=", 1)[1] for x in lines if x.startswith("device=") and GPU_NODE.match(x.split("=", 1)[1])}


def slices(c: node.Cluster) -> dict[str, list[dict]]:
    """gpuhook.dev's published devices by node."""
    r = c.cp.api("GET", f"{RESOURCE}/resourceslices?fieldSelector=spec.driver={DRIVER}")
    out: dict[str, list[dict]] = {}
    for s in r.body["items"]:
        out.setdefault(s["spec"]["nodeName"], []).extend(s["spec"]["devices"])
    return out


def expected_nodes(c: node.Cluster, node_name: str, device: str) -> tuple[str, set[str]]:
    """(vendor, the device nodes of the GPU) a published device is, by the probe of the node
    (its own view) and the device's id attribute; ("cpu", set()) for `none`."""
    if device == "none":
        return "cpu", set()
    (d,) = [d for d in slices(c)[node_name] if d["name"] == device]
    attrs = {k: next(iter(v.values())) for k, v in d["attributes"].items()}
    r = node.run([os.path.join(os.path.dirname(sys.executable), "gpuhook"), "probe", "--json", "--root",
                  c.nodes[node_name].path("/")])
    for v in json.loads(r.stdout)["vendors"]:
        for g in v["devices"]:
            if g["id"] == attrs["id"]:
                return v["vendor"], {n["path"] for n in g["nodes"]}
    raise AssertionError(f"{device} ({attrs['id']}) is not in the probe of {node_name}")


def checkpoint(c: node.Cluster, node_name: str) -> dict[str, dict]:
    """The driver's checkpoint on the node: claim UID -> its record."""
    path = c.nodes[node_name].var("lib", "kubelet", "plugins", DRIVER, "checkpoint.json")
    try:
        with open(path) as f:
            return json.load(f)["claims"]
    except FileNotFoundError:
        return {}


def dra_pods(c: node.Cluster) -> dict[str, dict]:
    return {p["spec"].get("nodeName"): p for p in c.pods(DRA_NS, DRA_SELECTOR)}


def driver_log(c: node.Cluster, node_name: str, previous: bool = False) -> list[dict]:
    """The driver's JSON log records on the node (of its container before the last restart)."""
    name = dra_pods(c)[node_name]["metadata"]["name"]
    out = c.kubectl("logs", "-n", DRA_NS, name, *(["--previous"] if previous else []), check=False).stdout
    records = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                records.append(rec)
    return records


def restarts(p: dict) -> int:
    return sum(s.get("restartCount", 0) for s in p.get("status", {}).get("containerStatuses", []))


def delete_all(c: node.Cluster) -> None:
    """Every pod of the namespace gone, then every ResourceClaim (those made for the pods go
    once the kubelet has unprepared them; the ones a test made, deleted)."""
    c.kubectl("delete", "pods", "-n", NAMESPACE, "--all", "--wait=true", "--timeout=120s")
    c.kubectl("delete", "resourceclaims", "-n", NAMESPACE, "--all", "--wait=true", "--timeout=120s")
    c.wait(lambda: not c.cp.api("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims").body["items"]
           or None, 120, "the ResourceClaims deleted")


@pytest.fixture(scope="module")
def dra(gpuhook_installed):
    """gpuhook installed (daemonset/), NV2 added, node-nvidia cordoned, `kubectl apply -k
    daemonset/dra/` and the gpuhook-dra pod Ready on every node, the example's template in
    NAMESPACE. Undone at the end."""
    c = gpuhook_installed
    started = time.monotonic()
    try:
        c.add(NV2)
        c.wait_ready(NV2.name)
        node.wait_installed(c, names=(NV2.name,))
        c.kubectl("cordon", node.NVIDIA.name)
        print(c.kubectl("apply", "-k", DRA_DIR).stdout)
        for name in c.nodes:
            c.wait(lambda name=name: node.pod_ready(dra_pods(c).get(name) or {}), 180, f"gpuhook-dra Ready on {name}")
        c.kubectl("create", "namespace", NAMESPACE)
        c.wait(lambda: c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default").status == 200,
               60, "the namespace's default ServiceAccount")
        apply(c, dict(template(), metadata=dict(template()["metadata"], namespace=NAMESPACE)))
        print(f"the DRA driver up on {len(c.nodes)} nodes {time.monotonic() - started:.1f} s after the module began")
        yield c
    finally:
        diag = os.environ.get("GPUHOOK_DRA_DIAG")  # a file for what the drivers and kubelets said
        if diag:
            with open(diag, "w") as f, contextlib.suppress(Exception):
                for name, p in dra_pods(c).items():
                    if name in c.nodes:
                        f.write(f"=== driver {name}\n" + c.kubectl("logs", "-n", DRA_NS, p["metadata"]["name"],
                                                                   check=False).stdout[-6000:])
                        with open(c.nodes[name].log("kubelet"), errors="replace") as k:
                            f.write(f"=== kubelet {name}\n" + "".join(
                                line for line in k if re.search(r"dra|resourceclaim|plugin|cdi", line, re.I))[-8000:])
        if NV2.name in c.nodes:  # its pods, if it failed, never finish: gone with it
            c.kubectl("delete", "pods", "-n", NAMESPACE, "--force", "--grace-period=0",
                      f"--field-selector=spec.nodeName={NV2.name}", check=False)
        c.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
        c.kubectl("delete", "deviceclass", "gpu.nvidia.com", "--ignore-not-found", check=False)
        c.kubectl("delete", "-k", DRA_DIR, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
        c.kubectl("uncordon", node.NVIDIA.name, check=False)
        if NV2.name in c.nodes:
            c.remove(NV2.name)
        print(f"test_dra_real: the module took {time.monotonic() - started:.1f} s")


@pytest.fixture(autouse=True)
def clean(request):
    """Each test's pods and claims gone after it, passed or not (the next test starts clean)."""
    yield
    if "dra" in request.fixturenames:
        c = request.getfixturevalue("dra")
        if NV2.name in c.nodes and not c.ready(NV2.name):  # failed: its pods never finish
            c.kubectl("delete", "pods", "-n", NAMESPACE, "--force", "--grace-period=0",
                      f"--field-selector=spec.nodeName={NV2.name}", check=False)
        for kind in ("deployments", "pods", "resourceclaims"):
            c.kubectl("delete", kind, "-n", NAMESPACE, "--all", "--wait=true", "--timeout=120s", check=False)


def registered(c: node.Cluster, name: str) -> bool:
    """The node's kubelet told its driver the plugin is registered (NotifyRegistrationStatus)."""
    told = [r for r in driver_log(c, name) if r.get("event") == "dra.registration"]
    return bool(told) and told[-1]["registered"] is True


def test_the_driver_registers_with_each_kubelet_and_publishes_its_nodes_devices(dra):
    """Each node's gpuhook-dra pod was told by its kubelet that the plugin is registered, and
    published the node's GPUs and `none`: every node has `none` (shareable: the API kept
    allowMultipleAllocations, DRAConsumableCapacity being on by default in 1.37); the CPU node
    nothing else. Each node's containerd reads the CDI specs the driver wrote in /var/run/cdi."""
    import tomllib

    c = dra
    gpus = {"node-nvidia": 8, NV2.name: 2, "node-amd": 2, "node-cpu": 0}
    published = c.wait(lambda: (got := slices(c)) and set(got) == set(c.nodes) and got, 60,
                       "a ResourceSlice of gpuhook.dev for every node")
    for name in c.nodes:
        try:
            c.wait(lambda name=name: registered(c, name), 60, f"the driver registered with {name}'s kubelet")
        except node.NodeError as e:
            kubelet = [line for line in open(c.nodes[name].log("kubelet"), errors="replace")
                       if "gpuhook" in line or "plugin" in line.lower()]
            raise AssertionError(f"{e}\ndriver: {driver_log(c, name)[-8:]}\nkubelet: {kubelet[-15:]}") from None
        devices = {d["name"]: d for d in published.get(name, [])}
        print(name, sorted(devices))
        assert devices["none"].get("allowMultipleAllocations") is True, devices["none"]
        kinds = [d["attributes"]["kind"]["string"] for d in devices.values()]
        assert kinds.count("gpu") == gpus[name] and kinds.count("none") == 1 and len(kinds) == gpus[name] + 1, kinds
        n = c.nodes[name]
        with open(os.path.join(n.upper, "etc", "containerd", "config.toml"), "rb") as f:
            rt = tomllib.load(f)["plugins"]["io.containerd.cri.v1.runtime"]
        assert rt.get("enable_cdi", True) is True and "/var/run/cdi" in rt["cdi_spec_dirs"], rt
        specs = sorted(os.listdir(n.path("/run/cdi")))
        assert "gpuhook.dev-none.yaml" in specs, specs


def test_three_pods_with_the_claim_two_nvidia_gpus_and_the_third_amd_or_none(dra):
    """Three pods with the example's template, all at once, preferring NVIDIA: the scheduler
    gives the two NVIDIA GPUs of NV2 to two of them, and the third, for which no NVIDIA GPU is
    left, an AMD GPU or `none`. No GPU goes to two pods; each container sees exactly the device
    nodes of its allocation and GPUHOOK_ACCELERATOR says which; unprepared when they go."""
    c = dra
    names = ("p1", "p2", "p3")
    apply(c, *(pod(n) for n in names))
    c.wait(lambda: all(running(get_pod(c, n)) for n in names), 180, "the three pods running")
    got = {}
    for n in names:
        p = get_pod(c, n)
        claim = claim_of(c, p)
        (res,) = results(claim)
        got[n] = (p["spec"]["nodeName"], res, claim["metadata"]["uid"])
        print(n, got[n][:2])
    nvidia = [(where, r) for where, r, _ in got.values() if r[0] == "gpu/gpu" and r[1] == NV2.name]
    others = [(where, r) for where, r, _ in got.values() if (where, r) not in nvidia]
    assert len(nvidia) == 2 and len({r[2] for _, r in nvidia}) == 2, got  # two GPUs, two pods
    assert all(r[2].startswith("nvidia-") and where == NV2.name for where, r in nvidia), got
    (third,) = others
    assert (third[1][0] == "gpu/none" and third[1][2] == "none") or (
        third[0] == third[1][1] == "node-amd" and third[1][0] == "gpu/gpu" and third[1][2].startswith("amd-")), got
    for n, (where, (_, pool, device), uid) in got.items():
        assert pool == where, (n, pool, where)  # a device of the pod's node
        vendor, nodes = expected_nodes(c, where, device)
        acc, seen = shown(c, n)
        print(n, "sees", acc, sorted(seen))
        assert (acc, seen) == (vendor, nodes), (n, device)
        assert [d["device"] for d in checkpoint(c, where)[uid]["devices"]] == [device]
    delete_all(c)
    for where, _, uid in got.values():
        assert uid not in checkpoint(c, where), "unprepared when the pod went"


def test_a_vendor_claim_and_a_device_plugin_request_beside_them_are_untouched(dra):
    """A claim for the NVIDIA DRA driver's class (gpu.nvidia.com: nothing here publishes it)
    and a pod asking `nvidia.com/gpu: 1` (no device plugin here): both Pending with the
    scheduler's reason, beside a gpuhook claim that runs; gpuhook's driver never sees the
    vendor claim (no prepare, no checkpoint entry, no allocation)."""
    c = dra
    apply(c, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}},
          {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "vendor-gpu", "namespace": NAMESPACE},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    vendor = pod("vendor-claim", claim={"name": "gpu", "resourceClaimName": "vendor-gpu"})
    plugin = pod("device-plugin")
    del plugin["spec"]["resourceClaims"], plugin["spec"]["containers"][0]["resources"]["claims"]
    plugin["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 1}
    apply(c, vendor, plugin, pod("beside"))
    reasons = {}
    for n in ("vendor-claim", "device-plugin"):
        cond = c.wait(lambda n=n: (x := condition(get_pod(c, n), "PodScheduled")).get("reason") == "Unschedulable"
                      and x, 120, f"{n} unschedulable")
        reasons[n] = cond["message"]
        print(n, "Pending:", cond["message"])
    assert "cannot allocate all claims" in reasons["vendor-claim"], reasons
    assert "Insufficient nvidia.com/gpu" in reasons["device-plugin"], reasons
    c.wait(lambda: running(get_pod(c, "beside")), 120, "the gpuhook claim's pod running")
    time.sleep(3)  # the scheduler's retries, and the driver's rounds, go on a while
    for n in ("vendor-claim", "device-plugin"):
        assert get_pod(c, n)["status"]["phase"] == "Pending"
    claim = c.cp.api("GET", f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/vendor-gpu").body
    assert not (claim.get("status") or {}).get("allocation"), claim["status"]
    for name in c.nodes:
        assert claim["metadata"]["uid"] not in checkpoint(c, name)
        assert not [r for r in driver_log(c, name) if "vendor-gpu" in json.dumps(r)], name
    delete_all(c)


def _driver_pid(node_name: str) -> int:
    """The gpuhook-dra container's process of the node (its NODE_NAME env), seen from the host."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"dra" in argv and b"--root" in argv and f"NODE_NAME={node_name}".encode() in env:
            found.append(int(entry))
    assert len(found) == 1, found
    return found[0]


def _records(path_glob: str) -> list[dict]:
    import glob

    out = []
    for path in sorted(glob.glob(path_glob)):
        with open(path, errors="replace") as f:
            for line in f:  # CRI log lines: time, stream, tag, then the driver's JSON
                with contextlib.suppress(ValueError, IndexError):
                    out.append(json.loads(line.split(" ", 3)[3]))
    return out


def test_the_driver_killed_during_a_real_prepare_the_pod_runs_prepared_once(dra):
    """The test holds the driver's checkpoint lock, so the kubelet's NodePrepareResources for a
    new pod on NV2 waits inside the driver; the driver is killed there (SIGKILL). The kubelet
    reports the failed prepare, the DaemonSet starts the driver again, the kubelet asks again,
    and the pod runs with its GPU: prepared once (one answer that was not read from the
    checkpoint, across both runs of the driver), one record in the checkpoint."""
    c = dra
    nv2 = c.nodes[NV2.name]
    before = restarts(dra_pods(c)[NV2.name])
    logs = nv2.var("log", "pods", f"{DRA_NS}_{dra_pods(c)[NV2.name]['metadata']['name']}_*", "dra", "*.log")
    lock = os.open(nv2.var("lib", "kubelet", "plugins", DRIVER, "checkpoint.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        apply(c, pod("fault", node_name=NV2.name))
        uid = c.wait(lambda: (p := get_pod(c, "fault")).get("status", {}).get("resourceClaimStatuses")
                     and claim_of(c, p)["metadata"]["uid"], 60, "the fault pod's claim")
        c.wait(lambda: any(r.get("event") == "dra.prepare.called" and r.get("uid") == uid for r in _records(logs)),
               60, "the kubelet's prepare inside the driver", period=0.1)
        pid = _driver_pid(NV2.name)
        os.kill(pid, signal.SIGKILL)
        print("killed the driver (pid", pid, ") inside the prepare of claim", uid)
    finally:
        os.close(lock)
    c.wait(lambda: running(get_pod(c, "fault")), 180, "the fault pod running")
    p = dra_pods(c)[NV2.name]
    assert restarts(p) == before + 1 and node.pod_ready(p)
    previous, now = driver_log(c, NV2.name, previous=True), driver_log(c, NV2.name)
    mine = lambda recs, ev: [r for r in recs if r.get("event") == ev and r.get("uid") == uid]  # noqa: E731
    assert mine(previous, "dra.prepare.called") and not mine(previous, "dra.prepare.answered"), previous[-5:]
    answers = mine(previous + now, "dra.prepare.answered")
    print("answers:", [(r["source"], r["devices"]) for r in answers])
    assert [r["source"] for r in answers if r["source"] != "checkpoint"] == ["allocation"], answers
    (_, pool, device), = results(claim_of(c, get_pod(c, "fault")))
    entry = checkpoint(c, NV2.name)[uid]
    assert entry["state"] == "prepared" and [d["device"] for d in entry["devices"]] == [device]
    assert shown(c, "fault") == expected_nodes(c, NV2.name, device)
    events = c.get("events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=fault")["items"]
    failed = [e["message"] for e in events if e["reason"] == "FailedPrepareDynamicResources"]
    print("the kubelet:", failed)
    assert failed, "the kubelet saw the prepare fail (and asked again)"
    delete_all(c)


def test_a_claim_on_an_attribute_the_driver_does_not_publish_is_a_clear_scheduling_reason(dra):
    """A claim that selects on gpuhook.dev/tensorCores, which no device has: the pod stays
    Pending and its PodScheduled condition names the attribute; no driver restarts."""
    c = dra
    before = {n: restarts(p) for n, p in dra_pods(c).items() if n in c.nodes}
    apply(c, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": "tensor-cores", "namespace": NAMESPACE},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": "gpu.gpuhook.dev",
                  "selectors": [{"cel": {"expression": 'device.attributes["gpuhook.dev"].tensorCores >= 4'}}]}}]}}})
    apply(c, pod("tensor", claim={"name": "gpu", "resourceClaimName": "tensor-cores"}))
    cond = c.wait(lambda: (x := condition(get_pod(c, "tensor"), "PodScheduled")).get("status") == "False"
                  and x.get("message") and x, 120, "the tensor pod's scheduling reason")
    print("PodScheduled:", cond["reason"], cond["message"])
    events = [e["message"] for e in c.get("events", "-n", NAMESPACE, "--field-selector",
                                           "involvedObject.name=tensor")["items"] if e["reason"] == "FailedScheduling"]
    print("FailedScheduling:", events)
    assert "tensorCores" in cond["message"], cond
    assert get_pod(c, "tensor")["status"]["phase"] == "Pending"
    after = dra_pods(c)
    assert all(restarts(after[n]) == k and node.pod_ready(after[n]) for n, k in before.items()), after
    delete_all(c)


def test_the_outage_with_the_claim(dra):
    """The seed's outage, the claim instead of the RuntimeClass: a Deployment of two replicas
    with the example's template, preferring NVIDIA, runs on NV2 with its GPUs; NV2 fails; the
    replacements are scheduled on the other nodes (an AMD GPU where one is free, else `none`)
    and run, with no FailedScheduling on the way."""
    c = dra
    labels = {"app": "dra-worker"}
    apply(c, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dra-worker", "namespace": NAMESPACE},
              "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                       "template": {"metadata": {"labels": labels}, "spec": pod_spec()}}})

    def live(off: set[str]) -> list[dict]:
        ps = [p for p in c.pods(NAMESPACE, "app=dra-worker") if not p["metadata"].get("deletionTimestamp")]
        ok = [p for p in ps if running(p) and p["spec"]["nodeName"] not in off]
        return ok if len(ok) == 2 else []

    first = c.wait(lambda: live(set()), 180, "the two replicas running")
    placed = {p["metadata"]["name"]: (p["spec"]["nodeName"], results(claim_of(c, p))) for p in first}
    print("placed:", placed)
    assert any(where == NV2.name and r[0][2].startswith("nvidia-") for where, r in placed.values()), placed
    started = time.monotonic()
    c.nodes[NV2.name].fail()
    c.wait(lambda: not c.ready(NV2.name), 60, f"{NV2.name} NotReady")
    now = c.wait(lambda: live({NV2.name}), 180, "the replacements running off the failed node")
    took = time.monotonic() - started
    print(f"{NV2.name} failed: the replicas ran elsewhere {took:.1f} s later")
    for p in now:
        name, where = p["metadata"]["name"], p["spec"]["nodeName"]
        (request, pool, device), = results(claim_of(c, p))
        print(" ", name, where, request, device)
        assert pool == where and (device == "none" or (where == "node-amd" and device.startswith("amd-")))
        assert shown(c, name) == expected_nodes(c, where, device)
    failed = [e for e in c.get("events", "-n", NAMESPACE)["items"]
              if e["reason"] == "FailedScheduling" and e["involvedObject"]["name"].startswith("dra-worker-")]
    assert failed == [], [(e["involvedObject"]["name"], e["message"]) for e in failed]
