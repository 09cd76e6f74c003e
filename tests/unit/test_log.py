"""Structured logs (one vocabulary with the runtime's line) and `gpuhook log`."""

from __future__ import annotations

import io
import json
import re

import pytest

from conftest import NO_CONFIG, gpuhook
from gpuhook import inject, log
from gpuhook.runtime import create
from gpuhook.runtime.args import Call, Invocation
from gpuhook.runtime.logline import write_log

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def lines_of(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_time_and_event_first():
    out = io.StringIO()
    log.configure(stream=out, fmt="json")
    log.get().info("inventory", vendors=["nvidia"], devices=["nvidia:GPU-1"], duration_ms=1.5)
    log.get(node="n1").warning("kube.error", error="HTTP 403")
    log.get().debug("hidden")
    a, b = lines_of(out)
    assert list(a)[:2] == ["time", "event"] and TIME.match(a["time"])
    assert a == {"time": a["time"], "event": "inventory", "vendors": ["nvidia"], "devices": ["nvidia:GPU-1"],
                 "duration_ms": 1.5}
    assert b["event"] == "kube.error" and b["level"] == "warning" and b["node"] == "n1"
    assert "\n" not in out.getvalue().strip("\n").split("\n")[0]


def test_same_shape_as_the_runtimes_create_line(tmp_path):
    """gpuhook-runtime writes its line without structlog; the keys and formats are the same."""
    class Config:
        log_file = str(tmp_path / "gpuhook.log")

    from gpuhook.edits import DeviceNode, Edits
    from gpuhook.plan import Plan

    edits = Edits(device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0),))
    out = inject.Decision(inject.INJECTED, plan=Plan(edits, vendors=("nvidia",)))
    write_log(create.log_line(Config, Invocation("create", "/b", "c1", None, None), out, Call({}, "/")))
    rt = json.loads(open(Config.log_file).read())
    buf = io.StringIO()
    log.configure(stream=buf, fmt="json")
    log.get().info("create", container_id="c1", decision="injected", vendors=["nvidia"], nodes=["/dev/nvidia0"])
    ours = lines_of(buf)[0]
    assert list(rt)[:2] == list(ours)[:2] == ["time", "event"]
    assert TIME.match(rt["time"]) and TIME.match(ours["time"])
    for key in ("event", "container_id", "decision", "vendors", "nodes"):
        assert rt[key] == ours[key]


def test_console_renderer_on_a_terminal():
    class TTY(io.StringIO):
        def isatty(self):
            return True

    out = TTY()
    log.configure(stream=out)  # auto
    log.get().info("agent.start", root="/host")
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert "agent.start" in text and "root=/host" in text and not text.startswith("{")
    log.configure(stream=io.StringIO(), fmt="json")


def test_utc_now_format():
    assert log.utc_now(t=0) == "1970-01-01T00:00:00.000Z"
    assert log.utc_now(t=1.2345) == "1970-01-01T00:00:01.234Z"
    assert log.utc_now(ms=False, t=61) == "1970-01-01T00:01:01Z"


# -- reading the runtime's log ---------------------------------------------------------------------

def rec(i: int, decision: str = "injected", **kw) -> str:
    return json.dumps({"time": f"2026-01-01T00:00:{i % 60:02d}.000Z", "event": "create", "container_id": f"c{i}",
                       "decision": decision, "vendors": ["nvidia"] if decision == "injected" else [],
                       "nodes": ["/dev/nvidia0"], "mounts": [], "hooks": 1, "duration_ms": 9.5, **kw})


def test_tail_tolerates_garbage_and_torn_lines(tmp_path):
    p = tmp_path / "gpuhook.log"
    body = [rec(1), "garbage", "", rec(2, "no-gpu"), "[1, 2]", '{"event": "other"}', rec(3, "error", error="boom"),
            '{"time": "2026-01-01T00:00:04.000Z", "event": "create", "contai']  # torn: a write in progress
    p.write_text("\n".join(body))
    records, skipped = log.tail_records(str(p), 10)
    assert [r["container_id"] for r in records] == ["c1", "c2", "c3"]
    assert skipped == 3  # garbage, [1, 2], the torn line
    records, _ = log.tail_records(str(p), 2)
    assert [r["container_id"] for r in records] == ["c2", "c3"]


def hook_line(cid: str, outcome: str = "timeout") -> str:
    return json.dumps({"time": "2026-01-01T00:00:59.000Z", "event": "hook", "kind": "ldcache", "container_id": cid,
                       "outcome": outcome, "error": f"ldconfig {outcome}; driver libraries need LD_LIBRARY_PATH"})


def test_a_hook_line_goes_with_the_create_of_its_container_before_it(tmp_path):
    """gpuhook-hook's line follows its container's create line (the create is logged before
    runc runs the hook); another create between them, an id used again later, a hook line of
    a container whose create is not in the log: each goes where it belongs, or nowhere."""
    p = tmp_path / "gpuhook.log"
    p.write_text("\n".join([hook_line("gone"), rec(1), rec(2), hook_line("c1"), rec(1), rec(3), hook_line("c3", "failed")])
                 + "\n")
    records, skipped = log.tail_records(str(p), 10)
    assert skipped == 0 and [r["container_id"] for r in records] == ["c1", "c2", "c1", "c3"]
    assert [r.get("hook_errors") and [h["outcome"] for h in r["hook_errors"]] for r in records] == [
        ["timeout"], None, None, ["failed"]]
    table = log.format_records(records, wide=True).splitlines()
    assert "injected (ldcache timeout)" in table[1] and "LD_LIBRARY_PATH" in table[1]
    assert "injected (ldcache failed)" in table[4] and "(ldcache" not in table[2] + table[3]


def test_tail_reads_backwards_across_blocks(tmp_path):
    p = tmp_path / "big.log"
    with open(p, "w") as f:
        for i in range(20000):  # ~4 MB: lines cross the 64 KiB blocks
            f.write(rec(i, mounts=["/usr/lib/x" * (i % 7)]) + "\n")
    records, skipped = log.tail_records(str(p), 1500)
    assert skipped == 0
    assert [r["container_id"] for r in records] == [f"c{i}" for i in range(18500, 20000)]
    records, _ = log.tail_records(str(p), 50000)
    assert len(records) == 20000


def test_log_command(tmp_path):
    p = tmp_path / "gpuhook.log"
    cid = "f" * 64
    p.write_text("\n".join([rec(1), "\x00\xff torn", rec(2, "no-gpu"), rec(3, "sandbox"),
                            json.dumps({**json.loads(rec(4, "error")), "container_id": cid, "error": "x" * 300}),
                            rec(5, pod_namespace="ml", pod_name="trainer-0", pod_uid="u-1", container_name="worker")]) + "\n")
    r = gpuhook("log", "--file", str(p), "-n", "3", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0].split() == ["TIME", "CONTAINER", "POD", "FRONT", "DECISION", "VENDORS", "NODES", "MOUNTS", "MS",
                               "ERROR"]
    assert [row.split()[4] for row in rows[1:]] == ["sandbox", "error", "injected"]
    assert [row.split()[2] for row in rows[1:]] == ["-", "-", "ml/trainer-0:worker"]
    assert cid[:15] + "…" in r.stdout and cid not in r.stdout  # long ids shortened
    assert r.stderr == ""  # the garbage is further back than the last 3
    r = gpuhook("log", "--file", str(p), config=NO_CONFIG)
    assert len(r.stdout.splitlines()) == 6 and "1 unreadable line(s) skipped" in r.stderr
    r = gpuhook("log", "--file", str(p), "--decision", "injected", "--wide", config=NO_CONFIG)
    assert [row.split()[1] for row in r.stdout.splitlines()[1:]] == ["c1", "c5"]
    r = gpuhook("log", "--file", str(p), "-n", "1", "--json", config=NO_CONFIG)
    assert json.loads(r.stdout)["container_id"] == "c5"
    r = gpuhook("log", "--file", str(tmp_path / "none.log"), config=NO_CONFIG)
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty.log").write_text("")
    r = gpuhook("log", "--file", str(tmp_path / "empty.log"), config=NO_CONFIG)
    assert r.returncode == 0 and "No container creates" in r.stdout


@pytest.fixture(autouse=True)
def _quiet_structlog():
    yield
    log.configure(stream=io.StringIO(), fmt="json")


def test_the_create_line_names_the_pod(tmp_path):
    """containerd's and CRI-O's annotations give the pod; missing, oversized or not text:
    no pod, nothing fails."""
    from gpuhook.plan.policy import pod_of

    containerd = {"io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "trainer-0",
                  "io.kubernetes.cri.sandbox-uid": "0b7c-uid", "io.kubernetes.cri.container-name": "worker"}
    crio = {"io.container.manager": "cri-o", "io.kubernetes.pod.namespace": "ml", "io.kubernetes.pod.name": "trainer-0",
            "io.kubernetes.pod.uid": "0b7c-uid", "io.kubernetes.container.name": "worker"}
    want = {"pod_namespace": "ml", "pod_name": "trainer-0", "pod_uid": "0b7c-uid", "container_name": "worker"}
    assert pod_of(containerd) == pod_of(crio) == want
    assert pod_of({}) == {}  # docker, podman, plain runc
    assert pod_of({"io.kubernetes.cri.sandbox-name": "x" * 254, "io.kubernetes.cri.sandbox-namespace": "a\nb",
                   "io.kubernetes.cri.sandbox-uid": ""}) == {}

    class Config:
        log_file = str(tmp_path / "gpuhook.log")

    from gpuhook.edits import Edits
    from gpuhook.plan import ALLOCATED, Held, Plan
    from gpuhook.plan.policy import Allocation

    held = Held("nvidia:GPU-1", ALLOCATED, Allocation("nvidia.com/gpu", "GPU-1", "pod-2"))
    out = inject.Decision(inject.DECLINED, want, Plan(Edits(), held_back=(held,), reason="all 1 GPU(s) held back"))
    write_log(create.log_line(Config, Invocation("create", "/b", "c1", None, None), out, Call({}, "/")))
    line = json.loads(open(Config.log_file).read())
    assert {k: line[k] for k in want} == want
    assert line["held_back"] == ["nvidia:GPU-1"] and line["reason"] == "all 1 GPU(s) held back"


def test_a_pod_cannot_bloat_the_node_log(tmp_path):
    """SECURITY.md promise 8: `error` is cut at 1000 characters, at most 20 warnings of at most
    500 each, whatever the pod's input made them; the line stays one JSON object."""

    class Config:
        log_file = str(tmp_path / "gpuhook.log")

    out = inject.Decision(inject.ERROR, error="E" * 100_000,
                          warnings=tuple(f"w{i}:" + "x" * 10_000 for i in range(300)))
    write_log(create.log_line(Config, Invocation("create", "/b", "c1", None, None), out, Call({}, "/")))
    with open(Config.log_file) as f:
        lines = f.read().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert len(line["error"]) == 1000
    assert len(line["warnings"]) == 20 and all(len(w) == 500 for w in line["warnings"])
    assert line["warnings"][0].startswith("w0:") and len(lines[0]) < 16_000


def test_the_table_says_which_front_made_each_create(tmp_path):
    p = tmp_path / "gpuhook.log"
    nri_line = json.dumps({**json.loads(rec(2)), "front": "nri"})
    p.write_text("\n".join([rec(1), nri_line]) + "\n")
    records, _ = log.tail_records(str(p), 10)
    header, wrapper, nri = (line.split() for line in log.format_records(records, wide=True).splitlines())
    assert header[3] == "FRONT" and (wrapper[3], nri[3]) == ("wrapper", "nri")


def test_a_plan_that_fails_still_logs_the_warnings_it_had(tmp_path, make_host, monkeypatch):
    """A pod annotation the policy warns about, then the driver's files fail to read (EIO, as
    a node's failing disk gives): the create's line has the error and that warning too."""
    import errno
    import os

    from conftest import SERVER_SPEC
    from gpuhook.config import Config
    from gpuhook.plan import nvidia

    def eio(*a, **k):
        raise OSError(errno.EIO, os.strerror(errno.EIO), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")

    monkeypatch.setattr(nvidia, "part", eio)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({**SERVER_SPEC, "annotations": {"gpuhook.dev/bogus": "1"}}))
    config = Config(host_root=make_host("nvidia", gpus=1), log_file=str(tmp_path / "gpuhook.log"), probe_cache_ttl=0)
    inv = Invocation("create", str(bundle), "c1", None, None)
    answer = create.create_call(inv, ["create", "--bundle", str(bundle), "c1"], "/bin/true", config, [],
                                Call({}, str(tmp_path)))
    line = json.loads(answer.log[1])
    assert line["decision"] == "error" and "Input/output error" in line["error"]
    assert any("gpuhook.dev/bogus" in w for w in line.get("warnings", [])), line


def test_a_hook_line_goes_with_the_nri_create_line_after_it(tmp_path):
    """The NRI plugin writes a create's line once the runtime made the container, after its
    hook ran: a hook line just before an NRI create line of its container is that create's."""
    p = tmp_path / "gpuhook.log"
    nri = [json.dumps({**json.loads(rec(n)), "front": "nri"}) for n in (1, 2)]
    p.write_text("\n".join([hook_line("c1"), rec(3), nri[0], nri[1]]) + "\n")
    records, _ = log.tail_records(str(p), 10)
    assert [(r["container_id"], [h["outcome"] for h in r.get("hook_errors", [])]) for r in records] == [
        ("c3", []), ("c1", ["timeout"]), ("c2", [])]


def test_the_table_says_why_an_nri_create_got_no_gpu(tmp_path):
    """The NRI plugin's late and missed lines: the table's last column is their reason."""
    from gpuhook.nri import plugin

    table = log.format_records([
        {"time": "t", "event": "create", "front": "nri", "container_id": "c1", "decision": plugin.LATE,
         "reason": plugin.WHY_LATE},
        {"time": "t", "event": "create", "front": "nri", "container_id": "c2", "decision": plugin.MISSED,
         "reason": plugin.WHY_MISSED}], wide=True).splitlines()
    assert table[1].split()[3:5] == ["nri", "late"] and table[1].endswith(plugin.WHY_LATE)
    assert table[2].split()[3:5] == ["nri", "missed"] and table[2].endswith(plugin.WHY_MISSED)
