"""The agent's parts alone, without the loop (agent/core.py, tested whole in test_agent.py):
what wakes it (agent/watch.py Debounce) and where each probe goes (agent/sinks.py)."""

from __future__ import annotations

import os
import threading
import time

from gpuhook.agent import kubeclient, labels as labels_mod, sinks, watch


class Log:
    """gpuhook.log's interface, the records kept: [(level, event, fields)]."""

    def __init__(self):
        self.records: list[tuple[str, str, dict]] = []

    def __getattr__(self, level):
        return lambda event, **kw: self.records.append((level, event, kw))

    def events(self, level=None) -> list[str]:
        return [e for lv, e, _ in self.records if level is None or lv == level]


class Kube:
    """The API as sinks see it: post_event, a node name and a URL; events posted kept; each
    call raises the next error of `fail` while there is one."""

    node, base_url = "node-1", "https://127.0.0.1:6443"

    def __init__(self, fail=()):
        self.fail = list(fail)
        self.posted: list[tuple] = []

    def post_event(self, reason, message, type_, uid):
        if self.fail:
            raise self.fail.pop(0)
        self.posted.append((reason, type_, uid))


# -- Debounce ----------------------------------------------------------------------------


def test_debounce_gathers_reasons_until_they_stop_coming():
    d = watch.Debounce(0.05, time.monotonic)
    for r in ("a", "b", "a"):
        d.notify(r)
    t0 = time.monotonic()
    assert d.wait(time.monotonic() + 60) == "a, b"  # each once, in order
    assert time.monotonic() - t0 >= 0.04
    for i in range(7):
        d.notify(f"r{i}")
    assert d.wait(time.monotonic() + 60) == "r0, r1, r2, r3, r4 (+2)"


def test_debounce_says_timer_at_the_deadline_and_none_once_stopped():
    d = watch.Debounce(0.05, time.monotonic)
    assert d.wait(time.monotonic() + 0.05) == "timer"
    threading.Timer(0.05, d.stop).start()
    assert d.wait(time.monotonic() + 60) is None and d.stopped.is_set()
    d.notify("late")
    assert d.wait(time.monotonic() + 60) is None


def test_debounce_waits_at_most_ten_quiet_times_after_the_first_event():
    d = watch.Debounce(0.02, time.monotonic)
    stop = threading.Event()

    def chatter():  # an event every 5 ms, for longer than 10 x 20 ms
        while not stop.wait(0.005):
            d.notify("udev")

    threading.Thread(target=chatter, daemon=True).start()
    try:
        t0 = time.monotonic()
        time.sleep(0.01)
        assert d.wait(time.monotonic() + 60) == "udev"
        assert time.monotonic() - t0 < 2.0
    finally:
        stop.set()


# -- Events and NodeLabels ----------------------------------------------------------------


def test_events_post_with_the_nodes_uid_and_the_failed_install_once():
    log, kube = Log(), Kube()
    ev = sinks.Events(kube, log)
    ev.node_uid = "uid-1"
    ev.post("GPUInventory", "2 GPUs")
    ev.post("RuntimeInstallFailed", "no containerd", "Warning")
    ev.post("RuntimeInstallFailed", "no containerd", "Warning")
    assert kube.posted == [("GPUInventory", "Normal", "uid-1"), ("RuntimeInstallFailed", "Warning", "uid-1")]
    sinks.Events(None, log).post("GPUInventory", "no API: nothing")  # no kube: a no-op


def test_api_errors_are_said_once_per_kind_until_the_api_works_again():
    log = Log()
    down = kubeclient.KubeError("connection refused")
    kube = Kube(fail=[down, down, kubeclient.KubeError("forbidden", 403)])
    ev = sinks.Events(kube, log)
    for _ in range(3):
        ev.post("GPUInventory", "x")
    assert log.events("warning") == ["kube.error", "kube.error"]  # unreachable once, http-403 once
    ev.recovered(3)
    ev.recovered(0)
    assert log.events("info").count("kube.ok") == 1 and ev.said == set()


def test_node_labels_back_off_after_a_failure_and_patch_again_when_due(monkeypatch):
    now = [100.0]
    calls = []

    def sync(api, labels):
        calls.append(dict(labels))
        if len(calls) <= 2:
            raise kubeclient.KubeError("down")
        return labels_mod.NodeSync(patch=dict(labels), removed=[], uid="uid-9", foreign={})

    monkeypatch.setattr(labels_mod, "sync_node_labels", sync)
    log = Log()
    ev = sinks.Events(Kube(), log)
    nl = sinks.NodeLabels(ev.kube, log, ev, lambda: now[0], resync=300.0)
    want = {"gpuhook.dev/accelerator": "nvidia"}
    assert nl.sync(want) is False and nl.backoff.due == 101.0  # 1 s
    assert nl.sync(want) is True and len(calls) == 1  # within the backoff: not tried
    now[0] = 101.0
    assert nl.sync(want) is False and nl.backoff.due == 103.0  # then 2 s
    now[0] = 103.0
    assert nl.sync(want) is True and len(calls) == 3 and ev.node_uid == "uid-9" and nl.backoff.failures == 0
    assert "labels.patched" in log.events("info") and "kube.ok" in log.events("info")
    assert nl.sync(want) is True and len(calls) == 3  # the same labels, not due
    now[0] = 403.0
    assert nl.sync(want) is True and len(calls) == 4  # resync
    assert nl.sync({**want, "gpuhook.dev/gpu.count": "1"}) is True and len(calls) == 5  # changed
    assert sinks.NodeLabels(None, log, ev, lambda: 0.0, 300.0).sync(want) is True  # no API


# -- the files ------------------------------------------------------------------------------


def test_feature_file_written_when_changed_and_off_with_no_dir(tmp_path):
    log = Log()
    nfd = sinks.FeatureFile(str(tmp_path / "nfd"), log)
    assert nfd.write({"gpuhook.dev/accelerator": "amd"}) is True
    assert (tmp_path / "nfd" / labels_mod.NFD_FILE).read_text().strip().endswith("gpuhook.dev/accelerator=amd")
    assert nfd.write({"gpuhook.dev/accelerator": "amd"}) is True and log.events("info") == ["labels.written"]
    assert sinks.FeatureFile("", log).write({"x": "y"}) is True
    (tmp_path / "file").write_text("")
    assert sinks.FeatureFile(str(tmp_path / "file" / "nfd"), log).write({"x": "y"}) is False
    assert log.events("error") == ["labels.error"]


def test_ready_file_written_then_removed(tmp_path):
    log = Log()
    ready = sinks.ReadyFile(str(tmp_path / "run" / "ready"), log)
    assert ready.write() is True and (tmp_path / "run" / "ready").read_text().endswith("Z\n")
    ready.remove()
    assert not (tmp_path / "run" / "ready").exists()
    ready.remove()  # gone already: nothing to say
    (tmp_path / "file").write_text("")
    assert sinks.ReadyFile(str(tmp_path / "file" / "ready"), log).write() is False
    assert log.events("error") == ["ready.error"]
    assert sinks.ReadyFile("", log).write() is True and not os.path.exists("")
