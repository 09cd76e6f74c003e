"""Where each probe of the agent goes (core.py's loop hands every one to each): the CDI specs
(CDISpecs), node-feature-discovery's feature file (FeatureFile), the /dev/char links
(DevLinks), the Node's labels in the API (NodeLabels), the node's Events (Events) and the
readiness file (ReadyFile). Each
takes what it writes from its arguments and keeps the state of its own retries, so each is
tested alone; a failure is logged, and the files' ones make the round "not ready".

Files are rewritten only when their bytes change, always atomically (a dotfile beside them,
then rename): a reader sees the old file or the new one, never part of one.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from .. import cdi, hook
from ..probe import nodestate
from . import kubeclient, labels as labels_mod
from .retry import Backoff


class DevLinks:
    """/dev/char links of the nodes gpuhook injects (install/devlinks.py); a failure is logged,
    never "not ready": the links matter only to the systemd cgroup driver."""

    def __init__(self, root: str, log):
        self.root = root
        self.log = log

    def write(self, inv) -> None:
        from ..install import devlinks

        try:
            links = devlinks.ensure(self.root, inv)
        except OSError as e:
            self.log.error("devlinks.error", error=str(e))
            return
        made = [f"{x.path} -> {x.target}" for x in links if x.status == "made"]
        failed = [f"{x.path}: {x.status}" for x in links if x.status.startswith("error")]
        if made:
            self.log.info("devlinks.made", links=made)
        if failed:
            self.log.warning("devlinks.error", links=failed)


class CDISpecs:
    """The node's CDI specs (cdi.py) in dir ("": none written), with the node's own ldconfig
    in their hooks (none there: no ld-cache hook, never the agent image's)."""

    def __init__(self, opts, log):
        self.opts = opts
        self.log = log
        self.dir = opts.resolved_cdi_dir()
        self.consumer_root = opts.root if opts.spec_root == "/" else "/"  # where the node's / is, from here
        found = opts.ldconfig is None and nodestate.find_ldconfig(self.consumer_root)
        self.ldconfig: str | bool = opts.ldconfig if opts.ldconfig is not None else found or False

    def write(self, inv) -> bool:
        if not self.dir:
            return True
        o = self.opts
        try:
            dropped: list = []
            # the hooks' helper as the node sees it (the bundle the install put there, looked
            # for each time: install may come after start); none there: specs without hooks
            helper = hook.helper(self.consumer_root) or False
            specs = cdi.specs(inv, o.spec_root, self.ldconfig, o.cdi_max_version, dropped, helper)
            written, removed = cdi.write_dir(specs, self.dir, o.cdi_format)
        except (OSError, cdi.CDIError) as e:
            self.log.error("cdi.error", error=str(e), dir=self.dir)
            return False
        if written or removed:
            self.log.info(
                "cdi.written",
                dir=self.dir,
                files=written,
                removed=removed,
                kinds=[s["kind"] for s in specs],
                cdi_versions=[s["cdiVersion"] for s in specs],
            )
            if dropped:
                self.log.warning(
                    "cdi.capped", max_version=o.cdi_max_version, left_out={kind: fields for kind, fields in dropped}
                )
        return True


class FeatureFile:
    """The node labels as node-feature-discovery's local feature file in dir ("": none)."""

    def __init__(self, nfd_dir: str, log):
        self.dir = nfd_dir
        self.log = log

    def write(self, node_labels: dict) -> bool:
        if not self.dir:
            return True
        try:
            if labels_mod.write_nfd(node_labels, self.dir):
                self.log.info("labels.written", file=os.path.join(self.dir, labels_mod.NFD_FILE), labels=node_labels)
        except OSError as e:
            self.log.error("labels.error", error=str(e), dir=self.dir)
            return False
        return True


class Events:
    """The node's Events in the API (kube None: none), and the API's errors: each kind logged
    once until the API works again (never a flood). node_uid: the Node's, once known (the
    Events' involvedObject)."""

    def __init__(self, kube, log):
        self.kube = kube
        self.log = log
        self.node_uid: str | None = None
        self.said: set[str] = set()  # kinds of API error logged since the API last worked
        self._install_failed_posted = False

    def post(self, reason: str, message: str, type_: str = "Normal") -> None:
        if self.kube is None:
            return
        if reason == "RuntimeInstallFailed":  # once: the install is tried again every round
            if self._install_failed_posted:
                return
            self._install_failed_posted = True
        try:
            self.kube.post_event(reason, message, type_, self.node_uid)
            self.log.info("event.posted", reason=reason, node=self.kube.node)
        except kubeclient.KubeError as e:
            self.error(e, what="node event", event_reason=reason)

    def error(self, e, **kw) -> None:
        if e.kind in self.said:
            return
        self.said.add(e.kind)
        self.log.warning(
            "kube.error",
            error=str(e),
            kind=e.kind,
            node=self.kube.node,
            note="the node's files do not wait for the API: said once, retried with backoff",
            **kw,
        )

    def recovered(self, failures: int) -> None:
        """The API worked again after `failures` tries: said once, when an error was."""
        if self.said:
            self.log.info("kube.ok", node=self.kube.node, api=self.kube.base_url, after_failures=failures)
            self.said.clear()


class NodeLabels:
    """The Node's labels in the API (kube None: none): patched when they change and at least
    every `resync` seconds; after a failure, tried again after 1, 2, 4... s (at most resync)."""

    def __init__(self, kube, log, events: Events, clock: Callable[[], float], resync: float):
        self.kube = kube
        self.log = log
        self.events = events
        self.clock = clock
        self.resync = resync
        self.synced: dict | None = None  # the labels last in the API, None: to be patched
        self.synced_at = 0.0
        self.backoff = Backoff(1.0, resync, clock)  # after a failure: 1, 2, 4... s, at most resync
        self.foreign_said: dict[str, str] = {}  # labels somebody else set, last logged

    def sync(self, node_labels: dict) -> bool:
        if self.kube is None:
            return True
        due = self.synced != node_labels or self.clock() - self.synced_at >= self.resync
        if not due or self.backoff.waiting():
            return True
        try:
            synced = labels_mod.sync_node_labels(self.kube, node_labels)
        except kubeclient.KubeError as e:
            self.synced = None  # try again, after a backoff
            self.events.error(e, what="node labels", retry_in_s=self.backoff.failed())
            return False
        self.events.recovered(self.backoff.ok())
        self.events.node_uid = synced.uid or self.events.node_uid
        self.synced = dict(node_labels)
        self.synced_at = self.clock()
        if synced.patch:
            self.log.info(
                "labels.patched",
                node=self.kube.node,
                labels={k: v for k, v in synced.patch.items() if v is not None},
                removed=synced.removed,
            )
        if synced.foreign and synced.foreign != self.foreign_said:
            self.log.warning(
                "labels.not_ours",
                node=self.kube.node,
                labels=synced.foreign,
                wanted={k: node_labels[k] for k in synced.foreign},
                note="set by somebody else: left as it is; remove it and the agent sets its own",
            )
        self.foreign_said = synced.foreign
        return True


class ReadyFile:
    """The agent's readiness file (path "": none): written once the runtime is installed and a
    round worked (the DaemonSet's readiness probe), removed when the agent stops."""

    def __init__(self, path: str, log):
        self.path = path
        self.log = log

    def write(self) -> bool:
        """Whether the agent is ready now: False when the file cannot be written."""
        if self.path:
            from ..fsutil import write_atomic

            try:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n"
                write_atomic(self.path, stamp.encode(), 0o644, sync_dir=False)
            except OSError as e:
                self.log.error("ready.error", error=str(e), file=self.path)
                return False
        self.log.info("ready", file=self.path or None)
        return True

    def remove(self) -> None:
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class NRIState:
    """A consumer of the node log's lines (follow.CreateFollower) for the NRI plugin's own
    lines alone (event "nri"): a Synchronize that keeps failing is said in the agent's log and
    as a Warning on the Node; synchronized again, said in the log."""

    def __init__(self, events: Events, log) -> None:
        self.events = events
        self.log = log

    def handle(self, rec: dict) -> None:  # create lines: the other consumers'
        pass

    def handle_nri(self, rec: dict) -> None:
        state = rec.get("state")
        if state == "sync-failed":
            error = str(rec.get("error") or "")[:600]
            self.log.warning("nri.not_synchronized", failures=rec.get("failures"), error=error)
            self.events.post(
                "NRIPluginNotSynchronized",
                f"gpuhook's NRI plugin cannot register with the container runtime: {error}",
                "Warning",
            )
        elif state == "synchronized":
            self.log.info("nri.synchronized", failures=rec.get("failures"))
