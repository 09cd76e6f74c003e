"""`gpuhook agent`: the DaemonSet's long-running process on every node.

    install (gpuhook.install) -> probe -> CDI specs + node labels (+ Events) -> ready file
    then: udev event (drm, kfd, accel; nvidia/amdgpu/i915/xe module load and unload)
          -> wait until `debounce` seconds pass without another -> probe -> refresh
          and every `interval` seconds anyway (NVIDIA nodes appear without udev events)

Files are rewritten only when their bytes change, always atomically (a dotfile beside
them, then rename): a reader sees the old file or the new one, never part of one. A probe
that fails changes nothing. SIGTERM stops the agent after the step in progress; what it
installed stays, so the node keeps starting gpu-optional pods without it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Callable

from .. import cdi, defaults, hook, vendors
from ..logline import bounded_warnings
from ..nri.plugin import DEFAULT_SOCKET as NRI_SOCKET, ROOTFS_TEMPLATE
from . import kube as kube_mod, labels as labels_mod, nri as nri_mod

UDEV_SUBSYSTEMS = vendors.udev_subsystems()  # each vendor's (gpuhook/vendors.py)
UDEV_MODULES = vendors.udev_modules()
READY_FILE = defaults.READY_FILE


@dataclasses.dataclass
class Options:
    root: str = "/"  # where the node's / is (/host in the DaemonSet)
    spec_root: str = "/"  # the node's / as the container runtime sees it (in CDI paths)
    interval: float = 30.0  # periodic re-probe, seconds
    debounce: float = 1.0  # quiet time after a udev event before re-probing
    cdi_dir: str | None = None  # default <root>/var/run/cdi (resolved inside root); "" = off
    nfd_dir: str | None = None  # default <root>/etc/kubernetes/node-feature-discovery/features.d; "" = off
    cdi_format: str = "yaml"
    cdi_max_version: str | None = None  # the newest cdiVersion the node's runtimes read (None: any)
    install: bool = True
    once: bool = False
    ready_file: str = READY_FILE  # "" = none
    ldconfig: str | None = None  # the node's ldconfig for the CDI ld-cache hook (found when None)
    install_restart: str = "none"  # passed to gpuhook install: signal | systemd | none
    api_resync: float = 300.0  # re-check the Node's labels at least this often
    udev: bool = True
    nvidia_driver_root: str | None = None  # the node config's nvidia_driver_root (None: auto)
    runtime_log: str | None = None  # the runtime's log to follow (None: the node config's log_file in root; "" = off)
    pod_events: bool = True  # Events and the gpuhook.dev/accelerator label on gpu-optional pods
    metrics_address: str | None = None  # host:port for Prometheus metrics (None: off)
    kubeconfig: str | None = None  # the API from a kubeconfig file (None: in-cluster, when in a pod)
    kube_context: str | None = None  # its context (None: current-context)
    node_name: str | None = None  # this node's name in the API (None: NODE_NAME, else the host name)
    vendor_label: str | None = None  # the label set to the primary vendor (None: the node config's, read at each probe)
    front: str = nri_mod.DEFAULT_FRONT  # wrapper | nri | auto: whether the NRI plugin runs (nri.py)
    nri_socket: str = NRI_SOCKET  # the runtime's NRI socket, as the node sees it
    nri_rootfs_template: str = ROOTFS_TEMPLATE  # the plugin's --rootfs-template

    def resolved_vendor_label(self) -> str:
        """vendor_label, else the node config's (gpu.type by default; "" = none): read again
        at each probe, so a renamed or removed key takes effect without a restart."""
        if self.vendor_label is not None:
            return self.vendor_label
        from ..config import load, node_config_path

        return load(node_config_path(self.root))[0].vendor_label

    def resolved_runtime_log(self) -> str:
        if self.runtime_log is not None:
            return self.runtime_log
        from ..config import load, node_config_path

        config, _ = load(node_config_path(self.root))
        if not config.log_file:
            return ""
        return self._under_root(None, config.log_file) if self.root != "/" else config.log_file

    def resolved_cdi_dir(self) -> str:
        return self._under_root(self.cdi_dir, cdi.DEFAULT_DIR)

    def resolved_nfd_dir(self) -> str:
        return self._under_root(self.nfd_dir, os.path.dirname(defaults.NFD_FEATURES))

    def _under_root(self, given: str | None, default: str) -> str:
        if given is not None:
            return given
        from ..probe.host import Host

        # inside the root as if chrooted: /var/run -> /run on the node must not lead to the
        # agent container's own /run
        return Host(self.root).resolve(default)


def default_installer(opts: Options, log, front: str) -> Callable[[], None]:
    """`gpuhook install` for this node (gpuhook.install.core.install) with the agent's front:
    for `nri` the plain runc handler and NRI turned on, with no gpuhook-nri.service (the agent
    runs the plugin itself: a unit beside it would be a second plugin)."""

    def install() -> None:
        from ..install.core import Options as InstallOptions, install as run_install

        run_install(
            InstallOptions(host_root=opts.root, restart=opts.install_restart, front=front, nri_unit=front != "nri"),
            lambda line: log.info("install.step", message=line),
        )

    return install


def summarize(inv) -> dict:
    """What the agent compares between probes: devices by vendor:id, driver versions, and
    the vendors whose devices cannot be used (plan.unusable: e.g. no driver userspace yet)."""
    from ..plan import unusable

    bad = {}
    for v in inv.vendors:
        why = unusable(v) if v.devices else None
        if why:
            bad[v.vendor] = why[1]
    return {
        "devices": {f"{v.vendor}:{d.id}": d.model or "" for v in inv.vendors for d in v.devices},
        "drivers": {v.vendor: v.driver_version for v in inv.vendors if v.driver_version},
        "unusable": bad,
    }


def describe(inv) -> str:
    """One line for people: '2 GPUs: nvidia x2 (NVIDIA H100, driver 550.54.14)'; a vendor
    whose devices cannot be used is named with the reason."""
    from ..plan import unusable

    vendors = [v for v in inv.vendors if v.devices]
    if not vendors:
        return "no GPU: CPU-only node"
    parts, n = [], 0
    for v in vendors:
        why = unusable(v)
        extra = [
            x for x in (labels_mod.common_model(v.devices), v.driver_version and f"driver {v.driver_version}") if x
        ]
        if why:
            extra.append(f"not usable: {why[1]}")
        else:
            n += len(v.devices)
        parts.append(f"{v.vendor} x{len(v.devices)}" + (f" ({', '.join(extra)})" if extra else ""))
    total = sum(len(v.devices) for v in vendors)
    return f"{total} GPU{'s' if total != 1 else ''}{f' ({n} usable)' if n != total else ''}: " + ", ".join(parts)


def diff(old: dict, new: dict) -> dict:
    added = sorted(set(new["devices"]) - set(old["devices"]))
    removed = sorted(set(old["devices"]) - set(new["devices"]))
    drivers = {
        v: [old["drivers"].get(v), new["drivers"].get(v)]
        for v in sorted(set(old["drivers"]) | set(new["drivers"]))
        if old["drivers"].get(v) != new["drivers"].get(v)
    }
    before, after = old.get("unusable", {}), new.get("unusable", {})
    usable = {
        v: [before.get(v), after.get(v)] for v in sorted(set(before) | set(after)) if before.get(v) != after.get(v)
    }
    return {"added": added, "removed": removed, "driver_version": drivers, "unusable": usable}


class UdevWatch:
    """pyudev monitor thread: calls notify(reason) for each relevant event."""

    def __init__(self, notify: Callable[[str], None], log, stop: threading.Event):
        self.notify = notify
        self.log = log
        self.stop = stop
        self.monitor: Any = None
        self.thread: threading.Thread | None = None
        self.source: str | None = None

    def start(self) -> None:
        """Raises when pyudev or libudev cannot be used (the agent falls back to its timer)."""
        import pyudev

        context = pyudev.Context()
        # libudev disables a "udev" monitor when udevd's control socket is not there (a
        # container without /run/udev): then take the kernel's events, which the debounce
        # delays until udev has made the nodes.
        self.source = "udev" if os.path.exists("/run/udev/control") else "kernel"
        monitor = pyudev.Monitor.from_netlink(context, source=self.source)
        for s in UDEV_SUBSYSTEMS:
            monitor.filter_by(s)
        monitor.start()
        self.monitor = monitor
        self.thread = threading.Thread(target=self._loop, name="gpuhook-udev", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                device = self.monitor.poll(timeout=0.5)
                if device is None:
                    continue
                if device.subsystem == "module" and device.sys_name not in UDEV_MODULES:
                    continue
                self.notify(f"udev:{device.action}:{device.subsystem}:{device.sys_name}")
        except Exception as e:  # the timer still runs: say so once and stop watching
            self.log.warning("udev.failed", error=f"{type(e).__name__}: {e}", fallback="periodic")


class Agent:
    def __init__(
        self,
        opts: Options,
        installer: Callable[[], None] | None = None,
        kube="auto",
        log=None,
        probe: Callable | None = None,
        clock=time.monotonic,
    ):
        from .. import log as logmod

        self.opts = opts
        self.log = log or logmod.get()
        if kube == "auto":  # KubeError (a kubeconfig that cannot be used) goes to the caller
            kube = (
                kube_mod.KubeAPI.from_kubeconfig(opts.kubeconfig, opts.kube_context, opts.node_name)
                if opts.kubeconfig
                else kube_mod.KubeAPI.in_cluster(node=opts.node_name)
            )
        self.kube = kube
        if probe is None:
            import functools

            from ..probe import probe as probe_fn

            probe = functools.partial(probe_fn, nvidia_driver_root=opts.nvidia_driver_root)
        self.probe = probe
        self.clock = clock
        self.stop_event = threading.Event()
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._first_event = self._last_event = 0.0
        self.runtime_ready = not opts.install
        self.install_error: str | None = None
        self.ready = False
        self.syncs = 0
        self.summary: dict | None = None
        self.probe_errors = 0  # metrics.py
        self.last_probe = 0.0  # Unix time of the last successful probe
        self._api_labels: dict | None = None
        self._api_synced = 0.0
        self._api_failures = 0  # consecutive: the next try waits 2**n s (at most api_resync)
        self._api_retry_at = 0.0
        self._api_said: set[str] = set()  # kinds of API error logged since the API last worked
        self._foreign_said: dict[str, str] = {}  # labels somebody else set, last logged
        self._node_uid: str | None = None
        self._install_event_posted = False
        self.watch: UdevWatch | None = None
        self.pod_reporter: Any = None
        self.metrics: Any = None
        self.follower: Any = None
        self.cdi_dir = opts.resolved_cdi_dir()
        self.nfd_dir = opts.resolved_nfd_dir()
        # the node's own ldconfig; none there: no ld-cache hook (not the agent image's)
        found = opts.ldconfig is None and cdi.find_ldconfig(opts.root if opts.spec_root == "/" else "/")
        self.ldconfig: str | bool = opts.ldconfig if opts.ldconfig is not None else found or False
        self.nri: Any = None  # the plugin's Supervisor (nri.py), when it runs
        self.front, self.front_why = nri_mod.choose(opts.front, opts.root, opts.nri_socket)
        self.installer = installer if installer is not None else default_installer(opts, self.log, self.front)

    # -- events --------------------------------------------------------------------
    def notify(self, reason: str) -> None:
        """Something may have changed: re-probe once things are quiet for `debounce`."""
        with self._cond:
            now = self.clock()
            if not self._pending:
                self._first_event = now
            self._last_event = now
            if reason not in self._pending:
                self._pending.append(reason)
            self._cond.notify_all()

    def stop(self, why: str = "stop") -> None:
        self._stop_reason = why
        self.stop_event.set()
        with self._cond:
            self._cond.notify_all()

    def _wait(self, deadline: float) -> str | None:
        """Block until the next re-probe is due; its reason, or None when stopping."""
        with self._cond:
            while not self.stop_event.is_set() and not self._pending:
                left = deadline - self.clock()
                if left <= 0:
                    return "timer"
                self._cond.wait(min(left, 1.0))
            # debounce: wait until no event came for `debounce` seconds (at most 10 of them)
            while not self.stop_event.is_set():
                now = self.clock()
                due = min(self._last_event + self.opts.debounce, self._first_event + 10 * max(self.opts.debounce, 0.1))
                if now >= due:
                    break
                self._cond.wait(due - now)
            if self.stop_event.is_set():
                return None
            reason = ", ".join(self._pending[:5]) + (f" (+{len(self._pending) - 5})" if len(self._pending) > 5 else "")
            self._pending.clear()
            return reason

    # -- steps -----------------------------------------------------------------------
    def install(self) -> bool:
        t0 = time.monotonic()
        try:
            self.installer()
        except Exception as e:
            worded = isinstance(e, (OSError, ValueError)) or type(e).__name__ == "InstallError"
            self.install_error = str(e) if worded else f"{type(e).__name__}: {e}"
            self.log.error(
                "install",
                decision="error",
                error=self.install_error,
                duration_ms=round((time.monotonic() - t0) * 1000, 1),
            )
            self._post("RuntimeInstallFailed", f"gpuhook install failed: {self.install_error}", "Warning")
            return False
        self.install_error = None
        self.runtime_ready = True
        self.log.info("install", decision="ok", duration_ms=round((time.monotonic() - t0) * 1000, 1))
        return True

    def sync(self, reason: str = "start") -> bool:
        """Probe, then bring the CDI specs, the feature file and the Node's labels in line.
        True when the probe and the node's files worked (what readiness means)."""
        t0 = time.monotonic()
        self.syncs += 1
        from ..config import cache_dir
        from ..probe import cache as probe_cache

        key = probe_cache.fingerprint(
            self.opts.root, self.opts.nvidia_driver_root
        )  # before: a change meanwhile invalidates
        try:
            inv = self.probe(self.opts.root)
        except Exception as e:  # the probe never raises by design; if it does, change nothing
            self.log.error("probe.error", reason=reason, error=f"{type(e).__name__}: {e}")
            self.probe_errors += 1
            return False
        self.last_probe = time.time()
        # creates on this node use it until the next probe is due (probe/cache.py): never a cold probe
        probe_cache.store(self.opts.root, cache_dir(), inv, key, valid_for=2 * self.opts.interval + self.opts.debounce)
        summary = summarize(inv)
        first = self.summary is None
        change = {} if self.summary is None else diff(self.summary, summary)
        changed = first or any(change.values())
        self.summary = summary
        vendors = [v.vendor for v in inv.vendors if v.devices]
        common = {"vendors": vendors, "devices": sorted(summary["devices"]), "driver_version": summary["drivers"]}
        if first:
            self.log.info(
                "inventory",
                reason=reason,
                message=describe(inv),
                **common,
                warnings=list(bounded_warnings(inv.warnings)),
                duration_ms=round((time.monotonic() - t0) * 1000, 1),
            )
        elif changed:
            self.log.info(
                "inventory.changed",
                reason=reason,
                message=describe(inv),
                **common,
                added=change["added"],
                removed=change["removed"],
                driver_changes=change["driver_version"],
                warnings=list(bounded_warnings(inv.warnings)),
            )
        else:
            self.log.debug("inventory.same", reason=reason)
        self._dev_links(inv)
        ok = self._write_cdi(inv)
        node_labels = labels_mod.node_labels(inv, self.runtime_ready, self.opts.resolved_vendor_label())
        ok = self._write_nfd(node_labels) and ok
        self._sync_api(node_labels)  # the API being away is logged and retried, never "not ready"
        if changed:
            if first:
                self._post("GPUInventory", describe(inv))
            else:
                parts = [f"+{d}" for d in change["added"]] + [f"-{d}" for d in change["removed"]]
                parts += [f"{v} driver {a or '-'} -> {b or '-'}" for v, (a, b) in change["driver_version"].items()]
                parts += [
                    f"{v} {'not usable' if a else 'usable'} -> {'not usable: ' + b if b else 'usable'}"
                    for v, (a, b) in change["unusable"].items()
                ]
                self._post("GPUInventoryChanged", f"{describe(inv)} ({'; '.join(parts)})")
            if summary["unusable"] and (first or change["unusable"]):
                self.log.warning("inventory.unusable", vendors=summary["unusable"])
                self._post(
                    "GPUUnusable",
                    "; ".join(
                        f"{v}: {why}: gpu-optional containers get none of its devices"
                        for v, why in summary["unusable"].items()
                    ),
                    "Warning",
                )
        return ok

    def _dev_links(self, inv) -> None:
        """/dev/char links of the nodes gpuhook injects (install/devlinks.py); a failure is logged,
        never "not ready": the links matter only to the systemd cgroup driver."""
        from ..install import devlinks

        try:
            links = devlinks.ensure(self.opts.root, inv)
        except OSError as e:
            self.log.error("devlinks.error", error=str(e))
            return
        made = [f"{x.path} -> {x.target}" for x in links if x.status == "made"]
        failed = [f"{x.path}: {x.status}" for x in links if x.status.startswith("error")]
        if made:
            self.log.info("devlinks.made", links=made)
        if failed:
            self.log.warning("devlinks.error", links=failed)

    def _write_cdi(self, inv) -> bool:
        if not self.cdi_dir:
            return True
        try:
            dropped: list = []
            # the hooks' helper as the node sees it (the bundle the install put there, looked
            # for each time: install may come after start); none there: specs without hooks
            helper = hook.helper(self.opts.root if self.opts.spec_root == "/" else "/") or False
            specs = cdi.specs(inv, self.opts.spec_root, self.ldconfig, self.opts.cdi_max_version, dropped, helper)
            written, removed = cdi.write_dir(specs, self.cdi_dir, self.opts.cdi_format)
        except (OSError, cdi.CDIError) as e:
            self.log.error("cdi.error", error=str(e), dir=self.cdi_dir)
            return False
        if written or removed:
            self.log.info(
                "cdi.written",
                dir=self.cdi_dir,
                files=written,
                removed=removed,
                kinds=[s["kind"] for s in specs],
                cdi_versions=[s["cdiVersion"] for s in specs],
            )
            if dropped:
                self.log.warning(
                    "cdi.capped",
                    max_version=self.opts.cdi_max_version,
                    left_out={kind: fields for kind, fields in dropped},
                )
        return True

    def _write_nfd(self, node_labels: dict) -> bool:
        if not self.nfd_dir:
            return True
        try:
            if labels_mod.write_nfd(node_labels, self.nfd_dir):
                self.log.info(
                    "labels.written", file=os.path.join(self.nfd_dir, labels_mod.NFD_FILE), labels=node_labels
                )
        except OSError as e:
            self.log.error("labels.error", error=str(e), dir=self.nfd_dir)
            return False
        return True

    def _sync_api(self, node_labels: dict) -> bool:
        if self.kube is None:
            return True
        due = self._api_labels != node_labels or self.clock() - self._api_synced >= self.opts.api_resync
        if not due or self.clock() < self._api_retry_at:
            return True
        try:
            synced = labels_mod.sync_node_labels(self.kube, node_labels)
        except kube_mod.KubeError as e:
            self._api_labels = None  # try again, after a backoff
            self._api_failures += 1
            wait = min(2.0 ** (self._api_failures - 1), self.opts.api_resync)
            self._api_retry_at = self.clock() + wait
            self._kube_error(e, what="node labels", retry_in_s=wait)
            return False
        if self._api_said:
            self.log.info("kube.ok", node=self.kube.node, api=self.kube.base_url, after_failures=self._api_failures)
            self._api_said.clear()
        self._api_failures = 0
        self._api_retry_at = 0.0
        self._node_uid = synced.uid or self._node_uid
        self._api_labels = dict(node_labels)
        self._api_synced = self.clock()
        if synced.patch:
            self.log.info(
                "labels.patched",
                node=self.kube.node,
                labels={k: v for k, v in synced.patch.items() if v is not None},
                removed=synced.removed,
            )
        if synced.foreign and synced.foreign != self._foreign_said:
            self.log.warning(
                "labels.not_ours",
                node=self.kube.node,
                labels=synced.foreign,
                wanted={k: node_labels[k] for k in synced.foreign},
                note="set by somebody else: left as it is; remove it and the agent sets its own",
            )
        self._foreign_said = synced.foreign
        return True

    def _post(self, reason: str, message: str, type_: str = "Normal") -> None:
        if self.kube is None:
            return
        if reason == "RuntimeInstallFailed":
            if self._install_event_posted:
                return
            self._install_event_posted = True
        try:
            self.kube.post_event(reason, message, type_, self._node_uid)
            self.log.info("event.posted", reason=reason, node=self.kube.node)
        except kube_mod.KubeError as e:
            self._kube_error(e, what="node event", event_reason=reason)

    def nri_line(self, rec: dict) -> None:
        """The NRI plugin's own line (event "nri"): a Synchronize that keeps failing is said in
        the agent's log and as a Warning on the Node; synchronized again, said in the log."""
        state = rec.get("state")
        if state == "sync-failed":
            error = str(rec.get("error") or "")[:600]
            self.log.warning("nri.not_synchronized", failures=rec.get("failures"), error=error)
            self._post(
                "NRIPluginNotSynchronized",
                f"gpuhook's NRI plugin cannot register with the container runtime: {error}",
                "Warning",
            )
        elif state == "synchronized":
            self.log.info("nri.synchronized", failures=rec.get("failures"))

    def _kube_error(self, e, **kw) -> None:
        """Each kind of API error is logged once until the API works again (never a flood)."""
        if e.kind in self._api_said:
            return
        self._api_said.add(e.kind)
        self.log.warning(
            "kube.error",
            error=str(e),
            kind=e.kind,
            node=self.kube.node,
            note="the node's files do not wait for the API: said once, retried with backoff",
            **kw,
        )

    def _mark_ready(self) -> None:
        if self.ready or not self.runtime_ready:
            return
        self.ready = True
        if self.opts.ready_file:
            from ..fsutil import write_atomic

            try:
                os.makedirs(os.path.dirname(self.opts.ready_file) or ".", exist_ok=True)
                write_atomic(
                    self.opts.ready_file,
                    (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n").encode(),
                    0o644,
                    sync_dir=False,
                )
            except OSError as e:
                self.log.error("ready.error", error=str(e), file=self.opts.ready_file)
                self.ready = False
                return
        self.log.info("ready", file=self.opts.ready_file or None)

    def _start_watch(self) -> None:
        if not self.opts.udev:
            self.log.info("udev.off", fallback="periodic", interval=self.opts.interval)
            return
        watch = UdevWatch(self.notify, self.log, self.stop_event)
        try:
            watch.start()
        except Exception as e:  # no pyudev, no libudev, no netlink: the timer does it all
            self.log.warning(
                "udev.unavailable",
                error=f"{type(e).__name__}: {e}".strip(),
                fallback="periodic",
                interval=self.opts.interval,
            )
            return
        self.watch = watch
        self.log.info(
            "udev.watching", source=watch.source, subsystems=list(UDEV_SUBSYSTEMS), modules=sorted(UDEV_MODULES)
        )

    def _start_creates(self) -> None:
        """Follow the runtime's log for pod Events and metrics (podevents.py, metrics.py)."""
        consumers: list = []
        if self.opts.metrics_address:
            from .metrics import Metrics

            try:
                self.metrics = Metrics(self)
                self.metrics.serve(self.opts.metrics_address)
            except (OSError, ValueError) as e:
                self.log.error("metrics.error", address=self.opts.metrics_address, error=str(e))
                self.metrics = None
            else:
                consumers.append(self.metrics)
                self.log.info("metrics.serving", address=self.metrics.address)
        if self.kube is not None and self.opts.pod_events:
            from .podevents import PodReporter

            self.pod_reporter = PodReporter(self.kube, self.log, root=self.opts.root)
            consumers.append(self.pod_reporter)
        if consumers:
            consumers.append(_NRIState(self))
        path = self.opts.resolved_runtime_log() if consumers else ""
        if not path:
            return
        from .podevents import CreateFollower

        self.follower = CreateFollower(path, consumers, self.log)
        self.follower.start(self.stop_event)

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        o = self.opts
        self.log.info(
            "agent.start",
            root=o.root,
            spec_root=o.spec_root,
            interval=o.interval,
            debounce=o.debounce,
            cdi_dir=self.cdi_dir or None,
            nfd_dir=self.nfd_dir or None,
            install=o.install,
            api=self.kube.base_url if self.kube else None,
            node=self.kube.node if self.kube else None,
        )
        if o.install:
            self.install()
        if o.once:
            ok = self._guarded_sync("once")
            if ok:
                self._mark_ready()
            return 0 if ok and self.runtime_ready else 1
        self._start_watch()
        self._start_creates()
        self._start_nri()
        if self._guarded_sync("start"):
            self._mark_ready()
        next_at = self.clock() + o.interval
        while not self.stop_event.is_set():
            reason = self._wait(next_at)
            if reason is None:
                break
            if o.install and not self.runtime_ready:
                self.install()
            if self._guarded_sync(reason):
                self._mark_ready()
            next_at = self.clock() + o.interval
        self._shutdown()
        return 0

    def _guarded_sync(self, reason: str) -> bool:
        """A bug in one round must not end the agent: log it, try again next time."""
        try:
            return self.sync(reason)
        except Exception as e:
            self.log.exception("sync.error", reason=reason, error=f"{type(e).__name__}: {e}")
            return False

    def _start_nri(self) -> None:
        """The NRI plugin in its own process (nri.py), when the front is nri."""
        from ..probe.host import Host

        o = self.opts
        why = self.front_why if self.front != "nri" else None  # with nri, the Supervisor says it
        there = why is not None and os.path.lexists(Host(o.root).resolve(o.nri_socket))
        # something at the socket's path that is not the runtime's socket: a warning
        (self.log.warning if there else self.log.info)(
            "front", front=self.front, asked=o.front, socket=o.nri_socket, reason=why
        )
        if self.front != "nri":
            return
        self.nri = nri_mod.Supervisor(
            nri_mod.child_argv(o.root, o.nri_socket, o.nri_rootfs_template),
            self.log,
            lambda: nri_mod.socket_fact(o.root, o.nri_socket),
        )
        self.nri.start()

    def _shutdown(self) -> None:
        if self.nri is not None:
            self.nri.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.opts.ready_file:
            try:
                os.unlink(self.opts.ready_file)
            except OSError:
                pass
        self.log.info(
            "agent.stop",
            reason=getattr(self, "_stop_reason", "stop"),
            syncs=self.syncs,
            note="gpuhook stays installed: gpu-optional pods keep starting",
        )


class _NRIState:
    """A consumer of the runtime log's lines (podevents.CreateFollower) for the NRI plugin's
    own lines alone: handed to Agent.nri_line."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def handle(self, rec: dict) -> None:  # create lines: the other consumers'
        pass

    def handle_nri(self, rec: dict) -> None:
        self.agent.nri_line(rec)
