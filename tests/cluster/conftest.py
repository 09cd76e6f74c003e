"""The real cluster's fixtures (tests/cluster/): the control plane of controlplane.py, started
once per session. As root (make test) a cluster that cannot be had (no Go, no module proxy, a
daemon that does not come up) fails the tests with one line; elsewhere they skip."""

from __future__ import annotations

import os

import pytest

import controlplane
import gobuild

REQUIRE = os.environ.get("GPUHOOK_REQUIRE_E2E") == "1"


@pytest.fixture(scope="session")
def control_plane():
    """A started controlplane.ControlPlane (etcd, kube-apiserver, kube-controller-manager,
    kube-scheduler of versions.KUBERNETES_VERSION), stopped at the end of the session."""
    if os.geteuid() != 0:
        if REQUIRE:
            pytest.fail("the cluster tests need root (a bridge, the daemons)", pytrace=False)
        pytest.skip("the cluster tests need root (make test runs them as root)")
    cp = controlplane.ControlPlane()
    try:
        cp.start()
    except (gobuild.Unavailable, controlplane.ControlPlaneError) as e:
        pytest.fail(f"no control plane: {e}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
