"""Node labels from the Inventory: a Node Feature Discovery feature file, and the Node itself
through the Kubernetes API when the agent has a service account.

    gpuhook.dev/accelerator=nvidia            the primary vendor (none on a CPU-only node)
    gpuhook.dev/accelerator.<vendor>=true     one per vendor the node has
    gpuhook.dev/gpu.count=3                   every device of every vendor
    gpuhook.dev/gpu.model=...                 the primary vendor's model
    gpuhook.dev/driver.version=...            the primary vendor's driver version
    gpuhook.dev/<vendor>.count / .model / .driver.version
    gpuhook.dev/runtime-ready=true            the gpu-optional runtime handler is installed
    gpuhook.dev/<vendor>.unusable=no-libcuda  devices there, userspace missing (plan.unusable):
                                              not counted or advertised above; with no other
    gpuhook.dev/accelerator.reason=nvidia-no-libcuda   vendor, accelerator=none and why

The primary vendor is the first of GPUHOOK_ACCELERATOR, i.e. the backend a gpu-optional
container picks (probe order: nvidia, amd, intel, accel, dxg: discrete before integrated).

Stdlib only (urllib, ssl): no Kubernetes client library.
"""


import json
import os
import re
import ssl
import urllib.error
import urllib.request

PREFIX = "gpuhook.dev/"
ACCELERATOR = PREFIX + "accelerator"
RUNTIME_READY = PREFIX + "runtime-ready"
# labels under our prefix that the operator sets and the agent must never remove
OPERATOR_LABELS = frozenset({PREFIX + "install"})
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
NFD_FILE = "gpuhook"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_VALUE = 63

_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_ENDS = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+\Z")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")


def label_value(text) -> str:
    """A valid label value (<= 63 characters of [A-Za-z0-9._-], alphanumeric at both ends;
    may be empty): accents are dropped (é -> e), other characters become '-', runs collapse."""
    import unicodedata

    s = unicodedata.normalize("NFKD", str(text or "").strip())
    s = _BAD.sub("-", "".join(c for c in s if not unicodedata.combining(c)))
    s = _ENDS.sub("", s)
    if len(s) > MAX_VALUE:
        s = _ENDS.sub("", s[:MAX_VALUE])
    return s


def valid_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    return bool(slash) and prefix == PREFIX[:-1] and bool(_NAME.match(name))


def common_model(devices) -> str:
    """The most common model among `devices` (ties: the first seen)."""
    counts: dict[str, int] = {}
    for d in devices:
        if d.model:
            counts[d.model] = counts.get(d.model, 0) + 1
    return max(counts, key=counts.get) if counts else ""


def node_labels(inv, runtime_ready: bool = False) -> dict[str, str]:
    """The gpuhook.dev/ labels this node should have (values never empty). A vendor whose
    devices a gpu-optional container would not get (plan.unusable: no driver userspace) is
    not advertised: only gpuhook.dev/<vendor>.unusable=<why>, and, when no vendor is left,
    gpuhook.dev/accelerator=none with gpuhook.dev/accelerator.reason=<vendor>-<why>."""
    from .plan import unusable

    vendors, refused = [], []
    for v in inv.vendors:
        why = unusable(v) if v.devices else None
        if why:
            refused.append((v.vendor, why[0]))
        elif v.devices:
            vendors.append(v)
    labels = {ACCELERATOR: vendors[0].vendor if vendors else "none",
              PREFIX + "gpu.count": str(sum(len(v.devices) for v in vendors))}
    for vendor, code in refused:
        labels[f"{PREFIX}{label_value(vendor)}.unusable"] = label_value(code)
    if refused and not vendors:
        labels[ACCELERATOR + ".reason"] = label_value(f"{refused[0][0]}-{refused[0][1]}")
    for i, v in enumerate(vendors):
        vendor = label_value(v.vendor)
        model, driver = label_value(common_model(v.devices)), label_value(v.driver_version)
        labels[f"{PREFIX}accelerator.{vendor}"] = "true"
        labels[f"{PREFIX}{vendor}.count"] = str(len(v.devices))
        if model:
            labels[f"{PREFIX}{vendor}.model"] = model
        if driver:
            labels[f"{PREFIX}{vendor}.driver.version"] = driver
        if i == 0:
            if model:
                labels[PREFIX + "gpu.model"] = model
            if driver:
                labels[PREFIX + "driver.version"] = driver
    if runtime_ready:
        labels[RUNTIME_READY] = "true"
    return {k: v for k, v in labels.items() if v and valid_key(k)}


# -- Node Feature Discovery -----------------------------------------------------------

def nfd_text(labels: dict[str, str]) -> str:
    lines = ["# Written by gpuhook agent: this node's GPUs. Rewritten whole on every change."]
    lines += [f"{k}={v}" for k, v in sorted(labels.items())]
    return "\n".join(lines) + "\n"


def parse_nfd(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def write_nfd(labels: dict[str, str], directory: str, name: str = NFD_FILE) -> bool:
    """Write the feature file atomically (a dotfile, which NFD skips, then rename); only
    when it changes. Labels gone from `labels` go from the file, and NFD removes them."""
    from .spec import write_atomic

    data = nfd_text(labels).encode()
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return False
    except OSError:
        pass
    os.makedirs(directory, exist_ok=True)
    write_atomic(path, data, 0o644)
    return True


# -- the Kubernetes API ----------------------------------------------------------------

class KubeError(Exception):
    def __init__(self, msg: str, status: int | None = None):
        super().__init__(msg)
        self.status = status


class KubeAPI:
    """The few calls the agent makes: get/patch its Node, create an Event."""

    def __init__(self, base_url: str, token: str | None, node: str, ca_file: str | None = None,
                 timeout: float = 5.0, namespace: str = "default"):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.node = node
        self.timeout = timeout
        self.namespace = namespace  # where Node events go (kubelet uses "default")
        self._ssl = None
        if self.base_url.startswith("https:"):
            self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()

    @classmethod
    def in_cluster(cls, env=None, sa_dir: str = SA_DIR, node: str | None = None) -> "KubeAPI | None":
        """From KUBERNETES_SERVICE_HOST/PORT, the service account token and CA, and NODE_NAME
        (the downward API); None when not in a cluster."""
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST")
        token_file = os.path.join(sa_dir, "token")
        if not host or not os.path.exists(token_file):
            return None
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        node = node or env.get("NODE_NAME")
        if not node:
            import socket

            node = socket.gethostname()
        ca = os.path.join(sa_dir, "ca.crt")
        api = cls(f"https://{host}:{port}", None, node, ca if os.path.exists(ca) else None)
        api.token_file = token_file
        return api

    token_file: str | None = None

    def _token(self) -> str | None:
        if self.token_file:  # projected tokens rotate: read it every time
            try:
                with open(self.token_file) as f:
                    return f.read().strip()
            except OSError:
                return self.token
        return self.token

    def request(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        token = self._token()
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read(4 << 20)
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = json.loads(e.read(65536) or b"{}").get("message", "")
            except (ValueError, AttributeError, OSError):
                pass
            raise KubeError(f"{method} {path}: HTTP {e.code}{': ' + detail if detail else ''}", e.code) from None
        except (urllib.error.URLError, OSError, ssl.SSLError) as e:
            reason = getattr(e, "reason", e)
            raise KubeError(f"{method} {path}: {reason}") from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise KubeError(f"{method} {path}: the answer is not JSON") from None

    def get_node(self) -> dict:
        return self.request("GET", f"/api/v1/nodes/{self.node}")

    def patch_labels(self, labels: dict[str, str | None]) -> dict:
        """A JSON merge patch of metadata.labels; None removes a label."""
        return self.request("PATCH", f"/api/v1/nodes/{self.node}", {"metadata": {"labels": labels}},
                            "application/merge-patch+json")

    def post_event(self, reason: str, message: str, type_: str = "Normal", node_uid: str | None = None,
                   now: str | None = None) -> dict:
        """A core/v1 Event on the Node (what `kubectl describe node` shows)."""
        from .log import utc_now

        now = now or utc_now(ms=False)
        involved = {"apiVersion": "v1", "kind": "Node", "name": self.node}
        if node_uid:
            involved["uid"] = node_uid
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{self.node}.gpuhook-", "namespace": self.namespace},
            "involvedObject": involved,
            "reason": reason, "message": message[:1024], "type": type_,
            "source": {"component": "gpuhook-agent", "host": self.node},
            "reportingComponent": "gpuhook.dev/agent", "reportingInstance": self.node,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        return self.request("POST", f"/api/v1/namespaces/{self.namespace}/events", body)


    # -- pods of this node (podevents.py checks names before they get here) --
    def get_pod(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def patch_pod_labels(self, namespace: str, name: str, labels: dict[str, str | None]) -> dict:
        return self.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"labels": labels}},
                            "application/merge-patch+json")

    def post_pod_event(self, namespace: str, name: str, uid: str, container: str | None, reason: str,
                       message: str, type_: str = "Normal", now: str | None = None) -> dict:
        """A core/v1 Event on a pod (what `kubectl describe pod` shows), about one container."""
        from .log import utc_now

        now = now or utc_now(ms=False)
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name[:200]}.gpuhook-", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason, "message": message[:1024], "type": type_, "action": "CreateContainer",
            "source": {"component": "gpuhook-agent", "host": self.node},
            "reportingComponent": "gpuhook.dev/agent", "reportingInstance": self.node,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        return self.request("POST", f"/api/v1/namespaces/{namespace}/events", body)

    def patch_event(self, namespace: str, name: str, patch: dict) -> dict:
        return self.request("PATCH", f"/api/v1/namespaces/{namespace}/events/{name}", patch,
                            "application/merge-patch+json")


def sync_node_labels(api: KubeAPI, labels: dict[str, str]) -> tuple[dict, list[str], str | None]:
    """Make the Node's gpuhook.dev/ labels exactly `labels`: one GET, and one merge patch
    only when something differs (labels the node no longer has are set to null).
    Returns (patch, removed keys, the Node's uid)."""
    node = api.get_node()
    meta = node.get("metadata") or {}
    have = meta.get("labels") or {}
    patch: dict[str, str | None] = {k: v for k, v in labels.items() if have.get(k) != v}
    removed = sorted(k for k in have if k.startswith(PREFIX) and k not in labels and k not in OPERATOR_LABELS)
    patch.update({k: None for k in removed})
    if patch:
        api.patch_labels(patch)
    return patch, removed, meta.get("uid")
