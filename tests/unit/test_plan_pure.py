"""plan(inventory, node_state, request, config) is pure: every case here runs with the
filesystem taken away (open, stat, access, listdir... raise), so what it decides comes from
its four arguments alone. What plan() needs of the node is read before it (probe/nodestate.py,
tested in test_pod_policy.py, test_trusted_dir.py and through the fake hosts elsewhere)."""

from __future__ import annotations

import builtins
import contextlib
import os

import pytest

from conftest import request
from gpuhook import hook
from gpuhook.config import Config
from gpuhook.edits import Mount
from gpuhook.inventory import Allocation, Device, Inventory, Library, Node, NodeState, VendorInventory
from gpuhook.plan import ALLOCATED, UNMAPPED, UNREADABLE, plan
from gpuhook.plan.nvidia import BIND_RW
from gpuhook.probe import nodestate

ME, OTHER = "pod-me", "pod-other"
NV = VendorInventory(
    "nvidia",
    tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{i}", "c", 195, i),)) for i in range(3)),
    (Node("/dev/nvidiactl", "c", 195, 255),),
    (Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.1", "libcuda.so.1", "compute"),),
    (),
    "550.1",
)
# one MI300X partition on its PCI device, one on an amdgpu_xcp platform device
AMD = VendorInventory("amd", tuple(
    Device("amd", "partition", i, f"0000:05:00.{i}", (Node(f"/dev/dri/renderD{128 + i}", "c", 226, 128 + i),),
           "0000:05:00.0", None, None, "0000:05:00.0") for i in range(2)), (Node("/dev/kfd", "c", 235, 0),))
INV = Inventory("/node", (NV,))
LDCONFIG, HELPER = "/sbin/ldconfig", "/opt/gpuhook/gpuhook-hook"
UNALLOCATED, ALL = Config(share="unallocated"), Config(share="all")


def alloc(ident: str, pod: str = OTHER, resource: str = "nvidia.com/gpu") -> Allocation:
    return Allocation(resource, ident, pod)


def _refuse(*args, **kw):
    raise AssertionError(f"plan() touched the filesystem: {args[:2]}")


FILESYSTEM = ((builtins, ("open",)),
              (os, ("open", "stat", "lstat", "access", "listdir", "scandir", "readlink", "makedirs", "mkdir",
                    "rename", "replace", "unlink", "getcwd")))


@contextlib.contextmanager
def no_filesystem():
    """Every way to read (or write) a file taken away while the block runs."""
    saved = [(mod, name, getattr(mod, name)) for mod, names in FILESYSTEM for name in names]
    for mod, name, _ in saved:
        setattr(mod, name, _refuse)
    try:
        yield
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)


def pure(*args):
    """plan(*args) with no filesystem."""
    with no_filesystem():
        return plan(*args)


def test_the_filesystem_is_really_gone():
    """The guard itself: a read through any of them fails the case, and reading the node's
    state (what a create does before plan) is such a read."""
    with no_filesystem(), pytest.raises(AssertionError, match="touched the filesystem"):
        open("/etc/hostname")
    with no_filesystem(), pytest.raises(AssertionError):
        os.stat("/")
    with no_filesystem(), pytest.raises(AssertionError):
        nodestate.read(INV, UNALLOCATED)


# (what varies, inventory, node state, annotations, config) -> (devices given, held back as (device, reason))
CASES = {
    "a CPU-only node": (Inventory("/node", ()), NodeState(), {}, UNALLOCATED, (), ()),
    "no checkpoint, every GPU": (INV, NodeState(), {}, UNALLOCATED, ("nvidia:GPU-0", "nvidia:GPU-1", "nvidia:GPU-2"), ()),
    "another pod's GPU held back": (
        INV, NodeState((alloc("GPU-1"),)), {}, UNALLOCATED,
        ("nvidia:GPU-0", "nvidia:GPU-2"), (("nvidia:GPU-1", ALLOCATED),)),
    "the pod's own allocation is not held back": (
        INV, NodeState((alloc("GPU-1", ME), alloc("2"))), {"io.kubernetes.cri.sandbox-uid": ME}, UNALLOCATED,
        ("nvidia:GPU-0", "nvidia:GPU-1"), (("nvidia:GPU-2", ALLOCATED),)),
    "outside Kubernetes every allocation is another pod's": (
        INV, NodeState((alloc("GPU-1", ME),)), {}, UNALLOCATED,
        ("nvidia:GPU-0", "nvidia:GPU-2"), (("nvidia:GPU-1", ALLOCATED),)),
    "share = all gives allocated GPUs too": (
        INV, NodeState((alloc("GPU-1"),), "never read"), {}, ALL, ("nvidia:GPU-0", "nvidia:GPU-1", "nvidia:GPU-2"), ()),
    "an unreadable checkpoint gives nothing": (
        INV, NodeState((), "checkpoint unreadable"), {}, UNALLOCATED, (),
        (("nvidia:GPU-0", UNREADABLE), ("nvidia:GPU-1", UNREADABLE), ("nvidia:GPU-2", UNREADABLE))),
    "an id that names no GPU holds the vendor's back": (
        INV, NodeState((alloc("GPU-9"),)), {}, UNALLOCATED, (),
        (("nvidia:GPU-0", UNMAPPED), ("nvidia:GPU-1", UNMAPPED), ("nvidia:GPU-2", UNMAPPED))),
    "an AMD partition by its platform device's render node": (
        Inventory("/node", (AMD,)),
        NodeState((alloc("amdgpu_xcp.1", resource="amd.com/gpu"),), None, {"amdgpu_xcp.1": frozenset({"/dev/dri/renderD129"})}),
        {}, UNALLOCATED, ("amd:0000:05:00.0",), (("amd:0000:05:00.1", ALLOCATED),)),
    "an AMD partition the partition map does not hold is unmapped": (
        Inventory("/node", (AMD,)), NodeState((alloc("amdgpu_xcp.7", resource="amd.com/gpu"),)), {}, UNALLOCATED,
        (), (("amd:0000:05:00.0", UNMAPPED), ("amd:0000:05:00.1", UNMAPPED))),
    "max-gpus without a round robin: the first": (
        INV, NodeState(), {"gpuhook.dev/max-gpus": "2"}, UNALLOCATED, ("nvidia:GPU-0", "nvidia:GPU-1"), ()),
}


@pytest.mark.parametrize("inv, state, annotations, config, devices, held", CASES.values(), ids=CASES.keys())
def test_what_plan_gives_from_its_arguments_alone(inv, state, annotations, config, devices, held):
    p = pure(inv, state, request(annotations=annotations, rootfs=None), config)
    assert p.devices == devices
    assert tuple((h.device, h.reason) for h in p.held_back) == held


def test_max_gpus_asks_the_node_states_round_robin_for_what_is_not_in_the_spec():
    asked = []

    def last(keys, n, warn):  # a round robin with its memory here: what plan() asked; the last n
        asked.append((list(keys), n))
        return keys[-n:]

    spec = {"/dev/nvidia0": ("c", 195, 0)}  # a device plugin's GPU: counted first, not chosen
    p = pure(INV, NodeState(round_robin=last),
             request(annotations={"gpuhook.dev/max-gpus": "2"}, spec_devices=spec, rootfs=None), UNALLOCATED)
    assert p.devices == ("nvidia:GPU-0",)  # the spec pinned NVIDIA's devices: none other to choose
    asked.clear()
    inv = Inventory("/node", (NV, AMD))
    p = pure(inv, NodeState(round_robin=last),
             request(annotations={"gpuhook.dev/max-gpus": "2"}, rootfs=None), UNALLOCATED)
    assert asked == [(["nvidia:GPU-0", "nvidia:GPU-1", "nvidia:GPU-2", "amd:0000:05:00.0",
                               "amd:0000:05:00.1"], 2)]
    assert p.devices == ("amd:0000:05:00.0", "amd:0000:05:00.1")


HOOKED = NodeState(ldconfig=LDCONFIG, helper=HELPER)


@pytest.mark.parametrize("state, config, hooks, warned", [
    (HOOKED, Config(log_file="/var/log/g.log"), [(hook.LDCACHE, f"{hook.LOG_ENV}=/var/log/g.log")], False),
    (HOOKED, Config(log_file=""), [(hook.LDCACHE, None)], False),
    (NodeState(helper=HELPER), UNALLOCATED, [], False),  # no ldconfig on the node: no ld-cache hook
    (NodeState(ldconfig=LDCONFIG), UNALLOCATED, [], True),  # no helper: no hook, and a warning
])
def test_the_hooks_come_from_the_node_states_ldconfig_and_helper(state, config, hooks, warned):
    p = pure(INV, state, request(rootfs="/run/c/rootfs"), config)
    got = [(h.kind, next((e for e in h.env if e.startswith(hook.LOG_ENV + "=")), None)) for h in p.edits.hooks]
    assert got == hooks
    assert all(h.path == HELPER and h.args[-2:] == (LDCONFIG, "/usr/lib/x86_64-linux-gnu") for h in p.edits.hooks)
    assert any("is missing" in w for w in p.warnings) == warned


@pytest.mark.parametrize("state, env, mounts, warning", [
    (NodeState(), {}, [], None),  # the node names no MPS directory
    (NodeState(mps_dir="/node/run/mps"), {}, [Mount("/node/run/mps", "/tmp/nvidia-mps", "bind", BIND_RW)], None),
    (NodeState(mps_dir="/node/run/mps"), {"CUDA_MPS_PIPE_DIRECTORY": "/mps"},
     [Mount("/node/run/mps", "/mps", "bind", BIND_RW)], None),
    (NodeState(mps_refused="/run/mps: not there"), {}, [], "mps_pipe_dir: /run/mps: not there; MPS not mounted"),
    (NodeState(mps_dir="/node/run/mps"), {"NVIDIA_DRIVER_CAPABILITIES": "utility"}, [], None),  # no compute: no MPS
])
def test_mps_comes_from_the_node_state(state, env, mounts, warning):
    p = pure(INV, state, request(env=env, rootfs=None), UNALLOCATED)
    assert [m for m in p.edits.mounts if m.options == BIND_RW] == mounts
    assert [w for w in p.warnings if "mps" in w.lower()] == ([warning] if warning else [])
