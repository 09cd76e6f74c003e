"""gpuhook dra's kubelet plugin over its real gRPC server on unix sockets, called as the kubelet
calls it: Registration.GetInfo and NotifyRegistrationStatus on the registration socket, then
DRAPlugin.NodePrepareResources / NodeUnprepareResources on the endpoint GetInfo names. The
claims' allocations come from a fake resource.k8s.io API; the CDI ids answered are checked
against the CDI specs the driver wrote."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import grpc
import pytest
import yaml

from conftest import REPO
from dra_api import DRAFakeAPI, wait_for
from gpuhook.dra import DRIVER, driver, dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from gpuhook.dra.publish import NodeDevices
from fakes import fakehost

NODE = "node-1"


class Plugin:
    """The driver as `gpuhook dra` runs it, on sockets in a short directory (a unix socket's
    path has at most 107 bytes)."""

    def __init__(self, base: str, api: DRAFakeAPI, host: str):
        self.base = base
        self.node = NodeDevices(host, os.path.join(base, "cdi"), ldconfig=False, helper=False)
        self.node.refresh()
        self.checkpoint = driver.Checkpoint(os.path.join(base, "plugins", DRIVER, driver.CHECKPOINT))
        kube = api.client()
        self.statuses: list[tuple[bool, str]] = []
        self.warnings: list[str] = []
        self.driver = driver.Driver(
            NODE, self.checkpoint, kube.get_resource_claim, self.node.table, self.warnings.append
        )
        self.dra_socket = os.path.join(base, "plugins", DRIVER, driver.DRA_SOCKET)
        self.reg_socket = driver.registration_socket(registry=os.path.join(base, "registry"))
        self.server = driver.serve(
            self.driver, self.dra_socket, self.reg_socket, on_status=lambda ok, err: self.statuses.append((ok, err))
        )

    def stop(self):
        # wait for gRPC's own threads: one still polling a closed listener takes the next socket
        # given that fd number (the fake API's, in the next test) and accepts its connections
        self.server.stop(None).wait()


class Kubelet:
    """What the kubelet does with a plugin: GetInfo on its registration socket, then the DRA
    service at the endpoint it names."""

    def __init__(self, reg_socket: str):
        self.reg = grpc.insecure_channel(f"unix://{reg_socket}")
        self.info = pluginregistration_pb2_grpc.RegistrationStub(self.reg).GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=10
        )
        self.dra = grpc.insecure_channel(f"unix://{self.info.endpoint}")
        self.stub = dra_pb2_grpc.DRAPluginStub(self.dra)

    def notify(self, ok: bool, error: str = "") -> None:
        pluginregistration_pb2_grpc.RegistrationStub(self.reg).NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=ok, error=error), timeout=10
        )

    def prepare(self, *claims: tuple[str, str, str], timeout: float = 10):
        req = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        )
        return self.stub.NodePrepareResources(req, timeout=timeout).claims

    def unprepare(self, *claims: tuple[str, str, str]):
        req = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=n, uid=u) for ns, n, u in claims]
        )
        return self.stub.NodeUnprepareResources(req, timeout=10).claims

    def close(self):
        self.reg.close()
        self.dra.close()


@pytest.fixture
def base():
    d = tempfile.mkdtemp(prefix="dra-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def api():
    a = DRAFakeAPI(node=NODE)
    yield a
    a.close()


@pytest.fixture
def host(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=2)
    return fh.root


@pytest.fixture
def plugin(base, api, host):
    p = Plugin(base, api, host)
    yield p
    p.stop()


@pytest.fixture
def kubelet(plugin):
    k = Kubelet(plugin.reg_socket)
    yield k
    k.close()


GPU0 = "nvidia-gpu-00000000-1111-2222-3333-444444444444"
GPU0_CDI = "gpuhook.dev/nvidia=GPU-00000000-1111-2222-3333-444444444444"


def _result(device: str, request: str = "gpu/gpu", **kw) -> dict:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **kw}


def _cdi(base: str) -> dict[str, dict]:
    """{fully qualified CDI device name: (the spec's edits, the device's edits)} of the specs written."""
    out = {}
    for name in os.listdir(os.path.join(base, "cdi")):
        spec = yaml.safe_load(open(os.path.join(base, "cdi", name)))
        for d in spec["devices"]:
            out[f"{spec['kind']}={d['name']}"] = (spec.get("containerEdits") or {}, d["containerEdits"])
    return out


def test_registration_is_what_the_kubelet_asks_for(plugin, kubelet):
    info = kubelet.info
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin",
        DRIVER,
        plugin.dra_socket,
        ["v1.DRAPlugin"],
    )
    assert os.path.basename(plugin.reg_socket) == "gpuhook.dev-reg.sock"
    kubelet.notify(True)
    kubelet.notify(False, "version not supported")
    assert plugin.statuses == [(True, ""), (False, "version not supported")]


def test_prepare_a_gpu_and_none_then_unprepare_twice(plugin, kubelet, api, base):
    api.add_claim("ns", "gpu-claim", "uid-gpu", [_result(GPU0)])
    api.add_claim("ns", "none-claim", "uid-none", [_result("none", "gpu/none", shareID="share-1")])
    got = kubelet.prepare(("ns", "gpu-claim", "uid-gpu"), ("ns", "none-claim", "uid-none"))
    (gpu,) = got["uid-gpu"].devices
    assert (
        got["uid-gpu"].error,
        list(gpu.request_names),
        gpu.pool_name,
        gpu.device_name,
        list(gpu.cdi_device_ids),
    ) == (
        "",
        ["gpu"],  # the claim's request, not its subrequest "gpu/gpu": what the kubelet matches containers on
        NODE,
        GPU0,
        [GPU0_CDI],
    )
    (none,) = got["uid-none"].devices
    assert (list(none.request_names), list(none.cdi_device_ids), none.share_id) == (
        ["gpu"],
        ["gpuhook.dev/none=none"],
        "share-1",
    )

    specs = _cdi(base)
    top, own = specs[GPU0_CDI]
    assert [n["path"] for n in own["deviceNodes"]] == ["/dev/nvidia1"]  # that GPU exactly (minor 1: the fake's order)
    assert "GPUHOOK_ACCELERATOR=nvidia" in top["env"] and "/dev/nvidiactl" in [n["path"] for n in top["deviceNodes"]]
    assert any(m["containerPath"].endswith("libcuda.so.1") or "libcuda" in m["containerPath"] for m in top["mounts"])
    assert specs["gpuhook.dev/none=none"] == ({}, {"env": ["GPUHOOK_ACCELERATOR=cpu"]})

    assert set(plugin.driver.prepared()) == {"uid-gpu", "uid-none"}
    for _ in range(2):  # the second: already unprepared, not an error
        out = kubelet.unprepare(("ns", "gpu-claim", "uid-gpu"), ("ns", "none-claim", "uid-none"))
        assert {uid: a.error for uid, a in out.items()} == {"uid-gpu": "", "uid-none": ""}
    assert plugin.driver.prepared() == {}


def test_prepare_again_answers_from_the_checkpoint_across_a_restart(base, api, host):
    api.add_claim("ns", "c", "uid-1", [_result(GPU0)])
    p = Plugin(base, api, host)
    k = Kubelet(p.reg_socket)
    first = k.prepare(("ns", "c", "uid-1"))["uid-1"]
    k.close()
    p.stop()
    gets = [r for r in api.requests if "resourceclaims" in r[1]]
    assert len(gets) == 1

    api.claims.clear()  # the claim cannot be read again: the answer must come from what was prepared
    p = Plugin(base, api, host)
    k = Kubelet(p.reg_socket)
    try:
        again = k.prepare(("ns", "c", "uid-1"))["uid-1"]
        assert again == first and again.error == ""
        assert len([r for r in api.requests if "resourceclaims" in r[1]]) == 1
    finally:
        k.close()
        p.stop()


@pytest.mark.parametrize(
    "results, uid, error",
    [
        (None, "uid-x", "ResourceClaim ns/c: not allocated"),
        ([_result(GPU0)], "uid-other", "ResourceClaim ns/c: its UID is uid-x, not uid-other"),
        ([_result("nvidia-gpu-gone")], "uid-x", f"device nvidia-gpu-gone is not on node {NODE} (any more)"),
        (
            [dict(_result(GPU0), pool="node-2")],
            "uid-x",
            f"ResourceClaim ns/c: device {GPU0} is in pool node-2, not this node's ({NODE})",
        ),
    ],
    ids=["not allocated", "another claim of that name", "a device the node does not have", "another node's pool"],
)
def test_a_claim_that_cannot_be_prepared_is_its_error_not_a_crash(plugin, kubelet, api, results, uid, error):
    api.add_claim("ns", "c", "uid-x", results)
    api.add_claim("ns", "fine", "uid-fine", [_result("none", "gpu/none")])
    got = kubelet.prepare(("ns", "c", uid), ("ns", "fine", "uid-fine"))
    assert got[uid].error == error and not got[uid].devices
    assert got["uid-fine"].error == "" and got["uid-fine"].devices[0].device_name == "none"  # the others go on
    assert plugin.warnings == [f"prepare ns/c ({uid}): {error}"]
    assert list(plugin.driver.prepared()) == ["uid-fine"]  # no record of a claim that was not prepared


def test_a_claim_the_api_does_not_have(plugin, kubelet):
    got = kubelet.prepare(("ns", "missing", "uid-m"))["uid-m"]
    assert got.error.startswith(
        "ResourceClaim ns/missing: GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/missing: HTTP 404"
    )
    assert plugin.driver.prepared() == {}


def test_other_drivers_devices_are_not_ours(plugin, kubelet, api):
    api.add_claim("ns", "c", "uid-1", [dict(_result("gpu-0"), driver="gpu.example.com"), _result("none", "gpu/none")])
    (only,) = kubelet.prepare(("ns", "c", "uid-1"))["uid-1"].devices
    assert only.device_name == "none"


def test_a_gpu_that_disappears_after_prepare_stays_prepared_for_its_claim(plugin, kubelet, api, host):
    """Once answered, the answer stands (the kubelet may ask again while the pod runs); a new
    claim for it gets a clear error."""
    api.add_claim("ns", "c", "uid-1", [_result(GPU0)])
    first = kubelet.prepare(("ns", "c", "uid-1"))["uid-1"]
    for path in ("proc/driver/nvidia/gpus/0000:18:00.0",):
        shutil.rmtree(os.path.join(host, path))
    plugin.node.refresh()
    assert GPU0 not in plugin.node.table()
    assert kubelet.prepare(("ns", "c", "uid-1"))["uid-1"] == first
    api.add_claim("ns", "d", "uid-2", [_result(GPU0)])
    assert kubelet.prepare(("ns", "d", "uid-2"))["uid-2"].error == f"device {GPU0} is not on node {NODE} (any more)"


# -- the driver killed in the middle of a prepare -------------------------------------------

# the driver in a process of its own that stops (a marker file, then a long sleep) right before
# or right after its checkpoint's save (`when`), where the test kills it with SIGKILL
CHILD = r"""
import os, sys, time
from gpuhook.agent.kube import KubeAPI
from gpuhook.dra import driver
from gpuhook.dra.publish import NodeDevices

base, url, token, node, host, when = sys.argv[1:7]
nd = NodeDevices(host, os.path.join(base, "cdi"), ldconfig=False, helper=False)
nd.refresh()
saves = []
real_save = driver.Checkpoint.save

def stop():
    open(os.path.join(base, "stopped"), "w").close()
    time.sleep(3600)

def save(self, claims):
    if when == "before":
        stop()
    real_save(self, claims)
    if when == "after":
        stop()

driver.Checkpoint.save = save
kube = KubeAPI(url, token, node)
cp = driver.Checkpoint(os.path.join(base, "plugins", driver.DRIVER, driver.CHECKPOINT))
d = driver.Driver(node, cp, kube.get_resource_claim, nd.table)
server = driver.serve(d, os.path.join(base, "plugins", driver.DRIVER, driver.DRA_SOCKET), driver.registration_socket(registry=os.path.join(base, "registry")))
open(os.path.join(base, "serving"), "w").close()
server.wait_for_termination()
"""


@pytest.mark.parametrize("when, state", [("before", None), ("after", driver.PREPARED)],
                         ids=["before its checkpoint", "after its checkpoint"])
def test_killed_during_a_prepare_the_retry_prepares_once(base, api, host, when, state):
    api.add_claim("ns", "c", "uid-1", [_result(GPU0)])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, base, api.url, api.token, NODE, host, when],
        cwd=REPO,
    )
    try:
        wait_for(lambda: os.path.exists(os.path.join(base, "serving")) or child.poll() is not None)
        assert child.poll() is None
        k = Kubelet(driver.registration_socket(registry=os.path.join(base, "registry")))
        lost = []
        t = threading.Thread(target=lambda: lost.append(_error_of(lambda: k.prepare(("ns", "c", "uid-1"), timeout=30))))
        t.start()
        wait_for(lambda: os.path.exists(os.path.join(base, "stopped")))
        path = os.path.join(base, "plugins", DRIVER, driver.CHECKPOINT)
        cp = json.load(open(path)) if os.path.exists(path) else {"claims": {}}
        assert cp["claims"].get("uid-1", {}).get("state") == state
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        t.join(30)
        assert lost == [grpc.StatusCode.UNAVAILABLE]  # the kubelet saw the call fail: it will retry
        k.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    gets = len([r for r in api.requests if "resourceclaims" in r[1]])

    p = Plugin(base, api, host)  # restarted: the kubelet retries
    k = Kubelet(p.reg_socket)
    try:
        got = k.prepare(("ns", "c", "uid-1"))["uid-1"]
        assert got.error == "" and [list(d.cdi_device_ids) for d in got.devices] == [[GPU0_CDI]]
        # from the checkpoint's record, not read again; nothing recorded: read again, once
        assert len([r for r in api.requests if "resourceclaims" in r[1]]) == gets + (state is None)
        claims = json.load(open(p.checkpoint.path))["claims"]
        assert list(claims) == ["uid-1"] and claims["uid-1"]["state"] == driver.PREPARED
        assert [d["device"] for d in claims["uid-1"]["devices"]] == [GPU0]  # once
        assert k.prepare(("ns", "c", "uid-1"))["uid-1"] == got
    finally:
        k.close()
        p.stop()


def _error_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return None


def test_a_corrupt_checkpoint_is_every_claims_error_not_a_fresh_start(plugin, kubelet, api):
    api.add_claim("ns", "c", "uid-1", [_result(GPU0)])
    os.makedirs(os.path.dirname(plugin.checkpoint.path), exist_ok=True)
    with open(plugin.checkpoint.path, "w") as f:
        f.write("{not json")
    got = kubelet.prepare(("ns", "c", "uid-1"))["uid-1"]
    assert got.error.startswith("checkpoint: ") and not got.devices
    assert kubelet.unprepare(("ns", "c", "uid-1"))["uid-1"].error.startswith("checkpoint: ")


def test_two_drivers_on_one_checkpoint_keep_each_others_claims(tmp_path):
    """A rolling update's old and new pod on one node: while one prepares (it read the
    checkpoint and waits on the API), the other's prepare waits for it, and both claims stay."""
    cp_path = str(tmp_path / "plugins" / DRIVER / driver.CHECKPOINT)
    inside, release = threading.Event(), threading.Event()
    claim_a = {
        "metadata": {"namespace": "ns", "name": "a", "uid": "uid-a"},
        "status": {"allocation": {"devices": {"results": [_result("none", "gpu/none")]}}},
    }
    claim_b = dict(claim_a, metadata={"namespace": "ns", "name": "b", "uid": "uid-b"})

    def slow_api(ns, name):
        inside.set()
        release.wait(10)
        return claim_a

    table = {"none": "gpuhook.dev/none=none"}.copy
    old = driver.Driver(NODE, driver.Checkpoint(cp_path), slow_api, table)
    new = driver.Driver(NODE, driver.Checkpoint(cp_path), lambda ns, name: claim_b, table)
    t = threading.Thread(target=old.prepare, args=("ns", "a", "uid-a"))
    t.start()
    assert inside.wait(10)
    done = []
    u = threading.Thread(target=lambda: done.append(new.prepare("ns", "b", "uid-b")))
    u.start()
    u.join(0.3)
    assert done == []  # waits for the other's prepare
    release.set()
    t.join(10)
    u.join(10)
    assert sorted(json.load(open(cp_path))["claims"]) == ["uid-a", "uid-b"]


def test_a_checkpoint_lock_held_too_long_is_the_claims_error(tmp_path, monkeypatch):
    import fcntl

    cp = driver.Checkpoint(str(tmp_path / driver.CHECKPOINT))
    monkeypatch.setattr(driver.Checkpoint, "LOCK_WAIT", 0.2)
    with open(cp.path + ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        d = driver.Driver(NODE, cp, lambda ns, name: {}, dict)
        with pytest.raises(OSError, match=r"checkpoint.json.lock: held by another process for 0.2 s"):
            d.prepare("ns", "c", "uid-1")


def test_each_prepare_is_noted_with_where_its_answer_came_from(tmp_path):
    """What the driver logs (the cluster test counts these across a driver killed and
    restarted): each call as it starts, each answer with its source: the allocation read from
    the API, or the checkpoint's prepared record (nothing done); a record of another state (an
    earlier version's "preparing") is no answer: read from the API."""
    cp = driver.Checkpoint(str(tmp_path / driver.CHECKPOINT))
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [_result(GPU0)]}}},
    }
    notes: list[tuple[str, dict]] = []
    d = driver.Driver(NODE, cp, lambda ns, name: claim, {GPU0: GPU0_CDI}.copy, note=lambda e, **f: notes.append((e, f)))
    d.prepare("ns", "c", "uid-1")
    d.prepare("ns", "c", "uid-1")
    cp.save({**cp.load(), "uid-2": {"state": "preparing", "namespace": "ns", "name": "c2", "allocated": []}})
    claim = {"metadata": {"namespace": "ns", "name": "c2", "uid": "uid-2"},
             "status": {"allocation": {"devices": {"results": [_result(GPU0)]}}}}
    d.prepare("ns", "c2", "uid-2")
    called = {"claim": "ns/c", "uid": "uid-1"}
    answered = dict(called, devices=[GPU0])
    assert notes == [
        (driver.PREPARE_CALLED, called),
        (driver.PREPARE_ANSWERED, dict(answered, source=driver.SOURCE_ALLOCATION)),
        (driver.PREPARE_CALLED, called),
        (driver.PREPARE_ANSWERED, dict(answered, source=driver.SOURCE_CHECKPOINT)),
        (driver.PREPARE_CALLED, {"claim": "ns/c2", "uid": "uid-2"}),
        (driver.PREPARE_ANSWERED, {"claim": "ns/c2", "uid": "uid-2", "devices": [GPU0],
                                   "source": driver.SOURCE_ALLOCATION}),
    ]
    with pytest.raises(driver.ClaimError):  # a claim that fails: called, never answered
        driver.Driver(NODE, cp, lambda ns, name: {}, dict, note=lambda e, **f: notes.append((e, f))).prepare(
            "ns", "x", "uid-3"
        )
    assert notes[-1] == (driver.PREPARE_CALLED, {"claim": "ns/x", "uid": "uid-3"})
