"""daemonset/dra/resourceslice-restriction.yaml, evaluated with cel-python as
test_admission.py evaluates the other policies (tests/admission_cel.py): the driver's
ServiceAccount writes the ResourceSlices `gpuhook dra` makes for its own node
(slices.resource_slices) and no other: not another node's, not another driver's, not a pool
or a name of another node, not without the node name of a bound token.
tests/cluster/test_dra_slices_real.py sends the same requests to a real kube-apiserver, the
judge where the two could disagree."""

from __future__ import annotations

import copy

import pytest
from admission_cel import AGENT, admit, policy

from gpuhook.dra import DRIVER, slices

POLICY = "gpuhook-own-resourceslices"
NOT_OWN = (
    "gpuhook may only write ResourceSlices of driver gpuhook.dev on the node its own pod runs on, in the pool "
    "named after that node"
)
NAMED = "gpuhook's ResourceSlices are named NODE-gpuhook.dev-NUMBER"


def a_slice(node: str = "gpu-1", i: int = 0) -> dict:
    """What the driver writes for `node`: its `none` device, slice i."""
    out = slices.resource_slices(node, (slices.none_device(),), 1)
    return out[0] if i == 0 else dict(out[0], metadata={"name": slices.slice_name(node, i)})


def write(
    operation: str, new: dict | None, old: dict | None = None, user: str = AGENT, own: str | None = "gpu-1"
) -> list[str]:
    return admit(POLICY, operation, new, old=old, user=user, node=own, resource="resourceslices")


def changed(s: dict, **spec) -> dict:
    out = copy.deepcopy(s)
    out["spec"].update(spec)
    return out


def test_the_driver_writes_its_own_nodes_slices():
    mine = a_slice()
    assert write("CREATE", mine) == []
    assert write("UPDATE", changed(mine, devices=[]), mine) == []
    assert write("DELETE", None, mine) == []
    assert write("CREATE", a_slice(i=12)) == []  # a pool of more than one slice


@pytest.mark.parametrize(
    "operation",
    ["CREATE", "UPDATE", "DELETE"],
)
def test_another_nodes_slice_is_refused(operation):
    theirs = a_slice("gpu-2")
    new, old = {"CREATE": (theirs, None), "UPDATE": (theirs, theirs), "DELETE": (None, theirs)}[operation]
    assert write(operation, new, old) == [NOT_OWN]


def test_another_drivers_slice_is_refused():
    vendor = changed(a_slice(), driver="gpu.nvidia.com")
    assert write("CREATE", vendor) == [NOT_OWN]
    assert write("DELETE", None, vendor) == [NOT_OWN]
    # made its own on the way in or on the way out: either side is refused
    assert write("UPDATE", a_slice(), vendor) == [NOT_OWN]
    assert write("UPDATE", vendor, a_slice()) == [NOT_OWN]


def test_a_pool_of_another_node_is_refused():
    other_pool = changed(a_slice(), pool={"name": "gpu-2", "generation": 1, "resourceSliceCount": 1})
    assert write("CREATE", other_pool) == [NOT_OWN]


@pytest.mark.parametrize("spec", [{"allNodes": True}, {"nodeSelector": {"nodeSelectorTerms": []}}])
def test_a_slice_for_no_one_node_is_refused(spec):
    s = a_slice()
    del s["spec"]["nodeName"]
    s["spec"].update(spec)
    assert write("CREATE", s) == [NOT_OWN]


@pytest.mark.parametrize(
    "name", ["gpu-2-gpuhook.dev-0", "gpu-1", "gpu-1-gpuhook.dev-gpuhook.dev-0", "gpu-1-gpuhook.dev-1000"]
)
def test_a_name_that_is_not_its_own_is_refused(name):
    """gpu-1-gpuhook.dev-gpuhook.dev-0 is the slice name of node gpu-1-gpuhook.dev: taken,
    that node's driver could never write its slice."""
    s = a_slice()
    s["metadata"]["name"] = name
    assert write("CREATE", s) == [NAMED]


def test_without_a_bound_tokens_node_name_nothing_is_written():
    """A token from a Secret, or --as the ServiceAccount: no node name to be own to."""
    assert write("CREATE", a_slice(), own=None) == [NOT_OWN]
    assert write("DELETE", None, a_slice(), own=None) == [NOT_OWN]


def test_nobody_else_is_looked_at():
    assert write("CREATE", a_slice("gpu-2"), user="system:serviceaccount:nvidia:nvidia-dra", own="gpu-1") == []
    assert write("CREATE", a_slice("gpu-2"), user="system:node:gpu-2", own=None) == []


def test_the_policy_knows_the_drivers_name_and_slice_names():
    """The policy's literals are the driver's: DRIVER, and slice_name's shape."""
    text = str(policy(POLICY)["spec"])
    assert f'"{DRIVER}"' in text and f'"-{DRIVER}-"' in text
    assert slices.slice_name("n", 7) == f"n-{DRIVER}-7"
