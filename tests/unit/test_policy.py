"""Per-pod policy: gpuhook.dev/* annotations, device plugins on the same node, the kubelet's
allocations (share = "unallocated") and the max-gpus round robin."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest

from conftest import REPO, request
from conftest import plan_on
from fakes import fakehost
from gpuhook.plan import nvidia, policy
from gpuhook.probe import nodestate
from gpuhook.config import Config
from gpuhook.edits import DeviceNode
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.plan import request_from_spec
from gpuhook.probe import probe

CHECKPOINT = "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


# the least an NVIDIA node's containers need (plan.unusable): libcuda of the running driver
CUDA = Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "libcuda.so.1", "compute")


def nv(n=8) -> VendorInventory:
    return VendorInventory("nvidia", tuple(
        Device("nvidia", "gpu", i, f"GPU-{i:04d}", (Node(f"/dev/nvidia{i}", "c", 195, i),), f"0000:{0x18 + i:02x}:00.0")
        for i in range(n)), (Node("/dev/nvidiactl", "c", 195, 255),), (CUDA,), (), "550.54.14")


def amd(n=2) -> VendorInventory:
    return VendorInventory("amd", tuple(
        Device("amd", "gpu", i, f"0000:{0x43 + i:02x}:00.0",
               (Node(f"/dev/dri/card{i + 1}", "c", 226, i + 1), Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i)),
               f"0000:{0x43 + i:02x}:00.0") for i in range(n)), (Node("/dev/kfd", "c", 235, 0),))


def intel() -> VendorInventory:
    return VendorInventory("intel", (Device("intel", "gpu", 0, "0000:00:02.0",
                                            (Node("/dev/dri/card0", "c", 226, 0), Node("/dev/dri/renderD130", "c", 226, 130)),
                                            "0000:00:02.0"),))


INV = Inventory("/", (nv(), amd(), intel()))


def req(annotations=None, **kw):
    """A container with no rootfs (no hooks), annotations first: what these tests vary."""
    return request(annotations=annotations, **{"rootfs": None, **kw})


def plan_edits(*args, **kw):
    """The edits of plan(), what most of these tests look at."""
    return plan_on(*args, **kw).edits


def vendors(e) -> list[str]:
    acc = next((x.split("=", 1)[1] for x in e.env if x.startswith("GPUHOOK_ACCELERATOR=")), "")
    return acc.split(",") if acc else []


def devices(e) -> list[str]:
    ids = next((x.split("=", 1)[1] for x in e.env if x.startswith("GPUHOOK_DEVICES=")), "")
    return ids.split(",") if ids else []


# -- annotations ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["false", "FALSE", " no ", "0", "off"])
def test_inject_false(value):
    assert not plan_edits(INV, req({"gpuhook.dev/inject": value}))


def test_vendors_narrow():
    e = plan_edits(INV, req({"gpuhook.dev/vendors": "nvidia,amd"}))
    assert vendors(e) == ["nvidia", "amd"]
    assert not any(n.path == "/dev/dri/renderD130" for n in e.device_nodes)
    e = plan_edits(INV, req({"gpuhook.dev/vendors": " Intel "}))
    assert vendors(e) == ["intel"] and [n.path for n in e.device_nodes] == ["/dev/dri/card0", "/dev/dri/renderD130"]
    # a vendor the node does not have: nothing (the pod said only that vendor)
    assert not plan_edits(Inventory("/", (nv(),)), req({"gpuhook.dev/vendors": "amd"}))


def test_max_gpus_counts_devices_across_vendors():
    e = plan_edits(INV, req({"gpuhook.dev/max-gpus": "1"}))
    assert devices(e) == ["nvidia:GPU-0000"] and vendors(e) == ["nvidia"]
    assert not any(n.path == "/dev/kfd" for n in e.device_nodes)  # a vendor without device gets nothing
    e = plan_edits(INV, req({"gpuhook.dev/max-gpus": "9"}))
    assert len(devices(e)) == 9
    assert not plan_edits(INV, req({"gpuhook.dev/max-gpus": "0"}))


@pytest.mark.parametrize("annotations, reason", [
    ({"gpuhook.dev/inject": "maybe"}, "not true or false"),
    ({"gpuhook.dev/vendors": "nvidia,../../etc"}, "unknown vendor"),
    ({"gpuhook.dev/vendors": "/dev/nvidia0"}, "unknown vendor"),
    ({"gpuhook.dev/vendors": " , "}, "no vendor named"),
    ({"gpuhook.dev/max-gpus": "-1"}, "not a whole number"),
    ({"gpuhook.dev/max-gpus": "1e3"}, "not a whole number"),
    ({"gpuhook.dev/max-gpus": "99999999999999999999"}, "not a whole number"),
    ({"gpuhook.dev/max-gpus": "\u0661"}, "not a whole number"),  # an Arabic-Indic digit
    ({"gpuhook.dev/max-gpus": "2" * 5000}, "over 256"),
    ({"gpuhook.dev/devices": "/dev/sda"}, "not a gpuhook annotation"),
    ({"gpuhook.dev/host-path": "/etc"}, "not a gpuhook annotation"),
])
def test_invalid_annotations_fall_back_to_node_policy_with_a_reason(annotations, reason):
    p = plan_on(INV, req(annotations))
    e, w = p.edits, p.warnings
    assert e == plan_on(INV, req()).edits  # as the node policy says: everything
    assert len(w) == 1 and reason in w[0], w
    assert len(w[0]) < 400  # a huge value is never copied whole into the log


def test_other_annotations_are_not_ours():
    assert plan_on(INV, req({"io.kubernetes.cri.sandbox-uid": "x", "gpuhook.devx/y": "1"})).warnings == ()


def test_valid_and_invalid_together():
    p = plan_on(INV, req({"gpuhook.dev/vendors": "amd", "gpuhook.dev/max-gpus": "lots"}))
    e, w = p.edits, p.warnings
    assert vendors(e) == ["amd"] and len(devices(e)) == 2 and len(w) == 1


# -- device plugins on the same node -------------------------------------------------------------

def test_device_plugin_gpu_in_spec_gets_no_other_gpu_of_that_vendor():
    e = plan_edits(INV, req(spec_devices={"/dev/nvidia2": ("c", 195, 2)}))
    nv_nodes = [n.path for n in e.device_nodes if n.path.startswith("/dev/nvidia")]
    assert nv_nodes == ["/dev/nvidia2", "/dev/nvidiactl"]  # what the GPU needs, no other GPU
    assert [d for d in devices(e) if d.startswith("nvidia:")] == ["nvidia:GPU-0002"]
    assert "amd" in vendors(e)  # other vendors are not affected


def test_device_plugin_match_is_by_number_not_path():
    # a plugin that put the host's /dev/nvidia5 at /dev/nvidia0 in the container
    e = plan_edits(INV, req(spec_devices={"/dev/nvidia0": ("c", 195, 5)}))
    assert [d for d in devices(e) if d.startswith("nvidia:")] == ["nvidia:GPU-0005"]
    # an unrelated device at a GPU's path does not count
    e = plan_edits(INV, req(spec_devices={"/dev/nvidia0": ("c", 10, 200)}))
    assert len([d for d in devices(e) if d.startswith("nvidia:")]) == 8


def test_device_plugin_amd_render_node():
    e = plan_edits(INV, req(spec_devices={"/dev/dri/renderD129": ("c", 226, 129)}, annotations={"gpuhook.dev/vendors": "amd"}))
    assert devices(e) == ["amd:0000:44:00.0"]
    assert [n.path for n in e.device_nodes] == ["/dev/dri/card2", "/dev/dri/renderD129", "/dev/kfd"]


def test_device_plugin_env_narrows_nvidia():
    e = plan_edits(INV, req(env={"NVIDIA_VISIBLE_DEVICES": "GPU-0003,GPU-0006"}))
    assert [d for d in devices(e) if d.startswith("nvidia:")] == ["nvidia:GPU-0003", "nvidia:GPU-0006"]


def test_device_plugin_gpus_count_against_max_gpus():
    e = plan_edits(INV, req({"gpuhook.dev/max-gpus": "2"}, spec_devices={"/dev/nvidia2": ("c", 195, 2)}))
    assert devices(e) == ["nvidia:GPU-0002", "amd:0000:43:00.0"]
    e = plan_edits(INV, req({"gpuhook.dev/max-gpus": "0"}, spec_devices={"/dev/nvidia2": ("c", 195, 2)}))
    assert devices(e) == ["nvidia:GPU-0002"]  # never taken away


def test_request_from_spec_reads_device_numbers_and_mounts():
    spec = {"linux": {"devices": [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2},
                                  {"path": "/dev/x"}, {"path": "/dev/y", "major": True, "minor": 1}, 7]},
            "mounts": [{"destination": "/proc"}, {"destination": 3}, "junk"]}
    r = request_from_spec(spec)
    assert r.spec_devices == {"/dev/nvidia2": ("c", 195, 2), "/dev/x": None, "/dev/y": None}
    assert r.mounts == ("/proc",)


# -- share = "unallocated" -------------------------------------------------------------------

def checkpoint(root: str, entries: list, raw: str | None = None) -> None:
    path = os.path.join(root, CHECKPOINT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(raw if raw is not None else json.dumps(
            {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"nvidia.com/gpu": ["GPU-0000"]}},
             "Checksum": 1234567}))


def entry(pod, resource, ids, v1=False):
    return {"PodUID": pod, "ContainerName": "c", "ResourceName": resource,
            "DeviceIDs": ids if v1 else {"0": ids[:1], "1": ids[1:]}, "AllocResp": "CgA="}


def test_unallocated_honours_the_checkpoint(tmp_path):
    root = str(tmp_path)
    checkpoint(root, [entry("pod-a", "nvidia.com/gpu", ["GPU-0001", "GPU-0004"]),
                      entry("pod-b", "amd.com/gpu", ["0000:43:00.0"], v1=True),
                      entry("pod-me", "nvidia.com/gpu", ["GPU-0007"])])
    inv = Inventory(root, INV.vendors)
    e = plan_edits(inv, req({"io.kubernetes.cri.sandbox-uid": "pod-me"}), config=Config(share="unallocated"))
    assert [d for d in devices(e) if d.startswith("nvidia:")] == [
        f"nvidia:GPU-{i:04d}" for i in (0, 2, 3, 5, 6, 7)]  # pod-me's own GPU is not someone else's
    assert [d for d in devices(e) if d.startswith("amd:")] == ["amd:0000:44:00.0"]
    # the default is share = "unallocated"; share = "all" does not even read the checkpoint
    assert devices(plan_edits(inv, req({"io.kubernetes.cri.sandbox-uid": "pod-me"}))) == devices(e)
    assert len(devices(plan_edits(inv, req(), config=Config(share="all")))) == 11


def test_plan_explains_what_it_held_back(tmp_path):
    root = str(tmp_path)
    checkpoint(root, [entry("pod-a", "nvidia.com/gpu", ["GPU-0001", "GPU-0004"])])
    p = plan_on(Inventory(root, INV.vendors), req())
    e = p.edits
    assert len(devices(e)) == 9 and p.reason is None and list(p.devices) == devices(e)
    assert [(h.device, h.why) for h in p.held_back] == [
        (f"nvidia:GPU-{i:04d}", "allocated by the kubelet to pod 'pod-a' (nvidia.com/gpu 'GPU-%04d')" % i)
        for i in (1, 4)]
    p = plan_on(Inventory(root, INV.vendors), req(), config=Config(share="all"))
    assert len(devices(p.edits)) == 11 and p.held_back == () and p.reason is None
    assert list(p.vendors) == vendors(p.edits) and list(p.devices) == devices(p.edits)


def test_plan_says_why_a_gpu_node_gave_nothing(tmp_path):
    root = str(tmp_path)
    checkpoint(root, [entry("pod-a", "nvidia.com/gpu", [f"GPU-{i:04d}" for i in range(8)])])
    nvidia_only = Inventory(root, tuple(v for v in INV.vendors if v.vendor == "nvidia"))
    p = plan_on(nvidia_only, req())
    assert not p.edits
    assert p.reason == 'all 8 GPU(s) held back: allocated by the kubelet to other pods (share = "unallocated")'
    for annotations, reason in [({"gpuhook.dev/inject": "false"}, 'the pod says gpuhook.dev/inject: "false"'),
                                ({"gpuhook.dev/max-gpus": "0"}, 'the pod says gpuhook.dev/max-gpus: "0"'),
                                ({"gpuhook.dev/vendors": "intel"}, "the pod's gpuhook.dev/vendors names no vendor of this node")]:
        p = plan_on(Inventory(str(tmp_path / "none"), nvidia_only.vendors), req(annotations))
        assert not p.edits and (p.vendors, p.devices, p.held_back, p.reason) == ((), (), (), reason)


def test_unallocated_partitions_of_an_allocated_gpu_and_intel_cards(tmp_path):
    root = str(tmp_path)
    parts = VendorInventory("amd", tuple(Device("amd", "partition", i, f"0000:05:00.{i}",
                                                (Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i),),
                                                "0000:05:00.0", None, None, "0000:05:00.0") for i in range(4)))
    checkpoint(root, [entry("p", "amd.com/gpu", ["0000:05:00.0"]), entry("p", "gpu.intel.com/i915", ["card0-0"])])
    e = plan_edits(Inventory(root, (parts, intel())), req(), config=Config(share="unallocated"))
    assert not e


def test_unallocated_without_a_checkpoint_gives_everything(tmp_path):
    e = plan_edits(Inventory(str(tmp_path), INV.vendors), req(), config=Config(share="unallocated"))
    assert len(devices(e)) == 11


@pytest.mark.parametrize("raw", ["{garbage", "[]", '{"Data": {"PodDeviceEntries": 5}}'])
def test_unallocated_with_an_unreadable_checkpoint_gives_no_gpu(tmp_path, raw):
    root = str(tmp_path)
    checkpoint(root, [], raw=raw)
    p = plan_on(Inventory(root, INV.vendors), req(), config=Config(share="unallocated"))
    assert not p.edits
    assert any("no GPU is given" in x for x in p.warnings)


# -- round robin -------------------------------------------------------------------------------------

def test_round_robin_spreads_4_containers_over_8_gpus(tmp_path):
    inv = Inventory("/", (nv(8),))
    given = []
    for _ in range(4):
        e = plan_edits(inv, req({"gpuhook.dev/max-gpus": "1"}), state_dir=str(tmp_path))
        given += devices(e)
    assert len(given) == 4 and len(set(given)) == 4
    for _ in range(4):  # the next four take the other GPUs, then it starts over
        given += devices(plan_edits(inv, req({"gpuhook.dev/max-gpus": "1"}), state_dir=str(tmp_path)))
    assert sorted(given) == sorted(f"nvidia:GPU-{i:04d}" for i in range(8))
    assert devices(plan_edits(inv, req({"gpuhook.dev/max-gpus": "1"}), state_dir=str(tmp_path))) == [given[0]]


def test_round_robin_least_used_first(tmp_path):
    keys = [f"k{i}" for i in range(4)]
    assert nodestate.least_used(keys, 3, str(tmp_path), print) == ["k0", "k1", "k2"]
    assert nodestate.least_used(keys, 2, str(tmp_path), print) == ["k0", "k3"]  # k3 unused; k0 used longest ago
    assert nodestate.least_used(keys, 4, str(tmp_path), print) == keys  # no choice: state untouched
    assert nodestate.least_used(keys, 1, None, print) == ["k0"]


def test_round_robin_corrupt_or_unwritable_state(tmp_path):
    w: list[str] = []
    (tmp_path / nodestate.STATE_FILE).write_text("{nonsense")
    assert nodestate.least_used(["a", "b"], 1, str(tmp_path), w.append) == ["a"]
    assert any("unreadable" in x for x in w)
    blocked = tmp_path / "file"
    blocked.write_text("")
    w.clear()
    assert nodestate.least_used(["a", "b"], 1, str(blocked / "sub"), w.append) == ["a"]
    assert w and "round robin" in w[0]


def _create(state_dir: str, out) -> None:
    sys.path.insert(0, REPO)
    from gpuhook.config import Config
    from gpuhook.inventory import NodeState
    from gpuhook.plan import plan as plan_

    state = NodeState(round_robin=nodestate.RoundRobin(state_dir).choose)
    e = plan_(Inventory("/", (nv(8),)), state, req({"gpuhook.dev/max-gpus": "1"}), Config()).edits
    out.put(devices(e)[0])


def test_round_robin_consistent_under_16_concurrent_processes(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_create, args=(str(tmp_path), out)) for _ in range(16)]
    for p in procs:
        p.start()
    given = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    counts = {g: given.count(g) for g in given}
    assert len(counts) == 8 and set(counts.values()) == {2}, counts
    state = json.loads((tmp_path / nodestate.STATE_FILE).read_text())
    assert state["seq"] == 16 and sorted(c for c, _ in state["usage"].values()) == [2] * 8
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_policy_and_plan_stay_off_heavy_imports():
    code = ("import sys; before = set(sys.modules)\n"
            "import gpuhook.plan, gpuhook.plan.policy\n"
            "new = set(sys.modules) - before\n"
            "bad = {'re', 'typing', 'dataclasses', 'pydantic', 'json', 'fcntl', 'gpuhook.probe.nvidia'} & new\n"
            "print(' '.join(sorted(bad)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""


# -- on fake hosts, as the runtime tests build them ---------------------------------------------------

def test_fake_host_device_plugin_nvidia2(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "h"), mknod=False)
    fakehost.nvidia(fh, gpus=4, libs=False)  # minors reversed: /dev/nvidia2 is GPU index 1
    spec = {"linux": {"devices": [{"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2}]}}
    e = plan_edits(probe(fh.root), request_from_spec(spec))
    assert [n.path for n in e.device_nodes if n.path[11:].isdigit()] == ["/dev/nvidia2"]
    assert "GPUHOOK_DEVICES=nvidia:GPU-00000001-1111-2222-3333-444444444445" in e.env


def test_a_fifo_as_the_round_robin_state_does_not_hang_the_create(tmp_path):
    """A FIFO planted where the round robin keeps its state: read non-blocking, refused, and
    the round robin starts afresh (with a warning) instead of hanging every create."""
    import threading

    os.mkfifo(tmp_path / nodestate.STATE_FILE)
    warnings: list = []
    done = threading.Event()
    result: list = []

    def run():
        result.append(nodestate.least_used(["k0", "k1", "k2"], 1, str(tmp_path), warnings.append))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10), "the round robin hung on a FIFO"
    assert result == [["k0"]] and any("unreadable, started afresh" in w for w in warnings)


def test_round_robin_hands_out_pairs_over_several_gpus_least_used_first(tmp_path):
    """max-gpus 2 over 5 GPUs: every GPU is given before one is given twice, each pair in the
    node's order, and a GPU that joins the node later is the first given after it joins."""
    keys = [f"GPU-{i}" for i in range(5)]
    d = str(tmp_path)
    assert nodestate.least_used(keys, 2, d, print) == ["GPU-0", "GPU-1"]
    assert nodestate.least_used(keys, 2, d, print) == ["GPU-2", "GPU-3"]
    # GPU-4 never given; of the rest, GPU-0 and GPU-1 were given longest ago
    assert nodestate.least_used(keys, 2, d, print) == ["GPU-0", "GPU-4"]
    assert nodestate.least_used(keys, 2, d, print) == ["GPU-1", "GPU-2"]
    # now GPU-3 and GPU-4 have one each, the others two: those first
    assert nodestate.least_used(keys, 3, d, print) == ["GPU-0", "GPU-3", "GPU-4"]
    grown = keys + ["GPU-5"]
    assert nodestate.least_used(grown, 1, d, print) == ["GPU-5"]
    # a GPU that left the node is never handed out, and the others keep their counts
    assert nodestate.least_used(["GPU-1", "GPU-2", "GPU-3"], 1, d, print) == ["GPU-1"]
    assert nodestate.least_used(keys, 0, d, print) == []


def test_round_robin_state_is_private_and_a_planted_link_is_not_followed(tmp_path):
    """The state file is the node's: written 0600; a symlink planted in its place is neither
    read nor written through (O_NOFOLLOW, then replaced by a file of gpuhook's own)."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"seq": 9, "usage": {"k0": [100, 8], "k1": [100, 8]}}')
    state = tmp_path / "state"
    state.mkdir()
    (state / nodestate.STATE_FILE).symlink_to(target)
    w: list = []
    assert nodestate.least_used(["k0", "k1", "k2"], 1, str(state), w.append) == ["k0"]  # not read: k2 would be least used
    assert any("unreadable" in x for x in w)
    assert target.read_text() == '{"seq": 9, "usage": {"k0": [100, 8], "k1": [100, 8]}}'
    assert not (state / nodestate.STATE_FILE).is_symlink()
    assert (state / nodestate.STATE_FILE).stat().st_mode & 0o777 == 0o600
    assert nodestate.least_used(["k0", "k1", "k2"], 1, str(state), w.append) == ["k1"]


@pytest.mark.parametrize("content", [
    '{"seq": "x", "usage": {}}', '{"seq": 1, "usage": {"k0": [1]}}', '{"seq": 1, "usage": {"k0": ["a", 1]}}',
    '{"seq": 1, "usage": []}', '{"seq": 1}', '[1, 2]', '{"seq": 1e999, "usage": {}}', '\xff',
])
def test_round_robin_state_of_the_wrong_shape_starts_afresh(tmp_path, content):
    (tmp_path / nodestate.STATE_FILE).write_bytes(content.encode("latin-1"))
    w: list = []
    assert nodestate.least_used(["k0", "k1"], 1, str(tmp_path), w.append) == ["k0"]
    assert any("unreadable, started afresh" in x for x in w)
    w.clear()
    assert nodestate.least_used(["k0", "k1"], 1, str(tmp_path), w.append) == ["k1"] and not w


def test_round_robin_forgets_devices_gone_long_ago_but_not_the_current_ones(tmp_path):
    """A node whose GPUs came and went for years: the state stays bounded, the oldest entries
    are the ones dropped (whatever their names), and what the current GPUs were given is kept."""
    old = {f"gone-{i:05d}": [1, i] for i in range(4100)}
    (tmp_path / nodestate.STATE_FILE).write_text(json.dumps({"seq": 7000, "usage": {**old, "a0": [5, 6999]}}))
    assert nodestate.least_used(["a0", "a1"], 1, str(tmp_path), print) == ["a1"]
    state = json.loads((tmp_path / nodestate.STATE_FILE).read_text())
    assert len(state["usage"]) < len(old)
    assert "a0" in state["usage"] and "a1" in state["usage"]
    assert "gone-00000" not in state["usage"] and "gone-00100" in state["usage"] and "gone-04099" in state["usage"]
    assert nodestate.least_used(["a0", "a1"], 1, str(tmp_path), print) == ["a1"]  # a0's count was kept: 5 > 1


def test_round_robin_counts_every_time_a_gpu_is_given(tmp_path):
    """Least used first, then least recently: a GPU given again is counted again."""
    (tmp_path / nodestate.STATE_FILE).write_text(json.dumps({"seq": 10, "usage": {"a": [2, 1], "b": [1, 8]}}))
    d = str(tmp_path)
    assert nodestate.least_used(["a", "b"], 1, d, print) == ["b"]  # given once, though more recently
    assert nodestate.least_used(["a", "b"], 1, d, print) == ["a"]  # now both twice: a longest ago
    assert nodestate.least_used(["a", "b"], 1, d, print) == ["b"]


def test_round_robin_no_choice_is_no_turn(tmp_path):
    """A container given every GPU (or none) makes no choice: the state is not even rewritten."""
    d = str(tmp_path)
    assert nodestate.least_used(["a", "b", "c"], 1, d, print) == ["a"]
    before = (tmp_path / nodestate.STATE_FILE).read_bytes()
    assert nodestate.least_used(["a", "b", "c"], 3, d, print) == ["a", "b", "c"]
    assert nodestate.least_used(["a", "b", "c"], 0, d, print) == []
    assert (tmp_path / nodestate.STATE_FILE).read_bytes() == before


def test_round_robin_state_dir_and_lock_are_private(tmp_path):
    d = tmp_path / "run" / "gpuhook"
    assert nodestate.least_used(["a", "b"], 1, str(d), print) == ["a"]
    for p in (d, d / nodestate.LOCK_FILE, d / nodestate.STATE_FILE):
        assert p.stat().st_mode & 0o077 == 0, p


def test_round_robin_lock_planted_as_a_link_is_not_followed(tmp_path):
    """A symlink where the lock goes: not opened through (O_NOFOLLOW); the create gets the
    first GPUs, with a warning, and nothing is written."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    (d / nodestate.LOCK_FILE).symlink_to(victim)
    w: list = []
    assert nodestate.least_used(["a", "b"], 1, str(d), w.append) == ["a"]
    assert any("cannot use" in x for x in w)
    assert victim.read_text() == "precious" and not (d / nodestate.STATE_FILE).exists()


def test_round_robin_lock_held_too_long_gives_the_first_with_a_warning(tmp_path, monkeypatch):
    """Another create holds the lock and never lets go (a hung process): the first n, a
    warning, and the state left as it was."""
    import fcntl

    monkeypatch.setattr(nodestate, "LOCK_WAIT_S", 0.05)
    assert nodestate.least_used(["k0", "k1"], 1, str(tmp_path), print) == ["k0"]
    before = (tmp_path / nodestate.STATE_FILE).read_bytes()
    fd = os.open(tmp_path / nodestate.LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        w: list = []
        assert nodestate.least_used(["k0", "k1"], 1, str(tmp_path), w.append) == ["k0"]
        assert any("stayed locked" in x for x in w)
    finally:
        os.close(fd)
    assert (tmp_path / nodestate.STATE_FILE).read_bytes() == before
    assert nodestate.least_used(["k0", "k1"], 1, str(tmp_path), print) == ["k1"]  # and the lock is free again


def test_round_robin_state_that_cannot_be_written_gives_the_first(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    assert nodestate.least_used(["k0", "k1"], 1, str(d), print) == ["k0"]
    (d / nodestate.STATE_FILE).unlink()
    (d / nodestate.STATE_FILE).mkdir()  # rename over a directory fails
    (d / nodestate.STATE_FILE / "x").write_text("")
    w: list = []
    assert nodestate.least_used(["k0", "k1"], 1, str(d), w.append) == ["k0"]
    assert any("cannot update" in x for x in w)


def test_a_checkpoint_index_counts_only_for_nvidias_own_resource(tmp_path):
    """The NVIDIA device plugin may name GPUs by index ("1"). An index is an NVIDIA GPU's only
    under nvidia.com/: another plugin's device "0" (an FPGA) holds no GPU back, and an NVIDIA
    index holds back that GPU, not an AMD GPU of the same index."""
    root = str(tmp_path)
    checkpoint(root, [entry("pod-f", "example.com/fpga", ["0"], v1=True),
                      entry("pod-n", "nvidia.com/gpu", ["2", "5"])])
    e = plan_edits(Inventory(root, INV.vendors), req())
    assert [d for d in devices(e) if d.startswith("nvidia:")] == [
        f"nvidia:GPU-{i:04d}" for i in (0, 1, 3, 4, 6, 7)]
    assert [d for d in devices(e) if d.startswith("amd:")] == ["amd:0000:43:00.0", "amd:0000:44:00.0"]


@pytest.mark.parametrize("ident", ["٣", "３", "+3", "3.0", "GPU-3"])
def test_a_checkpoint_id_that_only_looks_like_an_index_is_no_index(tmp_path, ident):
    """Non-ASCII digits (int("٣") is 3) and other near-numbers are not the NVIDIA plugin's
    indexes: such an id maps to no GPU, so which GPU it takes is unknown and every NVIDIA GPU
    is held back (a plain "3" holds back GPU 3 alone)."""
    checkpoint(str(tmp_path), [entry("pod-x", "nvidia.com/gpu", [ident], v1=True)])
    p = plan_on(Inventory(str(tmp_path), INV.vendors), req())
    given, w = devices(p.edits), p.warnings
    assert [d for d in given if d.startswith("nvidia:")] == []
    assert any("no nvidia GPU is given" in x for x in w)
    checkpoint(str(tmp_path), [entry("pod-x", "nvidia.com/gpu", ["3"], v1=True)])
    given = devices(plan_edits(Inventory(str(tmp_path), INV.vendors), req()))
    assert [d for d in given if d.startswith("nvidia:")] == [f"nvidia:GPU-{i:04d}" for i in (0, 1, 2, 4, 5, 6, 7)]


def test_held_back_explains_long_pod_and_device_names_cut_short(tmp_path):
    """A pod uid or device id of any length from the checkpoint: the explanation stays one
    readable line, cut with '...', and a short one is shown whole."""
    long_pod, long_id = "p" * 500, "GPU-0003" + "x" * 500
    checkpoint(str(tmp_path), [entry(long_pod, "nvidia.com/gpu", ["GPU-0001"], v1=True)])
    whys = [h.why for h in plan_on(Inventory(str(tmp_path), INV.vendors), req()).held_back]
    assert len(whys) == 1 and len(whys[0]) < 200 and "..." in whys[0] and "'GPU-0001'" in whys[0]
    checkpoint(str(tmp_path), [entry("pod-b", "nvidia.com/gpu", [long_id.upper()], v1=True)])
    whys = [h.why for h in plan_on(Inventory(str(tmp_path), INV.vendors), req()).held_back]
    assert len(whys) == 8 and all(len(x) < 250 and "..." in x and "'pod-b'" in x for x in whys)
    assert policy.show("x" * 10) == repr("x" * 10)
    cut = policy.show("y" * 1000)
    assert cut.endswith("...'") and len(cut) < 100 and policy.show(cut) != cut


@pytest.mark.parametrize("path, want", [
    ("/tmp/mps", "/tmp/mps"), ("/tmp/mps/", "/tmp/mps"), ("/run/nvidia-mps", "/run/nvidia-mps"),
    ("relative/dir", None), ("/", None), ("//", None), ("/tmp/../etc", None), ("/tmp/./x", None), ("/tmp//x", None),
    ("/proc/1/root", None), ("/sys/fs", None), ("/dev/shm", None), ("/proc", None),
    ("/procfs/x", "/procfs/x"), ("/tmp/proc", "/tmp/proc"), ("/tmp/a\0b", None), ("/" + "a" * 300, None),
    ("/" + "a" * 254, "/" + "a" * 254), ("/" + "a" * 255, None),
])
def test_container_dir_takes_only_a_plain_absolute_directory(path, want):
    """CUDA_MPS_PIPE_DIRECTORY is the tenant's: a directory gpuhook mounts the node's MPS
    pipes at, so never /, never /proc, /sys or /dev, nothing to normalise, no NUL, not too long."""
    assert nvidia.container_dir(path) == want


def test_request_from_spec_reads_what_the_runtime_wrote(tmp_path):
    """The spec as the runtime wrote it: a relative root is the bundle's, device types are the
    spec's own (b, u kept; anything else read as c), and an empty or missing root is no rootfs."""
    spec = {"root": {"path": "rootfs"}, "linux": {"devices": [
        {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0},
        {"path": "/dev/nvidia0", "type": "u", "major": 195, "minor": 0},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/odd", "type": "x", "major": 1, "minor": 3},
        {"path": "/dev/nonum", "type": "c"}]}}
    r = request_from_spec(spec, str(tmp_path))
    assert r.rootfs == str(tmp_path / "rootfs")
    assert r.spec_devices == {"/dev/sda": ("b", 8, 0), "/dev/nvidia0": ("u", 195, 0),
                              "/dev/nvidia1": ("c", 195, 1), "/dev/odd": ("c", 1, 3), "/dev/nonum": None}
    assert request_from_spec({"root": {"path": "rootfs"}}).rootfs is None  # relative and no bundle
    assert request_from_spec({"root": {"path": ""}}, str(tmp_path)).rootfs is None
    assert request_from_spec({"root": {"path": 7}}, str(tmp_path)).rootfs is None
    assert request_from_spec({"root": {"path": "/run/b/../b/rootfs"}}).rootfs == "/run/b/rootfs"


def test_round_robin_that_cannot_keep_its_state_says_so_in_the_plans_warnings(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    p = plan_on(Inventory("/", (nv(4),)), req({"gpuhook.dev/max-gpus": "1"}), state_dir=str(blocked / "sub"))
    e, warnings = p.edits, p.warnings
    assert devices(e) == ["nvidia:GPU-0000"]
    assert any("round robin" in w for w in warnings)


def test_a_node_without_ldconfig_still_gets_its_libraries_without_the_ld_cache_hook(tmp_path, monkeypatch):
    from gpuhook.probe import nodestate

    monkeypatch.setattr(nodestate, "LDCONFIG_CANDIDATES", (str(tmp_path / "no-ldconfig"),))
    assert nodestate.find_ldconfig() is None
    e = plan_edits(Inventory("/", (nv(1),)), req(rootfs=str(tmp_path)))
    assert devices(e) == ["nvidia:GPU-0000"] and any(m.container_path.endswith("libcuda.so.550.54.14") for m in e.mounts)
    assert not e.hooks


def test_planned_nodes_are_the_probes_numbers_owner_and_mode():
    """What runc creates in the container is the node the probe found: its type, numbers,
    owner, group and mode; and a group-only node brings its group into the container."""
    nodes = (Node("/dev/dri/card1", "c", 226, 1, 0o660, 0, 44), Node("/dev/dri/renderD128", "c", 226, 128, 0o666, 7, 109))
    amd1 = VendorInventory("amd", (Device("amd", "gpu", 0, "0000:43:00.0", nodes, "0000:43:00.0"),),
                           (Node("/dev/kfd", "b", 235, 3, 0o600, 0, 0),))
    e = plan_edits(Inventory("/", (amd1,)), req())
    by_path = {n.path: n for n in e.device_nodes}
    assert by_path["/dev/dri/card1"] == DeviceNode("/dev/dri/card1", "c", 226, 1, "rwm", 0o660, 0, 44)
    assert by_path["/dev/dri/renderD128"] == DeviceNode("/dev/dri/renderD128", "c", 226, 128, "rwm", 0o666, 7, 109)
    assert by_path["/dev/kfd"] == DeviceNode("/dev/kfd", "b", 235, 3, "rwm", 0o600, 0, 0)
    assert e.additional_gids == (44,)  # 0666 needs no group, 0600 gives the group nothing


@pytest.mark.parametrize("mode, needs_group", [
    (0o660, True), (0o664, True), (0o620, True), (0o666, False), (0o667, False), (0o600, False), (0o606, False),
])
def test_a_node_brings_its_group_only_when_only_its_group_may_open_it(mode, needs_group):
    node = Node("/dev/dri/renderD128", "c", 226, 128, mode, 0, 44)
    amd1 = VendorInventory("amd", (Device("amd", "gpu", 0, "0000:43:00.0", (node,), "0000:43:00.0"),))
    assert plan_edits(Inventory("/", (amd1,)), req()).additional_gids == ((44,) if needs_group else ())


@pytest.mark.parametrize("root", ["/srv/nodeX", "/srv/nodeX/"])
def test_a_host_root_is_joined_to_node_paths_cleanly(root):
    """A fake host root (dry runs, tests), with or without a trailing '/': the runtime gets
    the libraries under it, each path written plainly."""
    e = plan_edits(Inventory(root, (nv(1),)), req())
    assert f"/srv/nodeX{CUDA.path}" in {m.host_path for m in e.mounts}
    assert all("//" not in m.host_path for m in e.mounts)


@pytest.mark.parametrize("value", ["void", "VOID", " void ", "", "/var/run/nvidia-container-devices"])
@pytest.mark.parametrize("plugin", [False, True])
def test_visible_void_is_nothing_and_no_warning(value, plugin):
    """Empty, void, or the volume-mounts strategy with no device mounted: nothing at all from
    NVIDIA, not even driver files for a GPU a device plugin put in the spec, and no warning
    (not even when the node's NVIDIA userspace is missing: the container asked for nothing)."""
    spec_devices = {"/dev/nvidia0": ("c", 195, 0)} if plugin else None
    for inv in (Inventory("/", (nv(2),)), Inventory("/", (nv(2)._replace(libraries=()),))):
        p = plan_on(inv, req(env={"NVIDIA_VISIBLE_DEVICES": value}, spec_devices=spec_devices))
        assert not p.edits and p.warnings == ()


@pytest.mark.parametrize("value, want", [
    ("all", None), (" ALL ", None), ("All", None), ("0,1", {0, 1}), ("3, 0 ,x,٣,1234567,123456,", {0, 3, 123456}),
    ("0 1", set()), ("", set()),
])
def test_imex_channels_are_all_or_the_numbers_given(value, want):
    """NVIDIA_IMEX_CHANNELS: "all" (any case) is every channel; else the plain ASCII numbers
    listed (up to 6 digits), the rest ignored."""
    got = nvidia.imex_channels({"NVIDIA_IMEX_CHANNELS": value})
    assert (got if got is None else set(got)) == want
    assert nvidia.imex_channels({}) is None


def test_every_vendors_share_is_kept_whichever_comes_first(tmp_path):
    """A node with AMD and NVIDIA GPUs: the container gets both vendors' nodes and driver
    files, in whichever order the probe lists the vendors."""
    amd_libs = amd(1)._replace(libraries=(Library("/opt/rocm/lib/libhsa-runtime64.so.1", "libhsa-runtime64.so.1", "compute"),),
                               binaries=("/opt/rocm/bin/rocminfo",))
    for vendors_ in ((amd_libs, nv(1)), (nv(1), amd_libs)):
        e = plan_edits(Inventory("/srv/node", vendors_), req(rootfs=str(tmp_path)), ldconfig="/opt/node/ldconfig")
        paths = {n.path for n in e.device_nodes}
        assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/dri/card1", "/dev/kfd"} <= paths
        mounts = {m.container_path: m.host_path for m in e.mounts}
        assert mounts["/opt/rocm/lib/libhsa-runtime64.so.1"] == "/srv/node/opt/rocm/lib/libhsa-runtime64.so.1"
        assert mounts["/opt/rocm/bin/rocminfo"] == "/srv/node/opt/rocm/bin/rocminfo"
        assert mounts[CUDA.path] == "/srv/node" + CUDA.path
        (ld,) = [h for h in e.hooks if "/opt/node/ldconfig" in h.args]  # the node's ldconfig, as given
        assert any(a == "/opt/rocm/lib" for a in ld.args) and not any(a == "/opt/rocm/bin" for a in ld.args)
