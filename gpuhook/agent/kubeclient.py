"""The agent's connection to the Kubernetes API: where it is, who the agent is, TLS, and one
call with its errors. lightkube (httpx) underneath; the calls themselves (nodes, pods, Events,
ResourceSlices) are kube.KubeAPI's, on top of KubeClient.

Where the API is and who the agent is:

- `gpuhook agent --kubeconfig FILE [--context NAME]`: a kubeconfig, as kubectl reads it
  (server, certificate-authority[-data], insecure-skip-tls-verify, token, tokenFile, client
  certificates, exec plugins; relative paths are relative to the file), to run the agent
  from a workstation against a cluster;
- in a pod: KUBERNETES_SERVICE_HOST/PORT, the service account's token and CA
  (KubeClient.in_cluster); neither: no API work at all.

Token rotation: a bound service account token (and a kubeconfig's tokenFile) is a file the
kubelet rewrites before it expires. It is read again whenever the file changed (inode,
mtime, size: one stat per request) and once more after a 401, as client-go does.

Retries: a connection that cannot be made is tried again by the transport (httpcore, with
exponential backoff: 0 s, then 0.5 s); everything else comes back as one KubeError with the
HTTP status (None: unreachable) and a `kind` for logging once per kind of error. The callers
retry with backoff (podevents.PodReporter, Agent._sync_api); nothing here sleeps long.

lightkube is imported when a client is made, never by `import gpuhook.agent.kubeclient`: the
runtime (the per-container create path) never imports this module at all.
"""

from __future__ import annotations

import os
import threading
from typing import Self

from ..defaults import AGENT_NAME

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 5.0
CONNECT_RETRIES = 2
NODE_EVENTS_NAMESPACE = "default"  # where Node events go (the kubelet's are there too)


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


class KubeClient:
    """The connection: made from a URL and token, a kubeconfig or the pod's service account;
    `_call` makes one call and turns its failure into a KubeError; `node` is the agent's Node."""

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
    ) -> Self:
        api = cls.__new__(cls)
        api._setup(config, node_name(node), timeout, namespace, token_file)
        return api

    @classmethod
    def from_kubeconfig(
        cls, path: str, context: str | None = None, node: str | None = None, timeout: float = TIMEOUT
    ) -> Self:
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
    ) -> Self | None:
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
