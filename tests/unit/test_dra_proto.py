"""gpuhook/dra's gRPC modules are protoc's from the kubelet's own .proto files (regen.py)."""

from __future__ import annotations

import os

import pytest

from gpuhook.dra import regen

KUBELET = "/var/cache/gpuhook-test/go/mod/k8s.io/kubelet@v0.37.2/pkg/apis"


def test_checked_in_modules_are_what_the_protos_give(tmp_path):
    made = regen.generate(str(tmp_path))
    for name in regen.generated_names():
        with open(os.path.join(regen.HERE, name), "rb") as have, open(os.path.join(made, name), "rb") as want:
            assert have.read() == want.read(), f"{name} is stale: make dra-proto"


@pytest.mark.parametrize(
    "ours, theirs", [("dra.proto", "dra/v1/api.proto"), ("pluginregistration.proto", "pluginregistration/v1/api.proto"),
     ("podresources.proto", "podresources/v1/api.proto")]
)
def test_the_protos_are_the_kubelets_own(ours, theirs):
    src = os.path.join(KUBELET, theirs)
    if not os.path.exists(src):
        pytest.skip(f"{src}: the Go module cache is not on this machine")
    with open(os.path.join(regen.HERE, ours), "rb") as a, open(src, "rb") as b:
        assert a.read() == b.read()


def test_the_services_are_the_kubelets_names():
    from gpuhook.dra import dra_pb2, pluginregistration_pb2

    assert dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert (
        pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name
        == "pluginregistration.Registration"
    )
