"""The seed's outage on a real cluster (tests/cluster/node.py): three nodes, NVIDIA, AMD and
CPU-only, gpuhook installed as operators install it, then the seed's Deployment through the
failure of its GPU nodes."""

from __future__ import annotations

import node


def test_three_nodes_and_gpuhook_installed_by_its_daemonset(gpuhook_installed):
    c = gpuhook_installed
    for spec in node.NODES:
        labels = c.labels(spec.name)
        print(spec.name, {k: v for k, v in labels.items() if k.startswith("gpuhook.dev/") or k == "gpu.type"})
    assert c.labels(node.NVIDIA.name).get("gpu.type") == "nvidia"
