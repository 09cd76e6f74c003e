"""Prometheus metrics of the node agent (`gpuhook agent --metrics-address 127.0.0.1:9402`).

Off unless asked for. The runtime's creates come from its log (follow.CreateFollower:
the runtime itself never serves or counts anything); the rest is read from the agent's state
when Prometheus scrapes:

    gpuhook_container_creates_total{decision,vendor,front}   creates seen in the runtime's log
                                                       (front: nri, or wrapper: gpuhook.log.front_of)
    gpuhook_create_duration_seconds{decision}          histogram of the runtime's own time per create
    gpuhook_devices{vendor}                            devices the last probe found
    gpuhook_vendor_unusable{vendor}                    1: devices there, userspace missing
    gpuhook_runtime_installed                          1 when the gpu-optional handler is installed
    gpuhook_install_errors                             1 while the last install failed
    gpuhook_probe_errors_total                         probes that failed
    gpuhook_last_probe_timestamp_seconds               Unix time of the last successful probe
    gpuhook_front{front}                               1 for the front the agent chose (--front)
    gpuhook_nri_plugin_up                              1 while the NRI plugin's process runs (front nri)
    gpuhook_nri_plugin_restarts_total                  times it was started again after it exited
    gpuhook_nri_sync_failing                           1 from the plugin's "sync-failed" line (the runtime
                                                       closes it before its Synchronize is whole: it is
                                                       not registered) to its "synchronized" line

A create the NRI plugin could not give its GPUs is counted under its decision: "late" (the
runtime made it without the plugin's answer), "missed" (created while the plugin was not
registered), "unconfirmed" (the runtime never said).

prometheus_client is imported only here, i.e. only when metrics are on.
"""

from __future__ import annotations

DEFAULT_PORT = 9402
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def parse_address(text: str) -> tuple[str, int]:
    """host:port, [v6]:port, or :port (every interface: say so on purpose). A bare host
    gets DEFAULT_PORT."""
    host, sep, port = text.rpartition(":")
    if not sep or "]" in port:
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"--metrics-address {text!r}: not host:port")
    return host or "0.0.0.0", int(port)


class Metrics:
    def __init__(self, agent):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.agent = agent
        self.registry = CollectorRegistry(auto_describe=True)
        self.creates = Counter(
            "gpuhook_container_creates",
            "Container creates gpuhook-runtime logged",
            ["decision", "vendor", "front"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpuhook_create_duration_seconds",
            "gpuhook-runtime's own time per create",
            ["decision"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.nri_sync_failing = Gauge(
            "gpuhook_nri_sync_failing",
            "1 while gpuhook's NRI plugin is closed by the runtime before its Synchronize is whole (not registered)",
            registry=self.registry,
        )
        self.registry.register(_AgentState(agent))
        self.server = None
        self.address = None

    def handle(self, rec: dict) -> None:
        from ..logline import CreateRecord

        r = CreateRecord.read(rec)
        if r is None:
            return
        decision = (r.decision or "unknown")[:32]
        vendor = ",".join(v[:16] for v in r.vendors[:5]) or "none"
        self.creates.labels(decision, vendor, r.front[:16]).inc()
        if r.duration_ms is not None and 0 <= r.duration_ms < 3.6e6:
            self.duration.labels(decision).observe(r.duration_ms / 1000)

    def handle_nri(self, rec: dict) -> None:
        """The NRI plugin's own line (event "nri")."""
        state = rec.get("state")
        if state in ("sync-failed", "synchronized"):
            self.nri_sync_failing.set(1 if state == "sync-failed" else 0)

    def serve(self, address: str) -> None:
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        self.server, _ = start_http_server(port, host, registry=self.registry)
        bound = self.server.server_address
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _AgentState:
    """What the agent knows now, at scrape time."""

    def __init__(self, agent):
        self.agent = agent

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self.agent
        summary = a.summary or {"devices": {}, "unusable": {}}
        devices = GaugeMetricFamily("gpuhook_devices", "Devices the last probe found", labels=["vendor"])
        per: dict[str, int] = {}
        for key in summary["devices"]:
            v = key.partition(":")[0]
            per[v] = per.get(v, 0) + 1
        for v, n in sorted(per.items()):
            devices.add_metric([v], n)
        yield devices
        unusable = GaugeMetricFamily(
            "gpuhook_vendor_unusable",
            "1: the vendor's devices are there, its userspace is not (gpu-optional containers get none of them)",
            labels=["vendor"],
        )
        for v in sorted(summary.get("unusable") or {}):
            unusable.add_metric([v], 1)
        yield unusable
        yield GaugeMetricFamily(
            "gpuhook_runtime_installed",
            "1 when the gpu-optional runtime handler is installed",
            value=1 if a.runtime_ready else 0,
        )
        yield GaugeMetricFamily(
            "gpuhook_install_errors", "1 while the last gpuhook install failed", value=1 if a.install_error else 0
        )
        yield CounterMetricFamily("gpuhook_probe_errors", "Probes that failed", value=a.probe_errors)
        front = GaugeMetricFamily("gpuhook_front", "1 for the front the agent chose (--front)", labels=["front"])
        front.add_metric([a.front], 1)
        yield front
        if a.nri is not None:
            yield GaugeMetricFamily(
                "gpuhook_nri_plugin_up", "1 while the NRI plugin's process runs", value=1 if a.nri.up else 0
            )
            yield CounterMetricFamily(
                "gpuhook_nri_plugin_restarts",
                "Times the NRI plugin was started again after it exited",
                value=max(a.nri.starts - 1, 0),
            )
        if a.last_probe:
            yield GaugeMetricFamily(
                "gpuhook_last_probe_timestamp_seconds", "Unix time of the last successful probe", value=a.last_probe
            )
