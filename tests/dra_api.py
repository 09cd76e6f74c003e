"""What the DRA driver's tests share: the fake API server (fakes.kubeapi.FakeAPI)
with the resource.k8s.io/v1 calls the driver makes (ResourceSlices: list by field selector,
server-side apply, delete; ResourceClaims: get), the devices a fake host publishes, and a wait."""

from __future__ import annotations

import copy
import time
import urllib.parse
from typing import Any

from gpuhook import cdi
from gpuhook.dra import slices
from gpuhook.probe import probe
from fakes.kubeapi import FakeAPI

GROUP = "/apis/resource.k8s.io/v1"


class DRAFakeAPI(FakeAPI):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.slices: dict[str, dict] = {}
        self.claims: dict[tuple[str, str], dict] = {}
        self.drop_on_write = lambda obj: None  # what the server leaves out of a slice written (a gate that is off)
        handler = self.server.RequestHandlerClass  # this server's own subclass: DELETE too
        handler.do_DELETE = lambda h: h._handle("DELETE")  # type: ignore[attr-defined]

    def add_claim(
        self, namespace: str, name: str, uid: str, results: list[dict] | None, pods: tuple[dict, ...] = ()
    ) -> dict:
        """A ResourceClaim; results: its status.allocation.devices.results (None: not allocated);
        pods: those it is reserved for (status.reservedFor)."""
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "spec": {"devices": {"requests": []}},
        }
        if results is not None:
            claim["status"] = {"allocation": {"devices": {"results": results}}}
        if pods:
            claim.setdefault("status", {})["reservedFor"] = [
                {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
            ]
        with self.lock:
            self.claims[(namespace, name)] = claim
        return claim

    def edit_slice(self, name: str, change) -> None:
        """Somebody else changes a ResourceSlice (change(obj) edits it in place)."""
        with self.lock:
            change(self.slices[name])

    def answer(self, method: str, path: str, query: str, body: Any, content_type: str | None) -> tuple[int, dict]:
        if not path.startswith(GROUP + "/"):
            return super().answer(method, path, query, body, content_type)
        parts = path[len(GROUP) + 1 :].split("/")
        if parts[0] == "resourceslices":
            return self._slices(method, parts[1] if len(parts) > 1 else None, query, body, content_type)
        if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "resourceclaims" and method == "GET":
            claim = self.claims.get((parts[1], parts[3]))
            if claim is None:
                return 404, {"kind": "Status", "message": f"resourceclaims {parts[3]!r} not found", "code": 404}
            return 200, claim
        return 404, {"kind": "Status", "message": f"{method} {path}: not found", "code": 404}

    def _slices(self, method: str, name: str | None, query: str, body: Any, content_type: str | None):
        q = dict(urllib.parse.parse_qsl(query))
        if name is None and method == "GET":
            want = dict(f.split("=", 1) for f in q.get("fieldSelector", "").split(",") if f)
            items = [
                s
                for s in self.slices.values()
                if all(str(s["spec"].get(k.removeprefix("spec."))) == v for k, v in want.items())
            ]
            return 200, {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSliceList",
                "metadata": {},
                "items": items,
            }
        if name is not None and method == "PATCH":
            if content_type != "application/apply-patch+yaml" or q.get("force") != "true" or not q.get("fieldManager"):
                return 415, {"kind": "Status", "message": "a forced server-side apply with a field manager only"}
            obj = copy.deepcopy(body)
            obj["metadata"].setdefault("uid", f"slice-uid-{name}")
            self.drop_on_write(obj)
            self.slices[name] = obj
            return 200, obj
        if name is not None and method == "DELETE":
            if self.slices.pop(name, None) is None:
                return 404, {"kind": "Status", "message": "not found", "code": 404}
            return 200, {"kind": "Status", "status": "Success"}
        if name is not None and method == "GET" and name in self.slices:
            return 200, self.slices[name]
        return 404, {"kind": "Status", "message": "not found", "code": 404}


def published(root: str) -> tuple[slices.Published, ...]:
    """What the driver publishes for the fake host at `root` (its CDI specs with no hooks)."""
    inv = probe(root)
    return slices.published(inv, cdi.device_ids(cdi.specs(inv, ldconfig=False, helper=False) + [cdi.none_spec()]))


def wait_for(cond, timeout: float = 30):
    """cond()'s first true value, polled; AssertionError after `timeout` s."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)
