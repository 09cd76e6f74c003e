"""gpuhook dra's ResourceSlices (gpuhook/dra/slices.py, publish.py): what the probe finds on
the fake hosts, as devices users select on, `none` on every node; kept in the API as published."""

from __future__ import annotations

import json
import os
import re

import pytest

from dra_api import DRAFakeAPI, published
from gpuhook import cdi
from gpuhook.dra import DRIVER, publish, slices
from gpuhook.inventory import Device, Node, VendorInventory
from gpuhook.probe import probe
from fakes import fakehost

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


def _host(tmp_path, build) -> str:
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    build(fh)
    return fh.root


def _kinds(devices) -> list[tuple[str, str]]:
    return [(p.device["attributes"]["kind"]["string"], p.device["attributes"]["vendor"]["string"]) for p in devices]


# the fake host -> (kind, vendor) of each device published, `none` last
CASES = {
    "nvidia 8 GPUs": (fakehost.nvidia, [("gpu", "nvidia")] * 8),
    "amd": (fakehost.amd, [("gpu", "amd")] * 2),
    "intel": (fakehost.intel, [("gpu", "intel")] * 2),
    "nvidia and intel": (
        lambda fh: (fakehost.nvidia(fh, gpus=2), fakehost.intel(fh, dgpu=False)),
        [("gpu", "nvidia")] * 2 + [("gpu", "intel")],
    ),
    "amd MI300X partitions": (fakehost.amd_mi300, [("partition", "amd")] * 8),
    "cpu only": (fakehost.cpu_only, []),
    # a driver with no userspace on the node has no CDI spec: its GPUs cannot be prepared
    "nvidia without userspace": (lambda fh: fakehost.nvidia(fh, gpus=2, libs=False, userspace=False), []),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_gpu_of_any_vendor_then_none(tmp_path, case):
    build, gpus = CASES[case]
    devices = published(_host(tmp_path, build))
    assert _kinds(devices) == [*gpus, ("none", "none")]
    names = [p.name for p in devices]
    assert len(set(names)) == len(names) and all(DNS_LABEL.match(n) for n in names)
    none = devices[-1]
    assert (none.name, none.cdi_id, none.device["allowMultipleAllocations"]) == ("none", "gpuhook.dev/none=none", True)
    for p in devices[:-1]:
        assert "allowMultipleAllocations" not in p.device  # a GPU goes to one claim
        assert p.cdi_id.startswith(f"gpuhook.dev/{p.device['attributes']['vendor']['string']}=")


def test_a_gpus_attributes_and_cdi_id(tmp_path):
    root = _host(tmp_path, lambda fh: fakehost.nvidia(fh, gpus=2, driver="550.54.14"))
    first = published(root)[0]
    uuid = "GPU-00000000-1111-2222-3333-444444444444"
    assert first.name == "nvidia-" + uuid.lower()
    assert first.cdi_id == f"gpuhook.dev/nvidia={uuid}"  # the vendor spec's device by its stable id
    assert first.device["attributes"] == {
        "kind": {"string": "gpu"},
        "vendor": {"string": "nvidia"},
        "id": {"string": uuid},
        "uuid": {"string": uuid},
        "mig": {"bool": False},
        "model": {"string": "NVIDIA H100 80GB HBM3"},
        "pciBusID": {"string": "0000:18:00.0"},
        "index": {"int": 0},
        "driver": {"string": "nvidia"},
        "driverVersion": {"version": "550.54.14"},
    }
    spec = {s["kind"]: s for s in cdi.specs(probe(root), ldconfig=False, helper=False)}["gpuhook.dev/nvidia"]
    edits = next(d["containerEdits"] for d in spec["devices"] if d["name"] == uuid)
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia1"]  # that GPU, exactly


def test_an_nvidia_gpu_says_whether_it_has_mig_instances(tmp_path):
    devices = published(_host(tmp_path, lambda fh: fakehost.nvidia(fh, gpus=2, mig=True)))
    assert [p.device["attributes"]["mig"] for p in devices[:-1]] == [{"bool": True}, {"bool": False}]
    assert "mig" not in devices[-1].device["attributes"]


def test_a_partition_names_its_gpu(tmp_path):
    first = published(_host(tmp_path, fakehost.amd_mi300))[0].device["attributes"]
    assert first["kind"] == {"string": "partition"} and first["parent"] == {"string": "0000:05:00.0"}
    assert "uuid" not in first and "driverVersion" not in first  # nothing the probe did not find


@pytest.mark.parametrize(
    "given, published",
    [
        ("550.54.14", "550.54.14"),
        ("550.54", "550.54.0"),
        ("7", "7.0.0"),
        ("550.54.14-rc1", None),
        ("01.2", None),
        (None, None),
    ],
)
def test_driver_version_is_a_semantic_version_or_absent(given, published):
    node = Node("/dev/x", "c", 1, 1)
    v = VendorInventory("nvidia", (Device("nvidia", "gpu", 0, "GPU-1", (node,)),), driver_version=given)
    got = slices.attributes(v, v.devices[0]).get("driverVersion")
    assert got == ({"version": published} if published else None)


def test_long_ids_give_a_short_stable_name():
    d = Device("accel", "accel", 0, "x" * 100, ())
    name = slices.device_name("accel", d)
    assert DNS_LABEL.match(name) and name == slices.device_name("accel", d) and name.startswith("accel-")
    assert name != slices.device_name("accel", d._replace(id="y" * 100))


def test_a_pool_of_more_than_128_devices_is_cut_in_slices():
    devices = tuple(slices.Published(f"d{i}", f"k/x={i}", {"name": f"d{i}"}) for i in range(300))
    out = slices.resource_slices("node-1", devices, 4)
    assert [len(s["spec"]["devices"]) for s in out] == [128, 128, 44]
    assert {
        (s["spec"]["pool"]["name"], s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
        for s in out
    } == {("node-1", 4, 3)}
    assert [s["metadata"]["name"] for s in out] == [
        "node-1-gpuhook.dev-0",
        "node-1-gpuhook.dev-1",
        "node-1-gpuhook.dev-2",
    ]
    assert all(s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == "node-1" for s in out)


# -- in the API ----------------------------------------------------------------------------


@pytest.fixture
def api():
    a = DRAFakeAPI(node="node-1")
    yield a
    a.close()


def test_slices_written_kept_and_put_back(tmp_path, api):
    pub = publish.SlicePublisher(api.client(), "node-1")
    root = _host(tmp_path, lambda fh: fakehost.nvidia(fh, gpus=2))
    devices = published(root)
    assert pub.sync(devices) == ["applied node-1-gpuhook.dev-0"]
    (only,) = api.slices.values()
    assert only["spec"]["pool"] == {"name": "node-1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in only["spec"]["devices"]] == [p.name for p in devices]
    assert pub.sync(devices) == []  # nothing changed: no write

    # someone else removes a device from it: put back, at the same generation (the driver's devices did not change)
    api.edit_slice("node-1-gpuhook.dev-0", lambda s: s["spec"]["devices"].pop(0))
    assert pub.sync(devices) == ["applied node-1-gpuhook.dev-0"]
    assert api.slices["node-1-gpuhook.dev-0"]["spec"]["devices"] == [p.device for p in devices]
    assert api.slices["node-1-gpuhook.dev-0"]["spec"]["pool"]["generation"] == 1

    # a GPU disappears: the slice drops it, in a new generation
    fewer = devices[1:]
    assert pub.sync(fewer) == ["applied node-1-gpuhook.dev-0"]
    s = api.slices["node-1-gpuhook.dev-0"]["spec"]
    assert [d["name"] for d in s["devices"]] == [p.name for p in fewer] and s["pool"]["generation"] == 2
    # a slice of this node and driver that is not the driver's any more: deleted
    api.slices["node-1-gpuhook.dev-7"] = dict(
        api.slices["node-1-gpuhook.dev-0"], metadata={"name": "node-1-gpuhook.dev-7"}
    )
    api.slices["node-2-gpuhook.dev-0"] = {
        "metadata": {"name": "node-2-gpuhook.dev-0"},
        "spec": {"nodeName": "node-2", "driver": DRIVER},
    }
    assert pub.sync(fewer) == ["deleted node-1-gpuhook.dev-7"]
    assert sorted(api.slices) == ["node-1-gpuhook.dev-0", "node-2-gpuhook.dev-0"]  # another node's left alone

    # the driver restarted: the pool in the API is taken as its own, no new generation for the same devices
    again = publish.SlicePublisher(api.client(), "node-1")
    assert again.sync(fewer) == [] and api.slices["node-1-gpuhook.dev-0"]["spec"]["pool"]["generation"] == 2
    assert again.sync(devices) == ["applied node-1-gpuhook.dev-0"]
    assert api.slices["node-1-gpuhook.dev-0"]["spec"]["pool"]["generation"] == 3


def test_a_field_the_api_drops_is_written_again_but_the_generation_holds(tmp_path, api):
    """Where the DRAConsumableCapacity gate is off the API server drops allowMultipleAllocations
    from `none`: the slice never equals what was applied. Each round writes it again; the
    pool's generation must not climb with it (consumers would see a new pool every round)."""
    api.drop_on_write = lambda obj: [d.pop("allowMultipleAllocations", None) for d in obj["spec"]["devices"]]
    pub = publish.SlicePublisher(api.client(), "node-1")
    devices = published(_host(tmp_path, fakehost.cpu_only))
    for _ in range(3):
        assert pub.sync(devices) == ["applied node-1-gpuhook.dev-0"]
    assert api.slices["node-1-gpuhook.dev-0"]["spec"]["pool"]["generation"] == 1


def test_node_devices_write_the_cdi_specs_they_publish(tmp_path):
    root = _host(tmp_path, fakehost.amd)
    node = publish.NodeDevices(root, str(tmp_path / "cdi"), ldconfig=False, helper=False)
    table = {p.name: p.cdi_id for p in node.refresh()}
    assert table == node.table() and table["none"] == "gpuhook.dev/none=none"
    written = sorted(p.name for p in (tmp_path / "cdi").iterdir())
    assert written == ["gpuhook.dev-amd.yaml", "gpuhook.dev-gpu.yaml", "gpuhook.dev-none.yaml"]


def test_the_agents_prune_leaves_the_none_spec(tmp_path):
    """The agent writes the node's GPU kinds and removes those it no longer has: gpuhook.dev/none
    (the DRA driver's, on every node) is not one of them."""
    root = _host(tmp_path, fakehost.amd)
    specs = cdi.specs(probe(root), ldconfig=False, helper=False)
    cdi.write_dir(specs + [cdi.none_spec()], str(tmp_path / "cdi"))
    cdi.write_dir([], str(tmp_path / "cdi"))  # the GPUs gone, as the agent sees it
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["gpuhook.dev-none.yaml"]
    assert cdi.none_spec() == {
        "cdiVersion": "0.3.0",
        "kind": "gpuhook.dev/none",
        "devices": [{"name": "none", "containerEdits": {"env": ["GPUHOOK_ACCELERATOR=cpu"]}}],
    }


def test_a_gpus_memory_is_its_capacity_where_the_kernel_says_it(tmp_path):
    """AMD and Intel xe: capacity gpuhook.dev/memory, the bytes sysfs states, as a quantity;
    NVIDIA (no file without NVML), i915 and `none`: no capacity at all."""
    amd = published(_host(tmp_path / "amd", fakehost.amd))
    assert [p.device.get("capacity") for p in amd] == [{"memory": {"value": "65520Mi"}}] * 2 + [None]
    intel = published(_host(tmp_path / "intel", fakehost.intel))
    assert [p.device.get("capacity") for p in intel] == [None, {"memory": {"value": "16Gi"}}, None]
    nvidia = published(_host(tmp_path / "nvidia", fakehost.nvidia))
    assert {str(p.device.get("capacity")) for p in nvidia} == {"None"}


@pytest.mark.parametrize(
    "n, text",
    [
        (fakehost.MI210_VRAM, "65520Mi"),
        (fakehost.FLEX170_VRAM, "16Gi"),
        (1024, "1Ki"),
        (1 << 60, "1Ei"),
        (1023, "1023"),
        (1000, "1k"),
        (16 * 10**9, "15625000Ki"),  # a multiple of 1024: binary, as the API server keeps it
        (10**9 + 1, "1000000001"),
        (1001 * 10**6, "1001M"),
    ],
)
def test_memory_is_written_as_the_api_server_writes_it_back(n, text):
    """The canonical form (resource.Quantity's): a slice read back equals the one written, so
    a round has nothing to put back (tests/cluster/test_dra_slices_real.py asks the API server)."""
    assert slices.quantity(n) == text


def test_node_devices_write_the_specs_as_the_agent_is_told_to(tmp_path):
    """--cdi-format and --max-cdi-version, the agent's (cli/args.add_cdi_dir_args): JSON files,
    capped at 0.3.0 with what was left out kept to be said; the same devices published."""
    root = _host(tmp_path, lambda fh: fakehost.nvidia(fh, gpus=2))  # its library mounts have a type: 0.4.0
    plain = publish.NodeDevices(root, str(tmp_path / "yaml"), ldconfig=False, helper=False)
    node = publish.NodeDevices(
        root, str(tmp_path / "json"), ldconfig=False, helper=False, cdi_format="json", max_cdi_version="0.3.0"
    )
    assert node.refresh() == plain.refresh()
    files = sorted(os.listdir(tmp_path / "json"))
    assert files and all(f.endswith(".json") for f in files)
    versions = {json.load(open(tmp_path / "json" / f))["cdiVersion"] for f in files}
    assert versions and versions == {"0.3.0"}
    # the index names ("0", "1") need 0.5.0: left out, the UUID names kept (they are what is published)
    assert ("gpuhook.dev/nvidia", ["device names starting with a digit", "mount type"]) in node.dropped
    assert plain.dropped == []
    assert sorted(f.rsplit(".", 1)[0] for f in files) == sorted(
        f.rsplit(".", 1)[0] for f in os.listdir(tmp_path / "yaml")
    )


def test_the_service_says_what_the_cap_left_out_once(tmp_path, api):
    """As the agent's cdi.capped: a warning when what --max-cdi-version leaves out changes."""
    from gpuhook.dra import driver, service

    root = _host(tmp_path, lambda fh: fakehost.nvidia(fh, gpus=2))
    devices = publish.NodeDevices(root, str(tmp_path / "cdi"), ldconfig=False, helper=False, max_cdi_version="0.3.0")
    client = api.client()
    drv = driver.Driver(
        "node-1", driver.Checkpoint(str(tmp_path / "cp.json")), client.get_resource_claim, devices.table
    )
    lines: list = []

    class Log:
        def __getattr__(self, level):
            return lambda event, **kw: lines.append((level, event, kw))

    svc = service.Service("node-1", devices, drv, client, Log(), 1)
    svc.round()
    svc.round()
    capped = [line for line in lines if line[1] == "dra.cdi.capped"]
    assert capped == [
        (
            "warning",
            "dra.cdi.capped",
            {
                "max_version": "0.3.0",
                "left_out": {
                    "gpuhook.dev/nvidia": ["device names starting with a digit", "mount type"],
                    "gpuhook.dev/gpu": ["mount type"],
                },
            },
        )
    ]
    assert [line for line in lines if line[0] == "error"] == []
