"""The pods of the kubelet's device checkpoint that are gone, for share = "unallocated".

The kubelet keeps a gone pod's devices in its checkpoint until it next allocates, so the
wrapper (probe/nodestate.py), which reads the checkpoint, would hold them back until then.
Each round (core.py) the agent reads the checkpoint, then asks the kubelet's pod-resources
API (v1.PodResourcesLister/List on its socket, gRPC) which devices its active pods hold. A
pod of the checkpoint is gone when no active pod holds any of its devices and the kubelet
has removed its directory (/var/lib/kubelet/pods/<uid>, which it keeps until the pod is
over and deleted). A pod's uid is never used again and a pod that went never comes back, so
"gone" never goes stale: the uids go to nodestate.GONE_FILE (each while the checkpoint
still lists it), which the wrapper subtracts. gRPC stays here, off the per-create path.

Why both: List names pods, not uids (the device ids tie the two together), and it does not
show devices that only a pod's init containers hold, nor the pods a kubelet that just
started has not been given yet; the directory is there from the pod's first sync until
after it ended, so it covers those, and List covers the admitted pod whose directory is not
made yet. List is taken as whole only when it names the agent's own pod (POD_NAMESPACE,
POD_NAME: the DaemonSet's downward API); without them the agent asks nothing and the file
stays as it is. A pod that ended but is not deleted (Succeeded, Failed) keeps its directory:
its devices stay held back until it is deleted, though the kubelet would give them again.
"""

from __future__ import annotations

import os

from ..probe import nodestate

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's, as the node sees it
PODS_DIR = "/var/lib/kubelet/pods"  # <uid>/: a pod's directory, the kubelet's own
TIMEOUT_S = 5.0


def gone(allocations, pods, me: tuple[str, str], has_dir) -> set[str] | None:
    """The uids of `allocations` (the checkpoint's) none of whose (resource, id) an active pod
    of `pods` (List's PodResources, read after the checkpoint) holds and for which
    has_dir(uid) is false; None when `me` (namespace, name) is not among `pods`: the List is
    not known to be whole."""
    if me not in {(p.namespace, p.name) for p in pods}:
        return None
    held = {(d.resource_name, i) for p in pods for c in p.containers for d in c.devices for i in d.device_ids}
    by_pod: dict[str, set] = {}
    for a in allocations:
        if a.pod:
            by_pod.setdefault(a.pod, set()).add((a.resource, a.id))
    return {uid for uid, devices in by_pod.items() if not devices & held and not has_dir(uid)}


def list_pods(socket: str, timeout: float = TIMEOUT_S) -> list:
    """The kubelet's List: its active pods' PodResources. Raises grpc.RpcError."""
    import grpc

    from ..dra import podresources_pb2 as pb, podresources_pb2_grpc as pb_grpc

    request = pb.ListPodResourcesRequest()  # type: ignore[attr-defined]  # protoc's: its names made at import
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        reply = pb_grpc.PodResourcesListerStub(channel).List(request, timeout=timeout)
    return list(reply.pod_resources)


class GonePods:
    """Keeps <root>GONE_FILE true: update() once a round."""

    def __init__(self, root: str, log, env=None):
        env = os.environ if env is None else env
        self.root = root
        self.log = log
        self.me = (env.get("POD_NAMESPACE") or "", env.get("POD_NAME") or "")
        self.said: str | None = None  # the last trouble logged: each is logged when it starts

    def update(self) -> None:
        from ..config import load, node_config_path
        from ..probe.host import Host

        if load(node_config_path(self.root))[0].share != "unallocated":
            return  # nothing held back: nothing to free
        host = Host(self.root)
        allocations, why = nodestate.allocated_devices(self.root)  # before the List: see gone()
        if allocations is None:
            return self._trouble(why or "")
        uids = {a.pod for a in allocations if a.pod}
        known = nodestate.gone_pods(self.root)
        path = host.resolve(nodestate.GONE_FILE)
        if uids - known:
            if not all(self.me):
                return self._trouble("POD_NAMESPACE and POD_NAME not set: the List cannot be known whole")
            socket = host.resolve(SOCKET)
            try:
                pods = list_pods(socket)
            except Exception as e:  # grpc.RpcError (no kubelet there, or an old one), a bad reply
                details = getattr(e, "details", None)
                return self._trouble(f"{SOCKET}: {details() if callable(details) else e}")
            found = gone(allocations, pods, self.me, lambda uid: _has_dir(host, uid))
            if found is None:
                return self._trouble(f"{SOCKET}: the List lacks this pod {'/'.join(self.me)} (a kubelet starting)")
            self.said = None
            new = found - known
        else:
            new = set()
        keep = sorted((known & uids) | new)  # a uid the checkpoint no longer lists: of no more use
        if set(keep) == known:
            return
        from .. import fastjson
        from ..fsutil import write_atomic

        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            write_atomic(path, fastjson.dumps({"gone": keep}).encode(), 0o600, sync_dir=False)
        except OSError as e:
            return self._trouble(f"cannot write {path}: {e.strerror or e}")
        if new:
            self.log.info("pods.gone", pods=sorted(new), file=nodestate.GONE_FILE)

    def _trouble(self, why: str) -> None:
        if why != self.said:
            self.log.warning("pods.gone.unknown", error=why, note="their devices stay held back")
        self.said = why


def _has_dir(host, uid: str) -> bool:
    """Whether the kubelet has the pod's directory (a uid that is no file name: as if so)."""
    if not uid or "/" in uid or uid in (".", ".."):
        return True
    try:
        os.lstat(os.path.join(host.resolve(PODS_DIR), uid))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: not gone
    return True
