"""Which pods really got a GPU: the agent tells Kubernetes what the runtime's log says.

gpuhook-runtime writes one JSON line per create (runtime.log_line) and does no API work: a
create never waits on the API server. The agent tails that file (follow.CreateFollower) for
its consumers: PodReporter (here), the metrics (metrics.py).

For each create of a container of a Kubernetes pod (the line names the pod, from the CRI
annotations), PodReporter

- checks the pod is one of this node's: GET it, and its uid and spec.nodeName must be the
  line's and this node's (a line naming another namespace's pod is dropped, once logged);
- posts a core/v1 Event on it, the one events.event_for says (GPUsInjected, RanOnCPU,
  GPUsUnconfirmed); the same event again (a restarting container) is aggregated: the Event
  is patched with count + 1 and series {count, lastObservedTime}, as events.k8s.io's are;
- sets the pod label gpuhook.dev/accelerator (nvidia, amd..., or cpu), so that
  `kubectl get pods -L gpuhook.dev/accelerator` answers in one line;
- for a hook line of a container it saw created (gpuhook-hook writes one when ldconfig timed
  out or failed, or a check refused: the create's line said "injected" all the same), posts
  a Warning on the same pod: LdCacheNotUpdated (GPUHookFailed for another hook).

A line's pod is trusted only as the triple (namespace, name, uid) that one GET found
scheduled on this node: another line with the same uid but another namespace or name is
looked up again (and refused). A static pod's containers carry the UID the kubelet gave it
(the hash of its manifest), not its mirror pod's in the API: the mirror pod (annotation
MIRROR, set by the kubelet, whose value is that hash) is the line's pod, and the Event and
label go to it. Budgets are per namespace, so that one tenant's creates never
use up another's: Events (a token bucket: `burst`, then `rate` per second; past it they are
dropped and counted) and pod lookups (`lookup_burst`, then `lookup_rate` per second; past it
the line is dropped and counted). Every map is bounded (least recently used out first): the
pods checked, the lines refused (a refused triple costs no second GET), the buckets, the
Events to aggregate, the problems said once. A record the API did not take waits in a
retry.RetryQueue (one try per backoff however many wait, oldest first once the API is back);
nothing here can stop the agent.
"""

from __future__ import annotations

import re
import time
from typing import Callable

from ..inject import NO_GPU
from ..logline import POD_KEYS
from . import kubeclient, labels as labels_mod
from .retry import RetryQueue
from .budgets import Bucket, Lru
from .events import HOOK_DECISION, event_for

POD_LABEL = labels_mod.ACCELERATOR  # gpuhook.dev/accelerator, on pods as on nodes
# A pod's namespace and name as the API allows them (DNS subdomain): anything else is not
# put in a URL
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}\Z")
# a static pod's mirror in the API: the kubelet's annotation, valued the static pod's own UID
MIRROR = "kubernetes.io/config.mirror"
MAX_ENTRIES = 4096  # pods checked, lines refused, Events to aggregate, labels set
MAX_NAMESPACES = 1024  # namespaces with a budget of their own
MAX_EARLY_HOOKS = 256  # containers whose hook lines came before their create line (NRI's)


def micro_time(t: float | None = None) -> str:
    """metav1.MicroTime: 2026-11-29T19:40:49.577123Z."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


class PodReporter:
    """Create records -> pod Events and the pod label (see the module's doc)."""

    def __init__(
        self,
        kube,
        log,
        clock: Callable[[], float] = time.monotonic,
        burst: int = 25,
        rate: float = 1.0,
        retries: int = 5,
        backoff: float = 1.0,
        most: float = 30.0,
        set_label: bool = True,
        root: str | None = None,
        lookup_burst: int = 10,
        lookup_rate: float = 1.0,
    ):
        self.kube = kube
        self.root = root  # the node's / (bundle paths of the runtime's lines are under it)
        self.node = kube.node
        self.log = log
        self.clock = clock
        self.burst, self.rate = burst, rate
        self.lookup_burst, self.lookup_rate = lookup_burst, lookup_rate
        self.buckets = Lru(MAX_NAMESPACES)  # namespace -> its Event budget (Bucket)
        self.lookups = Lru(MAX_NAMESPACES)  # namespace -> its pod-lookup budget (Bucket)
        self.set_label = set_label
        # the pod is always the triple (namespace, name, uid) one GET checked together
        self.events = Lru(MAX_ENTRIES)  # (namespace, name, uid, reason, message) -> {"name", "namespace", "count"}
        self.labelled = Lru(MAX_ENTRIES)  # (namespace, name, uid) -> the label value it has
        self.containers = Lru(MAX_ENTRIES)  # container id -> its pod (from its create line)
        self.early_hooks = Lru(MAX_EARLY_HOOKS)  # container id -> hook lines before its create line
        self.pods = Lru(MAX_ENTRIES)  # the line's (namespace, name, uid) found this node's -> the API's uid
        self.refused = Lru(MAX_ENTRIES)  # (namespace, name, uid) -> when it was found not to be
        # the records the API did not take yet: {"rec", "posted"} (posted: its Event is there)
        self.queue = RetryQueue(self._report, log, "pod events", clock, backoff, most, retries, node=self.node)
        self.dropped = 0
        self.dropped_lookups = 0
        self.posted = 0
        self._said = Lru(MAX_ENTRIES)

    def _take(self, buckets: Lru, ns: str, burst: int, rate: float, what: str, event: str, note: str) -> bool:
        """A token from the namespace's budget in `buckets` (made with burst and rate the first
        time); none left: False, and one warning per namespace and `what` (the caller counts)."""
        bucket = buckets.get_fresh(ns)
        if bucket is None:
            bucket = Bucket(burst, rate, self.clock)
            buckets.put(ns, bucket)
        if bucket.take():
            return True
        self._once(f"{what}:{ns}", "warning", event, namespace=ns, burst=burst, rate=rate, note=note)
        return False

    def _once(self, kind: str, level: str, event: str, **kw) -> None:
        """Log each kind of problem once (the agent never floods its log; the memory of what
        was said is bounded)."""
        if kind in self._said:
            return
        self._said.put(kind, True)
        getattr(self.log, level)(event, node=self.node, **kw)

    def handle(self, rec: dict) -> None:
        cid = rec.get("container_id")
        if isinstance(cid, str) and isinstance(rec.get("pod_uid"), str):
            self.containers.put(cid, {k: rec.get(k) for k in POD_KEYS})
        self.queue.submit({"rec": rec})
        early = self.early_hooks.pop(cid, None) if isinstance(cid, str) else None
        for hook in early or ():
            self.handle_hook(hook)

    def handle_hook(self, rec: dict) -> None:
        """A hook line (gpuhook-hook's, event "hook"): an Event on the pod of its container,
        known from that container's create line. The NRI plugin writes a create's line once
        the runtime made the container, after the hook ran: a hook line of a container not
        seen yet waits for its create line (bounded), and says nothing without one."""
        cid = rec.get("container_id")
        pod = self.containers.get_fresh(cid)
        if pod is not None:
            self.queue.submit({"rec": {**rec, **pod, "decision": HOOK_DECISION}})
        elif isinstance(cid, str):
            self.early_hooks.put(cid, [*self.early_hooks.get(cid, [])[:3], rec])

    def tick(self) -> None:
        """Retry what is due."""
        self.queue.tick()

    def _from_bundle(self, rec: dict) -> dict | None:
        """The C front's line on a node with no GPU node (it forks no Python) has no pod:
        read it from the bundle's config.json while the container exists. None when the
        bundle is gone or is a sandbox's."""
        bundle = rec.get("bundle")
        if self.root is None or not isinstance(bundle, str) or not bundle.startswith("/") or ".." in bundle.split("/"):
            return None
        from ..plan import policy
        from ..plan import SANDBOX_ANNOTATIONS
        from ..probe.host import Host
        from ..runtime import create  # the bound of what the create reads of it

        data = Host(self.root).read_bytes(bundle.rstrip("/") + "/config.json", limit=create.MAX_SPEC_BYTES, quiet=True)
        if data is None:
            return None
        import json

        try:
            annotations = json.loads(data).get("annotations") or {}
        except (ValueError, AttributeError):
            return None
        if not isinstance(annotations, dict) or any(annotations.get(k) == v for k, v in SANDBOX_ANNOTATIONS):
            return None
        return dict(rec, **policy.pod_of({k: v for k, v in annotations.items() if isinstance(v, str)}))

    def _report(self, job: dict) -> None:
        rec = job["rec"]
        if "pod_uid" not in rec and rec.get("decision") == NO_GPU:
            rec = self._from_bundle(rec) or rec
        ns, name, uid = rec.get("pod_namespace"), rec.get("pod_name"), rec.get("pod_uid")
        if not (isinstance(ns, str) and isinstance(name, str) and isinstance(uid, str)):
            return  # not a pod's container (Docker, podman, plain runc): nothing to say
        what = event_for(rec)
        if what is None:
            return
        if not (_NAME.match(ns) and _NAME.match(name) and _UID.match(uid)):
            self._once(
                "bad-name",
                "warning",
                "pod.skipped",
                why="the log line's pod is not a valid name",
                namespace=ns[:80],
                pod=name[:80],
            )
            return
        reason, type_, message, accel = what
        api_uid = self._api_uid((ns, name, uid))
        if api_uid is None:
            return
        pod_key = (ns, name, api_uid)
        if not job.get("posted"):  # a retry after the label's patch failed posts no second Event
            self._post(pod_key, rec.get("container_name"), reason, type_, message)
            job["posted"] = True
        if self.set_label and accel is not None and self.labelled.get_fresh(pod_key) != accel:
            self.kube.patch_pod_labels(ns, name, {POD_LABEL: accel})
            self.labelled.put(pod_key, accel)

    def _api_uid(self, pod_key: tuple[str, str, str]) -> str | None:
        """The API's UID of the line's pod (namespace, name, uid) if the API says it is this
        node's (the same UID, or the mirror pod of the static pod of that UID), else None: a
        GET per pod (remembered a while, within the namespace's lookup rate), never a second
        one for a pod found not to be."""
        ns, name, uid = pod_key
        if pod_key in self.refused:
            return None  # found not to be this node's: no second GET
        known = self.pods.get_fresh(pod_key)
        if known is not None:
            return known
        if not self._take(
            self.lookups,
            ns,
            self.lookup_burst,
            self.lookup_rate,
            "lookups",
            "pod.lookups_limited",
            "this namespace's lines are dropped and counted until its rate allows",
        ):
            self.dropped_lookups += 1
            return None
        try:
            pod = self.kube.get_pod(ns, name)
        except kubeclient.KubeError as e:
            if e.status != 404:
                raise
            pod = {}  # no such pod: the line is not trusted either
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        annotations = meta.get("annotations") or {}
        ours = uid in (meta.get("uid"), isinstance(annotations, dict) and annotations.get(MIRROR))
        if not ours or not isinstance(meta.get("uid"), str) or spec.get("nodeName") != self.node:
            self.refused.put(pod_key, self.clock())
            self._once(
                f"not-ours:{ns}",
                "warning",
                "pod.skipped",
                namespace=ns,
                pod=name,
                why="not this node's pod (another uid or node): the line is not trusted",
            )
            return None
        self.pods.put(pod_key, meta["uid"])
        return meta["uid"]

    def _post(self, pod_key: tuple[str, str, str], container, reason: str, type_: str, message: str) -> None:
        """The pod's Event, within its namespace's rate: posted the first time, its count
        patched after (the same reason and message)."""
        ns, name, uid = pod_key
        key = (ns, name, uid, reason, message)
        seen = self.events.get_fresh(key)
        if not self._take(
            self.buckets,
            ns,
            self.burst,
            self.rate,
            "rate",
            "event.ratelimited",
            "this namespace's further events are dropped and counted until its rate allows",
        ):
            self.dropped += 1
            return
        now = micro_time()
        if seen is None:
            body = self.kube.post_pod_event(ns, name, uid, container, reason, message, type_, now[:19] + "Z")
            seen = {"name": (body.get("metadata") or {}).get("name"), "namespace": ns, "count": 1}
            self.events.put(key, seen)
        else:
            count = seen["count"] + 1
            if seen["name"]:
                self.kube.patch_event(
                    ns,
                    seen["name"],
                    {
                        "count": count,
                        "lastTimestamp": now[:19] + "Z",
                        "series": {"count": count, "lastObservedTime": now},
                    },
                )
            seen["count"] = count
        self.posted += 1
        self.log.info("event.posted", reason=reason, namespace=ns, pod=name, count=seen["count"])
