"""probe/nodestate.py: what a create reads of the node for plan() before it runs, only what the
node config makes plan() ask for (the checkpoint's own reading: test_pod_policy.py; the MPS
directory's checks: test_trusted_dir.py; plan() itself, with no filesystem: test_plan_pure.py)."""

from __future__ import annotations

import json
import os

import pytest

from gpuhook.config import Config
from gpuhook.inventory import Allocation, Device, Inventory, Node, NodeState, VendorInventory
from gpuhook.probe import nodestate

GPU = Device("nvidia", "gpu", 0, "GPU-0", (Node("/dev/nvidia0", "c", 195, 0),))
NV = VendorInventory("nvidia", (GPU,))
AMD = VendorInventory("amd", (Device("amd", "gpu", 0, "0000:43:00.0", ()),))
HELPER = "/opt/gpuhook/gpuhook-hook"


def host(tmp_path, entries=(), platform=()) -> str:
    """A host root with a kubelet checkpoint of `entries` ((pod, resource, ids)) and AMD
    partition platform devices {name: render node names}."""
    root = tmp_path / "host"
    cp = root / nodestate.CHECKPOINT.lstrip("/")
    cp.parent.mkdir(parents=True)
    cp.write_text(json.dumps({"Data": {"PodDeviceEntries": [
        {"PodUID": pod, "ResourceName": res, "DeviceIDs": ids} for pod, res, ids in entries]}}))
    for name, renders in dict(platform).items():
        for r in renders:
            (root / "sys/devices/platform" / name / "drm" / r).mkdir(parents=True)
    return str(root)


def read(root: str, vendors=(NV,), **config) -> NodeState:
    return nodestate.read(Inventory(root, vendors), Config(**config), ldconfig="/sbin/ldconfig", helper=HELPER)


def test_share_all_reads_no_checkpoint(tmp_path):
    root = host(tmp_path, [("p", "nvidia.com/gpu", ["GPU-0"])])
    assert read(root, share="all") == NodeState(ldconfig="/sbin/ldconfig", helper=HELPER)


def test_share_unallocated_reads_every_pods_allocations_and_the_partitions_they_name(tmp_path):
    root = host(tmp_path, [("p", "nvidia.com/gpu", ["GPU-0"])], {"amdgpu_xcp.1": ["renderD129", "card3"]})
    state = read(root)
    assert state.allocations == (Allocation("nvidia.com/gpu", "GPU-0", "p"),) and state.allocations_unknown is None
    assert state.partitions == {}  # no allocation names a partition: sysfs not read
    root = host(tmp_path / "b", [("p", "amd.com/gpu", ["amdgpu_xcp.1-slice-0"])],
                {"amdgpu_xcp.1": ["renderD129", "card3"], "amdgpu_xcp.2": ["renderD130"], "other.0": ["renderD1"]})
    assert read(root, (AMD,)).partitions == {"amdgpu_xcp.1": frozenset({"/dev/dri/renderD129"}),
                                             "amdgpu_xcp.2": frozenset({"/dev/dri/renderD130"})}


def gone(root: str, content) -> None:
    path = os.path.join(root, nodestate.GONE_FILE.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


def test_the_pods_the_agent_found_gone_hold_nothing_back(tmp_path):
    root = host(tmp_path, [("p", "nvidia.com/gpu", ["GPU-0"]), ("q", "nvidia.com/gpu", ["GPU-1", "GPU-2"])])
    assert {a.pod for a in read(root).allocations} == {"p", "q"}  # no file: every entry held back
    gone(root, {"gone": ["q", "long-gone"]})
    assert read(root).allocations == (Allocation("nvidia.com/gpu", "GPU-0", "p"),)
    assert read(root, share="all").allocations == ()  # not read where nothing is held back anyway


@pytest.mark.parametrize("content", ["{not json", {"gone": "q"}, {"went": ["q"]}, [1], {"gone": [7]}])
def test_a_gone_file_that_cannot_be_read_subtracts_nothing(tmp_path, content):
    root = host(tmp_path, [("q", "nvidia.com/gpu", ["GPU-1"])])
    gone(root, content)
    assert read(root).allocations == (Allocation("nvidia.com/gpu", "GPU-1", "q"),)


def test_an_unreadable_checkpoint_is_said_why(tmp_path):
    root = host(tmp_path)
    with open(os.path.join(root, nodestate.CHECKPOINT.lstrip("/")), "w") as f:
        f.write("{not json")
    state = read(root)
    assert state.allocations == () and state.allocations_unknown.endswith("not a device manager checkpoint (JSONDecodeError)")


def test_the_mps_directory_is_checked_only_where_the_node_names_one_and_has_nvidia_gpus(tmp_path):
    root = host(tmp_path)
    assert (read(root).mps_dir, read(root).mps_refused) == (None, None)  # none named
    named = {"mps_pipe_dir": "/run/mps"}
    assert read(root, **named).mps_refused == "/run/mps: not there"
    for vendors in ((AMD,), (NV._replace(devices=()),)):  # no NVIDIA GPU: not looked at
        state = read(root, vendors, **named)
        assert (state.mps_dir, state.mps_refused) == (None, None)


def test_ldconfig_is_the_callers_then_the_configs_then_the_nodes(tmp_path, monkeypatch):
    exe = tmp_path / "ldconfig"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(nodestate, "LDCONFIG_CANDIDATES", ("/nonexistent/ldconfig", str(exe)))
    inv = Inventory(host(tmp_path), (NV,))
    assert nodestate.read(inv, Config(share="all"), ldconfig="/mine", helper=HELPER).ldconfig == "/mine"
    assert nodestate.read(inv, Config(share="all", ldconfig="/conf"), helper=HELPER).ldconfig == "/conf"
    assert nodestate.read(inv, Config(share="all"), helper=HELPER).ldconfig == str(exe)


def test_the_helper_is_the_callers_or_this_packages_when_it_can_run(tmp_path, monkeypatch):
    from gpuhook import hook

    inv = Inventory(host(tmp_path), (NV,))
    assert nodestate.read(inv, Config(share="all"), helper="/x").helper == "/x"
    built = tmp_path / "gpuhook-hook"
    built.write_text("#!/bin/sh\n")
    monkeypatch.setattr(hook, "package_helper", lambda: str(built))
    assert nodestate.read(inv, Config(share="all")).helper is None  # not executable
    built.chmod(0o755)
    assert nodestate.read(inv, Config(share="all")).helper == str(built)


def test_the_round_robin_only_with_a_state_dir(tmp_path):
    inv = Inventory(host(tmp_path), (NV,))
    assert nodestate.read(inv, Config(share="all"), helper=HELPER).round_robin is None
    choose = nodestate.read(inv, Config(share="all"), str(tmp_path / "state"), helper=HELPER).round_robin
    assert choose(["a", "b"], 1, print) == ["a"] and choose(["a", "b"], 1, print) == ["b"]  # it remembers


@pytest.mark.parametrize("present, found", [
    ({}, None),
    ({"sbin/ldconfig": 0o755}, "/sbin/ldconfig"),
    ({"sbin/ldconfig": 0o644}, None),  # not executable
    ({"sbin/ldconfig": 0o755, "sbin/ldconfig.real": 0o755}, "/sbin/ldconfig.real"),  # Ubuntu's wrapper's target first
    ({"usr/sbin/ldconfig": 0o755}, "/usr/sbin/ldconfig"),
])
def test_find_ldconfig_under_a_consumer_root_names_it_as_the_node_sees_it(tmp_path, present, found):
    node = tmp_path / "node"
    for path, mode in present.items():
        (node / path).parent.mkdir(parents=True, exist_ok=True)
        (node / path).write_text("#!/bin/sh\n")
        (node / path).chmod(mode)
    assert nodestate.find_ldconfig(str(node)) == found
    assert nodestate.find_ldconfig(str(node) + "/") == found
