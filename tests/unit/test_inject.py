"""The one create core (gpuhook/inject.py): a request, the node config and its errors in; one
Decision and one log record out, whichever front asked. Table-driven: each row is what a
container and a node bring and what the core says of it. Then one container fed to two fronts
(the wrapper and the NRI plugin): the same record comes out of both, but for who made it."""

from __future__ import annotations

import errno
import json
import os

import pytest

from conftest import request
from gpuhook import inject, logline
from gpuhook.config import Config
from gpuhook.edits import DeviceNode, Edits, Hook, Mount
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.logline import CreateRecord
from gpuhook.plan import ALLOCATED, Held, Plan

LIB = "/usr/lib/x86_64-linux-gnu"
CUDA = Library(f"{LIB}/libcuda.so.550.54.14", "libcuda.so.1", "compute")
POD = {"io.kubernetes.cri.sandbox-namespace": "ml", "io.kubernetes.cri.sandbox-name": "trainer-0",
       "io.kubernetes.cri.sandbox-uid": "uid-1", "io.kubernetes.cri.container-name": "worker"}
POD_KEYS = {"pod_namespace": "ml", "pod_name": "trainer-0", "pod_uid": "uid-1", "container_name": "worker"}
SANDBOX = {**POD, "io.kubernetes.cri.container-type": "sandbox"}
CONFIG_ERRORS = ("/etc/gpuhook/config.toml: fail_mode: 'sideways' is not one of open, closed; 'open' used",)


def gpus(n: int = 2, nodes: bool = True) -> Inventory:
    devices = tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{i}", "c", 195, i),) if nodes else None,
                           f"0000:{0x18 + i:02x}:00.0") for i in range(n))
    return Inventory("/", (VendorInventory("nvidia", devices, (Node("/dev/nvidiactl", "c", 195, 255),), (CUDA,), (),
                                           "550.54.14"),), ("a probe warning",))


CPU = Inventory("/", ())


def raises(e: BaseException):
    def probe():
        raise e

    return probe


class Row:
    def __init__(self, name, req, probe, decision, error=None, warnings=(), devices=(), reason=False, pod=POD_KEYS):
        self.name, self.req, self.probe, self.decision = name, req, probe, decision
        self.error, self.warnings, self.devices, self.reason, self.pod = error, warnings, devices, reason, pod


ROWS = [
    Row("a sandbox is never probed", request(annotations=SANDBOX), raises(AssertionError("probed")), inject.SANDBOX),
    Row("a CPU-only node", request(annotations=POD), lambda: CPU, inject.NO_GPU),
    Row("outside Kubernetes: no pod", request(), lambda: CPU, inject.NO_GPU, pod={}),
    Row("a GPU node gives its GPUs", request(annotations=POD), gpus, inject.INJECTED,
        warnings=("a probe warning",), devices=("nvidia:GPU-0", "nvidia:GPU-1")),
    Row("the pod says no", request(annotations={**POD, "gpuhook.dev/inject": "false"}), gpus, inject.DECLINED,
        warnings=("a probe warning",), reason=True),
    Row("an OSError says itself", request(annotations=POD), raises(OSError(errno.EIO, "Input/output error")),
        inject.ERROR, error="[Errno 5] Input/output error"),
    Row("a ValueError says itself", request(annotations=POD), raises(ValueError("bad cache")), inject.ERROR,
        error="bad cache"),
    Row("any other failure with its type", request(annotations=POD), raises(RuntimeError("the probe broke")),
        inject.ERROR, error="RuntimeError: the probe broke"),
    Row("a plan that fails keeps the warnings it gave", request(
        annotations=POD, env={"NVIDIA_DRIVER_CAPABILITIES": "compute,bogus"}, rootfs=None),
        lambda: gpus(nodes=False), inject.ERROR, error="TypeError", warnings=(
            "a probe warning", "NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus' ignored")),
]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "cache"))


# the node config of the table: its ldconfig and log file reach the ld-cache hook
CONFIG = Config(ldconfig="/opt/node/ldconfig", log_file="/var/log/node.log")


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decide(row):
    d = inject.decide(row.req, CONFIG, list(CONFIG_ERRORS), probe=row.probe)
    assert d.decision == row.decision
    assert d.pod == row.pod
    assert d.warnings == CONFIG_ERRORS + row.warnings  # the node config's errors first, whatever happened
    if row.error is None:
        assert d.error is None
    else:
        assert d.error is not None and d.error.startswith(row.error)
    assert (d.plan is None) == (row.decision in (inject.SANDBOX, inject.ERROR))
    assert (d.edits is not None) == (row.decision == inject.INJECTED)
    if d.plan is not None:
        assert d.plan.devices == row.devices and bool(d.plan.reason) == row.reason
    if d.edits is not None:  # the node config is the plan's
        (ldcache,) = d.edits.hooks
        assert "/opt/node/ldconfig" in ldcache.args and "GPUHOOK_LOG_FILE=/var/log/node.log" in ldcache.env


def test_a_request_the_core_cannot_read_is_an_error_with_no_pod():
    from gpuhook.plan import Request

    d = inject.decide(Request({}, None, None), CONFIG, CONFIG_ERRORS, probe=gpus)  # type: ignore[arg-type]
    assert (d.decision, d.pod, d.plan, d.warnings) == (inject.ERROR, {}, None, CONFIG_ERRORS)
    assert d.error is not None and d.error.startswith("AttributeError: ")


def test_the_round_robin_keeps_its_state_in_the_nodes_cache_dir(tmp_path):
    """gpuhook.dev/max-gpus: 1 on a 2-GPU node: the GPU least given goes next, as the state in
    the cache dir says."""
    req = request(annotations={**POD, "gpuhook.dev/max-gpus": "1"})
    given = [inject.decide(req, CONFIG, probe=gpus).plan.devices for _ in range(3)]
    assert given == [("nvidia:GPU-0",), ("nvidia:GPU-1",), ("nvidia:GPU-0",)]
    assert os.listdir(tmp_path / "cache")
    # a check (the NRI plugin's of a container created while it was away) gives nothing out
    checked = [inject.decide(req, CONFIG, probe=gpus, remember=False).plan.devices for _ in range(2)]
    assert checked == [("nvidia:GPU-0",)] * 2  # the first, with no memory of the round robin
    assert inject.decide(req, CONFIG, probe=gpus).plan.devices == ("nvidia:GPU-1",)  # the round robin goes on


def test_the_probe_cache_is_the_nodes_by_default(tmp_path, monkeypatch):
    from gpuhook.probe import cache

    asked = []
    monkeypatch.setattr(cache, "probe_cached", lambda *a, **k: asked.append((a, k)) or CPU)
    config = Config(host_root="/node", probe_cache_ttl=3.0, nvidia_driver_root="/run/nvidia/driver")
    assert inject.decide(request(), config).decision == inject.NO_GPU
    assert asked == [(("/node", str(tmp_path / "cache"), 3.0, "/run/nvidia/driver"), {})]


def test_decide_says_each_step_as_it_ends_and_probes_through_the_cache_by_default(make_host, monkeypatch):
    stages: list[str] = []
    d = inject.decide(request(), Config(host_root=make_host("cpu")), stage=stages.append)
    assert (d.decision, stages) == (inject.NO_GPU, ["parsed", "probed", "planned"])
    from gpuhook.probe import cache

    def broken(*a, **k):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cache, "probe_cached", broken)
    stages.clear()
    d = inject.decide(request(), Config(host_root="/nonexistent"), stage=stages.append)
    assert (d.decision, d.error, stages) == (inject.ERROR, "[Errno 13] Permission denied", ["parsed"])


def test_what_the_container_has_is_what_the_request_says():
    req = request(annotations=POD, spec_devices={"/dev/nvidiactl": ("c", 195, 255)}, mounts=("/a", "/b"))
    d = inject.decide(req, CONFIG, probe=gpus)
    assert (d.had_nodes, d.had_mounts) == (("/dev/nvidiactl",), ("/a", "/b"))
    assert "/dev/nvidiactl" in [n.path for n in d.edits.device_nodes]
    rec = inject.record(d, logline.WRAPPER, "c", 0)
    assert rec.nodes == ("/dev/nvidia0", "/dev/nvidia1")
    twice = d._replace(plan=d.plan._replace(edits=d.plan.edits._replace(
        mounts=d.plan.edits.mounts + d.plan.edits.mounts[:1] + (Mount("/h", "/a"),))))
    assert inject.record(twice, logline.WRAPPER, "c", 0).mounts == rec.mounts  # each once, none it had


def test_failed_keeps_what_was_decided_and_says_the_front_own_failure():
    planned = inject.decide(request(annotations=POD), Config(ldconfig="/sbin/ldconfig"), CONFIG_ERRORS, probe=gpus)
    d = inject.failed(OSError(errno.ENOSPC, "No space left on device"), planned)
    assert (d.decision, d.error) == (inject.ERROR, "[Errno 28] No space left on device")
    assert (d.pod, d.plan, d.warnings) == (planned.pod, planned.plan, planned.warnings) and d.edits is None
    d = inject.failed(KeyError("x"), config_errors=CONFIG_ERRORS)  # before the core was asked
    assert (d.decision, d.error, d.warnings, d.pod, d.plan) == (inject.ERROR, "KeyError: 'x'", CONFIG_ERRORS, {}, None)
    assert planned.warned() is planned and planned.warned("mine").warnings == planned.warnings + ("mine",)


EDITS = Edits(env=("GPUHOOK_ACCELERATOR=nvidia",), device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0),),
              mounts=(Mount(f"{LIB}/libcuda.so.1", f"{LIB}/libcuda.so.1"),),
              hooks=(Hook("createContainer", "/opt/gpuhook/bin/gpuhook-hook", ("gpuhook-hook", "ldcache")),))
HELD = (Held("nvidia:GPU-1", ALLOCATED),)
GIVEN = Plan(EDITS, ("nvidia",), ("nvidia:GPU-0",), HELD)
NONE_GIVEN = Plan(Edits(), held_back=HELD, reason="all 1 GPU(s) held back")
ADDED = {"vendors": ("nvidia",), "nodes": ("/dev/nvidia0",), "mounts": (f"{LIB}/libcuda.so.1",), "hooks": 1}
NOTHING = {"vendors": (), "nodes": (), "mounts": (), "hooks": 0}


@pytest.mark.parametrize("decision, what, devices, held, reason", [
    (inject.Decision(inject.INJECTED, POD_KEYS, GIVEN), ADDED, ("nvidia:GPU-0",), ("nvidia:GPU-1",), None),
    # the front could not put the edits in place: nothing was added, the plan is still said
    (inject.Decision(inject.ERROR, POD_KEYS, GIVEN, error="disk full"), NOTHING, ("nvidia:GPU-0",),
     ("nvidia:GPU-1",), None),
    (inject.Decision(inject.DECLINED, POD_KEYS, NONE_GIVEN), NOTHING, (), ("nvidia:GPU-1",), "all 1 GPU(s) held back"),
    (inject.Decision(inject.SANDBOX, POD_KEYS), NOTHING, (), (), None),
    # what the container had already is not added again, by any front: not said to be
    (inject.Decision(inject.INJECTED, POD_KEYS, GIVEN, had_nodes=("/dev/nvidia0",), had_mounts=("/x",)),
     {**ADDED, "nodes": ()}, ("nvidia:GPU-0",), ("nvidia:GPU-1",), None),
], ids=["injected", "error after the plan", "all held back", "sandbox", "what the container had"])
def test_record(decision, what, devices, held, reason):
    rec = inject.record(decision, logline.NRI, "c1", 1.234, bundle="/b", stages_ms={"start": 0.0})
    assert (rec.front, rec.container_id, rec.bundle, rec.decision, rec.duration_ms) == (
        "nri", "c1", "/b", decision.decision, 1.23)
    assert {k: getattr(rec, k) for k in what} == what
    assert (rec.devices, rec.held_back, rec.reason, rec.error) == (devices, held, reason, decision.error)
    assert {k: getattr(rec, k) for k in POD_KEYS} == POD_KEYS and rec.stages_ms == {"start": 0.0}
    assert logline.utc_now()[:10] == rec.time[:10]


def test_the_line_has_every_creates_keys_then_those_that_say_something():
    rec = inject.record(inject.Decision(inject.NO_GPU), logline.WRAPPER, None, 0)
    line = rec.to_line()
    assert list(line) == ["time", "event", "front", "container_id", "decision", "vendors", "nodes", "mounts", "hooks",
                          "duration_ms"]
    assert (line["event"], line["front"], line["container_id"]) == ("create", "wrapper", None)
    full = inject.record(inject.Decision(inject.ERROR, POD_KEYS, NONE_GIVEN, ("w",), "e"), logline.NRI, "c", 1,
                         bundle="/b", runtime_server=True, stages_ms={"start": 0.0}).to_line()
    assert list(full) == ["time", "event", "front", "container_id", "bundle", *POD_KEYS, "decision", "vendors",
                          "nodes", "mounts", "hooks", "duration_ms", "runtime_server", "held_back", "reason", "error",
                          "warnings", "stages_ms"]


def test_the_line_is_bounded_once_for_every_front():
    """SECURITY.md promise 8, from the bounds logline.py writes once."""
    many = Plan(Edits(), devices=tuple(f"nvidia:GPU-{i}" for i in range(1000)),
                held_back=tuple(Held(f"nvidia:H-{i}", ALLOCATED) for i in range(1000)))
    d = inject.Decision(inject.ERROR, plan=many, error="E" * 100_000,
                        warnings=tuple(f"w{i}:" + "x" * 10_000 for i in range(300)))
    for front in (logline.WRAPPER, logline.NRI, logline.PRECREATE):
        line = inject.record(d, front, "c", 0).to_line()
        assert len(line["error"]) == logline.MAX_ERROR == 1000
        assert len(line["warnings"]) == logline.MAX_WARNINGS == 20
        assert {len(w) for w in line["warnings"]} == {logline.MAX_WARNING} == {500}
        assert line["warnings"][0].startswith("w0:") and line["warnings"][-1].startswith("w19:")
        assert len(line["devices"]) == logline.MAX_DEVICES == 256 and line["devices"][-1] == "nvidia:GPU-255"
        assert len(line["held_back"]) == logline.MAX_HELD_BACK == 64 and line["held_back"][0] == "nvidia:H-0"


def test_a_line_read_back_is_the_record_and_nothing_it_does_not_type():
    rec = inject.record(inject.Decision(inject.INJECTED, POD_KEYS, GIVEN, ("w",)), logline.NRI, "c1", 2.5,
                        bundle="/b", runtime_server=True, stages_ms={"start": 0.0})
    assert CreateRecord.read(json.loads(json.dumps(rec.to_line()))) == rec
    odd = CreateRecord.read({"event": "create", "front": 7, "decision": ["x"], "vendors": ["nvidia", 3], "hooks": True,
                             "duration_ms": "fast", "runtime_server": "yes", "held_back": "GPU-1", "pod_name": {}})
    assert odd == CreateRecord(front=logline.UNNAMED_FRONT, vendors=("nvidia",))
    assert CreateRecord.read({"event": "hook"}) is None and CreateRecord.read(["create"]) is None


# -- one container, two fronts --------------------------------------------------------------

def test_the_wrapper_and_the_nri_plugin_log_the_same_record_for_the_same_container(tmp_path, make_host, monkeypatch):
    """A node config with an error in it, a GPU the kubelet gave another pod: the wrapper's line
    and the NRI plugin's for the same container are one record, but for the front, its bundle
    and the time: both name the GPU held back and start their warnings with the config's error
    (before, the plugin's line had neither)."""
    from gpuhook.nri import nri_api_pb2 as pb, plugin as nri
    from gpuhook.runtime import prepare
    from gpuhook.runtime.args import Call
    from fakes import fakehost

    root = make_host("nvidia", mknod=False, gpus=2)
    fakehost.FakeHost(root).file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", json.dumps({
        "Data": {"PodDeviceEntries": [{"PodUID": "other-uid", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                                       "DeviceIDs": {"0": ["GPU-00000001-1111-2222-3333-444444444445"]},
                                       "AllocResp": "CgA="}]}, "Checksum": 1}))
    log = tmp_path / "gpuhook.log"
    conf = tmp_path / "gpuhook.toml"
    conf.write_text(f'host_root = "{root}"\nlog_file = "{log}"\nldconfig = "/sbin/ldconfig"\nruntime = "/bin/true"\n'
                    'fail_mode = "sideways"\n')
    monkeypatch.setenv("GPUHOOK_CONFIG", str(conf))
    annotations = {**POD, "io.kubernetes.cri.container-type": "container"}
    env = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    had_mount = f"{LIB}/libcuda.so.1"  # the container's own, as the UVM node below
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["true"], "env": env},
        "annotations": annotations, "mounts": [{"destination": had_mount, "type": "bind", "source": "/elsewhere"}],
        "linux": {"devices": [{"path": "/dev/nvidia-uvm", "type": "c", "major": 235, "minor": 0}]}}))

    answer = prepare(["create", "--bundle", str(bundle), "c1"], Call({"PATH": "/bin"}, str(tmp_path)))
    assert answer.argv is not None and answer.log is not None
    wrapper = json.loads(answer.log[1])

    plugin = nri.Plugin(log=lambda msg: None)
    req = pb.CreateContainerRequest(
        pod=pb.PodSandbox(id="pod1", name="trainer-0", namespace="ml", runtime_handler="gpu-optional"),
        container=pb.Container(id="c1", pod_sandbox_id="pod1", name="worker", annotations=annotations, env=env,
                               mounts=[pb.Mount(destination=had_mount, type="bind", source="/elsewhere")],
                               linux=pb.LinuxContainer(devices=[pb.LinuxDevice(path="/dev/nvidia-uvm", type="c",
                                                                               major=235, minor=0)])))
    adj = plugin.create_container(req.SerializeToString()).adjust
    assert adj.linux.devices
    plugin.write_log()
    assert not log.exists()  # an "injected" line waits for the runtime's word on the container
    made = pb.Container()
    made.CopyFrom(req.container)
    made.linux.devices.extend(adj.linux.devices)
    made.env.extend(f"{kv.key}={kv.value}" for kv in adj.env)
    plugin.confirm(made)
    plugin.write_log()
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]
    assert line.pop("env") == [f"{kv.key}={kv.value}" for kv in adj.env]  # the plugin's own: what the runtime confirmed

    assert (wrapper.pop("front"), line.pop("front")) == ("wrapper", "nri")
    assert wrapper.pop("bundle") == str(bundle) and "bundle" not in line
    for rec in (wrapper, line):
        del rec["time"], rec["duration_ms"]
    assert wrapper == line
    assert line["decision"] == "injected" and line["held_back"] == ["nvidia:GPU-00000001-1111-2222-3333-444444444445"]
    assert "fail_mode: 'sideways'" in line["warnings"][0] and line["pod_uid"] == "uid-1"
    # what the container had is in neither front's nodes or mounts: neither added it
    assert "/dev/nvidia-uvm" not in line["nodes"] and "/dev/nvidia1" in line["nodes"] and had_mount not in line["mounts"]
    assert os.path.exists(log)
