"""The agent's Kubernetes API client: lightkube (httpx) underneath, the few calls the agent
makes on top (get/patch its Node, Events, get/label/patch a pod of its node).

Where the API is and who the agent is:

- `gpuhook agent --kubeconfig FILE [--context NAME]`: a kubeconfig, as kubectl reads it
  (server, certificate-authority[-data], insecure-skip-tls-verify, token, tokenFile, client
  certificates, exec plugins; relative paths are relative to the file), to run the agent
  from a workstation against a cluster;
- in a pod: KUBERNETES_SERVICE_HOST/PORT, the service account's token and CA
  (KubeAPI.in_cluster); neither: no API work at all.

Token rotation: a bound service account token (and a kubeconfig's tokenFile) is a file the
kubelet rewrites before it expires. It is read again whenever the file changed (inode,
mtime, size: one stat per request) and once more after a 401, as client-go does.

Retries: a connection that cannot be made is tried again by the transport (httpcore, with
exponential backoff: 0 s, then 0.5 s); everything else comes back as one KubeError with the
HTTP status (None: unreachable) and a `kind` for logging once per kind of error. The callers
retry with backoff (podevents.PodReporter, Agent._sync_api); nothing here sleeps long.

lightkube is imported when a client is made, never by `import gpuhook.agent.kube`: the runtime
(the per-container create path) never imports this module at all.
"""

from __future__ import annotations

import os
import threading

from ..defaults import AGENT_NAME

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 5.0
CONNECT_RETRIES = 2
NODE_EVENTS_NAMESPACE = "default"  # where Node events go (the kubelet's are there too)
# Every reason the agent's Events may have, by the kind of object they are about: the one list.
# _create_event posts no other; daemonset/gpu-optional-admission.yaml admits no other (its
# lists are checked against these by tests/unit/test_admission.py).
EVENT_REASONS = {
    "Pod": ("GPUsInjected", "RanOnCPU", "LdCacheNotUpdated", "GPUHookFailed", "GPUsUnconfirmed", "GPULost"),
    "Node": ("GPUInventory", "GPUInventoryChanged", "GPUUnusable", "RuntimeInstallFailed", "NRIPluginNotSynchronized"),
}
REPORTING_COMPONENT = "gpuhook.dev/agent"


class KubeError(Exception):
    """One line about a failed call; `status` is the HTTP status (None: no answer)."""

    def __init__(self, msg: str, status: int | None = None, kind: str | None = None):
        super().__init__(msg)
        self.status = status
        self.kind = kind or (f"http-{status}" if status else "unreachable")

    @property
    def transient(self) -> bool:
        """Worth trying again: no answer, 429, or a server error."""
        return self.status is None or self.status == 429 or self.status >= 500


def node_name(given: str | None = None, env=None) -> str:
    """--node, else NODE_NAME (the DaemonSet's downward API), else this host's name."""
    env = os.environ if env is None else env
    if given:
        return given
    if env.get("NODE_NAME"):
        return env["NODE_NAME"]
    import socket

    return socket.gethostname()


def _token_file_auth(path: str):
    """An httpx Auth that sends the token in `path`, read again when the file changes
    (projected tokens are swapped in by the kubelet: a new inode) and after a 401."""
    import httpx2 as httpx

    class TokenFile(httpx.Auth):
        def __init__(self):
            self.path = path
            self.key = None
            self.bearer: str | None = None
            self.reads = 0
            self.lock = threading.Lock()

        def current(self, force: bool = False) -> str:
            with self.lock:
                try:
                    st = os.stat(self.path)
                    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                    if force or key != self.key or self.bearer is None:
                        with open(self.path) as f:
                            token = f.read(1 << 20).strip()
                        self.key, self.bearer = key, f"Bearer {token}"
                        self.reads += 1
                except OSError as e:
                    if self.bearer is None:  # never read: say why; once read, keep the last one
                        raise KubeError(f"token file {self.path}: {e.strerror or e}", kind="token-file") from None
                return self.bearer

        def auth_flow(self, request):
            request.headers["Authorization"] = sent = self.current()
            response = yield request
            if response.status_code == 401 and self.current(force=True) != sent:
                request.headers["Authorization"] = self.bearer
                yield request

    return TokenFile()


class KubeAPI:
    """The calls the agent makes. Every method returns the object as a dict or raises
    KubeError; `node` is the agent's Node."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        node: str | None = None,
        ca_file: str | None = None,
        timeout: float = TIMEOUT,
        namespace: str = NODE_EVENTS_NAMESPACE,
        token_file: str | None = None,
    ):
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.config.models import Cluster, User

        cluster = Cluster(server=base_url.rstrip("/"), certificate_auth=ca_file)
        config = KubeConfig.from_one(cluster=cluster, user=User(token=token)).get()
        self._setup(config, node_name(node), timeout, namespace, token_file)

    @classmethod
    def from_config(
        cls,
        config,
        node: str | None = None,
        timeout: float = TIMEOUT,
        namespace: str = NODE_EVENTS_NAMESPACE,
        token_file: str | None = None,
    ) -> KubeAPI:
        api = cls.__new__(cls)
        api._setup(config, node_name(node), timeout, namespace, token_file)
        return api

    @classmethod
    def from_kubeconfig(
        cls, path: str, context: str | None = None, node: str | None = None, timeout: float = TIMEOUT
    ) -> KubeAPI:
        """The cluster and user of `context` (default: current-context) in a kubeconfig file.
        KubeError (kind "config") when the file cannot be used: one line that says why."""
        from lightkube.config.kubeconfig import KubeConfig
        from lightkube.core.exceptions import ConfigError

        where = f"--kubeconfig {path}"
        try:
            config = KubeConfig.from_file(path).get(context)
        except ConfigError as e:
            raise KubeError(f"{where}: {e}", kind="config") from None
        except OSError as e:
            raise KubeError(f"{where}: {e.strerror or e}", kind="config") from None
        except Exception as e:  # YAML that is not a kubeconfig: yaml/msgspec errors, a missing key
            what = (
                f"no {e}"
                if isinstance(e, KeyError)
                else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            raise KubeError(f"{where}: not a usable kubeconfig ({what})", kind="config") from None
        assert config is not None  # from_file gives one, or raises
        if config.user is None:
            from lightkube.config.models import User

            config = config._replace(user=User())
        token_file = config.user.token_file if config.user else None
        if token_file:
            token_file = str(config.abs_file(token_file))
        try:
            return cls.from_config(config, node, timeout, token_file=token_file)
        except KubeError:
            raise
        except Exception as e:  # a CA or client certificate that does not load
            raise KubeError(f"{where}: {type(e).__name__}: {e}", kind="config") from None

    @classmethod
    def in_cluster(
        cls, env=None, sa_dir: str = SA_DIR, node: str | None = None, timeout: float = TIMEOUT
    ) -> KubeAPI | None:
        """From KUBERNETES_SERVICE_HOST/PORT, the service account token (re-read as it
        rotates) and CA, and NODE_NAME (the downward API); None when not in a cluster."""
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST")
        token_file = os.path.join(sa_dir, "token")
        if not host or not os.path.exists(token_file):
            return None
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        ca = os.path.join(sa_dir, "ca.crt")
        return cls(
            f"https://{host}:{port}",
            None,
            node_name(node, env),
            ca if os.path.exists(ca) else None,
            timeout=timeout,
            token_file=token_file,
        )

    def _setup(self, config, node: str, timeout: float, namespace: str, token_file: str | None) -> None:
        import httpx2 as httpx
        from lightkube import Client
        from lightkube.config.client_adapter import verify_cluster

        self.node = node
        self.namespace = namespace
        self.base_url = config.cluster.server
        self.timeout = timeout
        user = config.user
        if token_file:  # our auth, not lightkube's (which re-reads only after a 401)
            import msgspec

            user = msgspec.structs.replace(user, token_file=None)
        # the kubeconfig's TLS settings (CA, client certificate) in the transport that also
        # retries connections; env proxies are not used (the API is the cluster's)
        verify = (
            verify_cluster(config.cluster, user, config.abs_file, trust_env=False)
            if self.base_url.startswith("https:")
            else False
        )
        transport = httpx.HTTPTransport(verify=verify, retries=CONNECT_RETRIES, trust_env=False)
        self._client = Client(
            config._replace(user=user),
            namespace=namespace,
            timeout=httpx.Timeout(timeout),
            trust_env=False,
            transport=transport,
            field_manager=AGENT_NAME,
        )
        self.token_auth = None
        if token_file:
            self.token_auth = _token_file_auth(token_file)
            self._client._client._client.auth = self.token_auth  # the httpx.Client lightkube made

    def close(self) -> None:
        self._client.close()

    # -- one call ------------------------------------------------------------------------
    def _call(self, what: str, fn, *args, **kw) -> dict:
        import httpx2 as httpx
        from lightkube.core.exceptions import ConfigError

        try:
            obj = fn(*args, **kw)
        except httpx.HTTPStatusError as e:  # lightkube's ApiError is one
            code = e.response.status_code
            detail = ""
            status = getattr(e, "status", None)
            if status is not None and getattr(status, "message", None):
                detail = status.message
            else:
                try:
                    detail = (e.response.json() or {}).get("message", "")
                except (ValueError, AttributeError):
                    pass
            raise KubeError(f"{what}: HTTP {code}{': ' + str(detail)[:300] if detail else ''}", code) from None
        except httpx.TransportError as e:
            reason = str(e) or type(e).__name__
            kind = "tls" if "CERTIFICATE" in reason or "SSL" in reason else "unreachable"
            raise KubeError(f"{what}: {reason}", kind=kind) from None
        except ConfigError as e:
            raise KubeError(f"{what}: {e}", kind="config") from None
        except KubeError as e:  # the token file (from the auth flow)
            raise KubeError(f"{what}: {e}", kind=e.kind) from None
        except ValueError as e:  # msgspec: an answer that is not JSON, or not the object
            raise KubeError(
                f"{what}: the answer is not a Kubernetes object ({str(e)[:200]})", kind="bad-answer"
            ) from None
        return obj.to_dict() if hasattr(obj, "to_dict") else (obj or {})

    # -- the Node ------------------------------------------------------------------------
    def get_node(self) -> dict:
        from lightkube.resources.core_v1 import Node

        return self._call(f"GET /api/v1/nodes/{self.node}", self._client.get, Node, self.node)

    def patch_labels(self, labels: dict[str, str | None]) -> dict:
        """A JSON merge patch of metadata.labels; None removes a label."""
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        return self._call(
            f"PATCH /api/v1/nodes/{self.node}",
            self._client.patch,
            Node,
            self.node,
            {"metadata": {"labels": labels}},
            patch_type=PatchType.MERGE,
        )

    def post_event(
        self, reason: str, message: str, type_: str = "Normal", node_uid: str | None = None, now: str | None = None
    ) -> dict:
        """A core/v1 Event on the Node (what `kubectl describe node` shows)."""
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        if node_uid:
            involved["uid"] = node_uid
        return self._create_event(self.namespace, f"{self.node}.gpuhook-", involved, reason, message, type_, now)

    # -- pods of this node (podevents.py checks names before they get here) --------------
    def get_pod(self, namespace: str, name: str) -> dict:
        from lightkube.resources.core_v1 import Pod

        return self._call(
            f"GET /api/v1/namespaces/{namespace}/pods/{name}", self._client.get, Pod, name, namespace=namespace
        )

    def patch_pod_labels(self, namespace: str, name: str, labels: dict[str, str | None]) -> dict:
        from lightkube.resources.core_v1 import Pod
        from lightkube.types import PatchType

        return self._call(
            f"PATCH /api/v1/namespaces/{namespace}/pods/{name}",
            self._client.patch,
            Pod,
            name,
            {"metadata": {"labels": labels}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    def post_pod_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        container: str | None,
        reason: str,
        message: str,
        type_: str = "Normal",
        now: str | None = None,
    ) -> dict:
        """A core/v1 Event on a pod (what `kubectl describe pod` shows), about one container."""
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        return self._create_event(
            namespace, f"{name[:200]}.gpuhook-", involved, reason, message, type_, now, action="CreateContainer"
        )

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        from lightkube.resources.core_v1 import Event
        from lightkube.types import PatchType

        return self._call(
            f"PATCH /api/v1/namespaces/{namespace}/events/{name}",
            self._client.patch,
            Event,
            name,
            patch,
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    def _create_event(
        self,
        namespace: str,
        generate_name: str,
        involved: dict,
        reason: str,
        message: str,
        type_: str,
        now: str | None,
        action: str | None = None,
    ) -> dict:
        if reason not in EVENT_REASONS.get(str(involved.get("kind")), ()):
            raise ValueError(f"an Event with reason {reason!r} about a {involved.get('kind')}: not one of gpuhook's")
        from lightkube.resources.core_v1 import Event

        from ..log import utc_now

        now = now or utc_now(ms=False)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": generate_name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": AGENT_NAME, "host": self.node},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if action:
            body["action"] = action
        return self._call(
            f"POST /api/v1/namespaces/{namespace}/events",
            self._client.create,
            Event.from_dict(body),
            namespace=namespace,
        )

    # -- DRA (gpuhook dra): the node's ResourceSlices, the claims prepared on it ------------
    def list_resource_slices(self, driver: str) -> list[dict]:
        """The ResourceSlices of `driver` on this node."""
        from lightkube.resources.resource_v1 import ResourceSlice

        return self._call(
            "GET /apis/resource.k8s.io/v1/resourceslices",
            lambda: {
                "items": [
                    s.to_dict()
                    for s in self._client.list(
                        ResourceSlice, fields={"spec.nodeName": self.node, "spec.driver": driver}
                    )
                ]
            },
        )["items"]

    def apply_resource_slice(self, body: dict, manager: str) -> dict:
        """Server-side apply of a whole ResourceSlice, forced: what someone else changed in
        the fields `manager` owns is put back."""
        from lightkube.resources.resource_v1 import ResourceSlice

        name = body["metadata"]["name"]
        return self._call(
            f"PATCH /apis/resource.k8s.io/v1/resourceslices/{name}",
            self._client.apply,
            ResourceSlice.from_dict(body),
            field_manager=manager,
            force=True,
        )

    def delete_resource_slice(self, name: str) -> dict:
        from lightkube.resources.resource_v1 import ResourceSlice

        return self._call(
            f"DELETE /apis/resource.k8s.io/v1/resourceslices/{name}", self._client.delete, ResourceSlice, name
        )

    def get_resource_claim(self, namespace: str, name: str) -> dict:
        from lightkube.resources.resource_v1 import ResourceClaim

        return self._call(
            f"GET /apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
            self._client.get,
            ResourceClaim,
            name,
            namespace=namespace,
        )
