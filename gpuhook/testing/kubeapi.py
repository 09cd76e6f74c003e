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
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str):
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
                    node_path = f"/api/v1/nodes/{api.node_name}"
                    if method == "GET" and self.path == node_path:
                        return self._reply(200, api.node)
                    if method == "PATCH" and self.path == node_path:
                        if self.headers.get("Content-Type") != "application/merge-patch+json":
                            return self._reply(415, {"message": "unsupported patch type"})
                        manager = dict(urllib.parse.parse_qsl(query)).get("fieldManager", "unknown")
                        api._change_labels(manager, body.get("metadata", {}).get("labels") or {})
                        return self._reply(200, api.node)
                    parts = self.path.split("/")
                    if (
                        method == "POST"
                        and len(parts) == 6
                        and parts[1:4] == ["api", "v1", "namespaces"]
                        and parts[5] == "events"
                    ):
                        if body["metadata"].get("namespace") != parts[4] or (
                            body["involvedObject"].get("namespace", parts[4]) != parts[4]
                        ):
                            return self._reply(422, {"message": "namespace does not match"})
                        body = dict(body, metadata=dict(body["metadata"], name=f"e{len(api.events) + 1}"))
                        api.events.append(body)
                        return self._reply(201, body)
                    if len(parts) == 7 and parts[1:4] == ["api", "v1", "namespaces"] and parts[5] in ("pods", "events"):
                        if parts[5] == "events":
                            found = next(
                                (
                                    e
                                    for e in api.events
                                    if e["metadata"]["name"] == parts[6] and e["metadata"]["namespace"] == parts[4]
                                ),
                                None,
                            )
                            if method != "PATCH" or found is None:
                                return self._reply(404, {"message": "no such event"})
                            api.event_patches.append((parts[6], body))
                            found.update(body)
                            return self._reply(200, found)
                        pod = api.pods.get((parts[4], parts[6]))
                        if pod is None:
                            return self._reply(404, {"kind": "Status", "message": f"pods {parts[6]!r} not found"})
                        if method == "GET":
                            return self._reply(200, pod)
                        if method == "PATCH":
                            have = pod["metadata"].setdefault("labels", {})
                            for k, v in (body.get("metadata", {}).get("labels") or {}).items():
                                if v is None:
                                    have.pop(k, None)
                                else:
                                    have[k] = v
                            return self._reply(200, pod)
                    return self._reply(404, {"kind": "Status", "message": f"{method} {self.path}: not found"})

            def do_GET(self):
                self._handle("GET")

            def do_PATCH(self):
                self._handle("PATCH")

            def do_POST(self):
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # loopback only
        self.scheme = "http"
        self.ca_file = None
        if tls_dir:
            cert, key = os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key")
            subprocess.run(
                [
                    "openssl",
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=kubernetes",
                    "-addext",
                    "subjectAltName=IP:127.0.0.1",
                    "-keyout",
                    key,
                    "-out",
                    cert,
                ],
                check=True,
                capture_output=True,
            )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            if client_ca:  # TLS client certificates signed by (or being) client_ca are required
                ctx.load_verify_locations(client_ca)
                ctx.verify_mode = ssl.CERT_REQUIRED
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
            self.ca_file = cert
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

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
        from ..agent import kube

        return kube.KubeAPI(self.url, self.token, self.node_name, self.ca_file, **kw)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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
