"""The vendor registry (gpuhook/vendors.py): a vendor has one name wherever gpuhook shows it,
an old spelling an operator wrote still works, and a new vendor is one entry there: the
probe, the planner's annotations, the agent's udev watch and the runtime server's warm-up
all take it from that entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO, TESTS, request
from conftest import plan_on
from gpuhook.agent import labels

from gpuhook.probe import present, probe
from gpuhook.probe.host import Host
from fakes import fakehost


def wsl_host(tmp_path):
    fh = fakehost.FakeHost(str(tmp_path / "wsl"), mknod=False)
    fh.proc_devices({"dxg": 240})
    fh.file("/dev/dxg", "")
    fh.file("/usr/lib/wsl/lib/libdxcore.so", b"\x7fELF")
    return fh


def test_wsls_gpu_has_one_name_from_the_front_to_the_labels(tmp_path):
    """WSL2's GPU is "dxg" where its signs are found (what the C front reads), in the
    inventory, GPUHOOK_ACCELERATOR, GPUHOOK_DEVICES and the node labels."""
    fh = wsl_host(tmp_path)
    inv = probe(fh.root)
    assert present(Host(fh.root)) == ["dxg"]
    assert [v.vendor for v in inv.vendors] == ["dxg"]
    p = plan_on(inv, request(rootfs=None))
    assert p.vendors == ("dxg",) and p.devices == ("dxg:dxg",)
    assert {"GPUHOOK_ACCELERATOR=dxg", "GPUHOOK_DEVICES=dxg:dxg"} <= set(p.edits.env)
    got = labels.node_labels(inv)
    assert got["gpuhook.dev/accelerator"] == "dxg" and got["gpuhook.dev/accelerator.dxg"] == "true"


def test_an_annotation_may_still_name_wsls_gpu_wsl(tmp_path):
    """`gpuhook.dev/vendors: wsl` (the probe's old word) is read as dxg, with no warning; the
    warning for an unknown vendor lists the names only."""
    inv = probe(wsl_host(tmp_path).root)
    for value in ("wsl", "dxg", "nvidia, wsl", " WSL "):
        p = plan_on(inv, request(annotations={"gpuhook.dev/vendors": value}, rootfs=None))
        assert p.vendors == ("dxg",) and p.warnings == (), value
    p = plan_on(inv, request(annotations={"gpuhook.dev/vendors": "nvidia"}, rootfs=None))
    assert not p.edits and p.reason == "the pod's gpuhook.dev/vendors names no vendor of this node"
    p = plan_on(inv, request(annotations={"gpuhook.dev/vendors": "windows"}, rootfs=None))
    assert p.vendors == ("dxg",)  # ignored as a whole: every vendor of the node
    (w,) = p.warnings
    assert "(known: nvidia, amd, intel, accel, dxg)" in w


NEW_VENDOR = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gpuhook import vendors
# the one change a new vendor needs: its entry (and its probe module, fpga_probe.py)
new = vendors.Vendor("fpga", ("/dev/fpga[0-9]*",), "fpga_probe", udev=("fpga",), kernel_modules=("fpga_mgr",),
                     aliases=("fpga-old",))
vendors.VENDORS += (new,)
vendors.NAMES, vendors.BY_NAME, vendors.SPELLINGS = vendors._index(vendors.VENDORS)

from gpuhook.agent import watch
from gpuhook.config import Config
from gpuhook.plan import Request, plan
from gpuhook.probe import nodestate, probe
from gpuhook.runtime import server

inv = probe(sys.argv[2])
p = plan(inv, nodestate.read(inv, Config()), Request({}, {"gpuhook.dev/vendors": "fpga-old"}, None), Config())
print(json.dumps({"accelerator": [e for e in p.edits.env if e.startswith("GPUHOOK_ACCELERATOR=")],
                  "warnings": list(p.warnings), "subsystems": list(watch.UDEV_SUBSYSTEMS),
                  "modules": sorted(watch.UDEV_MODULES), "warm": "fpga_probe" in server.WARM}))
"""

FPGA_PROBE = """
from gpuhook.inventory import Device, Node, VendorInventory

def probe(host):
    if host.lstat("/dev/fpga0") is None:
        return None
    return VendorInventory("fpga", (Device("fpga", "accel", 0, "fpga0", (Node("/dev/fpga0", "c", 240, 0),)),))
"""


def test_a_new_vendor_is_one_registry_entry(tmp_path):
    """A vendor added to the registry alone is probed where its sign is, given to a container
    (named by its alias in an annotation), watched by the agent (its udev subsystem and
    kernel module) and imported ahead by the runtime server."""
    (tmp_path / "fpga_probe.py").write_text(textwrap.dedent(FPGA_PROBE))
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "fpga0").write_text("")
    env = {**os.environ, "PYTHONPATH": REPO}
    r = subprocess.run([sys.executable, "-c", NEW_VENDOR, str(tmp_path), str(root)], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["accelerator"] == ["GPUHOOK_ACCELERATOR=fpga"] and got["warnings"] == []
    assert got["subsystems"] == ["drm", "kfd", "accel", "fpga", "module"] and "fpga_mgr" in got["modules"]
    assert got["warm"]


def test_a_probe_that_names_its_vendor_otherwise_is_not_taken(tmp_path, monkeypatch):
    """The registry's name is the vendor's one name: a probe module whose inventory (or a
    device of it) says another (a rename in vendors.py its module missed, as "wsl" was dxg's)
    gives nothing under that name, and the probe says why in a warning."""
    import types

    from gpuhook import vendors
    from gpuhook.inventory import Device, Node, VendorInventory

    def fpga_probe(spelling: str, device_spelling: str):
        def run(host):
            node = Node("/dev/fpga0", "c", 240, 0)
            return VendorInventory(spelling, (Device(device_spelling, "accel", 0, "fpga0", (node,)),))
        return types.SimpleNamespace(probe=run)

    monkeypatch.setitem(vendors.BY_NAME, "fpga", vendors.Vendor("fpga", (), "fpga_probe"))
    for spelling, device_spelling in (("fpga-old", "fpga"), ("fpga", "fpga-old")):
        monkeypatch.setitem(sys.modules, "fpga_probe", fpga_probe(spelling, device_spelling))
        inv = probe(str(tmp_path), ("fpga",), signs=False)
        assert inv.vendors == (), spelling
        assert any("fpga probe" in w and "fpga-old" in w for w in inv.warnings), inv.warnings
    monkeypatch.setitem(sys.modules, "fpga_probe", fpga_probe("fpga", "fpga"))
    assert [v.vendor for v in probe(str(tmp_path), ("fpga",), signs=False).vendors] == ["fpga"]


RENAMED = """
import json, sys
from gpuhook import vendors
from fakes import fakehost

new = {"nvidia": "nv", "amd": "radeon", "intel": "arc", "accel": "npu", "dxg": "wsl2"}
vendors.VENDORS = tuple(vendors.Vendor(name=new[v.name], signs=v.signs, probe=v.probe) for v in vendors.VENDORS)
vendors.NAMES, vendors.BY_NAME, vendors.SPELLINGS = vendors._index(vendors.VENDORS)
from gpuhook.probe import probe

out = {}
for old, name in new.items():
    root = f"{sys.argv[1]}/{old}"
    fh = fakehost.FakeHost(root, mknod=False)
    if old in ("nvidia", "amd", "intel"):
        fakehost.SCENARIOS[old](fh)
    elif old == "dxg":
        fh.proc_devices({"dxg": 240})
        fh.file("/dev/dxg", "")
    else:
        fh.proc_devices({"accel": 261})
        fh.chardev("/dev/accel/accel0", 261, 0)
    inv = probe(root, (name,), signs=False)
    out[name] = sorted({v.vendor for v in inv.vendors} | {d.vendor for v in inv.vendors for d in v.devices})
print(json.dumps(out))
"""


def test_a_vendor_renamed_in_the_registry_alone_is_probed_under_its_new_name(tmp_path):
    """Each probe module takes its vendor's name from the registry (vendors.by_module): a
    rename there alone, of every vendor, names their devices by the new names."""
    r = subprocess.run([sys.executable, "-c", RENAMED, str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join((REPO, TESTS))}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"nv": ["nv"], "radeon": ["radeon"], "arc": ["arc"], "npu": ["npu"],
                                    "wsl2": ["wsl2"]}
