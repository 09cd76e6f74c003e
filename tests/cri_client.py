"""A minimal CRI v1 client for the tests: what kubelet would say to containerd, over gRPC.

The stubs come from tests/cri/api.proto (a subset of the real CRI API with the real field
numbers), generated with grpc_tools.protoc into a directory of the caller's choice at test
time; no generated code is kept in the repository.
"""

from __future__ import annotations

import importlib
import os
import sys
import time

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cri")
PROTO = "api.proto"


def available() -> str | None:
    """None when grpcio and grpcio-tools are importable, else why not."""
    import importlib.util

    for mod, pkg in (("grpc", "grpcio"), ("grpc_tools", "grpcio-tools")):
        if importlib.util.find_spec(mod) is None:  # found, not imported: conftest asks early
            return f"{pkg} is not installed (pip install '.[test]')"
    return None


_stubs: dict[tuple[str, str], tuple] = {}


def compile_proto(src: str, out_dir: str, name: str) -> tuple:
    """(pb2, pb2_grpc) of the .proto `src`, copied into out_dir as <name>.proto, generated there
    with grpc_tools.protoc (the well-known types on its path) and imported as <name>_pb2 and
    <name>_pb2_grpc (pb2_grpc does `import <name>_pb2`: both are loaded from out_dir)."""
    if (out_dir, name) in _stubs:
        return _stubs[out_dir, name]
    import shutil

    import grpc_tools
    from grpc_tools import protoc

    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(src, os.path.join(out_dir, f"{name}.proto"))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{out_dir}", f"-I{well_known}", f"--python_out={out_dir}",
                      f"--grpc_python_out={out_dir}", os.path.join(out_dir, f"{name}.proto")])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {src}")
    sys.path.insert(0, out_dir)
    for module in (f"{name}_pb2", f"{name}_pb2_grpc"):
        sys.modules.pop(module, None)
    try:
        pb2 = importlib.import_module(f"{name}_pb2")
        pb2_grpc = importlib.import_module(f"{name}_pb2_grpc")
    finally:
        sys.path.remove(out_dir)
    _stubs[out_dir, name] = (pb2, pb2_grpc)
    return pb2, pb2_grpc


def generate(out_dir: str) -> tuple:
    """CRI's stubs (tests/cri/api.proto) generated into out_dir: (api_pb2, api_pb2_grpc)."""
    return compile_proto(os.path.join(PROTO_DIR, PROTO), out_dir, PROTO.removesuffix(".proto"))


class CRIClient:
    """RuntimeService and ImageService of one CRI endpoint (a unix socket path)."""

    def __init__(self, address: str, stubs: tuple, timeout: float = 30) -> None:
        import grpc

        self.grpc = grpc
        self.pb, pb_grpc = stubs
        self.timeout = timeout
        self.channel = grpc.insecure_channel("unix://" + address, options=[("grpc.enable_http_proxy", 0)])
        self.runtime = pb_grpc.RuntimeServiceStub(self.channel)
        self.images = pb_grpc.ImageServiceStub(self.channel)
        self.pods: list[str] = []  # every sandbox this client made, for remove_all()

    def close(self) -> None:
        self.channel.close()

    # -- runtime -------------------------------------------------------------------
    def version(self):
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=self.timeout)

    def image_status(self, image: str):
        """The Image, or None when CRI does not know it."""
        r = self.images.ImageStatus(self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=image)),
                                    timeout=self.timeout)
        return r.image if r.HasField("image") else None

    def wait_image(self, image: str, timeout: float = 15):
        """After `ctr images import`, CRI learns of the image a moment later."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.image_status(image)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRI does not see image {image} after {timeout}s")
            time.sleep(0.05)

    def sandbox_config(self, name: str, *, uid: str | None = None, namespace: str = "default",
                       log_directory: str = "", cgroup_parent: str = "",
                       annotations: dict | None = None, labels: dict | None = None,
                       host_pid: bool = False, privileged: bool = False):
        """A kubelet-like PodSandboxConfig with host network (no CNI on these machines);
        host_pid: the node's PID namespace (hostPID: true); privileged: a pod with a
        privileged container (kubelet then asks for a privileged sandbox)."""
        pb = self.pb
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid or f"uid-{name}", namespace=namespace, attempt=0),
            hostname="",  # host network: the node's UTS namespace, so no hostname of its own
            log_directory=log_directory,
            labels=labels or {},
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=cgroup_parent,
                security_context=pb.LinuxSandboxSecurityContext(
                    privileged=privileged,
                    namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.NODE if host_pid else pb.CONTAINER,
                                                         ipc=pb.POD))),
        )

    def run_pod_sandbox(self, config, runtime_handler: str = "") -> str:
        r = self.runtime.RunPodSandbox(self.pb.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler),
                                       timeout=self.timeout)
        self.pods.append(r.pod_sandbox_id)
        return r.pod_sandbox_id

    def create_container(self, pod_id: str, sandbox_config, name: str, image: str, *,
                         command: list[str] | None = None, args: list[str] | None = None,
                         env: dict | None = None, log_path: str = "",
                         annotations: dict | None = None, labels: dict | None = None,
                         mounts: list[dict] | None = None, privileged: bool = False,
                         host_pid: bool = False, devices: list[tuple[str, str]] = (),
                         cdi_devices: list[str] = ()) -> str:
        """mounts: {"container_path", "host_path", "readonly", "propagation"} each
        (propagation: "private", "host_to_container" or "bidirectional"); devices: (host path,
        container path) each, rw and mknod (CRI's Device); cdi_devices: fully qualified CDI
        device names (CRI's CDI_devices, as the kubelet passes a DRA driver's CDI ids)."""
        pb = self.pb
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=command or [],
            args=args or [],
            envs=[pb.KeyValue(key=k, value=v) for k, v in (env or {}).items()],
            labels=labels or {},
            annotations=annotations or {},
            log_path=log_path,
            mounts=[pb.Mount(container_path=m["container_path"], host_path=m["host_path"],
                             readonly=bool(m.get("readonly")),
                             propagation=getattr(pb, "PROPAGATION_" + m.get("propagation", "private").upper()))
                    for m in mounts or []],
            devices=[pb.Device(host_path=h, container_path=c, permissions="rwm") for h, c in devices],
            CDI_devices=[pb.CDIDevice(name=n) for n in cdi_devices],
            linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
                privileged=privileged,
                namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.NODE if host_pid else pb.CONTAINER,
                                                     ipc=pb.POD))),
        )
        r = self.runtime.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config,
                                                                   sandbox_config=sandbox_config),
                                         timeout=self.timeout)
        return r.container_id

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=container_id), timeout=self.timeout)

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(self.pb.RemoveContainerRequest(container_id=container_id), timeout=self.timeout)

    def container_status(self, container_id: str, verbose: bool = False):
        return self.runtime.ContainerStatus(self.pb.ContainerStatusRequest(container_id=container_id, verbose=verbose),
                                            timeout=self.timeout)

    def wait_exited(self, container_id: str, timeout: float = 30):
        """The ContainerStatus once the container has exited."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.container_status(container_id).status
            if st.state == self.pb.CONTAINER_EXITED:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {container_id} still {st.state} after {timeout}s")
            time.sleep(0.05)

    def list_containers(self, pod_id: str = ""):
        f = self.pb.ContainerFilter(pod_sandbox_id=pod_id)
        return list(self.runtime.ListContainers(self.pb.ListContainersRequest(filter=f), timeout=self.timeout).containers)

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 10):
        return self.runtime.ExecSync(self.pb.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout),
                                     timeout=self.timeout + timeout)

    def list_pod_sandbox(self):
        return list(self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(), timeout=self.timeout).items)

    def stop_pod_sandbox(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def remove_pod_sandbox(self, pod_id: str) -> None:
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=self.timeout)

    def remove_all(self) -> None:
        """Stop and remove every pod sandbox the runtime has (as kubelet does: stop, then
        remove; both are idempotent)."""
        ids = list(dict.fromkeys(self.pods + [p.id for p in self.list_pod_sandbox()]))
        for pod_id in ids:
            self.stop_pod_sandbox(pod_id)
            self.remove_pod_sandbox(pod_id)
        self.pods.clear()
