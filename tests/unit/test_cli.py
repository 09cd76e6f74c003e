"""The gpuhook command, run as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import NO_CONFIG, REPO, TESTS, gpuhook
from gpuhook.models import InventoryModel


SPEC = json.dumps({"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["PATH=/bin"]},
                   "root": {"path": "/run/c/rootfs"}, "x-unknown": {"kept": [1, 2]}}, indent=1)


def test_probe_on_this_cpu_only_machine():
    r = gpuhook("probe", config=NO_CONFIG)
    assert r.returncode == 0
    assert "CPU-only node" in r.stdout


def test_probe_json_follows_the_schema(make_host):
    root = make_host("nvidia", mknod=False)
    r = gpuhook("probe", "--root", root, "--json", config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    inv = InventoryModel.model_validate_json(r.stdout)
    assert len(inv.vendors[0].devices) == 8


def node_log(tmp_path) -> tuple[str, object]:
    """(GPUHOOK_CONFIG, the log file) of a node config that logs in tmp_path, defaults otherwise."""
    conf = tmp_path / "gpuhook.toml"
    conf.write_text(f'log_file = "{tmp_path}/gpuhook.log"\n')
    return str(conf), tmp_path / "gpuhook.log"


def test_precreate_on_an_8_gpu_host(make_host, tmp_path):
    root = make_host("nvidia", mknod=False)
    conf, log = node_log(tmp_path)
    r = gpuhook("precreate", "--root", root, stdin=SPEC, config=conf)
    assert r.returncode == 0, r.stderr
    (line,) = [json.loads(x) for x in log.read_text().splitlines()]  # the create core's record, this front's
    assert (line["front"], line["decision"], len(line["devices"])) == ("precreate", "injected", 8)
    spec = json.loads(r.stdout)
    devices = {d["path"]: (d["major"], d["minor"]) for d in spec["linux"]["devices"]}
    for minor in range(8):
        assert devices[f"/dev/nvidia{minor}"] == (195, minor)
    assert devices["/dev/nvidiactl"] == (195, 255) and "/dev/nvidia-uvm" in devices
    rules = spec["linux"]["resources"]["devices"]
    for path, (major, minor) in devices.items():
        assert {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"} in rules
    mounts = {m["destination"]: m for m in spec["mounts"]}
    for lib in ("libcuda.so.550.54.14", "libnvidia-ml.so.550.54.14"):
        m = mounts[f"/usr/lib/x86_64-linux-gnu/{lib}"]
        assert m["source"] == f"{root}/usr/lib/x86_64-linux-gnu/{lib}" and m["options"][0] == "ro"
    assert "GPUHOOK_ACCELERATOR=nvidia" in spec["process"]["env"]
    assert spec["x-unknown"] == {"kept": [1, 2]}


def test_precreate_on_a_cpu_only_host_is_byte_for_byte(make_host, tmp_path):
    root = make_host("cpu")
    conf, log = node_log(tmp_path)
    r = gpuhook("precreate", "--root", root, stdin=SPEC.encode(), text=False, config=conf)
    assert r.returncode == 0 and r.stdout == SPEC.encode()
    assert [json.loads(x)["decision"] for x in log.read_text().splitlines()] == ["no-gpu"]


def test_plan_dry_run(make_host):
    root = make_host("amd", mknod=False)
    r = gpuhook("plan", "--root", root, config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    assert "GPUHOOK_ACCELERATOR=amd" in r.stdout and "/dev/kfd" in r.stdout
    r = gpuhook("plan", "--root", make_host("nvidia+intel", mknod=False), "--json", config=NO_CONFIG)
    edits = json.loads(r.stdout)["edits"]
    assert "GPUHOOK_ACCELERATOR=nvidia,intel" in edits["env"]
    assert any(h["hookName"] == "createContainer" for h in edits["hooks"])


@pytest.mark.parametrize("args, stdin, message", [
    (("precreate",), "{not json", "stdin: not valid JSON"),
    (("precreate",), "[1, 2]", "must be a JSON object"),
    (("precreate",), "", "stdin: not valid JSON"),
    (("probe", "--root", "/nonexistent"), None, "--root /nonexistent: not a directory"),
    (("plan", "--spec", "/nonexistent.json"), None, "--spec /nonexistent.json: No such file"),
])
def test_bad_input_is_one_line_and_nonzero(args, stdin, message):
    r = gpuhook(*args, stdin=stdin, config=NO_CONFIG)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1


def test_version():
    r = gpuhook("--version", config=NO_CONFIG)
    assert r.returncode == 0 and r.stdout.startswith("gpuhook 0.")


@pytest.mark.parametrize("scenario, words", [
    ("nvidia", "ld cache update, isolated in /run/c/rootfs (/sbin/ldconfig"),
    ("intel", "/dev/dri/by-path links, isolated in /run/c/rootfs (pci-0000:00:02.0-card -> ../card0"),
])
def test_plan_describes_each_hook_kind(make_host, tmp_path, scenario, words):
    """`gpuhook plan --spec` says what each hook does, by its kind, whatever the image holds."""
    root = make_host(scenario, mknod=False)
    spec = tmp_path / "config.json"
    spec.write_text(SPEC)
    (tmp_path / "node.toml").write_text('ldconfig = "/sbin/ldconfig"\n')
    r = gpuhook("plan", "--root", root, "--spec", str(spec), config=str(tmp_path / "node.toml"))
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if "createContainer hook:" in x]
    assert len(lines) == 1 and words in lines[0], r.stdout


def test_plan_shows_the_gpus_held_back_and_why(make_host, tmp_path):
    """The default share = "unallocated": GPUs the kubelet's checkpoint gives other pods are
    held back, and `gpuhook plan` names each one; share = "all" gives them."""
    from fakes import fakehost

    root = make_host("nvidia", mknod=False, gpus=2)
    uuids = [d["id"] for d in json.loads(gpuhook("probe", "--root", root, "--json", config=NO_CONFIG).stdout)["vendors"][0]["devices"]]
    fakehost.FakeHost(root).file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", json.dumps({
        "Data": {"PodDeviceEntries": [{"PodUID": "trainer-uid", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                                       "DeviceIDs": {"0": [uuids[1]]}, "AllocResp": "CgA="}]}, "Checksum": 1}))
    r = gpuhook("plan", "--root", root, config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"GPUHOOK_DEVICES=nvidia:{uuids[0]}\n" in out
    assert ('held back (1; share = "unallocated", set share = "all" in the node config to give them anyway):\n'
            f"  nvidia:{uuids[1]}: allocated by the kubelet to pod 'trainer-uid' (nvidia.com/gpu '{uuids[1]}')") in out
    r = gpuhook("plan", "--root", root, "--json", config=NO_CONFIG)
    assert json.loads(r.stdout)["held_back"] == [{"device": f"nvidia:{uuids[1]}", "why": (
        f"allocated by the kubelet to pod 'trainer-uid' (nvidia.com/gpu '{uuids[1]}')")}]
    (tmp_path / "all.toml").write_text('share = "all"\n')
    r = gpuhook("plan", "--root", root, config=str(tmp_path / "all.toml"))
    assert "held back" not in r.stdout and uuids[1] in r.stdout
    # every GPU allocated to someone else: the container runs without, and plan says why
    fakehost.FakeHost(root).file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", json.dumps({
        "Data": {"PodDeviceEntries": [{"PodUID": "t", "ContainerName": "c", "ResourceName": "nvidia.com/gpu",
                                       "DeviceIDs": uuids}]}, "Checksum": 1}))
    out = gpuhook("plan", "--root", root, config=NO_CONFIG).stdout
    assert 'No GPU for this container: all 2 GPU(s) held back: allocated by the kubelet to other pods' in out


def test_simulate_is_plan_on_a_fake_host_from_the_checkout():
    """tests/simulate.py: `gpuhook plan` over one of the tests' fake hosts (the development
    entry point that replaced `gpuhook plan --simulate`: the fakes are not installed)."""
    sim = [sys.executable, os.path.join(TESTS, "simulate.py")]
    env = dict(os.environ, GPUHOOK_CONFIG=NO_CONFIG)
    r = subprocess.run([*sim, "nvidia+intel", "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "GPUHOOK_ACCELERATOR=nvidia,intel" in json.loads(r.stdout)["edits"]["env"]
    r = subprocess.run([*sim, "quantum"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "quantum: unknown node" in r.stderr
    assert not os.path.exists(os.path.join(REPO, "gpuhook", "testing"))
