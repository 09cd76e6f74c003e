"""What a pod's gpuhook.dev/* annotations ask (policy.pod_policy) and what the kubelet's device
manager checkpoint on a node says was allocated to other pods (probe/nodestate.py allocated_devices): the
inputs a pod author, an admin or an attacker writing either controls, and what gpuhook makes
of them, with the one line it logs for what it ignores."""

from __future__ import annotations

import base64
import json
import os

import pytest

from gpuhook.plan import policy
from gpuhook.probe import nodestate
from gpuhook.plan.policy import Allocation, PodPolicy, pod_policy

CHECKPOINT = "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def asked(annotations: dict) -> tuple[PodPolicy, list[str]]:
    warnings: list[str] = []
    return pod_policy(annotations, warnings.append), warnings


# -- gpuhook.dev/inject -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["false", "FALSE", " no ", "0", "off", "Off\t"])
def test_inject_false_opts_out(value):
    assert asked({"gpuhook.dev/inject": value}) == (PodPolicy(inject=False), [])


@pytest.mark.parametrize("value", ["true", "TRUE", "1", " yes", "on"])
def test_inject_true_is_the_default(value):
    assert asked({"gpuhook.dev/inject": value}) == (PodPolicy(), [])


@pytest.mark.parametrize("value", ["maybe", "", "nope", "f", "2"])
def test_inject_neither_is_ignored_with_a_line(value):
    assert asked({"gpuhook.dev/inject": value}) == (
        PodPolicy(), [f"annotation gpuhook.dev/inject: {value!r} is not true or false, ignored"])


# -- gpuhook.dev/vendors ------------------------------------------------------------------------


@pytest.mark.parametrize("value, vendors", [
    ("nvidia", {"nvidia"}), ("nvidia,amd", {"nvidia", "amd"}), (" Intel ", {"intel"}),
    ("amd, ,accel,", {"amd", "accel"}), ("wsl", {"dxg"}), ("dxg,WSL", {"dxg"}),
    (",".join(policy.VENDOR_NAMES), set(policy.VENDOR_NAMES)),
])
def test_vendors_narrow_to_the_vendors_named(value, vendors):
    assert asked({"gpuhook.dev/vendors": value}) == (PodPolicy(vendors=frozenset(vendors)), [])


@pytest.mark.parametrize("value, why", [
    ("nvidia,../../etc", "unknown vendor '../../etc'"),
    ("cuda", "unknown vendor 'cuda'"),
    ("nvidia amd", "unknown vendor 'nvidia amd'"),
    (" , ", "no vendor named"),
    ("", "no vendor named"),
])
def test_vendors_unknown_or_none_means_every_vendor_with_a_line(value, why):
    assert asked({"gpuhook.dev/vendors": value}) == (PodPolicy(), [
        f"annotation gpuhook.dev/vendors: {value!r}: {why} (known: {', '.join(policy.VENDOR_NAMES)}); "
        "ignored, every vendor of the node is given"])


# -- gpuhook.dev/max-gpus -----------------------------------------------------------------------


@pytest.mark.parametrize("value, n", [("0", 0), ("1", 1), (" 8 ", 8), ("0012", 12), ("1024", 1024)])
def test_max_gpus_is_a_whole_number_up_to_the_limit(value, n):
    assert asked({"gpuhook.dev/max-gpus": value}) == (PodPolicy(max_gpus=n), [])


@pytest.mark.parametrize("value", ["-1", "1e3", "1025", "9999", "01025", "01024", "00001", "99999999999999999999", "\u0661", "²",
                                   "one", "", "1.0"])
def test_max_gpus_otherwise_is_no_limit_with_a_line(value):
    assert asked({"gpuhook.dev/max-gpus": value}) == (PodPolicy(), [
        f"annotation gpuhook.dev/max-gpus: {value!r} is not a whole number from 0 to 1024; ignored, no limit"])


# -- every annotation ---------------------------------------------------------------------------


def test_a_value_over_256_characters_is_ignored_unread():
    at_limit = " " * 255 + "0"
    assert asked({"gpuhook.dev/max-gpus": at_limit}) == (PodPolicy(max_gpus=0), [])
    for key in policy.KNOWN_ANNOTATIONS:
        pol, warnings = asked({key: "0" + " " * 256})
        assert pol == PodPolicy() and warnings == [
            f"annotation {key}: value of 257 characters, over 256, ignored"]


def test_other_gpuhook_keys_are_named_cut_short_and_ignored():
    long_key = "gpuhook.dev/" + "x" * 100
    pol, warnings = asked({"gpuhook.dev/devices": "/dev/sda", long_key: "1"})
    known = "gpuhook.dev/inject, gpuhook.dev/vendors, gpuhook.dev/max-gpus"
    assert pol == PodPolicy()
    assert warnings == [
        f"annotation 'gpuhook.dev/devices': not a gpuhook annotation (known: {known}), ignored",
        f"annotation {(long_key[:60] + '...')!r}: not a gpuhook annotation (known: {known}), ignored"]


def test_annotations_of_others_are_not_read():
    pol, warnings = asked({"io.kubernetes.cri.sandbox-uid": "x", "gpuhook.devx/inject": "false",
                           "example.com/gpuhook.dev/inject": "false", "GPUHOOK.DEV/inject": "false"})
    assert (pol, warnings) == (PodPolicy(), [])


def test_all_three_together_and_each_warning_in_key_order():
    pol, warnings = asked({"gpuhook.dev/vendors": "amd", "gpuhook.dev/max-gpus": "2", "gpuhook.dev/inject": "no"})
    assert pol == PodPolicy(False, frozenset({"amd"}), 2) and warnings == []
    pol, warnings = asked({"gpuhook.dev/vendors": "x", "gpuhook.dev/max-gpus": "y", "gpuhook.dev/inject": "z"})
    assert pol == PodPolicy() and [w.split(":")[0] for w in warnings] == [
        "annotation gpuhook.dev/inject", "annotation gpuhook.dev/max-gpus", "annotation gpuhook.dev/vendors"]


def test_show_quotes_escapes_and_cuts():
    assert policy.show("a\nb") == "'a\\nb'"
    assert policy.show("x" * 60) == repr("x" * 60)
    assert policy.show("x" * 61) == repr("x" * 60 + "...")
    assert policy.show("abcdef", 3) == repr("abc...")


# -- the kubelet's checkpoint -------------------------------------------------------------------


def checkpoint(root, entries, raw: "bytes | None" = None) -> None:
    path = os.path.join(root, CHECKPOINT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(raw if raw is not None else json.dumps(
            {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}).encode())


def entry(pod, resource, ids, resp=None, container="main") -> dict:
    e = {"PodUID": pod, "ContainerName": container, "ResourceName": resource, "DeviceIDs": ids}
    if resp is not None:
        e["AllocResp"] = resp
    return e


def test_no_checkpoint_means_no_allocations(tmp_path):
    assert nodestate.allocated_devices(str(tmp_path)) == ([], None)


def test_the_allocations_of_every_pod_in_file_order(tmp_path):
    """The read step takes every pod's (the container's own pod is left out by plan())."""
    resp = base64.b64encode(b"\x1a\x0c\x12\x0a/dev/nvid1").decode()
    checkpoint(tmp_path, [
        entry("p1", "nvidia.com/gpu", {"0": ["GPU-a", "GPU-b"], "1": ["GPU-c"]}, resp),
        entry("me", "nvidia.com/gpu", {"-1": ["GPU-d"]}),
        entry("p2", "amd.com/gpu", ["0000:43:00.0", 7]),  # a plain list before Kubernetes 1.20
        entry("p3", "gpu.intel.com/i915", {"-1": None}),
        entry("p4", "nvidia.com/gpu", None, resp=5),
    ])
    allocs, why = nodestate.allocated_devices(str(tmp_path))
    assert why is None and allocs == [
        Allocation("nvidia.com/gpu", "GPU-a", "p1", resp), Allocation("nvidia.com/gpu", "GPU-b", "p1", resp),
        Allocation("nvidia.com/gpu", "GPU-c", "p1", resp), Allocation("nvidia.com/gpu", "GPU-d", "me", ""),
        Allocation("amd.com/gpu", "0000:43:00.0", "p2", ""), Allocation("amd.com/gpu", "7", "p2", "")]
    assert policy.alloc_device_paths(allocs[0].alloc_resp) == ("/dev/nvid1",)


def test_odd_fields_of_an_entry_are_read_as_nothing(tmp_path):
    checkpoint(tmp_path, [
        {"DeviceIDs": {"-1": ["a", 1.5, None, ["x"], {"y": 1}, True]}},  # no pod, no resource; odd ids
        {"PodUID": None, "ResourceName": None, "DeviceIDs": []},
    ])
    allocs, why = nodestate.allocated_devices(str(tmp_path))
    assert why is None and allocs == [Allocation("", "a", "", ""), Allocation("", "True", "", "")]


def test_an_empty_list_of_entries(tmp_path):
    checkpoint(tmp_path, None)
    assert nodestate.allocated_devices(str(tmp_path)) == ([], None)


@pytest.mark.parametrize("raw, why", [
    (b"{", "JSONDecodeError"),
    (b"[]", "TypeError"),
    (b"{}", "KeyError"),
    (b'{"Data": {}}', "KeyError"),
    (b'{"Data": []}', "TypeError"),
    (b'{"Data": {"PodDeviceEntries": [1]}}', "AttributeError"),
    (b'{"Data": {"PodDeviceEntries": 5}}', "TypeError"),
    (b'{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"-1": 3}}]}}', "TypeError"),
    (b"\xff\xfe", "UnicodeDecodeError"),
])
def test_a_checkpoint_that_is_not_one_says_why(tmp_path, raw, why):
    checkpoint(tmp_path, None, raw)
    assert nodestate.allocated_devices(str(tmp_path)) == (
        None, f"{nodestate.CHECKPOINT}: not a device manager checkpoint ({why})")


def test_a_checkpoint_that_cannot_be_read_is_unreadable(tmp_path):
    os.makedirs(os.path.join(tmp_path, CHECKPOINT))  # a directory in its place
    assert nodestate.allocated_devices(str(tmp_path)) == (None, f"{nodestate.CHECKPOINT} unreadable")


def test_a_checkpoint_too_large_to_be_the_kubelets_is_unreadable(tmp_path):
    path = os.path.join(tmp_path, CHECKPOINT)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.truncate((32 << 20) + 1)
    assert nodestate.allocated_devices(str(tmp_path)) == (None, f"{nodestate.CHECKPOINT} unreadable")
    with open(path, "wb") as f:  # 32 MiB is still read
        data = b'{"Data": {"PodDeviceEntries": []}}'
        f.write(data + b" " * ((32 << 20) - len(data)))
    assert nodestate.allocated_devices(str(tmp_path)) == ([], None)


def test_a_dangling_link_as_the_checkpoint_is_unreadable_not_absent(tmp_path):
    path = os.path.join(tmp_path, CHECKPOINT)
    os.makedirs(os.path.dirname(path))
    os.symlink("/nonexistent/checkpoint", path)
    assert nodestate.allocated_devices(str(tmp_path)) == (None, f"{nodestate.CHECKPOINT} unreadable")


# -- the device plugin's answer in the checkpoint (AllocResp) ---------------------------------


def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([n & 0x7F | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


@pytest.mark.parametrize("env_len", [0, 100, 200, 20000])  # lengths of one, two and three varint bytes
def test_the_plugins_device_paths_are_read_past_envs_of_any_length(env_len):
    """ContainerAllocateResponse: envs (1, a map entry {key 1, value 2}) then devices (3,
    DeviceSpec {container_path 1, host_path 2, permissions 3}), as the kubelet keeps it."""
    env = _field(1, _field(1, b"NVIDIA_VISIBLE_DEVICES") + _field(2, b"M" * env_len))
    paths = ["/dev/nvidia7", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidiactl", "/dev/" + "x" * 130]
    devices = b"".join(_field(3, _field(1, p.encode()) + _field(2, p.encode()) + _field(3, b"rw")) for p in paths)
    fixed = (bytes([5 << 3 | 5]) + bytes(range(0x91, 0x95)) + bytes([6 << 3 | 1]) + bytes(range(0xA1, 0xA9))
             + bytes([7 << 3]) + _varint(300))  # fixed32, fixed64 (bytes that read as no field), a varint
    raw = base64.b64encode(env + fixed + devices).decode()
    assert policy.alloc_device_paths(raw) == tuple(paths)


def test_a_varint_of_more_than_ten_bytes_ends_the_read():
    key = bytes([0x9A] + [0x80] * 9 + [0x00])  # field 3, wire 2, spelt in 11 bytes
    good = _field(3, _field(2, b"/dev/nvidia0"))
    assert policy.alloc_device_paths(base64.b64encode(good + key + good[1:]).decode()) == ("/dev/nvidia0",)


def test_an_answer_cut_inside_a_device_names_none_of_it():
    whole = _field(3, _field(2, b"/dev/nvidia0") + _field(3, b"rw"))
    cut = whole[:-3]  # the length still says the whole DeviceSpec
    assert policy.alloc_device_paths(base64.b64encode(whole).decode()) == ("/dev/nvidia0",)
    assert policy.alloc_device_paths(base64.b64encode(cut).decode()) == ()


def test_an_answer_that_is_not_strict_base64_names_no_device():
    raw = base64.b64encode(_field(3, _field(2, b"/dev/nvidia0"))).decode()
    assert policy.alloc_device_paths(raw) == ("/dev/nvidia0",)
    for bad in (raw[:4] + "\n" + raw[4:], raw[:4] + "!" + raw[4:], raw[:4] + "-_" + raw[4:]):
        assert policy.alloc_device_paths(bad) == ()


def test_a_device_path_that_is_not_utf8_is_read_with_replacements():
    raw = base64.b64encode(_field(3, _field(2, b"/dev/nvidia\xff0"))).decode()
    assert policy.alloc_device_paths(raw) == ("/dev/nvidia\ufffd0",)


def test_the_pod_is_read_from_the_keys_of_the_runtime_that_wrote_the_spec():
    crio = {"io.container.manager": "cri-o", "io.kubernetes.pod.uid": "u-crio", "io.kubernetes.pod.name": "p",
            "io.kubernetes.pod.namespace": "ns", "io.kubernetes.container.name": "c",
            "io.kubernetes.cri.sandbox-uid": "u-containerd"}
    assert policy.pod_uid(crio) == "u-crio"
    assert policy.pod_of(crio) == {"pod_namespace": "ns", "pod_name": "p", "pod_uid": "u-crio", "container_name": "c"}
    containerd = dict(crio, **{"io.container.manager": "other"})
    assert policy.pod_uid(containerd) == "u-containerd"


def test_a_pod_name_is_kept_from_1_to_253_printable_characters():
    key = "io.kubernetes.cri.sandbox-name"
    for name, kept in [("a", True), ("x" * 253, True), ("x" * 254, False), ("", False), ("a\nb", False)]:
        assert ("pod_name" in policy.pod_of({key: name})) is kept, name
    assert policy.pod_uid({"io.kubernetes.cri.sandbox-uid": 7}) is None


def test_every_annotation_is_read_whatever_sorts_before_it():
    pol, warnings = asked({"app.kubernetes.io/name": "x", "gpuhook.dev/inject": "false"})
    assert pol == PodPolicy(inject=False) and warnings == []
    pol, warnings = asked({"gpuhook.dev/devices": "x", "gpuhook.dev/inject": "false", "gpuhook.dev/bogus": "1"})
    assert pol == PodPolicy(inject=False) and len(warnings) == 2
    pol, warnings = asked({"gpuhook.dev/inject": "x" * 300, "gpuhook.dev/max-gpus": "2"})
    assert pol == PodPolicy(max_gpus=2) and len(warnings) == 1
