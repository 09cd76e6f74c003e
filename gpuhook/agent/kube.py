"""The calls the agent makes on the Kubernetes API (kube.KubeAPI): get and label its Node,
post Events on it, get, label and post Events on a pod of its node, patch an Event's count,
and gpuhook dra's ResourceSlices and ResourceClaims. The connection (kubeconfig, in-cluster
token, TLS, errors as KubeError) is kubeclient.KubeClient's; lightkube is imported only when
a call is made.
"""

from __future__ import annotations

from ..defaults import AGENT_NAME
from .kubeclient import KubeClient

# Every reason the agent's Events may have, by the kind of object they are about: the one list.
# _create_event posts no other; daemonset/gpu-optional-admission.yaml admits no other (its
# lists are checked against these by tests/unit/test_admission.py).
EVENT_REASONS = {
    "Pod": ("GPUsInjected", "RanOnCPU", "LdCacheNotUpdated", "GPUHookFailed", "GPUsUnconfirmed", "GPULost"),
    "Node": ("GPUInventory", "GPUInventoryChanged", "GPUUnusable", "RuntimeInstallFailed", "NRIPluginNotSynchronized"),
}
REPORTING_COMPONENT = "gpuhook.dev/agent"


class KubeAPI(KubeClient):
    """The calls the agent makes. Every method returns the object as a dict or raises
    kubeclient.KubeError; `node` is the agent's Node."""

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
