"""A device plugin of the tests' own over the kubelet's real device-plugin gRPC API
(k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it advertises a node's fake GPUs as
`nvidia.com/gpu` the way NVIDIA's plugin does (one device per GPU, its UUID the id, the
/dev node in the Allocate answer), so that the real kubelet schedules, allocates and writes
its checkpoint (/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint) for it.

The .proto is the one of the k8s.io/kubelet module of the cluster's release, in the Go
module cache the build filled (gobuild.GO_ENV), compiled with grpc_tools at test time.

It runs in the test process: the node's /var/lib/kubelet is a host directory (node.py), so
the kubelet's registration socket and the plugin's own socket are plain files here. A kubelet
that starts again removes every socket there: the plugin notices (kubelet.sock is a new
file), serves again and registers again, as a real plugin does.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent import futures

import gobuild
from versions import KUBERNETES_VERSION

RESOURCE = "nvidia.com/gpu"
PROTO_NAME = "deviceplugin.proto"  # a name of its own: CRI's stubs are api_pb2 too


def proto_path() -> str:
    """api.proto of k8s.io/kubelet v0.<minor>.<patch> (the cluster's release) in the module cache."""
    staging = "v0." + KUBERNETES_VERSION.lstrip("v").split(".", 1)[1]
    return os.path.join(gobuild.GO_ENV["GOMODCACHE"], "k8s.io", f"kubelet@{staging}", "pkg", "apis", "deviceplugin",
                        "v1beta1", "api.proto")


def stubs(out_dir: str) -> tuple:
    """(pb2, pb2_grpc) of the device-plugin API, generated into out_dir."""
    from cri_client import compile_proto

    src = proto_path()
    if not os.path.exists(src):
        raise FileNotFoundError(f"no {src}: the kubelet's device-plugin API comes with the cluster's build "
                                "(tests/cluster/gobuild.py)")
    return compile_proto(src, out_dir, PROTO_NAME.removesuffix(".proto"))


class DevicePlugin:
    """`devices`: id -> the device node's path on the node (e.g. a GPU's UUID -> /dev/nvidia3).
    `plugin_dir`: the node's /var/lib/kubelet/device-plugins as a host path."""

    def __init__(self, plugin_dir: str, devices: dict[str, str], stub_dir: str, resource: str = RESOURCE,
                 name: str = "gpuhook-test-nvidia.sock"):
        self.dir, self.devices, self.resource, self.name = plugin_dir, devices, resource, name
        self.pb2, self.pb2_grpc = stubs(stub_dir)
        self.server = None
        self.allocations: list[list[str]] = []  # the ids of each Allocate, in order
        self.registrations = 0
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.dir, "kubelet.sock")

    def _servicer(self):
        pb2, plugin = self.pb2, self

        class Servicer(self.pb2_grpc.DevicePluginServicer):
            def GetDevicePluginOptions(self, request, context):
                return pb2.DevicePluginOptions()

            def ListAndWatch(self, request, context):
                yield pb2.ListAndWatchResponse(devices=[pb2.Device(ID=i, health="Healthy") for i in plugin.devices])
                while not plugin._stop.is_set() and context.is_active():
                    time.sleep(0.5)

            def Allocate(self, request, context):
                out = pb2.AllocateResponse()
                for req in request.container_requests:
                    ids = list(req.devices_ids)
                    plugin.allocations.append(ids)
                    out.container_responses.append(pb2.ContainerAllocateResponse(
                        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)},
                        devices=[pb2.DeviceSpec(container_path=plugin.devices[i], host_path=plugin.devices[i],
                                                permissions="rw") for i in ids]))
                return out

            def GetPreferredAllocation(self, request, context):
                return pb2.PreferredAllocationResponse()

            def PreStartContainer(self, request, context):
                return pb2.PreStartContainerResponse()

        return Servicer()

    def _serve_and_register(self) -> None:
        import grpc

        if self.server is not None:
            self.server.stop(0).wait()
        path = os.path.join(self.dir, self.name)
        if os.path.exists(path):
            os.unlink(path)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.pb2_grpc.add_DevicePluginServicer_to_server(self._servicer(), self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as ch:
            self.pb2_grpc.RegistrationStub(ch).Register(
                self.pb2.RegisterRequest(version="v1beta1", endpoint=self.name, resource_name=self.resource,
                                         options=self.pb2.DevicePluginOptions()), timeout=10)
        self.registrations += 1

    def _kubelet_id(self):
        try:
            st = os.stat(self.kubelet_socket)
            return (st.st_ino, st.st_mtime_ns)
        except OSError:
            return None

    def start(self, timeout: float = 60) -> None:
        """Serve and register once the kubelet's socket is there; then keep registered across
        kubelet restarts (a thread watching kubelet.sock)."""
        deadline = time.monotonic() + timeout
        while self._kubelet_id() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no kubelet socket at {self.kubelet_socket}")
            time.sleep(0.2)
        seen = self._kubelet_id()
        self._serve_and_register()
        self._watch = threading.Thread(target=self._watch_kubelet, args=(seen,), daemon=True)
        self._watch.start()

    def _watch_kubelet(self, seen) -> None:
        while not self._stop.wait(0.5):
            now = self._kubelet_id()
            if now is not None and now != seen:
                time.sleep(0.5)  # the kubelet's registration service listening
                try:
                    self._serve_and_register()
                    seen = now
                except Exception:  # noqa: BLE001 (not up yet: the next round tries again)
                    pass

    def stop(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.stop(0).wait()
        if self._watch is not None:
            self._watch.join(5)
