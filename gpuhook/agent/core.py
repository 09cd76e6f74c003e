"""`gpuhook agent`: the DaemonSet's long-running process on every node. The loop is here; what
wakes it is watch.py (udev, the debounce), where each probe goes is sinks.py (CDI specs, the
feature file, node labels, Events, /dev/char links), what it says of a probe summary.py.

    install (gpuhook.install) -> probe -> CDI specs + node labels (+ Events) -> ready file
    then: udev event (drm, kfd, accel; nvidia/amdgpu/i915/xe module load and unload)
          -> wait until `debounce` seconds pass without another -> probe -> refresh
          and every `interval` seconds anyway (NVIDIA nodes appear without udev events)

A probe that fails changes nothing. SIGTERM stops the agent after the step in progress; what
it installed stays, so the node keeps starting gpu-optional pods without it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from ..logline import bounded_warnings
from . import kube as kube_mod, labels as labels_mod, nri as nri_mod, podres, sinks, summary as summary_mod, watch
from .options import READY_FILE, Options, default_installer

__all__ = ["READY_FILE", "Agent", "Options", "default_installer"]


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
        self.debounce = watch.Debounce(opts.debounce, clock)
        self.stop_event = self.debounce.stopped
        self.runtime_ready = not opts.install
        self.install_error: str | None = None
        self.ready, self.syncs = False, 0
        self.summary: dict | None = None
        self.probe_errors = 0  # metrics.py
        self.last_probe = 0.0  # Unix time of the last successful probe
        # where each probe goes
        self.links = sinks.DevLinks(opts.root, self.log)
        self.cdi = sinks.CDISpecs(opts, self.log)
        self.nfd = sinks.FeatureFile(opts.resolved_nfd_dir(), self.log)
        self.events = sinks.Events(kube, self.log)
        self.labels = sinks.NodeLabels(kube, self.log, self.events, clock, opts.api_resync)
        self.ready_file = sinks.ReadyFile(opts.ready_file, self.log)
        self.gone = podres.GonePods(opts.root, self.log)  # the kubelet's gone pods, for share = "unallocated"
        # what runs beside the loop
        self.watch: watch.UdevWatch | None = None
        self.pod_reporter: Any = None
        self.metrics: Any = None
        self.follower: Any = None
        self.nri: Any = None  # the plugin's Supervisor (nri.py), when it runs
        self.front, self.front_why = nri_mod.choose(opts.front, opts.root, opts.nri_socket)
        self.installer = installer if installer is not None else default_installer(opts, self.log, self.front)

    # -- events --------------------------------------------------------------------
    def notify(self, reason: str) -> None:
        """Something may have changed: re-probe once things are quiet for `debounce`."""
        self.debounce.notify(reason)

    def stop(self, why: str = "stop") -> None:
        self._stop_reason = why
        self.debounce.stop()

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
            self.events.post("RuntimeInstallFailed", f"gpuhook install failed: {self.install_error}", "Warning")
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

        key = probe_cache.fingerprint(self.opts.root, self.opts.nvidia_driver_root)  # before: a change then invalidates
        try:
            inv = self.probe(self.opts.root)
        except Exception as e:  # the probe never raises by design; if it does, change nothing
            self.log.error("probe.error", reason=reason, error=f"{type(e).__name__}: {e}")
            self.probe_errors += 1
            return False
        self.last_probe = time.time()
        # creates on this node use it until the next probe is due (probe/cache.py): never a cold probe
        probe_cache.store(self.opts.root, cache_dir(), inv, key, valid_for=2 * self.opts.interval + self.opts.debounce)
        summary = summary_mod.summarize(inv)
        change = None if self.summary is None else summary_mod.diff(self.summary, summary)
        changed = change is None or any(change.values())
        self.summary = summary
        common = {"vendors": [v.vendor for v in inv.vendors if v.devices], "devices": sorted(summary["devices"]),
                  "driver_version": summary["drivers"]}  # fmt: skip
        described, warnings = summary_mod.describe(inv), list(bounded_warnings(inv.warnings))
        if change is None:
            ms = round((time.monotonic() - t0) * 1000, 1)
            self.log.info("inventory", reason=reason, message=described, **common, warnings=warnings, duration_ms=ms)
        elif changed:
            self.log.info(
                "inventory.changed",
                reason=reason,
                message=described,
                **common,
                added=change["added"],
                removed=change["removed"],
                driver_changes=change["driver_version"],
                warnings=warnings,
            )
        else:
            self.log.debug("inventory.same", reason=reason)
        self.links.write(inv)
        node_labels = labels_mod.node_labels(inv, self.runtime_ready, self.opts.resolved_vendor_label())
        ok = self.cdi.write(inv) & self.nfd.write(node_labels)  # both written, whatever the first did
        self.labels.sync(node_labels)  # the API being away is logged and retried, never "not ready"
        self.gone.update()
        for event, message, type_ in summary_mod.events(inv, summary, change) if changed else ():
            if event == "GPUUnusable":
                self.log.warning("inventory.unusable", vendors=summary["unusable"])
            self.events.post(event, message, type_)
        return ok

    def _mark_ready(self) -> None:
        if self.ready or not self.runtime_ready:
            return
        self.ready = self.ready_file.write()

    def _start_watch(self) -> None:
        if not self.opts.udev:
            self.log.info("udev.off", fallback="periodic", interval=self.opts.interval)
            return
        udev = watch.UdevWatch(self.notify, self.log, self.stop_event)
        try:
            udev.start()
        except Exception as e:  # no pyudev, no libudev, no netlink: the timer does it all
            self.log.warning(
                "udev.unavailable",
                error=f"{type(e).__name__}: {e}".strip(),
                fallback="periodic",
                interval=self.opts.interval,
            )
            return
        self.watch = udev
        self.log.info(
            "udev.watching",
            source=udev.source,
            subsystems=list(watch.UDEV_SUBSYSTEMS),
            modules=sorted(watch.UDEV_MODULES),
        )

    def _start_creates(self) -> None:
        """Follow the runtime's log (follow.py) for pod Events and metrics (podevents.py, metrics.py)."""
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
        path = self.opts.resolved_runtime_log() if consumers else ""
        if not path:
            return
        from .follow import CreateFollower

        consumers.append(sinks.NRIState(self.events, self.log))
        self.follower = CreateFollower(path, consumers, self.log, position_file=self.opts.resolved_log_position())
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
            cdi_dir=self.cdi.dir or None,
            nfd_dir=self.nfd.dir or None,
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
            reason = self.debounce.wait(next_at)
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
        self.ready_file.remove()
        self.log.info(
            "agent.stop",
            reason=getattr(self, "_stop_reason", "stop"),
            syncs=self.syncs,
            note="gpuhook stays installed: gpu-optional pods keep starting",
        )
