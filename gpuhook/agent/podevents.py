"""Which pods really got a GPU: the agent follows the runtime's log and tells Kubernetes.

gpuhook-runtime writes one JSON line per create (runtime.log_line) and does no API work:
a create never waits on the API server. The agent tails that file (CreateFollower) and
hands each create record to its consumers: PodReporter (here) and the metrics (metrics.py).

For each create of a container of a Kubernetes pod (the line names the pod, from the CRI
annotations), PodReporter

- checks the pod is one of this node's: GET it, and its uid and spec.nodeName must be the
  line's and this node's (a line naming another namespace's pod is dropped, once logged);
- posts a core/v1 Event on it: GPUsInjected (vendor, count, device ids) or RanOnCPU (why:
  CPU-only node, gpuhook.dev/inject "false", every GPU held back, a gpuhook error; a Warning
  when the NRI plugin's line says the runtime made the container without its adjustment,
  "late", or while it was not registered, "missed"), or GPUsUnconfirmed (a Warning, no label:
  the runtime never said what it made, "unconfirmed"). The
  same event again (a restarting container) is aggregated: the Event is patched with
  count + 1 and series {count, lastObservedTime}, as events.k8s.io's series are;
- sets the pod label gpuhook.dev/accelerator (nvidia, amd..., or cpu), so that
  `kubectl get pods -L gpuhook.dev/accelerator` answers in one line;
- for a hook line of a container it saw created (gpuhook-hook writes one when ldconfig timed
  out or failed, or a check refused: the create's line said "injected" all the same), posts
  a Warning on the same pod: LdCacheNotUpdated (GPUHookFailed for another hook).

A line's pod is trusted only as the triple (namespace, name, uid) that one GET found
scheduled on this node: another line with the same uid but another namespace or name is
looked up again (and refused). Budgets are per namespace, so that one tenant's creates never
use up another's: Events (a token bucket: `burst`, then `rate` per second; past it they are
dropped and counted) and pod lookups (`lookup_burst`, then `lookup_rate` per second; past it
the line is dropped and counted). Every map is bounded (least recently used out first): the
pods checked, the lines refused (a refused triple costs no second GET), the buckets, the
Events to aggregate, the problems said once. API errors are logged once per kind of error
and the record is retried with exponential backoff (at most `retries` times); nothing here
can stop the agent.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import OrderedDict
from typing import Callable

from . import kubeclient, labels as labels_mod
from ..hook import EVENT as HOOK_EVENT
from ..nri.plugin import LATE as NRI_LATE, MISSED as NRI_MISSED, NRI_EVENT, UNCONFIRMED as NRI_UNCONFIRMED
from ..vendors import CPU

POD_LABEL = labels_mod.ACCELERATOR  # gpuhook.dev/accelerator, on pods as on nodes
# A pod's namespace and name as the API allows them (DNS subdomain): anything else is not
# put in a URL
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}\Z")
MAX_IDS = 16  # device ids named in one message
_POD_KEYS = ("pod_namespace", "pod_name", "pod_uid", "container_name")
HOOK_DECISION = "hook-failed"  # a hook line, as PodReporter hands it to event_for
MAX_ENTRIES = 4096  # pods checked, lines refused, Events to aggregate, labels set
MAX_NAMESPACES = 1024  # namespaces with a budget of their own
MAX_EARLY_HOOKS = 256  # containers whose hook lines came before their create line (NRI's)
# the NRI plugin's decisions that the runtime's word made (nri/plugin.py): no GPU is claimed
NRI_NOT_GIVEN = (NRI_LATE, NRI_MISSED, NRI_UNCONFIRMED)


def micro_time(t: float | None = None) -> str:
    """metav1.MicroTime: 2026-11-29T19:40:49.577123Z."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


def why_of(rec: dict) -> str:
    return str(rec.get("reason") or "no GPU was given")[:300]


def event_for(rec: dict) -> tuple[str, str, str, str | None] | None:
    """(reason, type, message, accelerator label value: None to leave it) for a create's line
    (read as the typed logline.CreateRecord) or a hook line with its pod, decision
    HOOK_DECISION; None when it is not about a container of a pod (sandbox, no pod in the line)."""
    from ..logline import NRI, CreateRecord

    if rec.get("decision") == HOOK_DECISION:
        return _hook_event(rec)
    r = CreateRecord.read(rec)
    if r is None or r.decision not in ("injected", "no-gpu", "declined", "error", "unchanged", *NRI_NOT_GIVEN):
        return None
    where = _where(r.container_name, r.front == NRI)
    decision = r.decision
    if decision == "injected":
        vendors, ids = list(r.vendors), list(r.devices)
        if vendors:
            per = ", ".join(f"{v} x{sum(1 for d in ids if d.startswith(v + ':'))}" for v in vendors)
            shown = ", ".join(ids[:MAX_IDS]) + (f" (+{len(ids) - MAX_IDS})" if len(ids) > MAX_IDS else "")
            msg = (
                f"{where} got {len(ids)} GPU device(s): {per}: {shown}"
                if ids
                else f"{where} got GPUs: {', '.join(vendors)}"
            )  # a line of a gpuhook before device ids
            if r.held_back:
                msg += f"; {len(r.held_back)} held back (allocated by the kubelet to other pods)"
            return "GPUsInjected", "Normal", msg, vendors[0]
        return "RanOnCPU", "Normal", f"{where} got GPU driver files but no GPU device", CPU
    if decision == NRI_UNCONFIRMED:  # the plugin answered; the runtime never said what it made: no claim
        msg = f"{where}: gpuhook's NRI plugin gave it GPUs, but the runtime never confirmed it got them ({why_of(rec)})"
        return "GPUsUnconfirmed", "Warning", msg, None
    if decision in NRI_NOT_GIVEN:  # late, missed: the runtime made it without gpuhook's adjustment
        return "RanOnCPU", "Warning", f"{where} runs without a GPU: {why_of(rec)}", CPU
    if decision == "no-gpu":
        why = "CPU-only node"
    elif decision == "error":
        why = f"gpuhook failed ({(r.error or 'unknown error')[:300]}); it started without GPUs"
    else:
        why = r.reason or "no GPU was given"
    return "RanOnCPU", ("Warning" if decision == "error" else "Normal"), f"{where} runs without a GPU: {why}", CPU


def _where(container_name, through_nri: bool) -> str:
    where = f"container {container_name}" if isinstance(container_name, str) and container_name else "a container"
    return where + " (through NRI)" if through_nri else where  # the NRI plugin's create; the wrapper's say nothing


def _hook_event(rec: dict) -> tuple[str, str, str, str | None]:
    """A hook line's Event (with its container's pod): the label stays as the create set it."""
    from ..hook import DESCRIPTION, LDCACHE
    from ..logline import NRI

    where = _where(rec.get("container_name"), rec.get("front") == NRI)
    kind = rec.get("kind")
    what = DESCRIPTION.get(kind, "a gpuhook hook") if isinstance(kind, str) else "a gpuhook hook"
    msg = f"{where}: {what} {str(rec.get('outcome') or 'failed')[:16]}: {str(rec.get('error') or '')[:300]}"
    return ("LdCacheNotUpdated" if kind == LDCACHE else "GPUHookFailed"), "Warning", msg, None


class _Bucket:
    def __init__(self, burst: int, rate: float, clock):
        self.burst, self.rate, self.clock = burst, rate, clock
        self.tokens = float(burst)
        self.at = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class _Lru(OrderedDict):
    """A bounded map: the least recently used entry goes first."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_fresh(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class PodReporter:
    """Create records -> pod Events and the pod label (see the module's doc)."""

    def __init__(
        self,
        kube,
        log,
        clock: Callable[[], float] = time.monotonic,
        burst: int = 25,
        rate: float = 1.0,
        retries: int = 4,
        backoff: float = 1.0,
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
        self.buckets = _Lru(MAX_NAMESPACES)  # namespace -> its Event budget (_Bucket)
        self.lookups = _Lru(MAX_NAMESPACES)  # namespace -> its pod-lookup budget (_Bucket)
        self.retries = retries
        self.backoff = backoff
        self.set_label = set_label
        # the pod is always the triple (namespace, name, uid) one GET checked together
        self.events = _Lru(MAX_ENTRIES)  # (namespace, name, uid, reason, message) -> {"name", "namespace", "count"}
        self.labelled = _Lru(MAX_ENTRIES)  # (namespace, name, uid) -> the label value it has
        self.containers = _Lru(MAX_ENTRIES)  # container id -> its pod (from its create line)
        self.early_hooks = _Lru(MAX_EARLY_HOOKS)  # container id -> hook lines before its create line
        self.pods = _Lru(MAX_ENTRIES)  # (namespace, name, uid) -> when it was found to be this node's
        self.refused = _Lru(MAX_ENTRIES)  # (namespace, name, uid) -> when it was found not to be
        self.retry: list[tuple[float, int, dict]] = []  # (due, attempt, record)
        self.dropped = 0
        self.dropped_lookups = 0
        self.posted = 0
        self._said = _Lru(MAX_ENTRIES)

    def _take(self, buckets: _Lru, ns: str, burst: int, rate: float, what: str, event: str, note: str) -> bool:
        """A token from the namespace's budget in `buckets` (made with burst and rate the first
        time); none left: False, and one warning per namespace and `what` (the caller counts)."""
        bucket = buckets.get_fresh(ns)
        if bucket is None:
            bucket = _Bucket(burst, rate, self.clock)
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
            self.containers.put(cid, {k: rec.get(k) for k in _POD_KEYS})
        self._attempt(rec, 0)
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
            self._attempt({**rec, **pod, "decision": HOOK_DECISION}, 0)
        elif isinstance(cid, str):
            self.early_hooks.put(cid, [*self.early_hooks.get(cid, [])[:3], rec])

    def tick(self) -> None:
        """Retry what is due."""
        now = self.clock()
        due = [r for r in self.retry if r[0] <= now]
        self.retry = [r for r in self.retry if r[0] > now]
        for _, attempt, rec in due:
            self._attempt(rec, attempt)

    def _attempt(self, rec: dict, attempt: int) -> None:
        try:
            self._report(rec)
        except kubeclient.KubeError as e:
            transient = e.transient
            self._once(
                e.kind,
                "warning",
                "kube.error",
                error=str(e),
                what="pod event",
                note="retried with backoff" if transient else "not retried",
                once=True,
            )
            if transient and attempt < self.retries:
                self.retry.append((self.clock() + self.backoff * (2**attempt), attempt + 1, rec))

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

    def _report(self, rec: dict) -> None:
        if "pod_uid" not in rec and rec.get("decision") == "no-gpu":
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
        pod_key = (ns, name, uid)
        if not self._is_ours(pod_key):
            return
        self._post(pod_key, rec.get("container_name"), reason, type_, message)
        if self.set_label and accel is not None and self.labelled.get_fresh(pod_key) != accel:
            self.kube.patch_pod_labels(ns, name, {POD_LABEL: accel})
            self.labelled.put(pod_key, accel)

    def _is_ours(self, pod_key: tuple[str, str, str]) -> bool:
        """Whether the API says the pod (namespace, name, uid) is this node's: a GET per pod
        (remembered a while, within the namespace's lookup rate), never a second one for a
        pod found not to be."""
        ns, name, uid = pod_key
        if pod_key in self.refused:
            return False  # found not to be this node's: no second GET
        if self.pods.get_fresh(pod_key) is not None:
            return True
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
            return False
        try:
            pod = self.kube.get_pod(ns, name)
        except kubeclient.KubeError as e:
            if e.status != 404:
                raise
            pod = {}  # no such pod: the line is not trusted either
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != uid or spec.get("nodeName") != self.node:
            self.refused.put(pod_key, self.clock())
            self._once(
                f"not-ours:{ns}",
                "warning",
                "pod.skipped",
                namespace=ns,
                pod=name,
                why="not this node's pod (another uid or node): the line is not trusted",
            )
            return False
        self.pods.put(pod_key, self.clock())
        return True

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


# the longest node log line the follower waits to see whole (server.MAX_REPLY_LOG_LINE bounds
# a create's); past it, the line is skipped
MAX_LINE = 1 << 20


class CreateFollower:
    """Tails the runtime's log (JSON lines, appended with O_APPEND by every create) from
    its end at start, and feeds each new "create" record to the consumers. A rotated or
    truncated file is followed from its beginning. A consumer that raises is logged and
    skipped: the follower never stops."""

    def __init__(self, path: str, consumers: list, log, poll: float = 0.25, from_start: bool = False):
        self.path = path
        self.consumers = consumers
        self.log = log
        self.poll = poll
        self._ino: tuple[int, int] | None = None
        self._pos = 0  # where the next line starts
        self._skip_line = False  # the line at _pos is the rest of one not to be read
        self._from_start = from_start
        self._said_missing = False
        self.thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        self.read_new(first=True)
        self.thread = threading.Thread(target=self._loop, args=(stop,), name="gpuhook-creates", daemon=True)
        self.thread.start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll):
            self.read_new()
            for c in self.consumers:
                tick = getattr(c, "tick", None)
                if tick:
                    self._call(tick)

    def _call(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # a bug in one consumer must not end the others
            self.log.error("creates.consumer_error", error=f"{type(e).__name__}: {e}")

    def read_new(self, first: bool = False) -> int:
        """Read what was appended since the last call; the number of create records fed. A
        line is read once it has its newline: until then it is read again from its start on
        the next call (a writer that could not finish it may blank it or cut it back,
        logline.undo_short_write). A damaged line is skipped, the rest kept (log.parse_line)."""
        from ..log import parse_line

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            if not self._said_missing:
                self._said_missing = True
                self.log.info("creates.waiting", file=self.path, why=e.strerror or str(e))
            return 0
        try:
            st = os.fstat(fd)
            if self._ino != (st.st_dev, st.st_ino) or st.st_size < self._pos:
                rotated = self._ino is not None
                self._ino = (st.st_dev, st.st_ino)
                self._pos = st.st_size if first and not self._from_start and not rotated else 0
                # from the end: within a line still being written, its rest is not to be read
                self._skip_line = self._pos > 0 and os.pread(fd, 1, self._pos - 1) != b"\n"
                if self._said_missing or first:
                    self.log.info("creates.following", file=self.path, offset=self._pos)
                self._said_missing = False
            if st.st_size <= self._pos:
                return 0
            os.lseek(fd, self._pos, os.SEEK_SET)
            data = os.read(fd, min(st.st_size - self._pos, 4 << 20))
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1  # what is read of an unfinished line waits for its end
        if end == 0 and len(data) < MAX_LINE:
            return 0
        if end == 0:  # no newline in so much: the rest of that line is skipped
            self._pos += len(data)
            self._skip_line = True
            return 0
        self._pos += end
        lines = data[:end].split(b"\n")[:-1]
        if self._skip_line:
            lines, self._skip_line = lines[1:], False
        fed = 0
        for raw in lines:
            rec, _damaged = parse_line(raw)
            if rec is not None and rec.get("event") == "create":
                fed += 1
                for c in self.consumers:
                    self._call(c.handle, rec)
            elif rec is not None and rec.get("event") == HOOK_EVENT:
                for c in self.consumers:
                    if hasattr(c, "handle_hook"):
                        self._call(c.handle_hook, rec)
            elif isinstance(rec, dict) and rec.get("event") == NRI_EVENT:  # the NRI plugin's own state
                for c in self.consumers:
                    if hasattr(c, "handle_nri"):
                        self._call(c.handle_nri, rec)
        return fed
