"""CDI specs from the node's GPUs: kinds, names, versions, paths, the ld-cache hook, YAML."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading

import pytest
from hypothesis import given, settings, strategies as st

from conftest import NO_CONFIG, gpuhook
from gpuhook import cdi, hook
from gpuhook.inventory import Device, Inventory, Library, Node, VendorInventory
from gpuhook.probe import nodestate, probe
from fakes.cdi_yaml import load_yaml


# -- fixtures ------------------------------------------------------------------------------

NV = VendorInventory(
    "nvidia",
    tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{7 - i}", "c", 195, 7 - i),), f"0000:1{i}:00.0",
                 "NVIDIA H100") for i in range(2)),
    (Node("/dev/nvidiactl", "c", 195, 255),),
    (Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.1", "libcuda.so.1", "compute"),),
    ("/usr/bin/nvidia-smi",),
    "550.1",
)
INTEL = VendorInventory("intel", (Device("intel", "gpu", 0, "0000:00:02.0", (Node("/dev/dri/card0", "c", 226, 0),
                                                                            Node("/dev/dri/renderD128", "c", 226, 128))),))
AMD = VendorInventory("amd", (
    Device("amd", "partition", 0, "0000:43:00.1", (Node("/dev/dri/renderD128", "c", 226, 128),), "0000:43:00.0"),
    Device("amd", "partition", 1, "0000:43:00.1/renderD129", (Node("/dev/dri/renderD129", "c", 226, 129),), "0000:43:00.0"),
), (Node("/dev/kfd", "c", 235, 0),))
INV = Inventory("/", (NV, INTEL))


def by_kind(specs):
    return {s["kind"]: s for s in specs}


def device(spec, name):
    return next(d for d in spec["devices"] if d["name"] == name)


# -- kinds, names, edits -----------------------------------------------------------------

def test_one_kind_per_vendor_and_a_vendor_agnostic_one():
    specs = by_kind(cdi.specs(INV, ldconfig="/sbin/ldconfig"))
    assert list(specs) == ["gpuhook.dev/nvidia", "gpuhook.dev/intel", "gpuhook.dev/gpu"]
    nv = specs["gpuhook.dev/nvidia"]
    assert [d["name"] for d in nv["devices"]] == ["0", "GPU-0", "1", "GPU-1", "all"]
    # a device by index and by UUID: its own node only, nothing else
    assert device(nv, "0")["containerEdits"] == device(nv, "GPU-0")["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/nvidia7", "type": "c", "major": 195, "minor": 7, "permissions": "rwm"}]}
    assert device(nv, "1")["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia6"
    # all: every GPU, and the device list of the env contract
    all_ = device(nv, "all")["containerEdits"]
    assert [n["path"] for n in all_["deviceNodes"]] == ["/dev/nvidia7", "/dev/nvidia6"]
    assert all_["env"] == ["GPUHOOK_DEVICES=nvidia:GPU-0,nvidia:GPU-1"]
    # node-wide: control nodes, libraries, binaries, the hook, the accelerator
    top = nv["containerEdits"]
    assert top["env"] == ["GPUHOOK_ACCELERATOR=nvidia"]
    assert [n["path"] for n in top["deviceNodes"]] == ["/dev/nvidiactl"]
    assert [m["containerPath"] for m in top["mounts"]] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.1",
                                                           "/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/bin/nvidia-smi"]
    # at their host paths, read-only; the development name is the versioned file again
    assert [m["hostPath"] for m in top["mounts"]] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"] * 2 + ["/usr/bin/nvidia-smi"]
    assert all("ro" in m["options"] for m in top["mounts"])
    assert len(top["hooks"]) == 1 and top["hooks"][0]["hookName"] == "createContainer"
    # Intel has no node-wide nodes and no libraries: only the accelerator variable
    intel = specs["gpuhook.dev/intel"]
    assert intel["containerEdits"] == {"env": ["GPUHOOK_ACCELERATOR=intel"]}
    assert [d["name"] for d in intel["devices"]] == ["0", "0000-00-02.0", "all"]
    # the vendor-agnostic kind: exactly what the runtime class injects
    gpu = specs["gpuhook.dev/gpu"]
    assert [d["name"] for d in gpu["devices"]] == ["all"]
    env = device(gpu, "all")["containerEdits"]["env"]
    assert env == ["GPUHOOK_ACCELERATOR=nvidia,intel", "GPUHOOK_DEVICES=nvidia:GPU-0,nvidia:GPU-1,intel:0000:00:02.0"]
    assert len(device(gpu, "all")["containerEdits"]["deviceNodes"]) == 5


def test_never_a_vendors_own_kind():
    for s in cdi.specs(Inventory("/", (NV, INTEL, AMD))):
        assert s["kind"].startswith("gpuhook.dev/"), s["kind"]


def test_names_follow_cdi_rules_and_never_repeat():
    specs = by_kind(cdi.specs(Inventory("/", (AMD,))))
    names = [d["name"] for d in specs["gpuhook.dev/amd"]["devices"]]
    assert names == ["0", "0000-43-00.1", "1", "0000-43-00.1-renderD129", "all"]
    for s in specs.values():
        for d in s["devices"]:
            assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", d["name"])


@pytest.mark.parametrize("text,name", [("GPU-8f3c", "GPU-8f3c"), ("0000:43:00.0", "0000-43-00.0"),
                                       ("/dev/x/", "dev-x"), ("::", ""), ("a b", "a-b")])
def test_safe_name(text, name):
    assert cdi.safe_name(text) == name


def test_a_device_without_nodes_of_its_own_is_only_in_all():
    odd = VendorInventory("intel", (Device("intel", "gpu", 0, "0000:00:02.0", ()),
                                    Device("intel", "gpu", 1, "0000:03:00.0", (Node("/dev/dri/card1", "c", 226, 1),))))
    (spec, _) = cdi.specs(Inventory("/", (odd,)))
    assert [d["name"] for d in spec["devices"]] == ["1", "0000-03-00.0", "all"]


def test_cpu_only_node_has_no_spec():
    assert cdi.specs(Inventory("/", ())) == []


def test_the_lowest_version_that_has_the_fields():
    specs = by_kind(cdi.specs(INV))
    # device names that start with a digit (the indexes "0", "1"...: CDI's requiresV050, which
    # containerd's CDI registry enforces; tests/cluster/test_dra_real.py found it)
    assert specs["gpuhook.dev/nvidia"]["cdiVersion"] == "0.5.0"
    assert specs["gpuhook.dev/intel"]["cdiVersion"] == "0.5.0"
    assert cdi.required_version({"kind": "a.b/c", "devices": [{"name": "0", "containerEdits": {}}]}) == "0.5.0"
    assert cdi.required_version({"kind": "a.b/c", "devices": [{"name": "all", "containerEdits": {}}]}) == "0.3.0"
    # under a fake host, device nodes get a hostPath (0.5.0): what podman 4.3 still reads
    fake = by_kind(cdi.specs(INV._replace(root="/h"), spec_root="/h"))
    assert fake["gpuhook.dev/nvidia"]["cdiVersion"] == "0.5.0"
    assert device(fake["gpuhook.dev/nvidia"], "0")["containerEdits"]["deviceNodes"][0]["hostPath"] == "/h/dev/nvidia7"
    assert fake["gpuhook.dev/nvidia"]["containerEdits"]["mounts"][0]["hostPath"] == "/h/usr/lib/x86_64-linux-gnu/libcuda.so.550.1"
    assert cdi.required_version({"kind": "a.b/c", "devices": [{"name": "x", "containerEdits": {"additionalGids": [44]}}]}) == "0.7.0"
    assert cdi.required_version({"kind": "a.b/c.d", "devices": []}) == "0.6.0"


def test_spec_paths_are_the_nodes_view_not_the_probe_root(make_host):
    """The agent probes /host in its pod; the node's runtime reads the spec at /."""
    root = make_host("nvidia", mknod=False)
    specs = by_kind(cdi.specs(probe(root)))  # spec_root "/"
    top = specs["gpuhook.dev/nvidia"]["containerEdits"]
    assert all(m["hostPath"].startswith("/usr/") for m in top["mounts"])
    assert all("hostPath" not in n for n in top["deviceNodes"])
    under = by_kind(cdi.specs(probe(root), spec_root=root))["gpuhook.dev/nvidia"]["containerEdits"]
    assert all(m["hostPath"].startswith(root + "/usr/") for m in under["mounts"])
    assert all(n["hostPath"] == root + n["path"] for n in under["deviceNodes"])


@pytest.mark.parametrize("scenario", ["nvidia", "amd", "intel", "nvidia+intel", "bmc", "cpu"])
def test_every_simulated_node_validates(make_host, scenario):
    specs = cdi.specs(probe(make_host(scenario, mknod=False)), ldconfig="/sbin/ldconfig")
    kinds = [s["kind"] for s in specs]
    if scenario in ("bmc", "cpu"):
        assert kinds == []
    else:
        assert kinds[-1] == "gpuhook.dev/gpu"
        assert kinds[:-1] == ["gpuhook.dev/" + v for v in scenario.split("+")]
    for s in specs:
        cdi.validate(s)
        assert load_yaml(cdi.dumps(s, "yaml")) == s
        assert json.loads(cdi.dumps(s, "json")) == s


def test_capped_for_older_consumers(make_host):
    """AMD/Intel nodes need additionalGids (0.7.0); podman 4.3 reads up to 0.5.0."""
    inv = probe(make_host("amd", mknod=True))
    full = by_kind(cdi.specs(inv))
    if not full["gpuhook.dev/amd"].get("containerEdits", {}).get("additionalGids"):
        pytest.skip("the fake host's nodes are not group-only here (no render group)")
    assert full["gpuhook.dev/amd"]["cdiVersion"] == "0.7.0"
    dropped = []
    capped = by_kind(cdi.specs(inv, max_version="0.5.0", dropped=dropped))
    assert capped["gpuhook.dev/amd"]["cdiVersion"] == "0.5.0"  # its devices' names are PCI addresses
    assert "additionalGids" not in json.dumps(capped)
    assert dropped == [("gpuhook.dev/amd", ["additionalGids"]), ("gpuhook.dev/gpu", ["additionalGids"])]
    assert by_kind(cdi.specs(inv, max_version="0.7.0")) == full
    with pytest.raises(cdi.CDIError, match="0.9.9"):
        cdi.specs(inv, max_version="0.9.9")
    # a fake host's hostPath goes too below 0.5.0: runtimes take type/major/minor
    (s,) = cdi.specs(Inventory("/h", (INTEL,)), spec_root="/h", max_version="0.4.0")[:1]
    assert s["cdiVersion"] == "0.3.0" and "hostPath" not in json.dumps(s)
    assert [d["name"] for d in s["devices"]] == ["all"]  # "0" and the PCI names need 0.5.0


@pytest.mark.parametrize("spec,error", [
    ({"cdiVersion": "0.9.9", "kind": "gpuhook.dev/x", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}, "cdiVersion"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}, "vendor/class"),
    ({"cdiVersion": "0.5.0", "kind": "Bad_Vendor/x", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}, "DNS"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x", "devices": []}, "at least one device"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x", "devices": [{"name": "-a", "containerEdits": {"env": ["A=1"]}}]}, "name rules"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x", "devices": [{"name": "a\n", "containerEdits": {"env": ["A=1"]}}]}, "name rules"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x\n", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}, "vendor/class"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x", "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}] * 2}, "twice"),
    ({"cdiVersion": "0.5.0", "kind": "gpuhook.dev/x", "devices": [{"name": "a", "containerEdits": {}}]}, "needs container edits"),
    ({"cdiVersion": "0.3.0", "kind": "gpuhook.dev/x", "devices": [{"name": "a", "containerEdits": {
        "deviceNodes": [{"path": "/dev/a", "hostPath": "/h/dev/a"}]}}]}, "lacks fields"),
])
def test_validate_refuses(spec, error):
    with pytest.raises(cdi.CDIError, match=error):
        cdi.validate(spec)


# -- the ld-cache hook, as CDI must run it ----------------------------------------------------

def _run_hook(tmp_path, config: dict, indent, rootfs_rel: bool, ldconfig: str | None = None, hook_entry=None):
    """Run a CDI hook of gpuhook's as runc would, the OCI state on stdin: (its result, the
    container root it chose (where `ldconfig`, a marker, made /found), the bundle). The nvidia
    spec's ld-cache hook unless a hook is given."""
    if hook_entry is None:
        (hook_entry,) = by_kind(cdi.specs(INV, ldconfig=ldconfig))["gpuhook.dev/nvidia"]["containerEdits"]["hooks"]
    bundle = tmp_path / "the bundle"  # a space: every path stays one argument
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    config = dict(config, root={"path": "rootfs" if rootfs_rel else str(bundle / "rootfs"), "readonly": False})
    (bundle / "config.json").write_text(json.dumps(config, indent=indent))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
                        "bundle": str(bundle),
                        # a tenant's annotations: a "bundle" of its own, and a root.path look-alike
                        "annotations": {"x": "\"root\": {\"path\": \"/evil\"}", "bundle": str(tmp_path / "evil")}})
    (tmp_path / "evil" / "rootfs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "evil" / "config.json").write_text(json.dumps({"root": {"path": str(tmp_path / "evil" / "rootfs")}}))
    r = subprocess.run([hook_entry["path"], *hook_entry["args"][1:]], input=state, capture_output=True, text=True,
                       env=dict(e.split("=", 1) for e in hook_entry["env"]), timeout=10, executable=hook_entry["path"])
    chosen = [d for d in (bundle / "rootfs", tmp_path / "evil" / "rootfs") if (d / "found").exists()]
    return r, chosen, bundle


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuhook-hook isolates itself: root only")
@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("rel", [False, True])
def test_hook_finds_the_rootfs_from_the_oci_state(tmp_path, indent, rel, marker_ldconfig):
    """The spec's hook takes hook.ROOTFS_FROM_STATE: the helper finds the root in what the runtime
    wrote (the state's bundle, its config.json's root.path, under the bundle when relative), never
    in what the tenant wrote (annotations, env, a mount named /root)."""
    config = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "env": ["A=\"root\": {\"path\": \"/no\"}"]},
              "annotations": {"k": "v", "root": "{\"path\": \"/evil\"}"}, "mounts": [{"destination": "/root"}]}
    r, chosen, bundle = _run_hook(tmp_path, config, indent, rel, marker_ldconfig)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert chosen == [bundle / "rootfs"]


def test_every_hook_of_a_spec_finds_its_rootfs_in_the_state(make_host):
    specs = cdi.specs(probe(make_host("intel", mknod=False))) + cdi.specs(INV, ldconfig="/sbin/ldconfig")
    hooks = [h for spec in specs for e in [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
             for h in e.get("hooks", ())]
    assert {hook.parse(h["args"])[0] for h in hooks} == {hook.LDCACHE, hook.BYPATH}
    assert all(h["path"] == hook.package_helper() and hook.parse(h["args"])[1] == hook.ROOTFS_FROM_STATE for h in hooks)


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuhook-hook isolates itself: root only")
def test_hook_never_stops_the_container():
    (entry,) = by_kind(cdi.specs(INV, ldconfig="/sbin/ldconfig"))["gpuhook.dev/nvidia"]["containerEdits"]["hooks"]
    r = subprocess.run([entry["path"], *entry["args"][1:]], input="not json", capture_output=True, text=True,
                       timeout=10, env={})
    assert r.returncode == 0 and "gpuhook-ldcache: the OCI state on stdin names no bundle; skipped" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="gpuhook-hook isolates itself: root only")
def test_intels_by_path_links_through_cdi(tmp_path, make_host):
    """plan()'s other rootfs hook: /dev/dri/by-path links, made in the container's /dev."""
    specs = by_kind(cdi.specs(probe(make_host("intel", mknod=False))))
    (entry,) = specs["gpuhook.dev/intel"]["containerEdits"]["hooks"]
    assert hook.parse(entry["args"])[:2] == (hook.BYPATH, hook.ROOTFS_FROM_STATE)
    r, _, bundle = _run_hook(tmp_path, {"ociVersion": "1.0.2"}, None, True, hook_entry=entry)
    assert r.returncode == 0, r.stderr
    assert "/dev is not a directory" in r.stderr  # no /dev yet: nothing made, the container starts
    (bundle / "rootfs" / "dev" / "dri").mkdir(parents=True)
    r, _, bundle = _run_hook(tmp_path, {"ociVersion": "1.0.2"}, None, True, hook_entry=entry)
    assert r.returncode == 0 and r.stderr == ""
    links = bundle / "rootfs" / "dev" / "dri" / "by-path"
    assert os.readlink(links / "pci-0000:00:02.0-render") == "../renderD128"
    assert os.readlink(links / "pci-0000:03:00.0-card") == "../card1"


def test_the_hook_uses_the_nodes_ldconfig(tmp_path):
    """In the DaemonSet the node's / is at --root: its ldconfig, named as the node sees it."""
    node = tmp_path / "node"
    (node / "sbin").mkdir(parents=True)
    (node / "sbin" / "ldconfig").write_text("#!/bin/sh\n")
    os.chmod(node / "sbin" / "ldconfig", 0o755)
    assert nodestate.find_ldconfig(str(node)) == "/sbin/ldconfig"
    (entry,) = by_kind(cdi.specs(INV, ldconfig="/sbin/ldconfig.real"))["gpuhook.dev/gpu"]["devices"][0]["containerEdits"]["hooks"]
    assert hook.parse(entry["args"])[0] == hook.LDCACHE and hook.parse(entry["args"])[2][0] == "/sbin/ldconfig.real"


def test_no_ldconfig_on_the_node_no_hook(make_host, tmp_path):
    specs = by_kind(cdi.specs(INV, ldconfig=False))
    assert "hooks" not in specs["gpuhook.dev/nvidia"]["containerEdits"]
    assert "hooks" not in specs["gpuhook.dev/gpu"]["devices"][0]["containerEdits"]
    # the command looks for the node's ldconfig under --root: a fake host has none
    root = make_host("nvidia", mknod=False)
    r = gpuhook("cdi", "generate", "--root", root, "--output", "-", "--format", "json", "--kind", "gpu", config=NO_CONFIG)
    assert r.returncode == 0 and "hooks" not in r.stdout


# -- YAML -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8), json_values,
                       min_size=1, max_size=5))
def test_yaml_round_trips(value):
    text = cdi.to_yaml(value)
    text.encode("utf-8")
    assert load_yaml(text) == value


def test_yaml_escapes_what_yaml_reads_as_line_breaks():
    text = cdi.to_yaml({"a": "x\u2028y\u0085z\ufeff", "true": "on", "b": ["", "no"]})
    assert "\u2028" not in text and "\u0085" not in text
    assert 'b:\n- ""\n- "no"' in text and '"true": "on"' in text
    assert load_yaml(text) == {"a": "x\u2028y\u0085z\ufeff", "true": "on", "b": ["", "no"]}


# -- files --------------------------------------------------------------------------------------

def test_write_dir_is_atomic_idempotent_and_prunes(tmp_path):
    d = str(tmp_path / "cdi")
    os.makedirs(d)
    (tmp_path / "cdi" / "nvidia.yaml").write_text("not ours")
    specs = cdi.specs(INV)
    assert cdi.write_dir(specs, d) == (["gpuhook.dev-nvidia.yaml", "gpuhook.dev-intel.yaml", "gpuhook.dev-gpu.yaml"], [])
    ino = os.stat(os.path.join(d, "gpuhook.dev-nvidia.yaml")).st_ino
    assert cdi.write_dir(specs, d) == ([], [])  # unchanged bytes: nothing written
    assert os.stat(os.path.join(d, "gpuhook.dev-nvidia.yaml")).st_ino == ino
    # Intel gone, JSON now: the old files go, other vendors' files stay
    written, removed = cdi.write_dir(cdi.specs(Inventory("/", (NV,))), d, "json")
    assert written == ["gpuhook.dev-nvidia.json", "gpuhook.dev-gpu.json"]
    assert removed == ["gpuhook.dev-gpu.yaml", "gpuhook.dev-intel.yaml", "gpuhook.dev-nvidia.yaml"]
    assert sorted(os.listdir(d)) == ["gpuhook.dev-gpu.json", "gpuhook.dev-nvidia.json", "nvidia.yaml"]
    assert cdi.write_dir([], d, "json") == ([], ["gpuhook.dev-gpu.json", "gpuhook.dev-nvidia.json"])


def test_readers_never_see_a_partial_spec(tmp_path):
    d = str(tmp_path / "cdi")
    big = cdi.specs(INV)
    small = cdi.specs(Inventory("/", (NV._replace(devices=NV.devices[:1]),)))
    stop = threading.Event()
    bad = []

    def read():
        while not stop.is_set():
            for name in os.listdir(d) if os.path.isdir(d) else ():
                if name.startswith("."):
                    continue  # CDI reads *.yaml / *.json only
                try:
                    with open(os.path.join(d, name)) as f:
                        cdi.validate(load_yaml(f.read()))
                except FileNotFoundError:
                    pass
                except Exception as e:  # noqa: BLE001
                    bad.append(f"{name}: {e!r}")

    t = threading.Thread(target=read)
    t.start()
    try:
        for i in range(60):
            cdi.write_dir(big if i % 2 else small, d)
    finally:
        stop.set()
        t.join()
    assert not bad, bad[:3]


# -- the command ---------------------------------------------------------------------------------

def test_cdi_generate_command(make_host, tmp_path):
    root = make_host("nvidia+intel", mknod=False)
    out = tmp_path / "cdi"
    r = gpuhook("cdi", "generate", "--root", root, "--output-dir", str(out), config=NO_CONFIG)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["gpuhook.dev-gpu.yaml", "gpuhook.dev-intel.yaml", "gpuhook.dev-nvidia.yaml"]
    assert "gpuhook.dev/nvidia (cdiVersion 0.5.0): 0, GPU-" in r.stdout
    nv = load_yaml((out / "gpuhook.dev-nvidia.yaml").read_text())
    assert nv["kind"] == "gpuhook.dev/nvidia" and len(nv["devices"]) == 5
    r = gpuhook("cdi", "generate", "--root", root, "--output", "-", "--format", "json", "--kind", "intel", config=NO_CONFIG)
    assert r.returncode == 0 and json.loads(r.stdout)["kind"] == "gpuhook.dev/intel"
    r = gpuhook("cdi", "generate", "--root", root, "--output", "-", config=NO_CONFIG)
    assert r.returncode == 0 and r.stdout.count("\n---\n") == 2
    r = gpuhook("cdi", "generate", "--root", root, "--output", str(tmp_path / "one.json"), config=NO_CONFIG)
    assert r.returncode == 2 and "--kind" in r.stderr and "Traceback" not in r.stderr
    r = gpuhook("cdi", "generate", "--root", root, "--output", str(tmp_path / "one.json"), "--kind", "gpu", "--format", "json", config=NO_CONFIG)
    assert r.returncode == 0 and json.load(open(tmp_path / "one.json"))["kind"] == "gpuhook.dev/gpu"
    # the node loses its GPUs: the specs go
    r = gpuhook("cdi", "generate", "--root", make_host("cpu"), "--output-dir", str(out), config=NO_CONFIG)
    assert r.returncode == 0 and "No GPU" in r.stdout
    assert os.listdir(out) == []
    r = gpuhook("cdi", "generate", "--root", str(tmp_path / "nope"), config=NO_CONFIG)
    assert r.returncode == 2 and "not a directory" in r.stderr
