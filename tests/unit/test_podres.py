"""agent/podres.py: the pods of the kubelet's device checkpoint that are gone, found through a
real gRPC server on a unix socket speaking the kubelet's own pod-resources API (v1.PodResourcesLister,
from its .proto), and read back by the wrapper's side (probe/nodestate.py)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from concurrent import futures

import grpc
import pytest

from conftest import make_agent
from gpuhook.agent import podres
from gpuhook.config import Config
from gpuhook.dra import podresources_pb2 as pb, podresources_pb2_grpc as pb_grpc
from gpuhook.inventory import Allocation, Inventory
from gpuhook.probe import nodestate

ME = ("gpuhook-system", "gpuhook-abcde")
ENV = {"POD_NAMESPACE": ME[0], "POD_NAME": ME[1]}
GPU = "nvidia.com/gpu"


def pod(namespace: str, name: str, **containers) -> pb.PodResources:
    """A PodResources: containers={name: {resource: [ids]}}."""
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=ids)
                                               for r, ids in devs.items()])
        for c, devs in containers.items()])  # fmt: skip


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources server: List answers `pods`; calls counted."""

    def __init__(self, socket: str):
        self.pods: list = [pod(*ME, agent={})]
        self.calls = 0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        os.makedirs(os.path.dirname(socket), exist_ok=True)
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def List(self, request, context):
        self.calls += 1
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


class Log:
    def __init__(self):
        self.records: list[tuple[str, str, dict]] = []

    def __getattr__(self, level):
        return lambda event, **kw: self.records.append((level, event, kw))


class Node:
    """A node root in a short directory (a unix socket's path is at most 107 bytes) with the
    kubelet's checkpoint, its pods' directories, its pod-resources server and a node config."""

    def __init__(self, share="unallocated"):
        self.root = tempfile.mkdtemp(prefix="podres-", dir="/tmp")
        self.config(share)
        self.kubelet: Kubelet | None = None

    def config(self, share: str) -> None:
        path = self.path("/etc/gpuhook/config.toml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(f'share = "{share}"\n')

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def serve(self) -> Kubelet:
        self.kubelet = Kubelet(self.path(podres.SOCKET))
        return self.kubelet

    def checkpoint(self, **pods) -> None:
        """pods={uid: [ids]}, each of nvidia.com/gpu; each with its directory."""
        path = self.path(nodestate.CHECKPOINT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"Data": {"PodDeviceEntries": [
                {"PodUID": uid, "ContainerName": "c", "ResourceName": GPU, "DeviceIDs": {"0": ids}}
                for uid, ids in pods.items()]}}, f)  # fmt: skip
        for uid in pods:
            os.makedirs(self.path(f"{podres.PODS_DIR}/{uid}"), exist_ok=True)

    def ends(self, uid: str) -> None:
        """What the kubelet does once a pod is over and deleted: its directory goes."""
        shutil.rmtree(self.path(f"{podres.PODS_DIR}/{uid}"))

    def written(self):
        try:
            with open(self.path(nodestate.GONE_FILE)) as f:
                return json.load(f)["gone"]
        except FileNotFoundError:
            return None

    def held(self) -> set[str]:
        """The uids whose devices a create holds back now (the wrapper's reading)."""
        state = nodestate.read(Inventory(self.root, ()), Config(share="unallocated"), ldconfig="/x", helper="/x")
        return {a.pod for a in state.allocations}

    def close(self) -> None:
        if self.kubelet is not None:
            self.kubelet.server.stop(None).wait()  # its fds closed before the next test makes its own
        shutil.rmtree(self.root)


@pytest.fixture
def node(monkeypatch):
    monkeypatch.delenv("GPUHOOK_CONFIG", raising=False)  # the node config is the root's
    n = Node()
    yield n
    n.close()


# -- the rule itself ---------------------------------------------------------------------------


def allocs(**pods) -> list[Allocation]:
    return [Allocation(GPU, i, uid) for uid, ids in pods.items() for i in ids]


def test_gone_is_no_device_held_by_an_active_pod_and_no_directory():
    a = allocs(p=["GPU-0", "GPU-1"], q=["GPU-2"], r=["GPU-3"], s=["GPU-4"])
    pods = [pod(*ME, agent={}), pod("ns", "p", c={GPU: ["GPU-1"]}),  # p: one of its two still held
            pod("ns", "new", c={GPU: ["GPU-3"]}, d={"amd.com/gpu": ["GPU-2"]})]  # r's GPU-3 taken again
    assert podres.gone(a, pods, ME, lambda uid: uid == "s") == {"q"}  # s: its directory is there
    assert podres.gone(a, pods[1:], ME, lambda uid: False) is None  # the agent's own pod not listed


# -- the agent's part against a pod-resources server -------------------------------------------------


def test_a_deleted_pods_devices_come_back_once_the_kubelet_no_longer_lists_it(node):
    k = node.serve()
    node.checkpoint(p=["GPU-0"], q=["GPU-1", "GPU-2"])
    k.pods.append(pod("ns", "p", c={GPU: ["GPU-0"]}))
    k.pods.append(pod("ns", "q", c={GPU: ["GPU-1", "GPU-2"]}))
    log = Log()
    gone = podres.GonePods(node.root, log, ENV)
    gone.update()
    assert (node.written(), k.calls, node.held()) == (None, 1, {"p", "q"})
    del k.pods[2]  # q deleted: the kubelet no longer lists it ...
    gone.update()
    assert (node.written(), node.held()) == (None, {"p", "q"})  # ... but its directory is still there
    node.ends("q")
    gone.update()
    assert (node.written(), node.held()) == (["q"], {"p"})
    assert ("info", "pods.gone", {"pods": ["q"], "file": nodestate.GONE_FILE}) in log.records
    node.checkpoint(p=["GPU-0"])  # the kubelet's next allocation drops q: so does the file
    gone.update()
    assert (node.written(), node.held()) == ([], {"p"})
    assert [r for r in log.records if r[0] != "info"] == []


def test_nothing_is_asked_when_every_pod_of_the_checkpoint_is_known_gone(node):
    k = node.serve()
    node.checkpoint(q=["GPU-1"])
    node.ends("q")
    gone = podres.GonePods(node.root, Log(), ENV)
    gone.update()
    gone.update()
    assert (node.written(), k.calls, node.held()) == (["q"], 1, set())


def test_a_list_without_the_agents_own_pod_frees_nothing(node):
    k = node.serve()
    k.pods = []  # a kubelet just started: its sources gave it nothing yet
    node.checkpoint(q=["GPU-1"])
    node.ends("q")
    log = Log()
    gone = podres.GonePods(node.root, log, ENV)
    gone.update()
    gone.update()
    assert (node.written(), k.calls, node.held()) == (None, 2, {"q"})
    warned = [kw["error"] for level, event, kw in log.records if level == "warning"]
    assert warned == [f"{podres.SOCKET}: the List lacks this pod gpuhook-system/gpuhook-abcde (a kubelet starting)"]


@pytest.mark.parametrize("env, serve, why", [
    ({}, True, "POD_NAMESPACE and POD_NAME not set: the List cannot be known whole"),
    (ENV, False, podres.SOCKET + ": "),  # no kubelet there: gRPC's own words follow
])  # fmt: skip
def test_without_a_whole_list_nothing_is_freed_and_it_is_said_once(node, env, serve, why):
    k = node.serve() if serve else None
    node.checkpoint(q=["GPU-1"])
    node.ends("q")
    log = Log()
    gone = podres.GonePods(node.root, log, env)
    gone.update()
    gone.update()
    assert (node.written(), node.held()) == (None, {"q"}) and (k is None or k.calls == 0)
    (warned,) = [(event, kw) for level, event, kw in log.records if level == "warning"]
    assert warned[0] == "pods.gone.unknown" and warned[1]["error"].startswith(why)


def test_with_share_all_nothing_is_read(node):
    node.config("all")
    k = node.serve()
    node.checkpoint(q=["GPU-1"])
    node.ends("q")
    podres.GonePods(node.root, Log(), ENV).update()
    assert (node.written(), k.calls) == (None, 0)


def test_the_agents_round_frees_them(node, tmp_path, monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    node.serve()
    node.checkpoint(q=["GPU-1"])
    node.ends("q")
    agent = make_agent(tmp_path, node.root)
    agent.sync()
    assert node.written() == ["q"]
