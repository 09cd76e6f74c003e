"""Which pods really got a GPU: the agent follows the runtime's log and tells Kubernetes.

gpuhook-runtime writes one JSON line per create (runtime.log_line) and does no API work:
a create never waits on the API server. The agent tails that file (CreateFollower) and
hands each create record to its consumers: PodReporter (here) and the metrics (metrics.py).

For each create of a container of a Kubernetes pod (the line names the pod, from the CRI
annotations), PodReporter

- checks the pod is one of this node's: GET it, and its uid and spec.nodeName must be the
  line's and this node's (a line naming another namespace's pod is dropped, once logged);
- posts a core/v1 Event on it: GPUsInjected (vendor, count, device ids) or RanOnCPU (why:
  CPU-only node, gpuhook.dev/inject "false", every GPU held back, a gpuhook error). The
  same event again (a restarting container) is aggregated: the Event is patched with
  count + 1 and series {count, lastObservedTime}, as events.k8s.io's series are;
- sets the pod label gpuhook.dev/accelerator (nvidia, amd..., or cpu), so that
  `kubectl get pods -L gpuhook.dev/accelerator` answers in one line;
- for a hook line of a container it saw created (gpuhook-hook writes one when ldconfig timed
  out or failed, or a check refused: the create's line said "injected" all the same), posts
  a Warning on the same pod: LdCacheNotUpdated (GPUHookFailed for another hook).

Events are rate-limited (a token bucket: `burst`, then `rate` per second); past it they
are dropped and counted. API errors are logged once per kind of error and the record is
retried with exponential backoff (at most `retries` times); nothing here can stop the agent.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Callable

from . import kube as kube_mod, labels as labels_mod
from ..hook import EVENT as HOOK_EVENT

POD_LABEL = labels_mod.ACCELERATOR  # gpuhook.dev/accelerator, on pods as on nodes
CPU = "cpu"
# A pod's namespace and name as the API allows them (DNS subdomain): anything else is not
# put in a URL
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}\Z")
MAX_IDS = 16  # device ids named in one message
_POD_KEYS = ("pod_namespace", "pod_name", "pod_uid", "container_name")
HOOK_DECISION = "hook-failed"  # a hook line, as PodReporter hands it to event_for


def micro_time(t: float | None = None) -> str:
    """metav1.MicroTime: 2026-11-29T19:40:49.577123Z."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


def event_for(rec: dict) -> tuple[str, str, str, str | None] | None:
    """(reason, type, message, accelerator label value: None to leave it) for a create record
    (or a hook line with its pod, decision HOOK_DECISION); None when it is not about a
    container of a pod (sandbox, no pod in the line)."""
    decision = rec.get("decision")
    if decision in ("sandbox", None) or decision not in (
        "injected",
        "no-gpu",
        "declined",
        "error",
        "unchanged",
        HOOK_DECISION,
    ):
        return None
    ctr = rec.get("container_name")
    where = f"container {ctr}" if isinstance(ctr, str) and ctr else "a container"
    if decision == HOOK_DECISION:  # the label stays as the create set it
        from ..hook import DESCRIPTION, LDCACHE

        kind = rec.get("kind")
        what = DESCRIPTION.get(kind, "a gpuhook hook") if isinstance(kind, str) else "a gpuhook hook"
        msg = f"{where}: {what} {str(rec.get('outcome') or 'failed')[:16]}: {str(rec.get('error') or '')[:300]}"
        return ("LdCacheNotUpdated" if kind == LDCACHE else "GPUHookFailed"), "Warning", msg, None
    if decision == "injected":
        vendors = [str(v) for v in rec.get("vendors") or [] if isinstance(v, str)]
        ids = [str(d) for d in rec.get("devices") or [] if isinstance(d, str)]
        if vendors:
            per = ", ".join(f"{v} x{sum(1 for d in ids if d.startswith(v + ':'))}" for v in vendors)
            shown = ", ".join(ids[:MAX_IDS]) + (f" (+{len(ids) - MAX_IDS})" if len(ids) > MAX_IDS else "")
            msg = (
                f"{where} got {len(ids)} GPU device(s): {per}: {shown}"
                if ids
                else f"{where} got GPUs: {', '.join(vendors)}"
            )  # a line of a gpuhook before device ids
            held = rec.get("held_back") or []
            if held:
                msg += f"; {len(held)} held back (allocated by the kubelet to other pods)"
            return "GPUsInjected", "Normal", msg, vendors[0]
        return "RanOnCPU", "Normal", f"{where} got GPU driver files but no GPU device", CPU
    if decision == "no-gpu":
        why = "CPU-only node"
    elif decision == "error":
        why = f"gpuhook failed ({str(rec.get('error') or 'unknown error')[:300]}); it started without GPUs"
    else:
        why = str(rec.get("reason") or "no GPU was given")
    return "RanOnCPU", ("Warning" if decision == "error" else "Normal"), f"{where} runs without a GPU: {why}", CPU


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
    ):
        self.kube = kube
        self.root = root  # the node's / (bundle paths of the runtime's lines are under it)
        self.node = kube.node
        self.log = log
        self.clock = clock
        self.bucket = _Bucket(burst, rate, clock)
        self.retries = retries
        self.backoff = backoff
        self.set_label = set_label
        self.events: dict[tuple, dict] = {}  # (pod uid, reason, message) -> {"name", "namespace", "count"}
        self.labelled: dict[str, str] = {}  # pod uid -> the label value it has
        self.containers: dict[str, dict] = {}  # container id -> its pod (from its create line)
        self.pods: dict[str, float] = {}  # pod uid -> when it was checked to be this node's
        self.retry: list[tuple[float, int, dict]] = []  # (due, attempt, record)
        self.dropped = 0
        self.posted = 0
        self._said: set[str] = set()

    def _once(self, kind: str, level: str, event: str, **kw) -> None:
        """Log each kind of problem once (the agent never floods its log)."""
        if kind in self._said:
            return
        self._said.add(kind)
        getattr(self.log, level)(event, node=self.node, **kw)

    def handle(self, rec: dict) -> None:
        cid = rec.get("container_id")
        if isinstance(cid, str) and isinstance(rec.get("pod_uid"), str):
            self.containers[cid] = {k: rec.get(k) for k in _POD_KEYS}
            if len(self.containers) > 4096:
                self.containers.pop(next(iter(self.containers)))
        self._attempt(rec, 0)

    def handle_hook(self, rec: dict) -> None:
        """A hook line (gpuhook-hook's, event "hook"): an Event on the pod of its container,
        known from that container's create line; nothing for a container not seen."""
        pod = self.containers.get(rec.get("container_id"))  # type: ignore[arg-type]
        if pod is not None:
            self._attempt({**rec, **pod, "decision": HOOK_DECISION}, 0)

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
        except kube_mod.KubeError as e:
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

        data = Host(self.root).read_bytes(bundle.rstrip("/") + "/config.json", limit=16 << 20, quiet=True)
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
        if uid not in self.pods:
            pod = self.kube.get_pod(ns, name)
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            if meta.get("uid") != uid or spec.get("nodeName") != self.node:
                self._once(
                    f"not-ours:{ns}/{name}",
                    "warning",
                    "pod.skipped",
                    namespace=ns,
                    pod=name,
                    why="not this node's pod (another uid or node): the line is not trusted",
                )
                return
            self.pods[uid] = self.clock()
            if len(self.pods) > 4096:
                self.pods.pop(next(iter(self.pods)))
        key = (uid, reason, message)
        seen = self.events.get(key)
        if not self.bucket.take():
            self.dropped += 1
            self._once(
                "rate",
                "warning",
                "event.ratelimited",
                burst=self.bucket.burst,
                rate=self.bucket.rate,
                note="further events are dropped and counted until the rate allows",
            )
        else:
            now = micro_time()
            if seen is None:
                body = self.kube.post_pod_event(
                    ns, name, uid, rec.get("container_name"), reason, message, type_, now[:19] + "Z"
                )
                self.events[key] = {"name": (body.get("metadata") or {}).get("name"), "namespace": ns, "count": 1}
                if len(self.events) > 4096:
                    self.events.pop(next(iter(self.events)))
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
            self.log.info("event.posted", reason=reason, namespace=ns, pod=name, count=self.events[key]["count"])
        if self.set_label and accel is not None and self.labelled.get(uid) != accel:
            self.kube.patch_pod_labels(ns, name, {POD_LABEL: accel})
            self.labelled[uid] = accel
            if len(self.labelled) > 4096:
                self.labelled.pop(next(iter(self.labelled)))


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
        self._pos = 0
        self._buf = b""
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
        """Read what was appended since the last call; the number of create records fed."""
        import json

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
                self._buf = b""
                if self._said_missing or first:
                    self.log.info("creates.following", file=self.path, offset=self._pos)
                self._said_missing = False
            if st.st_size <= self._pos:
                return 0
            os.lseek(fd, self._pos, os.SEEK_SET)
            data = os.read(fd, min(st.st_size - self._pos, 4 << 20))
        finally:
            os.close(fd)
        self._pos += len(data)
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()[-(1 << 20) :]  # a line still being written
        fed = 0
        for raw in lines:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "create":
                fed += 1
                for c in self.consumers:
                    self._call(c.handle, rec)
            elif isinstance(rec, dict) and rec.get("event") == HOOK_EVENT:
                for c in self.consumers:
                    if hasattr(c, "handle_hook"):
                        self._call(c.handle_hook, rec)
        return fed
