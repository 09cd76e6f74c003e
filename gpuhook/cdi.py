"""CDI specs of the node's GPUs: `gpuhook cdi generate` and the agent.

The same Edits as every other front end (gpuhook.plan decides, edits.py shapes), written as
Container Device Interface specs so that CDI consumers (podman, containerd >= 1.7,
CRI-O, DRA drivers) can ask for the node's GPUs by name.

Kinds (one kind per spec file, as CDI requires):

  gpuhook.dev/<vendor>   one file per vendor the node has (nvidia, amd, intel, accel,
                         dxg): a device per GPU by index ("0") and by stable id (NVIDIA
                         UUID, PCI address with ':' -> '-'), and "all"; the vendor's control
                         nodes, libraries, hooks and GIDs are the spec-wide containerEdits.
  gpuhook.dev/gpu        one device, "all": every GPU of every vendor, exactly what the
                         gpu-optional runtime class would inject (vendor-agnostic).
  gpuhook.dev/none       one device, "none": no device at all, only GPUHOOK_ACCELERATOR=cpu
                         (vendors.CPU): what `gpuhook dra` gives a claim that got
                         its `none` device. Written by the DRA driver on every node (none_spec),
                         and left alone when the agent prunes the kinds a node no longer has.

Vendors' own kinds (nvidia.com/gpu, amd.com/gpu...) are never used: NVIDIA's own CDI
generator writes nvidia.com/gpu=0 and nvidia.com/gpu=all, and two specs defining the same
device make CDI registries reject both.

cdiVersion is the lowest version that has every field a spec uses (what the CDI library's
MinimumRequiredVersion does): 0.4.0 for mount types, 0.5.0 for a deviceNode hostPath or a
device name that starts with a digit (an index, a PCI address), 0.7.0 for additionalGids
(group-only render/video nodes of AMD and Intel). Consumers reject the whole spec for a
version they do not know (podman 4.3 reads up to 0.5.0), so a spec never claims more than it needs, and `max_version` leaves newer fields out for such
runtimes (cap_version; the caller is told which).

Hooks: plan()'s createContainer hooks take the container's rootfs, unknown to a CDI spec:
they are given hook.ROOTFS_FROM_STATE, and gpuhook-hook reads the root from what the runtime
wrote (the OCI state's bundle, then its config.json's root.path).

Paths: the spec is read by the node's container runtime, so its paths are the node's own
view (`spec_root`, default "/"). Under a fake host (`spec_root` = that host), mounts and
device hostPaths point into it.

Stdlib only, no YAML library: the YAML is block style with every string double-quoted
(JSON string syntax, which YAML shares), which any YAML 1.1/1.2 reader parses.
"""

import json
import os
import re

from . import defaults, hook
from .edits import Edits
from .inventory import Device, Inventory, VendorInventory
from .vendors import CPU

KIND_VENDOR = "gpuhook.dev"
GENERIC_CLASS = "gpu"
NONE_CLASS = "none"
NONE = "none"  # the device of gpuhook.dev/none
ALL = "all"
FORMATS = ("yaml", "json")
DEFAULT_DIR = defaults.CDI_DIR
FILE_PREFIX = KIND_VENDOR + "-"  # gpuhook.dev-nvidia.yaml, gpuhook.dev-gpu.yaml
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0")

# CDI name rules (SPEC.md): device names start and end with [A-Za-z0-9], with [A-Za-z0-9_.-]
# between; the kind's name segment the same, at most 63 characters (dots only from 0.6.0);
# the kind's prefix a DNS subdomain.
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\Z")
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


class CDIError(ValueError):
    """A spec that would break CDI's rules (never written)."""


def kind_of(vendor: str) -> str:
    return f"{KIND_VENDOR}/{vendor}"


def file_name(kind: str, fmt: str = "yaml") -> str:
    return kind.replace("/", "-") + "." + fmt


def safe_name(text: str) -> str:
    """A device name from an id: characters CDI does not allow become '-', ends trimmed."""
    s = re.sub(r"[^A-Za-z0-9_.-]", "-", text or "")
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", s)


def device_name(d: Device) -> str:
    """The name of `d` in its vendor's spec that stays the same across reboots: its stable id
    (NVIDIA UUID, PCI address) as CDI allows it. vendor_spec names it so (when no other device
    took the name first); `gpuhook dra` gives containers this one."""
    return safe_name(d.id)


def qualified(kind: str, name: str) -> str:
    """A fully qualified CDI device name, as runtimes and the kubelet take it: gpuhook.dev/nvidia=0."""
    return f"{kind}={name}"


def device_ids(all_specs: list[dict]) -> frozenset[str]:
    """Every fully qualified device name the specs define."""
    return frozenset(qualified(s["kind"], d["name"]) for s in all_specs for d in s["devices"])


def none_spec() -> dict:
    """gpuhook.dev/none=none: the device that gives a container no GPU, and says so."""
    spec = {
        "cdiVersion": "",
        "kind": kind_of(NONE_CLASS),
        "devices": [{"name": NONE, "containerEdits": {"env": [f"GPUHOOK_ACCELERATOR={CPU}"]}}],
    }
    spec["cdiVersion"] = required_version(spec)
    validate(spec)
    return spec


# -- building specs from plan()'s edits -----------------------------------------------


def _request():
    from .plan import Request

    return Request({}, {}, hook.ROOTFS_FROM_STATE)


def _plan(inv: Inventory, ldconfig: str | None | bool, helper: str | None | bool = None) -> Edits:
    """plan() for a CDI spec: a container with nothing of its own (no env, annotations or
    devices: the node's defaults). ldconfig None: plan() looks for one; False: no ld-cache
    hook (plan() would look in this process's own filesystem, not the node's, in a pod).
    helper: gpuhook-hook as the node sees it (hook.helper()); None: this package's; False:
    no hooks at all."""
    from .config import Config
    from .plan import plan
    from .probe import nodestate

    config = Config(log_file="")  # a CDI spec's hooks write no node log
    state = nodestate.read(
        inv, config, None, ldconfig if isinstance(ldconfig, str) else None, helper if isinstance(helper, str) else None
    )
    edits = plan(inv, state, _request(), config).edits
    if edits.hooks and (ldconfig is False or helper is False):
        edits = edits._replace(hooks=tuple(h for h in edits.hooks if helper is not False and h.kind != hook.LDCACHE))
    return edits


def _cdi_edits(edits: Edits, spec_root: str) -> dict:
    """Edits.to_cdi(), plus the node's hostPath of each device node under a fake host, and
    the hooks that need the container's rootfs in their CDI form."""
    d = edits.to_cdi()
    if spec_root != "/":
        base = spec_root.rstrip("/")
        for n in d.get("deviceNodes", ()):
            n["hostPath"] = base + n["path"]
    return d


def _without(edits: Edits, nodes: set, env_keys: set) -> Edits:
    return edits._replace(
        device_nodes=tuple(n for n in edits.device_nodes if n not in nodes),
        env=tuple(e for e in edits.env if e.partition("=")[0] not in env_keys),
    )


def _only(nodes: tuple, env: tuple = ()) -> Edits:
    return Edits(env=env, device_nodes=nodes)


def vendor_spec(
    inv: Inventory,
    v: VendorInventory,
    spec_root: str = "/",
    ldconfig: str | None | bool = None,
    helper: str | None | bool = None,
) -> dict:
    """gpuhook.dev/<vendor>: a device per GPU (by index and by id) and `all`; the vendor's
    node-wide edits (control nodes, libraries, binaries, hook, GPUHOOK_ACCELERATOR) at the
    top level. GPUHOOK_DEVICES is set by `all` only: CDI keeps one value per variable, so a
    container given two named devices could not be told both."""
    sub = inv._replace(root=spec_root, vendors=(v,))
    full = _plan(sub, ldconfig, helper)
    devices: list[dict] = []
    names = {ALL}
    dev_nodes: set = set()
    per_device = []
    for d in v.devices:
        # the device's own nodes (the libraries stay: plan() gives no device of a vendor
        # whose userspace is missing, and only device_nodes are taken from this plan)
        one = _plan(
            inv._replace(root=spec_root, vendors=(v._replace(devices=(d,), control_nodes=(), binaries=()),)), False
        )
        own = tuple(one.device_nodes)
        dev_nodes.update(own)
        per_device.append((d, own))
    for d, own in per_device:
        if not own:  # nothing of its own to give (CDI wants edits on every device): only in `all`
            continue
        edits = _cdi_edits(_only(own), spec_root)
        for name in dict.fromkeys((str(d.index), device_name(d))):
            if not name or name in names or not _NAME.match(name):
                continue
            names.add(name)
            devices.append({"name": name, "containerEdits": edits})
    env_all = tuple(e for e in full.env if e.startswith("GPUHOOK_DEVICES="))
    all_nodes = tuple(n for n in full.device_nodes if n in dev_nodes)
    devices.append({"name": ALL, "containerEdits": _cdi_edits(_only(all_nodes, env_all), spec_root)})
    top = _cdi_edits(_without(full, dev_nodes, {"GPUHOOK_DEVICES"}), spec_root)
    spec: dict = {"cdiVersion": "", "kind": kind_of(v.vendor), "devices": devices}
    if top:
        spec["containerEdits"] = top
    spec["cdiVersion"] = required_version(spec)
    return spec


def generic_spec(
    inv: Inventory, spec_root: str = "/", ldconfig: str | None | bool = None, helper: str | None | bool = None
) -> dict | None:
    """gpuhook.dev/gpu=all: everything the runtime class would inject, every vendor."""
    full = _plan(inv._replace(root=spec_root), ldconfig, helper)
    if not full:
        return None
    spec = {
        "cdiVersion": "",
        "kind": kind_of(GENERIC_CLASS),
        "devices": [{"name": ALL, "containerEdits": _cdi_edits(full, spec_root)}],
    }
    spec["cdiVersion"] = required_version(spec)
    return spec


def specs(
    inv: Inventory,
    spec_root: str = "/",
    ldconfig: str | None | bool = None,
    max_version: str | None = None,
    dropped: list | None = None,
    helper: str | None | bool = None,
) -> list[dict]:
    """Every spec of this node: one per vendor with devices, then gpuhook.dev/gpu. None at
    all on a CPU-only node (a CDI spec must have a device). CDIError if one would break
    CDI's rules (never written)."""
    from .plan import unusable

    # a vendor whose userspace is missing (plan.unusable) gets no spec: it cannot work
    out = [vendor_spec(inv, v, spec_root, ldconfig, helper) for v in inv.vendors if v.devices and unusable(v) is None]
    generic = generic_spec(inv, spec_root, ldconfig, helper)
    if generic is not None:
        out.append(generic)
    if max_version is not None:
        out = [cap_version(s, max_version, dropped) for s in out]
    for s in out:
        validate(s)
    return out


def cap_version(spec: dict, max_version: str, dropped: list | None = None) -> dict:
    """The spec for a consumer that reads cdiVersion <= max_version (podman 4.3: 0.5.0):
    the fields of newer versions are left out, and named in `dropped`. Without
    additionalGids a non-root process needs the nodes' group (render, video) by itself."""
    if max_version not in KNOWN_VERSIONS:
        raise CDIError(f"cdiVersion {max_version!r}: not one of {', '.join(KNOWN_VERSIONS)}")
    if _v(required_version(spec)) <= _v(max_version):
        return spec
    spec = json.loads(json.dumps(spec))
    lost = []
    for e in [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]:
        if _v(max_version) < (0, 7, 0):
            for key in ("additionalGids", "intelRdt"):
                if e.pop(key, None):
                    lost.append(key)
        if _v(max_version) < (0, 5, 0):
            for n in e.get("deviceNodes", ()):
                if n.pop("hostPath", None):
                    lost.append("hostPath")
        if _v(max_version) < (0, 4, 0):
            for m in e.get("mounts", ()):
                if m.pop("type", None):
                    lost.append("mount type")
    if _v(max_version) < (0, 5, 0):
        if any(_digit_named(d) for d in spec["devices"]):
            lost.append("device names starting with a digit")
            spec["devices"] = [d for d in spec["devices"] if not _digit_named(d)]
    if _v(max_version) < (0, 6, 0):
        spec.pop("annotations", None)
        for d in spec["devices"]:
            d.pop("annotations", None)
    spec["devices"] = [d for d in spec["devices"] if d["containerEdits"]]
    spec["cdiVersion"] = required_version(spec)
    if _v(spec["cdiVersion"]) > _v(max_version):
        raise CDIError(f"{spec['kind']}: needs cdiVersion {spec['cdiVersion']}, over {max_version}")
    if dropped is not None and lost:
        dropped.append((spec["kind"], sorted(set(lost))))
    return spec


# -- versions and validation ----------------------------------------------------------


def _v(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split("."))


def _digit_named(device: dict) -> bool:
    """A device name starting with a digit ("0", "0000-43-00.0"): CDI allows it from 0.5.0."""
    return device.get("name", "")[:1].isdigit()


def required_version(spec: dict) -> str:
    """The lowest cdiVersion that has every field `spec` uses."""
    need = "0.3.0"
    editss = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", ())]

    def bump(v: str) -> None:
        nonlocal need
        if _v(v) > _v(need):
            need = v

    if any(_digit_named(d) for d in spec.get("devices", ())):
        bump("0.5.0")
    for e in editss:
        if any("type" in m for m in e.get("mounts", ())):
            bump("0.4.0")
        if any("hostPath" in n for n in e.get("deviceNodes", ())):
            bump("0.5.0")
        if e.get("additionalGids") or e.get("intelRdt"):
            bump("0.7.0")
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", ())):
        bump("0.6.0")
    if "." in spec.get("kind", "").partition("/")[2]:
        bump("0.6.0")
    return need


def validate(spec: dict) -> None:
    """CDIError unless `spec` follows CDI's rules for what gpuhook writes."""
    version = spec.get("cdiVersion")
    if version not in KNOWN_VERSIONS:
        raise CDIError(f"cdiVersion {version!r}: not one of {', '.join(KNOWN_VERSIONS)}")
    if _v(version) < _v(required_version(spec)):
        raise CDIError(f"cdiVersion {version} lacks fields this spec uses (needs {required_version(spec)})")
    kind = spec.get("kind")
    prefix, slash, cls = (kind or "").partition("/")
    if not slash or not _CLASS.match(cls.replace(".", "_")) or "/" in cls:
        raise CDIError(f"kind {kind!r}: not vendor/class")
    if len(prefix) > 253 or not all(_DNS_LABEL.match(label) for label in prefix.split(".")):
        raise CDIError(f"kind {kind!r}: its prefix is not a DNS subdomain")
    devices = spec.get("devices")
    if not devices:
        raise CDIError(f"{kind}: a spec needs at least one device")
    seen = set()
    for d in devices:
        name = d.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise CDIError(f"{kind}: device name {name!r} breaks CDI's name rules")
        if name in seen:
            raise CDIError(f"{kind}: device {name!r} defined twice")
        seen.add(name)
        if not d.get("containerEdits"):
            raise CDIError(f"{kind}={name}: a device needs container edits")
    for e in [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in devices]:
        for n in e.get("deviceNodes", ()):
            if not str(n.get("path", "")).startswith("/"):
                raise CDIError(f"{kind}: device node path {n.get('path')!r} is not absolute")
        for h in e.get("hooks", ()):
            if not str(h.get("path", "")).startswith("/"):
                raise CDIError(f"{kind}: hook path {h.get('path')!r} is not absolute")
        for m in e.get("mounts", ()):
            if not str(m.get("containerPath", "")).startswith("/"):
                raise CDIError(f"{kind}: mount {m.get('containerPath')!r} is not absolute")


# -- serialising ----------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\Z")
# characters YAML 1.1 reads as line breaks or a byte order mark: escaped (\uXXXX is the same in JSON and YAML)
_YAML_ESCAPES = {ch: f"\\u{ord(ch):04x}" for ch in "\u0085\u2028\u2029\ufeff"}


def _yaml_scalar(value) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    s = json.dumps(str(value), ensure_ascii=False)  # a YAML double-quoted scalar, too
    for ch, esc in _YAML_ESCAPES.items():
        s = s.replace(ch, esc)
    return s


def _yaml_key(key: str) -> str:
    return (
        key
        if _PLAIN_KEY.match(key) and key not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n")
        else _yaml_scalar(key)
    )


def _yaml(value, indent: int, lines: list[str], prefix: str) -> None:
    """Append `value` to `lines`; `prefix` is what goes before its first line."""
    pad = " " * indent
    if isinstance(value, dict) and value:
        first = True
        for k, v in value.items():
            head = (prefix if first else pad) + _yaml_key(str(k)) + ":"
            first = False
            if isinstance(v, (dict, list)) and v:
                if isinstance(v, list):
                    lines.append(head)
                    _yaml(v, indent, lines, pad)
                else:
                    lines.append(head)
                    _yaml(v, indent + 2, lines, pad + "  ")
            else:
                lines.append(head + " " + _yaml_inline(v))
    elif isinstance(value, list) and value:
        first = True
        for item in value:
            head = (prefix if first else pad) + "- "
            first = False
            if isinstance(item, (dict, list)) and item:
                _yaml(item, indent + 2, lines, head)
            else:
                lines.append(head + _yaml_inline(item))
    else:
        lines.append(prefix + _yaml_inline(value))


def _yaml_inline(value) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


def to_yaml(value) -> str:
    lines: list[str] = []
    _yaml(value, 0, lines, "")
    return "\n".join(lines) + "\n"


def dumps(spec: dict, fmt: str = "yaml") -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        return "# Written by gpuhook (gpuhook cdi generate / gpuhook agent): do not edit.\n" + to_yaml(spec)
    raise ValueError(f"format {fmt!r}: yaml or json")


# -- writing --------------------------------------------------------------------------


def ours(name: str) -> bool:
    """A file name gpuhook writes in a CDI directory."""
    return name.startswith(FILE_PREFIX) and name.rpartition(".")[2] in FORMATS


def _kept(name: str) -> bool:
    """gpuhook.dev/none's file: not one of the node's GPU kinds, never pruned with them (the
    DRA driver writes it; `gpuhook uninstall` removes it with the rest)."""
    return name in {file_name(kind_of(NONE_CLASS), fmt) for fmt in FORMATS}


def write_dir(
    all_specs: list[dict], directory: str, fmt: str = "yaml", prune: bool = True
) -> tuple[list[str], list[str]]:
    """Write each spec to `directory` atomically, only when its bytes change; remove the
    gpuhook specs the node no longer has (and those of the other format) when `prune`. Returns (written,
    removed) file names."""
    from .fsutil import write_atomic

    os.makedirs(directory, exist_ok=True)
    wanted = {}
    for s in all_specs:
        wanted[file_name(s["kind"], fmt)] = dumps(s, fmt).encode()
    written = []
    for name, data in wanted.items():
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    continue
        except OSError:
            pass
        write_atomic(path, data, 0o644)
        written.append(name)
    removed = []
    for name in sorted(os.listdir(directory)) if prune else ():
        if ours(name) and name not in wanted and not _kept(name):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return written, removed
