"""The spec editor: devices with cgroup rules, mounts, env, hooks, GIDs; idempotent; keeps
everything it does not know; refuses wrong types without touching the input."""

from __future__ import annotations

import copy
import os
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook import fastjson
from gpuhook.edits import BIND_RO, DeviceNode, Edits, Hook, Mount
from gpuhook.spec import SpecError, apply

EDITS = Edits(
    env=("GPUHOOK_ACCELERATOR=nvidia", "GPUHOOK_DEVICES=nvidia:GPU-1"),
    device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0, "rwm", 0o666, 0, 0),
                  DeviceNode("/dev/nvidiactl", "c", 195, 255)),
    mounts=(Mount("/host/usr/lib/libcuda.so.550", "/usr/lib/libcuda.so.550"),),
    hooks=(Hook("createContainer", "/bin/sh", ("sh", "-c", "true"), ("PATH=/bin",), 30),),
    additional_gids=(44, 109),
)


def base_spec() -> dict:
    return {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", "GPUHOOK_ACCELERATOR=old"], "args": ["sh"]},
            "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}


def test_every_node_gets_a_device_and_an_allow_rule():
    out = apply(base_spec(), EDITS)
    assert out["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666, "uid": 0, "gid": 0},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]
    assert out["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"}]
    assert out["mounts"] == [{"destination": "/usr/lib/libcuda.so.550", "type": "bind",
                              "source": "/host/usr/lib/libcuda.so.550", "options": list(BIND_RO)}]
    assert BIND_RO == ("ro", "nosuid", "nodev", "rbind", "rprivate")
    assert out["process"]["env"] == ["PATH=/bin", "GPUHOOK_ACCELERATOR=nvidia", "GPUHOOK_DEVICES=nvidia:GPU-1"]
    assert out["hooks"]["createContainer"] == [{"path": "/bin/sh", "args": ["sh", "-c", "true"],
                                                "env": ["PATH=/bin"], "timeout": 30}]
    assert out["process"]["user"]["additionalGids"] == [44, 109]


def test_input_is_not_modified_and_empty_edits_return_it():
    spec = base_spec()
    before = copy.deepcopy(spec)
    apply(spec, EDITS)
    assert spec == before
    assert apply(spec, Edits()) is spec


def test_existing_device_is_not_duplicated_and_a_taken_path_is_left_alone():
    spec = base_spec()
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 2}]
    out = apply(spec, EDITS)
    assert [d["path"] for d in out["linux"]["devices"]] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert out["linux"]["devices"][0]["minor"] == 2  # the device plugin's stays
    rules = out["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} not in rules


@pytest.mark.parametrize("path, value", [
    (("linux", "devices"), "x"), (("linux",), []), (("process", "env"), {}), (("mounts",), {}),
    (("hooks",), []), (("linux", "resources"), 3), (("process",), "sh"),
])
def test_wrong_types_are_refused(path, value):
    spec = base_spec()
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    before = copy.deepcopy(spec)
    with pytest.raises(SpecError):
        apply(spec, EDITS)
    assert spec == before


# -- properties -------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.text(max_size=8))
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=12)
spec_strategy = st.fixed_dictionaries(
    {"ociVersion": st.just("1.0.2")},
    optional={
        "process": st.fixed_dictionaries({}, optional={"env": st.lists(st.text(max_size=10), max_size=4),
                                                       "user": st.fixed_dictionaries({"uid": st.integers(0, 9)}),
                                                       "unknownProcessField": json_value}),
        "linux": st.fixed_dictionaries({}, optional={
            "devices": st.lists(st.fixed_dictionaries({"path": st.sampled_from(["/dev/nvidia0", "/dev/fuse", "/dev/x"]),
                                                       "type": st.just("c"), "major": st.integers(0, 300),
                                                       "minor": st.integers(0, 300)}), max_size=3),
            "resources": st.fixed_dictionaries({}, optional={"devices": st.lists(st.dictionaries(st.text(max_size=5), json_value, max_size=3), max_size=3),
                                                             "memory": json_value}),
            "futureLinuxField": json_value}),
        "mounts": st.lists(st.fixed_dictionaries({"destination": st.text(max_size=10)}, optional={"x": json_value}), max_size=3),
        "annotations": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
        "vendorExtension": json_value,
    })
edits_strategy = st.builds(
    Edits,
    env=st.lists(st.from_regex(r"[A-Z_]{1,6}=[a-z0-9]{0,4}", fullmatch=True), max_size=3).map(tuple),
    device_nodes=st.lists(st.builds(DeviceNode, st.sampled_from(["/dev/nvidia0", "/dev/nvidia1", "/dev/kfd"]),
                                    st.just("c"), st.integers(0, 300), st.integers(0, 300)), max_size=3).map(tuple),
    mounts=st.lists(st.builds(Mount, st.text(max_size=6), st.sampled_from(["/a", "/b", "/usr/lib/x.so"])), max_size=3).map(tuple),
    hooks=st.lists(st.builds(Hook, st.sampled_from(["createContainer", "prestart"]), st.just("/bin/sh")), max_size=2).map(tuple),
    additional_gids=st.lists(st.integers(0, 1000), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(spec_strategy, edits_strategy)
def test_apply_is_idempotent(spec, edits):
    once = apply(spec, edits)
    assert apply(once, edits) == once


@settings(max_examples=300, deadline=None)
@given(spec_strategy, edits_strategy)
def test_unknown_fields_are_kept_exactly(spec, edits):
    out = apply(spec, edits)
    known = {"process": {"env", "user"}, "linux": {"devices", "resources"}, "mounts": None, "hooks": None}
    for key, value in spec.items():
        if key not in known:
            assert out[key] == value
        elif isinstance(value, dict):
            for k2, v2 in value.items():
                if k2 not in known[key]:
                    assert out[key][k2] == v2
    for key in ("memory",):
        if key in spec.get("linux", {}).get("resources", {}):
            assert out["linux"]["resources"][key] == spec["linux"]["resources"][key]
    # what was there is still there, in the same order, before anything added
    for path in (("linux", "devices"), ("mounts",), ("linux", "resources", "devices")):
        before, after = spec, out
        for k in path:
            before = before.get(k, {}) if isinstance(before, dict) else {}
            after = after.get(k, {}) if isinstance(after, dict) else {}
        if isinstance(before, list):
            assert after[:len(before)] == before
    # the output is still valid JSON that fastjson writes and json reads back the same
    assert json.loads(fastjson.dumps(out)) == out


@settings(max_examples=200, deadline=None)
@given(json_value)
def test_fastjson_matches_json(value):
    text = json.dumps(value)
    assert fastjson.loads(text) == json.loads(text)
    assert json.loads(fastjson.dumps(value)) == value


@given(st.one_of(st.text(max_size=64), st.text(alphabet='[]{}",:0123456789.eE-+ truefalsnNaIfiy\\u', max_size=24)))
def test_fastjson_rejects_or_parses_like_json(text):
    """Same as json.loads, except that NaN and Infinity (not JSON) and duplicate keys
    (which runc reads otherwise) are refused."""
    def no_duplicates(pairs):
        if len(dict(pairs)) != len(pairs):
            raise ValueError("duplicate key")
        return dict(pairs)

    try:
        want = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)),
                          object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError):
        with pytest.raises(ValueError):
            fastjson.loads(text)
    else:
        assert fastjson.loads(text) == want


@pytest.mark.parametrize("where, item", [
    (("mounts",), {"destination": ["/x"], "type": "bind", "source": "/x"}),
    (("linux", "devices"), {"path": {"a": 1}, "type": "c", "major": 1, "minor": 3}),
])
def test_an_item_key_of_another_type_is_refused_not_a_crash(where, item):
    """A mount's destination or a device's path that is not a string (runc refuses it): a
    SpecError, as for every other wrong type; it was a TypeError in apply (found by atheris)."""
    spec = {"ociVersion": "1.0.2", "linux": {}}
    node = spec
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = [item]
    edits = Edits(device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0),),
                  mounts=(Mount("/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1"),))
    with pytest.raises(SpecError):
        apply(spec, edits)


# -- cases a tenant's spec or a node can bring ------------------------------------------

def test_an_env_value_holding_equals_signs_is_replaced_by_its_key():
    """The key is what comes before the first '=': a value with '=' in it (JAVA_OPTS=-Da=b)
    is replaced, never kept beside the new one; two edits of one key leave the last."""
    spec = {"process": {"env": ["PATH=/bin", "JAVA_OPTS=-Da=b", "EMPTY="]}}
    out = apply(spec, Edits(env=("JAVA_OPTS=-Dc=d=e", "EMPTY=1", "NEW=x=y", "NEW=z")))
    assert out["process"]["env"] == ["PATH=/bin", "JAVA_OPTS=-Dc=d=e", "EMPTY=1", "NEW=z"]


def test_null_fields_count_as_absent():
    spec = {"process": None, "linux": None, "mounts": None, "hooks": None}
    out = apply(spec, EDITS)
    assert out["process"]["env"] == list(EDITS.env)
    assert out["process"]["user"]["additionalGids"] == [44, 109]
    assert [d["path"] for d in out["linux"]["devices"]] == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert len(out["linux"]["resources"]["devices"]) == 2
    assert [m["destination"] for m in out["mounts"]] == ["/usr/lib/libcuda.so.550"]
    assert list(out["hooks"]) == ["createContainer"]


def test_a_path_taken_by_a_device_of_another_type_is_left_alone():
    """A block device at the node's path (same numbers, type b): neither replaced nor allowed."""
    spec = {"linux": {"devices": [{"path": "/dev/nvidia0", "type": "b", "major": 195, "minor": 0}]}}
    out = apply(spec, Edits(device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0),)))
    assert out["linux"]["devices"] == spec["linux"]["devices"]
    assert out["linux"]["resources"]["devices"] == []


def test_a_device_the_spec_already_has_still_gets_its_rule_once():
    """The runtime (or a device plugin) listed the node but no rule: the rule is added, once,
    with the node's own permissions; one already there is not repeated."""
    node = DeviceNode("/dev/nvidia0", "c", 195, 0, "rw")
    spec = {"linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                      "resources": {"devices": [{"allow": False, "access": "rwm"}]}}}
    out = apply(spec, Edits(device_nodes=(node, node)))
    assert out["linux"]["devices"] == spec["linux"]["devices"]
    assert out["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"}, {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rw"}]
    assert apply(out, Edits(device_nodes=(node,))) == out


def test_a_node_is_written_with_only_the_fields_it_has():
    out = apply({}, Edits(device_nodes=(DeviceNode("/dev/dri/card0", "c", 226, 0, "rwm", None, None, 44),)))
    assert out["linux"]["devices"] == [{"path": "/dev/dri/card0", "type": "c", "major": 226, "minor": 0, "gid": 44}]


def test_a_mount_destination_the_container_has_is_never_replaced():
    """A tenant's own mount at a library's path stays (its source, its options), and two edits
    for one destination give one mount, the first."""
    mine = {"destination": "/usr/lib/libcuda.so.1", "type": "bind", "source": "/tenant/lib", "options": ["rw"]}
    out = apply({"mounts": [mine]}, Edits(mounts=(
        Mount("/host/libcuda.so.1", "/usr/lib/libcuda.so.1"),
        Mount("/host/libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1"),
        Mount("/other/libnvidia-ml.so.1", "/usr/lib/libnvidia-ml.so.1", options=("ro",)))))
    assert out["mounts"] == [mine, {"destination": "/usr/lib/libnvidia-ml.so.1", "type": "bind",
                                    "source": "/host/libnvidia-ml.so.1", "options": list(BIND_RO)}]


def test_hooks_join_the_stage_the_spec_has_once_and_without_a_timeout_unless_given():
    theirs = {"path": "/usr/bin/their-hook", "args": ["their-hook"]}
    hook = Hook("prestart", "/usr/lib/gpuhook/hook", ("gpuhook-hook", "ldcache"), ("PATH=/bin",))
    out = apply({"hooks": {"prestart": [theirs], "poststop": [theirs]}}, Edits(hooks=(hook, hook)))
    mine = {"path": "/usr/lib/gpuhook/hook", "args": ["gpuhook-hook", "ldcache"], "env": ["PATH=/bin"]}
    assert out["hooks"] == {"prestart": [theirs, mine], "poststop": [theirs]}


def test_groups_the_container_has_are_not_repeated():
    spec = {"process": {"user": {"uid": 1000, "additionalGids": [44, 5]}}}
    out = apply(spec, Edits(additional_gids=(44, 109, 109)))
    assert out["process"]["user"] == {"uid": 1000, "additionalGids": [44, 5, 109]}


@pytest.mark.parametrize("spec", [
    {"process": {"user": {"additionalGids": [True]}}},  # a bool is not a gid, though Python calls it an int
    {"process": {"user": {"additionalGids": "44"}}},
    {"process": {"user": []}},
    {"process": {"env": ["A=1", 7]}},
    {"annotations": {"a": 1}},
    {"annotations": []},
    {"root": "rootfs"},
    {"hooks": {"prestart": {}}},
    {"hooks": {"prestart": ["/bin/sh"]}},
    {"linux": {"devices": ["/dev/nvidia0"]}},
    {"linux": {"resources": {"devices": [["allow"]]}}},
    {"mounts": ["/x"]},
])
def test_a_field_runc_would_refuse_is_refused_whichever_edits_come(spec):
    """Whatever gpuhook would edit: the spec's shape is checked before any edit, so a spec runc
    refuses is never half-read by gpuhook (even when the edits touch another field)."""
    with pytest.raises(SpecError):
        apply(spec, Edits(env=("A=1",)))


@pytest.mark.parametrize("spec", [
    {"annotations": {"a": "1"}, "root": {"path": "rootfs"}, "hooks": {"prestart": [{"path": "/x"}]}},
    {"mounts": [{"destination": None}], "linux": {"devices": [{"type": "c"}]}},
    {"process": {"user": {"additionalGids": [0, 44]}}},
])
def test_fields_of_the_right_shape_are_accepted(spec):
    out = apply(spec, Edits(env=("A=1",)))
    assert out["process"]["env"] == ["A=1"]


def _as_a_cdi_runtime_applies(cdi: dict, spec: dict) -> dict:
    """What a CDI-aware runtime (containerd, podman) makes of containerEdits, by the CDI spec's
    field names: the other way into a container, which must come out as apply() does."""
    out = copy.deepcopy(spec)
    proc = out.setdefault("process", {})
    for item in cdi.get("env", []):
        env = proc.setdefault("env", [])
        keys = [e.partition("=")[0] for e in env]
        k = item.partition("=")[0]
        if k in keys:
            env[keys.index(k)] = item
        else:
            env.append(item)
    for n in cdi.get("deviceNodes", []):
        linux = out.setdefault("linux", {})
        dev = {"path": n["path"], "type": n["type"], "major": n["major"], "minor": n["minor"]}
        dev.update({oci: n[key] for key, oci in (("fileMode", "fileMode"), ("uid", "uid"), ("gid", "gid")) if key in n})
        linux.setdefault("devices", []).append(dev)
        linux.setdefault("resources", {}).setdefault("devices", []).append(
            {"allow": True, "type": n["type"], "major": n["major"], "minor": n["minor"], "access": n["permissions"]})
    for m in cdi.get("mounts", []):
        out.setdefault("mounts", []).append({"destination": m["containerPath"], "type": m["type"],
                                             "source": m["hostPath"], "options": m["options"]})
    for h in cdi.get("hooks", []):
        entry = {"path": h["path"], "args": h["args"], "env": h["env"]}
        if "timeout" in h:
            entry["timeout"] = h["timeout"]
        out.setdefault("hooks", {}).setdefault(h["hookName"], []).append(entry)
    if "additionalGids" in cdi:
        proc.setdefault("user", {}).setdefault("additionalGids", []).extend(cdi["additionalGids"])
    return out


@pytest.mark.parametrize("edits", [
    EDITS,
    Edits(device_nodes=(DeviceNode("/dev/dri/renderD128", "c", 226, 128, "rw", None, 0, 44),
                        DeviceNode("/dev/kfd", "c", 235, 0, "rwm", 0o660))),
    Edits(mounts=(Mount("/run/nvidia-persistenced/socket", "/run/nvidia-persistenced/socket", "bind", ("rw",)),),
          hooks=(Hook("createContainer", "/usr/lib/gpuhook/hook", ("hook",)),)),
    Edits(env=("A=1",)),
    Edits(additional_gids=(44,)),
])
def test_cdi_and_the_spec_editor_give_a_container_the_same(edits):
    """The same Edits reach a container through a CDI spec (edits.to_cdi) or through gpuhook's
    own spec editor (spec.apply): both ways give the same devices, rules, mounts, hooks, env, groups."""
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", "A=0"]}}
    cdi = edits.to_cdi()
    assert all(cdi[k] for k in cdi), "no empty keys"
    assert _as_a_cdi_runtime_applies(cdi, spec) == apply(spec, edits)


@pytest.mark.parametrize("spec, field, got, want", [
    ({"process": {"env": {"A": "1"}}}, "process.env", "dict", "list"),
    ({"process": "sh"}, "process", "str", "object"),
    ({"linux": {"resources": []}}, "linux.resources", "list", "object"),
])
def test_a_refused_spec_says_which_field_is_of_which_type(spec, field, got, want):
    """The one line the user reads names the field, the type it has and the type runc wants."""
    with pytest.raises(SpecError) as e:
        apply(spec, EDITS)
    msg = str(e.value)
    assert field in msg and got in msg and want in msg


@pytest.mark.parametrize("spec, field, got", [
    ({"process": {"env": ["A=1", 7]}}, "process.env", "int"),
    ({"mounts": [{"destination": ["/x"]}]}, "mounts", "list"),
    ({"hooks": {"prestart": ["/bin/sh"]}}, "hooks", "object"),
])
def test_a_refused_item_says_where_it_is(spec, field, got):
    with pytest.raises(SpecError) as e:
        apply(spec, EDITS)
    assert field in str(e.value) and got in str(e.value)


def test_the_same_node_twice_in_the_edits_is_one_device_and_one_rule():
    n = DeviceNode("/dev/nvidia0", "c", 195, 0)
    other = DeviceNode("/dev/nvidia0", "c", 195, 7)  # the path taken by the first: left out
    out = apply({}, Edits(device_nodes=(n, n, other)))
    assert out["linux"]["devices"] == [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    assert out["linux"]["resources"]["devices"] == [
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]
