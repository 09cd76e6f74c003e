"""The inputs of the planner's policy, read and validated: pod annotations, the node's
round-robin memory (max-gpus) and the kubelet's device allocations (NVIDIA's env contract:
plan/nvidia.py).

gpuhook.plan decides what a container gets; this module only turns untrusted text (annotations,
the kubelet's checkpoint, gpuhook's own state file) into small values, and
says in words what it refused. It is on the per-container path: stdlib only, and nothing is
imported that is not used (the lock and the JSON layer only when a state file is touched).

Rules for pod annotations (`gpuhook.dev/*`, passed by containerd/CRI-O into the OCI spec):
an annotation can only narrow what the node gives; none names a host path; a value that is
not valid (unknown key, unknown vendor, not a small whole number, too long) is ignored as a
whole, with a warning, and the container gets what the node policy gives.
"""

import os
import stat as _stat

from .. import vendors as _vendors
from ..record import Record

PREFIX = "gpuhook.dev/"
INJECT = "gpuhook.dev/inject"
VENDORS = "gpuhook.dev/vendors"
MAX_GPUS = "gpuhook.dev/max-gpus"
KNOWN_ANNOTATIONS = (INJECT, VENDORS, MAX_GPUS)
VENDOR_NAMES = _vendors.NAMES  # an older spelling (vendors.py's aliases) is read as the name
FALSE = ("false", "0", "no", "off")
TRUE = ("true", "1", "yes", "on")
MAX_VALUE_LEN = 256
MAX_GPUS_LIMIT = 1024

STATE_FILE = "gpu-usage.json"
LOCK_FILE = "gpu-usage.lock"
LOCK_WAIT_S = 2.0

CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
# The pod of a container, read only from the keys the node's own CRI runtime writes into its
# spec after the pod's annotations, so that they win over any a pod sets (`gpuhook log`'s POD
# column, the agent's pod Events, the pod's own allocations in the kubelet's checkpoint).
# CRI-O marks its specs itself (io.container.manager: cri-o, written last) and copies the
# kubelet's container labels (io.kubernetes.pod.*) over the pod's annotations; it also copies
# every pod annotation, containerd's keys included, so those mean nothing there. containerd's
# CRI plugin writes io.kubernetes.cri.* after the annotations it passes through. Docker,
# podman and plain runc set none. The admission policy refuses io.kubernetes.* annotations and
# the marker's key on gpu-optional pods.
CRIO_MARKER = ("io.container.manager", "cri-o")
POD_ANNOTATIONS_CRIO = {
    "pod_namespace": "io.kubernetes.pod.namespace",
    "pod_name": "io.kubernetes.pod.name",
    "pod_uid": "io.kubernetes.pod.uid",
    "container_name": "io.kubernetes.container.name",
}
POD_ANNOTATIONS_CONTAINERD = {
    "pod_namespace": "io.kubernetes.cri.sandbox-namespace",
    "pod_name": "io.kubernetes.cri.sandbox-name",
    "pod_uid": "io.kubernetes.cri.sandbox-uid",
    "container_name": "io.kubernetes.cri.container-name",
}
MAX_NAME_LEN = 253  # a DNS subdomain, the longest name Kubernetes gives an object


def show(value: str, limit: int = 60) -> str:
    """An untrusted string for a log message: quoted, escaped, cut."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


# -- pod annotations ------------------------------------------------------------------


class PodPolicy(Record):
    """inject: False opts out. vendors: frozenset of vendor names, None = every vendor.
    max_gpus: at most that many devices (GPUs or partitions), None = no limit."""

    inject: bool = True
    vendors: "frozenset[str] | None" = None
    max_gpus: "int | None" = None

    __slots__ = ()


def pod_policy(annotations: dict, warn) -> "PodPolicy":
    inject, vendors, max_gpus = True, None, None
    for key in sorted(annotations):
        if not key.startswith(PREFIX):
            continue
        value = annotations[key]
        if key not in KNOWN_ANNOTATIONS:
            warn(f"annotation {show(key)}: not a gpuhook annotation (known: {', '.join(KNOWN_ANNOTATIONS)}), ignored")
            continue
        if len(value) > MAX_VALUE_LEN:
            warn(f"annotation {key}: value of {len(value)} characters, over {MAX_VALUE_LEN}, ignored")
            continue
        v = value.strip().lower()
        if key == INJECT:
            if v in FALSE:
                inject = False
            elif v not in TRUE:
                warn(f"annotation {key}: {show(value)} is not true or false, ignored")
        elif key == VENDORS:
            names = [_vendors.canonical(t.strip()) or t.strip() for t in v.split(",") if t.strip()]
            bad = [n for n in names if n not in VENDOR_NAMES]
            if bad or not names:
                why = f"unknown vendor {show(bad[0])}" if bad else "no vendor named"
                warn(
                    f"annotation {key}: {show(value)}: {why} (known: {', '.join(VENDOR_NAMES)}); "
                    "ignored, every vendor of the node is given"
                )
            else:
                vendors = frozenset(names)
        elif key == MAX_GPUS:
            if v.isascii() and v.isdigit() and len(v) <= 4 and int(v) <= MAX_GPUS_LIMIT:
                max_gpus = int(v)
            else:
                warn(
                    f"annotation {key}: {show(value)} is not a whole number from 0 to {MAX_GPUS_LIMIT}; "
                    "ignored, no limit"
                )
    return PodPolicy(inject, vendors, max_gpus)


def pod_keys(annotations: dict) -> dict:
    """The annotation keys that name the pod, those of the runtime that wrote the spec."""
    key, value = CRIO_MARKER
    return POD_ANNOTATIONS_CRIO if annotations.get(key) == value else POD_ANNOTATIONS_CONTAINERD


def pod_of(annotations: dict) -> dict:
    """{"pod_namespace", "pod_name", "pod_uid", "container_name"}: those the runtime's own
    annotations give, each a non-empty string of at most MAX_NAME_LEN printable characters;
    {} for a container outside Kubernetes. A value that is not such a string is left out."""
    out = {}
    for field, key in pod_keys(annotations).items():
        v = annotations.get(key)
        if isinstance(v, str) and 0 < len(v) <= MAX_NAME_LEN and v.isprintable():
            out[field] = v
    return out


def pod_uid(annotations: dict) -> "str | None":
    return pod_of(annotations).get("pod_uid")


# -- round robin -----------------------------------------------------------------------


def least_used(keys: "list[str]", n: int, state_dir: "str | None", warn) -> "list[str]":
    """The n of `keys` given out least often on this node (ties: least recently, then in
    the order given), remembered in <state_dir>/gpu-usage.json. The read-choose-write runs
    under an exclusive fcntl lock and the file is replaced atomically, so concurrent creates
    never hand out the same device twice while another one is less used. Without a state
    dir, or when the state cannot be used, the first n (with a warning)."""
    if n >= len(keys):
        return list(keys)
    if n <= 0:
        return []
    if state_dir is None:
        return list(keys[:n])
    from .. import fastjson
    from ..fsutil import flock_within, write_atomic

    path = os.path.join(state_dir, STATE_FILE)
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        lock = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        warn(f"round robin: cannot use {state_dir}: {e.strerror or e}; the first {n} device(s) given")
        return list(keys[:n])
    try:
        if not flock_within(lock, LOCK_WAIT_S, 0.002):
            warn(f"round robin: {path} stayed locked {LOCK_WAIT_S} s; the first {n} device(s) given")
            return list(keys[:n])
        seq, usage = 0, {}
        try:
            # non-blocking: a FIFO planted here must not hang every create (under the lock)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not _stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ValueError("not a regular file")
                record = fastjson.loads(os.read(fd, 1 << 20))
            finally:
                os.close(fd)
            seq = int(record["seq"])
            usage = {k: (int(c), int(t)) for k, (c, t) in record["usage"].items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
            warn(f"round robin: {path} unreadable, started afresh")
            seq, usage = 0, {}
        order = sorted(range(len(keys)), key=lambda i: (*usage.get(keys[i], (0, -1)), i))
        chosen = sorted(order[:n])
        for i in chosen:
            count, _ = usage.get(keys[i], (0, -1))
            usage[keys[i]] = (count + 1, seq)
        if len(usage) > 4096:  # devices that left the node long ago
            usage = dict(sorted(usage.items(), key=lambda kv: kv[1][1])[-4096:])
        data = fastjson.dumps({"seq": seq + 1, "usage": {k: list(v) for k, v in usage.items()}})
        write_atomic(path, data.encode(), 0o600, sync_dir=False)
        return [keys[i] for i in chosen]
    except OSError as e:
        warn(f"round robin: cannot update {path}: {e.strerror or e}; the first {n} device(s) given")
        return list(keys[:n])
    finally:
        os.close(lock)  # releases the lock


# -- kubelet device allocations ---------------------------------------------------------


# -- device plugin ids --------------------------------------------------------------------

# Whose GPUs a device plugin's resource hands out, by the resource name's prefix. An id under
# one of these that gpuhook cannot map to a GPU of the node holds that vendor's GPUs back.
GPU_RESOURCES = _vendors.gpu_resources()
NVIDIA_REPLICA = "::"  # NVIDIA's time-slicing and MPS replicas: <id>::<n>
AMD_SLICE = "-slice-"  # ROCm's time slices: <PCI address>-slice-<n>
INTEL_MONITORING = "_monitoring"  # gpu.intel.com/i915_monitoring "all": telemetry, takes no GPU
HEX = frozenset("0123456789abcdef")


class DeviceRef(Record):
    """What one id of the kubelet's checkpoint names. vendor: whose GPU resource it is under
    ("" for a resource of no GPU vendor). kind: uuid (NVIDIA GPU UUID), index (NVIDIA index),
    minor (/dev/nvidia<minor>), mig (an NVIDIA MIG UUID), pci (a PCI address), xcp (an AMD
    partition's platform device), card (a DRM card name), none (takes no GPU: Intel's
    monitoring resource), any (a resource of another vendor: matched against every id of a
    device), unknown (a GPU vendor's id in no format gpuhook knows)."""

    vendor: str
    kind: str
    value: str = ""

    __slots__ = ()


def _digits(s: str) -> bool:
    return 0 < len(s) <= 9 and s.isascii() and s.isdigit()


def _pci(s: str) -> bool:
    """0000:43:00.0: domain, bus, device, function in hex."""
    dom, _, rest = s.partition(":")
    bus, _, rest = rest.partition(":")
    dev, _, fn = rest.partition(".")
    parts = ((dom, 4), (bus, 2), (dev, 2), (fn, 1))
    return all(len(p) == n and set(p) <= HEX for p, n in parts)


def _uuid(s: str) -> bool:
    """gpu-<hex and dashes> (lower case; NVIDIA's are 36 long)."""
    body = s[4:]
    return s.startswith("gpu-") and 0 < len(body) <= 64 and set(body) <= HEX | {"-"}


def device_ref(resource: str, ident: str) -> "DeviceRef":
    """The GPU an id of the kubelet's checkpoint takes, in the formats the device plugins write:
    NVIDIA's (GPU-<uuid>, <index>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>, <index>:<mig index>,
    each with ::<replica> under time-slicing or MPS), GKE's (nvidia<minor>, nvidia<minor>/gi<n>,
    either with /vgpu<n> when shared), ROCm's (<PCI address>, amdgpu_xcp_<n>, either with
    -slice-<n>), Intel's (card<N>-<n>; "all" under *_monitoring)."""
    vendor = next((v for p, v in GPU_RESOURCES if resource.startswith(p)), "")
    low = ident.lower()
    if not vendor:
        return DeviceRef("", "any", low)
    unknown = DeviceRef(vendor, "unknown", low)
    if vendor == "nvidia":
        base, sep, replica = low.partition(NVIDIA_REPLICA)
        if sep and not _digits(replica):
            return unknown
        if base.startswith("nvidia"):  # GKE: the /dev name, then /gi<n> (MIG), /vgpu<n> (shared)
            minor, *rest = base[6:].split("/")
            tail = [r for r in rest if not (r[:2] == "gi" and _digits(r[2:]) or r[:4] == "vgpu" and _digits(r[4:]))]
            return DeviceRef(vendor, "minor", minor) if _digits(minor) and len(rest) <= 2 and not tail else unknown
        if base.startswith("mig-gpu-"):  # before R470: MIG-GPU-<uuid>/<gi>/<ci>
            gpu, *rest = base[4:].split("/")
            return (
                DeviceRef(vendor, "uuid", gpu) if _uuid(gpu) and len(rest) == 2 and all(map(_digits, rest)) else unknown
            )
        if base.startswith("mig-"):
            return DeviceRef(vendor, "mig", base)
        if _uuid(base):
            return DeviceRef(vendor, "uuid", base)
        gpu, colon, mig = base.partition(":")  # deviceIDStrategy=index: <index>, <index>:<mig index>
        if _digits(gpu) and (not colon or _digits(mig)):
            return DeviceRef(vendor, "index", gpu)
        return unknown
    if vendor == "amd":
        base, sep, n = low.rpartition(AMD_SLICE)
        if not (sep and _digits(n)):
            base = low
        if _pci(base):
            return DeviceRef(vendor, "pci", base)
        if base.startswith("amdgpu_xcp") and base[10:11] in ("_", ".") and _digits(base[11:]):
            return DeviceRef(vendor, "xcp", base)
        return unknown
    if resource.endswith(INTEL_MONITORING) and low == "all":
        return DeviceRef(vendor, "none", low)
    card, _, n = low.partition("-")
    if card.startswith("card") and _digits(card[4:]) and (not n or _digits(n)):
        return DeviceRef(vendor, "card", card)
    return unknown


class Allocation(Record):
    """One device id the kubelet's device manager allocated to a pod: the resource it is of,
    the id as the device plugin wrote it, the pod's uid, and the plugin's answer for that
    container (AllocResp: a ContainerAllocateResponse, protobuf, base64), read only when an
    id does not name its GPU (alloc_device_paths)."""

    resource: str
    id: str
    pod: str
    alloc_resp: str = ""

    __slots__ = ()


def allocated_devices(root: str, own_pod: "str | None") -> "tuple[list[Allocation] | None, str | None]":
    """The Allocations the kubelet's device manager made to pods other than `own_pod`, from its
    checkpoint (<root>/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint:
    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
    "DeviceIDs": {"<NUMA node>": [ids]} (a plain list before Kubernetes 1.20), "AllocResp"}],
    "RegisteredDevices": {...}}, "Checksum": N}). No file: no allocations.
    Returns (allocations, None), or (None, why) when the file exists but cannot be understood."""
    from ..probe.host import Host

    host = Host(root)
    if host.lstat(CHECKPOINT) is None:
        return [], None
    data = host.read_bytes(CHECKPOINT, limit=32 << 20, quiet=True)
    if data is None:
        return None, f"{CHECKPOINT} unreadable"
    from .. import fastjson

    try:
        entries = fastjson.loads(data)["Data"]["PodDeviceEntries"] or []
        out: list = []
        for e in entries:
            if own_pod is not None and e.get("PodUID") == own_pod:
                continue
            resource = str(e.get("ResourceName") or "")
            ids = e.get("DeviceIDs") or []
            if isinstance(ids, dict):
                ids = [i for per_numa in ids.values() for i in (per_numa or [])]
            pod = str(e.get("PodUID") or "")
            resp = e.get("AllocResp")
            resp = resp if isinstance(resp, str) else ""
            out.extend(Allocation(resource, str(i), pod, resp) for i in ids if isinstance(i, (str, int)))
        return out, None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"{CHECKPOINT}: not a device manager checkpoint ({type(e).__name__})"


def alloc_device_paths(alloc_resp: str) -> "tuple[str, ...]":
    """The host paths of the device nodes a device plugin's answer gave a container
    (ContainerAllocateResponse field 3, devices: DeviceSpec field 2, host_path), from the
    checkpoint's base64 AllocResp; () when there are none or it cannot be read. NVIDIA's
    plugin names a MIG instance's parent GPU there (/dev/nvidia<minor>) with passDeviceSpecs."""
    import base64
    import binascii

    try:
        data = base64.b64decode(alloc_resp[: 1 << 20], validate=True)
    except (binascii.Error, ValueError):
        return ()
    out = []
    for field, value in _proto_fields(data):
        if field == 3 and isinstance(value, bytes):
            out += [v.decode("utf-8", "replace") for f, v in _proto_fields(value) if f == 2 and isinstance(v, bytes)]
    return tuple(out)


def _proto_fields(data: bytes):
    """(field number, value) of a protobuf message's top level: varints as int, length-delimited
    fields as bytes; fixed-width ones skipped; it stops at the first thing it cannot read."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        if key is None:
            return
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            if value is None:
                return
            yield field, value
        elif wire == 2:
            size, i = _varint(data, i)
            if size is None or i + size > n:
                return
            yield field, data[i : i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            return


def _varint(data: bytes, i: int) -> "tuple[int | None, int]":
    value = shift = 0
    while i < len(data) and shift < 64:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
    return None, i
