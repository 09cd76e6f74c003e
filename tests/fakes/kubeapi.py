"""A Kubernetes API server on loopback for the agent's tests, the demo and the bench (FakeAPI),
and a kubeconfig for it as kubectl writes one (write_kubeconfig). conftest's fake_api fixture
makes them and closes them."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import urllib.parse
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeAPI:
    """A Kubernetes API server on 127.0.0.1 with one Node: GET and merge-PATCH of the Node,
    POST of Events. Checks the bearer token; records every request (its path without the
    query: a real client adds ?fieldManager=) and the Authorization header it came with."""

    def __init__(
        self,
        node: str = "node-1",
        token: str = "t0ken",
        tls_dir: str | None = None,
        labels: dict | None = None,
        client_ca: str | None = None,
    ):
        self.node_name = node
        self.token = token
        self.node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "uid": "uid-1234", "labels": dict(labels or {"kubernetes.io/hostname": node})},
        }
        self.events: list[dict] = []
        self.pods: dict[tuple[str, str], dict] = {}  # (namespace, name) -> Pod: add_pod()
        self.event_patches: list[tuple[str, dict]] = []
        self.requests: list[tuple[str, str, dict | None, str | None]] = []
        self.auth: list[str | None] = []  # the Authorization header of each request
        self.queries: list[str] = []  # the query string of each request
        self.fail_next: list[int] = []  # HTTP statuses to answer with before behaving
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"api": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # loopback only
        self.scheme = "http"
        self.ca_file: str | None = None
        if tls_dir:
            self._serve_tls(tls_dir, client_ca)
        self.port = self.server.server_address[1]
        # never blocked in accept: with a connection gone before the accept (taken by a stray
        # thread of another test polling a recycled fd number), serve_forever would wait there for
        # ever and close() with it; on a timeout it goes back to its loop (accepted sockets block)
        self.server.socket.settimeout(1)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _serve_tls(self, tls_dir: str, client_ca: str | None) -> None:
        """HTTPS with a fresh self-signed certificate for 127.0.0.1 (ca_file), client
        certificates signed by (or being) client_ca required when given."""
        cert, key = os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes"]
            + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
            check=True,
            capture_output=True,
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        if client_ca:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https"
        self.ca_file = cert

    def answer(self, method: str, path: str, query: str, body: Any, content_type: str | None) -> tuple[int, dict]:
        """(status, body) for one authorized request, under the lock."""
        node_path = f"/api/v1/nodes/{self.node_name}"
        if method == "GET" and path == node_path:
            return 200, self.node
        if method == "PATCH" and path == node_path:
            if content_type != "application/merge-patch+json":
                return 415, {"message": "unsupported patch type"}
            manager = dict(urllib.parse.parse_qsl(query)).get("fieldManager", "unknown")
            self._change_labels(manager, body.get("metadata", {}).get("labels") or {})
            return 200, self.node
        parts = path.split("/")
        if len(parts) in (6, 7) and parts[1:4] == ["api", "v1", "namespaces"]:
            ns, kind, name = parts[4], parts[5], (parts[6] if len(parts) == 7 else None)
            if kind == "events" and name is None and method == "POST":
                return self._post_event(ns, body)
            if kind == "events" and name is not None:
                return self._patch_event(method, ns, name, body)
            if kind == "pods" and name is not None:
                answer = self._pod(method, ns, name, body)
                if answer is not None:
                    return answer
        return 404, {"kind": "Status", "message": f"{method} {path}: not found"}

    def _post_event(self, ns: str, body: Any) -> tuple[int, dict]:
        if body["metadata"].get("namespace") != ns or body["involvedObject"].get("namespace", ns) != ns:
            return 422, {"message": "namespace does not match"}
        body = dict(body, metadata=dict(body["metadata"], name=f"e{len(self.events) + 1}"))
        self.events.append(body)
        return 201, body

    def _patch_event(self, method: str, ns: str, name: str, body: Any) -> tuple[int, dict]:
        found = next(
            (e for e in self.events if e["metadata"]["name"] == name and e["metadata"]["namespace"] == ns), None
        )
        if method != "PATCH" or found is None:
            return 404, {"message": "no such event"}
        self.event_patches.append((name, body))
        found.update(body)
        return 200, found

    def _pod(self, method: str, ns: str, name: str, body: Any) -> tuple[int, dict] | None:
        """GET, or a merge PATCH of the labels, of a Pod add_pod() made; None for another method."""
        pod = self.pods.get((ns, name))
        if pod is None:
            return 404, {"kind": "Status", "message": f"pods {name!r} not found"}
        if method == "GET":
            return 200, pod
        if method != "PATCH":
            return None
        have = pod["metadata"].setdefault("labels", {})
        for k, v in (body.get("metadata", {}).get("labels") or {}).items():
            if v is None:
                have.pop(k, None)
            else:
                have[k] = v
        return 200, pod

    def _change_labels(self, manager: str, patch: dict) -> None:
        """A merge patch of the Node's labels by `manager`, with the API server's field
        management of an Update: a label whose value changes moves to `manager` in
        metadata.managedFields, a label removed leaves every manager's set."""
        meta = self.node["metadata"]
        have = meta.setdefault("labels", {})
        entries = meta.setdefault("managedFields", [])
        for k, v in patch.items():
            if have.get(k) == v:
                continue  # no change: no ownership moves
            for e in entries:
                e["fieldsV1"]["f:metadata"]["f:labels"].pop(f"f:{k}", None)
            if v is None:
                have.pop(k, None)
                continue
            have[k] = v
            entry = next((e for e in entries if e["manager"] == manager and e["operation"] == "Update"), None)
            if entry is None:
                entry = {
                    "manager": manager,
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {}}},
                }
                entries.append(entry)
            entry["fieldsV1"]["f:metadata"]["f:labels"][f"f:{k}"] = {}
        meta["managedFields"] = [e for e in entries if e["fieldsV1"]["f:metadata"]["f:labels"]]

    def label(self, manager: str, patch: dict) -> None:
        """Somebody else labels the Node (`kubectl label` is manager kubectl-label)."""
        with self.lock:
            self._change_labels(manager, patch)

    def add_pod(self, namespace: str, name: str, uid: str, node: str | None = None) -> dict:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "uid": uid, "labels": {"app": name}},
            "spec": {"nodeName": node or self.node_name, "containers": [{"name": "app"}]},
        }
        with self.lock:
            self.pods[(namespace, name)] = pod
        return pod

    def pod_events(self) -> list[dict]:
        with self.lock:
            return [dict(e) for e in self.events if e["involvedObject"]["kind"] == "Pod"]

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def labels(self) -> dict:
        with self.lock:
            return dict(self.node["metadata"]["labels"])

    def client(self, **kw):
        """gpuhook's own client (agent/kube.py) for this API."""
        from gpuhook.agent import kube

        return kube.KubeAPI(self.url, self.token, self.node_name, self.ca_file, **kw)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    """FakeAPI's request handler: records the request, checks the token, then answers as
    FakeAPI.answer says (api: the FakeAPI, set on a subclass per server)."""

    api: FakeAPI

    def log_message(self, *a):
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        api = self.api
        length = int(self.headers.get("Content-Length") or 0)
        body: Any = json.loads(self.rfile.read(length)) if length else None
        self.path, _, query = self.path.partition("?")
        with api.lock:
            api.requests.append((method, self.path, body, self.headers.get("Content-Type")))
            api.auth.append(self.headers.get("Authorization"))
            api.queries.append(query)
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                return self._reply(401, {"kind": "Status", "message": "Unauthorized"})
            if api.fail_next:
                return self._reply(api.fail_next.pop(0), {"kind": "Status", "message": "try later"})
            self._reply(*api.answer(method, self.path, query, body, self.headers.get("Content-Type")))

    def do_GET(self):
        self._handle("GET")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_POST(self):
        self._handle("POST")


def write_kubeconfig(path, api, *, ca: str = "file", user: dict | None = None, context: str = "test") -> str:
    """A kubeconfig as kubectl writes it, for the fake API; `ca`: "file" (a path relative to
    the kubeconfig), "data" (certificate-authority-data), "none" (the system's CAs)."""
    import base64

    import yaml

    cluster = {"server": api.url}
    if ca == "file":
        shutil.copy(api.ca_file, os.path.join(os.path.dirname(path), "cluster-ca.crt"))
        cluster["certificate-authority"] = "cluster-ca.crt"
    elif ca == "data":
        cluster["certificate-authority-data"] = base64.b64encode(open(api.ca_file, "rb").read()).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "clusters": [
            {"name": "fake", "cluster": cluster},
            {"name": "elsewhere", "cluster": {"server": "https://192.0.2.1"}},
        ],
        "users": [{"name": "agent", "user": user if user is not None else {"token": api.token}}],
        "contexts": [
            {"name": context, "context": {"cluster": "fake", "user": "agent"}},
            {"name": "other", "context": {"cluster": "elsewhere", "user": "agent"}},
        ],
    }
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    return str(path)
