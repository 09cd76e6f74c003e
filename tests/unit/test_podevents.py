"""Which pods really got a GPU: the agent follows the runtime's log and posts pod Events
(GPUsInjected / RanOnCPU, aggregated, rate-limited), sets the pod label
gpuhook.dev/accelerator, and serves Prometheus metrics. The API is a fake one on 127.0.0.1
(fakes.kubeapi.FakeAPI); end to end, the log comes from real creates through CRI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO, create_line as create, needs_cri, wrapper_path
from fakes.front import prime
from gpuhook.agent import core as agent_mod
from gpuhook import log
from gpuhook.agent import events, follow, podevents, sinks



class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_what_each_create_says():
    assert events.event_for(create()) == (
        "GPUsInjected", "Normal", "container app got 2 GPU device(s): nvidia x2: nvidia:GPU-0, nvidia:GPU-1", "nvidia")
    assert events.event_for(create("no-gpu")) == ("RanOnCPU", "Normal",
                                                    "container app runs without a GPU: CPU-only node", "cpu")
    why = 'all 8 GPU(s) held back: allocated by the kubelet to other pods (share = "unallocated")'
    assert events.event_for(create("declined", reason=why))[2] == f"container app runs without a GPU: {why}"
    reason, type_, msg, _ = events.event_for(create("error", error="config.json is not valid JSON"))
    assert (reason, type_) == ("RanOnCPU", "Warning") and "gpuhook failed (config.json is not valid JSON)" in msg
    assert events.event_for(create("sandbox")) is None


def test_events_labels_and_aggregation(fake_api, logs):
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    api.add_pod("ml", "cpu-job", "uid-cpu-job")
    r = podevents.PodReporter(api.client(), log.get())
    r.handle(create())
    r.handle(create("no-gpu", pod="cpu-job", uid="uid-cpu-job"))
    gpu, cpu = api.pod_events()
    assert gpu["reason"] == "GPUsInjected" and gpu["type"] == "Normal"
    assert gpu["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "trainer-0",
                                     "uid": "uid-trainer-0", "fieldPath": "spec.containers{app}"}
    assert gpu["metadata"]["namespace"] == "ml" and gpu["reportingInstance"] == "node-1"
    assert gpu["reportingComponent"] == "gpuhook.dev/agent" and gpu["count"] == 1
    assert "nvidia:GPU-0, nvidia:GPU-1" in gpu["message"]
    assert cpu["reason"] == "RanOnCPU" and "CPU-only node" in cpu["message"]
    assert api.pods[("ml", "trainer-0")]["metadata"]["labels"] == {"app": "trainer-0", "gpuhook.dev/accelerator": "nvidia"}
    assert api.pods[("ml", "cpu-job")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "cpu"
    # a restarting container: the same Event, count and series, and no new label patch
    patches = sum(1 for m, p, *_ in api.requests if m == "PATCH" and "/pods/" in p)
    r.handle(create())
    r.handle(create())
    assert len(api.pod_events()) == 2
    (gpu, _) = api.pod_events()
    assert gpu["count"] == 3 and gpu["series"]["count"] == 3 and gpu["series"]["lastObservedTime"].endswith("Z")
    assert sum(1 for m, p, *_ in api.requests if m == "PATCH" and "/pods/" in p) == patches
    assert sum(1 for m, p, *_ in api.requests if m == "GET" and "/pods/" in p) == 2  # each pod checked once


def test_lines_that_name_another_pod_are_not_trusted(fake_api, logs):
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0", node="node-2")  # another node's pod
    api.add_pod("kube-system", "coredns", "uid-real")
    r = podevents.PodReporter(api.client(), log.get())
    r.handle(create())
    r.handle(create(ns="kube-system", pod="coredns", uid="uid-forged"))
    r.handle(create(ns="../../nodes", pod="node-1"))  # never put in a URL
    r.handle(create(ns="ml", pod="x" * 300))
    r.handle({k: v for k, v in create().items() if not k.startswith("pod_")})  # docker, podman: no pod
    assert api.pod_events() == [] and all(not p.startswith("/api/v1/namespaces/..") for _, p, *_ in api.requests)
    assert all("gpuhook.dev/accelerator" not in pod["metadata"]["labels"] for pod in api.pods.values())
    skipped = [x for x in logs() if x["event"] == "pod.skipped"]
    assert len(skipped) == 3 and "not this node's pod" in skipped[0]["why"]



def test_a_static_pods_line_is_reported_on_its_mirror_pod(fake_api, logs):
    """A static pod's containers carry the kubelet's UID for it (its manifest's hash), which is
    not its mirror pod's in the API: the mirror pod (kubernetes.io/config.mirror = that hash)
    gets the Event, with its own UID, and the label. A pod of that name that is no mirror of
    that UID is still refused."""
    api = fake_api()
    r = podevents.PodReporter(api.client(), log.get())
    static = "6f1d2e3c4b5a69788796a5b4c3d2e1f0"  # the kubelet's: an md5 of the manifest
    mirror = api.add_pod("kube-system", "infer-node-1", "uid-mirror")
    mirror["metadata"]["annotations"] = {podevents.MIRROR: static, "kubernetes.io/config.hash": static}
    r.handle(create(pod="infer-node-1", ns="kube-system", uid=static))
    (event,) = api.pod_events()
    assert event["involvedObject"]["uid"] == "uid-mirror" and event["reason"] == "GPUsInjected"
    assert mirror["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia"
    other = api.add_pod("kube-system", "not-a-mirror", "uid-other")
    other["metadata"]["annotations"] = {podevents.MIRROR: "another-hash"}
    r.handle(create(pod="not-a-mirror", ns="kube-system", uid=static))
    assert len(api.pod_events()) == 1 and "gpuhook.dev/accelerator" not in other["metadata"]["labels"]
    assert any(x["event"] == "pod.skipped" for x in logs())

def test_rate_limit_drops_and_counts(fake_api, logs):
    api = fake_api()
    clock = Clock()
    r = podevents.PodReporter(api.client(), log.get(), clock=clock, burst=3, rate=0.5)
    for i in range(6):
        api.add_pod("ml", f"p{i}", f"uid-{i}")
        r.handle(create(pod=f"p{i}", uid=f"uid-{i}"))
    assert len(api.pod_events()) == 3 and r.dropped == 3
    assert [x["event"] for x in logs()].count("event.ratelimited") == 1
    clock.t += 2  # one token back
    api.add_pod("ml", "late", "uid-late")
    r.handle(create(pod="late", uid="uid-late"))
    assert len(api.pod_events()) == 4


def test_api_errors_are_logged_once_and_retried_with_backoff(fake_api, logs):
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    clock = Clock()
    r = podevents.PodReporter(api.client(), log.get(), clock=clock, backoff=1.0)
    api.fail_next = [503, 503]
    r.handle(create())
    assert api.pod_events() == [] and len(r.queue.jobs) == 1
    clock.t += 0.5
    r.tick()
    assert len(api.requests) == 1  # not due yet
    clock.t += 0.6
    r.tick()  # second 503: backoff doubles
    assert r.queue.backoff.due == pytest.approx(clock.t + 2.0)
    clock.t += 2.1
    r.tick()
    assert len(api.pod_events()) == 1 and not r.queue.jobs
    errors = [x for x in logs() if x["event"] == "kube.error"]
    assert len(errors) == 1 and "503" in errors[0]["error"]
    assert [x["failures"] for x in logs() if x["event"] == "kube.retry"] == [1, 2]
    assert [x["after_failures"] for x in logs() if x["event"] == "kube.ok"] == [2]
    # an unreachable API: said once, one try per backoff however many creates come
    down = podevents.PodReporter(_dead_client(), log.get())
    for _ in range(3):
        down.handle(create())
    assert [x["event"] for x in logs()].count("kube.error") == 2
    assert down.queue.attempts == 1 and len(down.queue.jobs) == 3


class Outage:
    """The API client, away while `down` (no answer at all, as a connection refused)."""

    def __init__(self, client):
        self.client, self.down, self.node = client, False, client.node

    def __getattr__(self, name):
        fn = getattr(self.client, name)

        def call(*a, **kw):
            if self.down:
                from gpuhook.agent import kubeclient

                raise kubeclient.KubeError(f"{name}: [Errno 111] Connection refused")
            return fn(*a, **kw)

        return call


def test_an_api_away_for_a_while_costs_a_try_per_backoff_and_every_create_is_reported_after(fake_api, logs):
    """The creates of an outage wait (they were once dropped after 4 tries, ~15 s): one try
    per backoff (1, 2, 4... s, at most 30), then every Event and label once the API is back,
    oldest first, a restarted container's Event patched (count 2), not posted twice."""
    api = fake_api()
    for i in range(3):
        api.add_pod("ml", f"p{i}", f"uid-{i}")
    clock = Clock()
    kube = Outage(api.client())
    r = podevents.PodReporter(kube, log.get(), clock=clock)
    r.handle(create(pod="p0", uid="uid-0"))
    kube.down = True
    started = clock.t
    for second in range(300):  # five minutes away: a create now and then, ticks 4 times a second
        if second % 20 == 0:
            r.handle(create(pod=f"p{second // 20 % 3}", uid=f"uid-{second // 20 % 3}"))
        for _ in range(4):
            clock.t += 0.25
            r.tick()
    tries = r.queue.attempts - 1  # the first create's (it worked)
    assert 10 <= tries <= 16, tries  # 1+2+4+8+16 s, then every 30 s: not a try per tick nor per create
    assert len(r.queue.jobs) == 15 and r.queue.lost == 0
    assert clock.t - started == pytest.approx(300)
    kube.down = False
    clock.t += 30
    r.tick()
    assert not r.queue.jobs
    by_pod = {e["involvedObject"]["name"]: e["count"] for e in api.pod_events()}
    assert by_pod == {"p0": 6, "p1": 5, "p2": 5}, by_pod
    assert all(p["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia" for p in api.pods.values())
    assert [x["event"] for x in logs()].count("kube.error") == 1
    assert len([x for x in logs() if x["event"] == "kube.retry"]) == tries


def test_a_label_patch_that_failed_is_retried_without_a_second_event(fake_api, logs):
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    clock = Clock()
    r = podevents.PodReporter(api.client(), log.get(), clock=clock)
    r.handle(create("no-gpu", pod="warm", uid="uid-warm"))  # (not this node's pod: its GET is the first)
    api.fail_next = []
    orig = r.kube.patch_pod_labels
    fails = [1]

    def patch(*a, **kw):
        if fails:
            fails.pop()
            from gpuhook.agent import kubeclient

            raise kubeclient.KubeError("PATCH: HTTP 503", 503)
        return orig(*a, **kw)

    r.kube.patch_pod_labels = patch
    r.handle(create())
    assert len(api.pod_events()) == 1 and len(r.queue.jobs) == 1
    clock.t += 1.5
    r.tick()
    (event,) = api.pod_events()
    assert event["count"] == 1 and api.pods[("ml", "trainer-0")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia"


def _dead_client():
    from gpuhook.agent import kube

    return kube.KubeAPI("http://127.0.0.1:9", "t", "node-1", timeout=1.0)  # discard port: nothing listens


def test_the_follower_reads_appended_lines_and_survives_rotation(tmp_path, logs):
    path = tmp_path / "gpuhook.log"
    path.write_text(json.dumps(create(pod="old")) + "\n")
    seen = []

    class C:
        def handle(self, rec):
            seen.append(rec["pod_name"])

    f = follow.CreateFollower(str(path), [C()], log.get())
    assert f.read_new(first=True) == 0  # what was there before the agent started is not replayed
    with open(path, "a") as out:
        out.write(json.dumps(create(pod="a")) + "\ngarbage\n" + json.dumps({"event": "other"}) + "\n")
        out.write(json.dumps(create(pod="b"))[:20])  # a line being written
    assert f.read_new() == 1 and seen == ["a"]
    with open(path, "a") as out:
        out.write(json.dumps(create(pod="b"))[20:] + "\n")
    assert f.read_new() == 1 and seen == ["a", "b"]
    os.rename(path, tmp_path / "gpuhook.log.1")  # logrotate
    path.write_text(json.dumps(create(pod="c")) + "\n")
    assert f.read_new() == 1 and seen == ["a", "b", "c"]


def test_a_hook_line_becomes_a_warning_on_its_containers_pod(tmp_path, fake_api, logs):
    """gpuhook-hook's line (event hook: ldconfig timed out) after an "injected" create: the
    follower hands it to the reporter, which posts LdCacheNotUpdated on the pod of that
    container (known from its create line) and leaves the pod's label as it was. A hook line
    of a container the agent never saw created says nothing; the metrics never see hook lines."""
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    r = podevents.PodReporter(api.client(), log.get())
    counted = []

    class Metrics:
        def handle(self, rec):
            counted.append(rec["event"])

    path = tmp_path / "gpuhook.log"
    path.write_text("")
    f = follow.CreateFollower(str(path), [r, Metrics()], log.get())
    f.read_new(first=True)
    hook_line = {"time": "2026-01-01T00:00:30.000Z", "event": "hook", "kind": "ldcache", "container_id": "c" * 64,
                 "outcome": "timeout", "error": "ldconfig in /b/rootfs took over 25 s: stopped; driver libraries "
                 "need LD_LIBRARY_PATH"}
    with open(path, "a") as out:
        out.write(json.dumps(create()) + "\n" + json.dumps(hook_line) + "\n")
        out.write(json.dumps({**hook_line, "container_id": "unknown"}) + "\n")
    assert f.read_new() == 1 and counted == ["create"]
    injected, warning = api.pod_events()
    assert injected["reason"] == "GPUsInjected"
    assert (warning["reason"], warning["type"]) == ("LdCacheNotUpdated", "Warning")
    assert warning["involvedObject"]["name"] == "trainer-0" and warning["involvedObject"]["fieldPath"] == "spec.containers{app}"
    assert "ld cache update timeout" in warning["message"] and "LD_LIBRARY_PATH" in warning["message"]
    assert api.pods[("ml", "trainer-0")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia"


# -- end to end: real creates through CRI, the agent, a fake API ------------------------------------

@needs_cri
def test_cri_creates_become_pod_events_and_metrics(make_host, runtime, containerd, cri_stubs, tmp_path, fake_api, logs):
    """containerd (CRI) runs gpu-optional pods through gpuhook-runtime, first on a fake 8-GPU
    NVIDIA host, then (the node config pointed elsewhere) on a CPU-only host. The agent,
    following the runtime's log, posts GPUsInjected on the first pod and RanOnCPU on the
    second, labels both, and its metrics endpoint counts the creates."""
    import cri_client
    from containerd_harness import IMAGE_NAME
    from kubelet import HANDLER, Kubelet

    gpu_host, cpu_host = make_host("nvidia", mknod=True), make_host("cpu", mknod=True)
    rt = runtime(gpu_host)
    ctd = containerd(rt, cri=True, runtimes={HANDLER: {"binary": wrapper_path(), "pod_annotations": ["gpuhook.dev/*"]}})
    client = cri_client.CRIClient(ctd.address, cri_stubs)
    ctd.before_stop(client.close)
    ctd.before_stop(client.remove_all)
    client.wait_image(IMAGE_NAME)
    k = Kubelet(ctd, client, tmp_path)

    api = fake_api()
    from gpuhook.probe import probe

    # the agent's root is this machine's / (where containerd's bundles are); it probes the fake GPU host
    agent = agent_mod.Agent(agent_mod.Options(root="/", interval=60, install=False, udev=False,
                                              cdi_dir="", nfd_dir="", ready_file="", runtime_log=rt.log,
                                              metrics_address="127.0.0.1:0"),
                            kube=api.client(), log=log.get(), probe=lambda _root: probe(gpu_host))
    import threading

    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while agent.metrics is None or agent.follower is None or not agent.last_probe:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        url = f"http://{agent.metrics.address}/metrics"
        before = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'gpuhook_devices{vendor="nvidia"} 8.0' in before
        assert "gpuhook_container_creates_total{" not in before

        for name, host in (("gpu-pod", gpu_host), ("cpu-pod", cpu_host)):
            text = open(rt.config).read().splitlines()
            text[0] = f'host_root = "{host}"'
            open(rt.config, "w").write("\n".join(text) + "\n")
            prime(rt.config, rt.env["GPUHOOK_CACHE_DIR"])  # as a Python run leaves it for the front
            pod_id, config = k.run_pod(name)
            api.add_pod("default", name, f"uid-{name}")
            # (it lives a second: on a node with no GPU node the agent reads the pod from its bundle)
            status, out = k.run_to_completion(pod_id, config, "app", "echo accel=${GPUHOOK_ACCELERATOR:-none}; sleep 1")
            assert status.exit_code == 0 and f"accel={'nvidia' if name == 'gpu-pod' else 'none'}" in out, out

        def events():
            return {e["involvedObject"]["name"]: e for e in api.pod_events()}
        while len(events()) < 2:
            assert time.monotonic() < deadline + 30, (api.pod_events(), [x for x in logs() if "pod" in x["event"]])
            time.sleep(0.1)
        ev = events()
        assert ev["gpu-pod"]["reason"] == "GPUsInjected" and "got 8 GPU device(s): nvidia x8" in ev["gpu-pod"]["message"]
        assert ev["gpu-pod"]["involvedObject"]["uid"] == "uid-gpu-pod"
        assert ev["cpu-pod"]["reason"] == "RanOnCPU" and "CPU-only node" in ev["cpu-pod"]["message"]
        assert api.pods[("default", "gpu-pod")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "nvidia"
        assert api.pods[("default", "cpu-pod")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "cpu"
        # the sandboxes went through the handler too: counted, but no Event (on the CPU-only
        # host the front logs the sandbox as no-gpu: it reads no spec)
        after = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'gpuhook_container_creates_total{decision="injected",front="wrapper",vendor="nvidia"} 1.0' in after
        assert 'gpuhook_container_creates_total{decision="no-gpu",front="wrapper",vendor="none"} 2.0' in after
        assert 'gpuhook_container_creates_total{decision="sandbox",front="wrapper",vendor="none"} 1.0' in after
        assert len(api.pod_events()) == 2
        assert 'gpuhook_create_duration_seconds_count{decision="injected"} 1.0' in after
        assert "gpuhook_runtime_installed 1.0" in after and "gpuhook_last_probe_timestamp_seconds" in after
    finally:
        agent.stop("test")
        thread.join(15)


def test_metrics_endpoint_counts_creates(tmp_path, make_host):
    """`gpuhook agent --metrics-address` as a process; curl sees the counters move when the
    runtime's log gets create lines."""
    import shutil
    import socket

    root = make_host("nvidia", mknod=False, gpus=2, libs=False)
    runtime_log = tmp_path / "gpuhook.log"
    runtime_log.write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "gpuhook", "agent", "--root", root, "--no-install", "--no-udev",
                          "--cdi-dir", "", "--nfd-dir", "", "--ready-file", "", "--log-format", "json",
                          "--runtime-log", str(runtime_log), "--metrics-address", f"127.0.0.1:{port}"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, GPUHOOK_CONFIG="/nonexistent/gpuhook.toml"))
    curl = shutil.which("curl")

    def scrape() -> str:
        if curl:
            return subprocess.run([curl, "-sf", f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True,
                                  timeout=10).stdout
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            return ""
    try:
        deadline = time.monotonic() + 30
        while 'gpuhook_devices{vendor="nvidia"} 2.0' not in scrape():
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.1)
        with open(runtime_log, "a") as f:
            for i in range(3):
                f.write(json.dumps(create(duration_ms=30 + i)) + "\n")
            f.write(json.dumps(create("no-gpu")) + "\n")
        want = 'gpuhook_container_creates_total{decision="injected",front="wrapper",vendor="nvidia"} 3.0'
        while want not in scrape():
            assert time.monotonic() < deadline, scrape()
            time.sleep(0.1)
        out = scrape()
        assert 'gpuhook_container_creates_total{decision="no-gpu",front="wrapper",vendor="none"} 1.0' in out
        assert 'gpuhook_create_duration_seconds_bucket{decision="injected",le="0.05"} 3.0' in out
        assert "gpuhook_probe_errors_total 0.0" in out
    finally:
        p.terminate()
        p.wait(15)


# -- a line's pod, the budgets, memory (issue 26.3, 26.6) --------------------------------------------

def test_a_pod_is_trusted_only_as_the_namespace_name_and_uid_checked_together(fake_api, logs):
    """After ml/trainer-0 was checked, a line with its uid but kube-system/etcd-node-2 (a pod of
    another node) is looked up again and refused: no Event, no label on etcd-node-2."""
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    api.add_pod("kube-system", "etcd-node-2", "uid-etcd", node="node-2")
    r = podevents.PodReporter(api.client(), log.get())
    r.handle(create())
    r.handle(create(ns="kube-system", pod="etcd-node-2", uid="uid-trainer-0"))
    r.handle(create(ns="ml", pod="trainer-1", uid="uid-trainer-0"))  # no such pod
    gets = [p for m, p, *_ in api.requests if m == "GET"]
    assert gets == ["/api/v1/namespaces/ml/pods/trainer-0", "/api/v1/namespaces/kube-system/pods/etcd-node-2",
                    "/api/v1/namespaces/ml/pods/trainer-1"]
    assert [e["involvedObject"]["name"] for e in api.pod_events()] == ["trainer-0"]
    assert "gpuhook.dev/accelerator" not in api.pods[("kube-system", "etcd-node-2")]["metadata"]["labels"]
    assert not [p for m, p, *_ in api.requests if m == "PATCH" and "etcd" in p]
    # the same forged line again costs nothing: no second GET
    r.handle(create(ns="kube-system", pod="etcd-node-2", uid="uid-trainer-0"))
    assert len([1 for m, *_ in api.requests if m == "GET"]) == 3


def test_one_namespaces_creates_do_not_use_up_anothers_event_budget(fake_api, logs):
    api = fake_api()
    clock = Clock()
    r = podevents.PodReporter(api.client(), log.get(), clock=clock, burst=5, rate=0.1, lookup_burst=100)
    for i in range(20):
        api.add_pod("noisy", f"p{i}", f"uid-n{i}")
        r.handle(create(ns="noisy", pod=f"p{i}", uid=f"uid-n{i}"))
    assert len(api.pod_events()) == 5 and r.dropped == 15
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    r.handle(create())  # another tenant's GPUsInjected is posted
    assert api.pod_events()[-1]["involvedObject"]["name"] == "trainer-0"
    limited = [x for x in logs() if x["event"] == "event.ratelimited"]
    assert [x["namespace"] for x in limited] == ["noisy"]


def test_lines_that_fail_the_check_cost_bounded_memory_and_rate_limited_lookups(fake_api, logs, monkeypatch):
    monkeypatch.setattr(podevents, "MAX_ENTRIES", 8)
    api = fake_api()
    clock = Clock()
    r = podevents.PodReporter(api.client(), log.get(), clock=clock, lookup_burst=10, lookup_rate=1.0)
    for i in range(200):
        r.handle(create(ns="evil", pod=f"ghost-{i}", uid=f"uid-{i}"))
    assert len([1 for m, *_ in api.requests if m == "GET"]) == 10  # then one a second
    assert r.dropped_lookups == 190 and api.pod_events() == []
    clock.t += 3
    for i in range(200, 210):
        r.handle(create(ns="evil", pod=f"ghost-{i}", uid=f"uid-{i}"))
    assert len([1 for m, *_ in api.requests if m == "GET"]) == 13
    assert len(r.refused) <= 8 and len(r._said) <= 8 and len(r.pods) <= 8
    assert len([x for x in logs() if x["event"] == "pod.skipped"]) == 1  # said once for the namespace
    (limited,) = [x for x in logs() if x["event"] == "pod.lookups_limited"]  # said once too, with its budget
    assert (limited["namespace"], limited["burst"], limited["rate"]) == ("evil", 10, 1.0)
    # another namespace's lookups are its own
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    r.handle(create())
    assert api.pod_events()[-1]["involvedObject"]["name"] == "trainer-0"


def test_the_agent_posts_only_gpuhooks_own_reasons():
    """One list of reasons (kube.EVENT_REASONS): the reporter's, the node agent's and the DRA
    driver's come from it, and an Event with another reason is never sent."""
    import re

    from gpuhook.agent import kube
    from gpuhook.dra import service as dra_service

    from gpuhook.hook import BYPATH, LDCACHE

    creates = {events.event_for(create(d))[0] for d in ("injected", "no-gpu", "declined", "error", "unconfirmed")}
    hooks = {events.event_for({**create(events.HOOK_DECISION), "kind": k})[0] for k in (LDCACHE, BYPATH)}
    assert creates | hooks | {dra_service.LOST_REASON} == set(kube.EVENT_REASONS["Pod"])
    node_reasons = set()
    for name in ("core.py", "summary.py", "sinks.py"):  # the loop's, a probe's summary's, the sinks'
        with open(os.path.join(REPO, "gpuhook", "agent", name)) as f:
            node_reasons |= set(re.findall(r'(?:post\(|append\(\()\s*"([A-Za-z]+)"', f.read()))
    assert node_reasons == set(kube.EVENT_REASONS["Node"])
    client = kube.KubeAPI("http://127.0.0.1:9", "t", "node-1", timeout=1.0)
    with pytest.raises(ValueError, match="not one of gpuhook's"):
        client.post_pod_event("ml", "p", "u", "c", "BackOff", "x")
    with pytest.raises(ValueError, match="not one of gpuhook's"):
        client.post_event("GPUsInjected", "a pod's reason on the Node")


def test_an_event_says_when_the_nri_plugin_made_the_create():
    reason, _type, msg, label = events.event_for(create(front="nri"))
    assert reason == "GPUsInjected" and msg.startswith("container app (through NRI) got 2 GPU device(s)") and label
    assert "NRI" not in events.event_for(create())[2]
    assert events.event_for(create("no-gpu", front="nri"))[2].startswith("container app (through NRI)")


def test_the_creates_metric_says_which_front_made_each_create():
    from gpuhook.agent.metrics import Metrics

    m = Metrics(agent=None)
    m.handle(create(front="nri"))
    m.handle(create())
    value = m.creates.labels("injected", "nvidia", "nri")._value.get()
    assert (value, m.creates.labels("injected", "nvidia", "wrapper")._value.get()) == (1.0, 1.0)


def test_the_agent_reads_no_bigger_bundle_than_the_create_does(tmp_path, monkeypatch):
    """The agent reads a no-gpu line's pod from its bundle's config.json only as far as the
    create reads that file (create.MAX_SPEC_BYTES, one bound): one over it has no pod for the
    agent either, one within it does."""
    from gpuhook.plan import policy
    from gpuhook.runtime import create

    monkeypatch.setattr(create, "MAX_SPEC_BYTES", 4096)
    bundle = tmp_path / "bundle"
    bundle.mkdir()

    class Kube:
        node = "node-1"

    reporter = podevents.PodReporter(Kube(), None, root=str(tmp_path))
    names = {}
    for size in (4096, 4097):
        spec = {"annotations": {policy.POD_ANNOTATIONS_CONTAINERD["pod_name"]: "p"}, "pad": ""}
        spec["pad"] = "x" * (size - len(json.dumps(spec)))
        (bundle / "config.json").write_text(json.dumps(spec))
        rec = reporter._from_bundle({"event": "create", "decision": "no-gpu", "bundle": "/bundle"})
        names[size] = rec and rec.get("pod_name")
    assert names == {4096: "p", 4097: None}


def nri_line(decision: str, reason: str, **kw) -> dict:
    """A create line of the NRI plugin's that the runtime's word made (nri/plugin.py)."""
    return {**create(decision, front="nri", vendors=[], reason=reason, planned_devices=8), **kw}


def test_an_nri_create_the_runtime_made_without_gpus_claims_none(fake_api, logs):
    """late (the answer came after NRI's timeout), missed (created while the plugin was not
    registered): a RanOnCPU Warning and the cpu label; unconfirmed: a GPUsUnconfirmed Warning
    and no label. None says the container got GPUs."""
    from gpuhook.nri import plugin

    late = events.event_for(nri_line(plugin.LATE, plugin.WHY_LATE))
    assert late == ("RanOnCPU", "Warning", f"container app (through NRI) runs without a GPU: {plugin.WHY_LATE}", "cpu")
    missed = events.event_for(nri_line(plugin.MISSED, plugin.WHY_MISSED))
    assert missed[:2] == ("RanOnCPU", "Warning") and missed[3] == "cpu" and "not registered" in missed[2]
    reason, type_, msg, label = events.event_for(nri_line(plugin.UNCONFIRMED, plugin.WHY_SILENT))
    assert (reason, type_, label) == ("GPUsUnconfirmed", "Warning", None) and "never confirmed" in msg
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    r = podevents.PodReporter(api.client(), log.get())
    r.handle(nri_line(plugin.LATE, plugin.WHY_LATE))
    (ev,) = api.pod_events()
    assert ev["reason"] == "RanOnCPU" and "GPUsInjected" not in json.dumps(api.pod_events())
    assert api.pods[("ml", "trainer-0")]["metadata"]["labels"]["gpuhook.dev/accelerator"] == "cpu"


def test_the_nri_plugins_own_lines_reach_the_agent_the_metrics_and_a_node_event(tmp_path, fake_api, logs):
    """The plugin's "nri" lines (a Synchronize that keeps failing, then synchronized): the
    follower hands them to handle_nri; the metric gpuhook_nri_sync_failing follows them; the
    agent posts NRIPluginNotSynchronized on its Node."""
    from gpuhook.agent.metrics import Metrics
    from gpuhook.nri import plugin

    api = fake_api()
    m = Metrics(agent=None)
    path = tmp_path / "gpuhook.log"
    path.write_text("")
    nri_state = sinks.NRIState(sinks.Events(api.client(), log.get()), log.get())
    f = follow.CreateFollower(str(path), [m, nri_state], log.get())
    f.read_new(first=True)
    failed = {"time": "t", "event": plugin.NRI_EVENT, "front": "nri", "state": "sync-failed", "failures": 1,
              "error": "the runtime closed the connection before it synchronized the plugin (closed by the runtime)"}
    with open(path, "a") as out:
        out.write(json.dumps(failed) + "\n")
    assert f.read_new() == 0
    assert m.nri_sync_failing._value.get() == 1
    (ev,) = [e for e in api.events if e["involvedObject"]["kind"] == "Node"]
    assert (ev["reason"], ev["type"]) == ("NRIPluginNotSynchronized", "Warning") and "cannot register" in ev["message"]
    with open(path, "a") as out:
        out.write(json.dumps({**failed, "state": "synchronized"}) + "\n")
    f.read_new()
    assert m.nri_sync_failing._value.get() == 0


def test_a_hook_line_before_its_nri_create_line_waits_for_it(fake_api, logs):
    """NRI: the hook ran (and wrote its line) before the plugin's create line, which waits for
    the runtime's word: the Warning comes once the create line does."""
    api = fake_api()
    api.add_pod("ml", "trainer-0", "uid-trainer-0")
    r = podevents.PodReporter(api.client(), log.get())
    r.handle_hook({"time": "t", "event": "hook", "kind": "ldcache", "container_id": "c" * 64, "outcome": "timeout",
                   "error": "ldconfig took over 25 s"})
    assert api.pod_events() == []
    r.handle(create(front="nri"))
    assert [e["reason"] for e in api.pod_events()] == ["GPUsInjected", "LdCacheNotUpdated"]
