"""Node labels from the Inventory: a Node Feature Discovery feature file, and the Node itself
through the Kubernetes API when the agent has a service account.

    gpuhook.dev/accelerator=nvidia            the primary vendor (none on a CPU-only node)
    gpuhook.dev/accelerator.<vendor>=true     one per vendor the node has
    gpuhook.dev/gpu.count=3                   every device of every vendor
    gpuhook.dev/gpu.model=...                 the primary vendor's model
    gpuhook.dev/driver.version=...            the primary vendor's driver version
    gpuhook.dev/<vendor>.count / .model / .driver.version
    gpuhook.dev/runtime-ready=true            the gpu-optional runtime handler is installed
    gpuhook.dev/<vendor>.unusable=no-libcuda  devices there, userspace missing (plan.unusable):
                                              not counted or advertised above; with no other
    gpuhook.dev/accelerator.reason=nvidia-no-libcuda   vendor, accelerator=none and why

The primary vendor is the first of GPUHOOK_ACCELERATOR, i.e. the backend a gpu-optional
container picks (probe order: nvidia, amd, intel, accel, dxg: discrete before integrated).

One label outside gpuhook.dev/, for the node affinity users already write: the node config's
vendor_label (default gpu.type; "" turns it off) = the primary vendor, set exactly when
gpuhook.dev/accelerator names one (never on a CPU-only node, nor for a vendor whose userspace
is missing). Which labels are the agent's is the API server's record, metadata.managedFields
(the agent's field manager, AGENT_NAME): the agent removes a label it no longer wants only
when it set it (a GPU gone, the key renamed or turned off), so an operator's own label stays
(gpuhook.dev/pool, gpuhook.dev/install, a hand-made gpu.type). Under gpuhook.dev/ the
agent's value of a key it computes is final (it overwrites another's); outside it, a key
somebody else set is never overwritten.

The API calls are gpuhook.agent.kube's (lightkube); this module only says what the labels are.
"""

import dataclasses
import os
import re

from ..config import valid_label_name, valid_vendor_label
from ..defaults import AGENT_NAME, NFD_FEATURES

PREFIX = "gpuhook.dev/"
ACCELERATOR = PREFIX + "accelerator"
RUNTIME_READY = PREFIX + "runtime-ready"
NFD_FILE = os.path.basename(NFD_FEATURES)  # the agent's file in its --nfd-dir
MAX_VALUE = 63

_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_ENDS = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+\Z")


def label_value(text) -> str:
    """A valid label value (<= 63 characters of [A-Za-z0-9._-], alphanumeric at both ends;
    may be empty): accents are dropped (é -> e), other characters become '-', runs collapse."""
    import unicodedata

    s = unicodedata.normalize("NFKD", str(text or "").strip())
    s = _BAD.sub("-", "".join(c for c in s if not unicodedata.combining(c)))
    s = _ENDS.sub("", s)
    if len(s) > MAX_VALUE:
        s = _ENDS.sub("", s[:MAX_VALUE])
    return s


def valid_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    return bool(slash) and prefix == PREFIX[:-1] and valid_label_name(name)


def common_model(devices) -> str:
    """The most common model among `devices` (ties: the first seen)."""
    counts: dict[str, int] = {}
    for d in devices:
        if d.model:
            counts[d.model] = counts.get(d.model, 0) + 1
    return max(counts, key=lambda m: counts[m]) if counts else ""


def usable_vendors(inv) -> tuple[list, list[tuple[str, str]]]:
    """(the vendors whose devices a gpu-optional container gets, in probe order: the first
    is GPUHOOK_ACCELERATOR's first; (vendor, code) of each vendor with devices that it would
    not get: plan.unusable, e.g. no driver userspace)."""
    from ..plan import unusable

    vendors, refused = [], []
    for v in inv.vendors:
        why = unusable(v) if v.devices else None
        if why:
            refused.append((v.vendor, why[0]))
        elif v.devices:
            vendors.append(v)
    return vendors, refused


def node_labels(inv, runtime_ready: bool = False, vendor_label: str = "") -> dict[str, str]:
    """The labels this node should have (values never empty): gpuhook.dev/ ones, and
    `vendor_label` (the node config's, "" none) = gpuhook.dev/accelerator's vendor when it
    names one. A vendor whose devices a gpu-optional container would not get (plan.unusable:
    no driver userspace) is not advertised: only gpuhook.dev/<vendor>.unusable=<why>, and,
    when no vendor is left, gpuhook.dev/accelerator=none with
    gpuhook.dev/accelerator.reason=<vendor>-<why>."""
    vendors, refused = usable_vendors(inv)
    primary = vendors[0].vendor if vendors else None
    labels = {
        ACCELERATOR: primary or "none",
        PREFIX + "gpu.count": str(sum(len(v.devices) for v in vendors)),
    }
    for vendor, code in refused:
        labels[f"{PREFIX}{label_value(vendor)}.unusable"] = label_value(code)
    if refused and not vendors:
        labels[ACCELERATOR + ".reason"] = label_value(f"{refused[0][0]}-{refused[0][1]}")
    for i, v in enumerate(vendors):
        vendor = label_value(v.vendor)
        model, driver = label_value(common_model(v.devices)), label_value(v.driver_version)
        labels[f"{PREFIX}accelerator.{vendor}"] = "true"
        labels[f"{PREFIX}{vendor}.count"] = str(len(v.devices))
        if model:
            labels[f"{PREFIX}{vendor}.model"] = model
        if driver:
            labels[f"{PREFIX}{vendor}.driver.version"] = driver
        if i == 0:
            if model:
                labels[PREFIX + "gpu.model"] = model
            if driver:
                labels[PREFIX + "driver.version"] = driver
    if runtime_ready:
        labels[RUNTIME_READY] = "true"
    extra = vendor_label if vendor_label and valid_vendor_label(vendor_label) else None
    if extra and primary:
        labels[extra] = primary
    return {k: v for k, v in labels.items() if v and (valid_key(k) or k == extra)}


# -- Node Feature Discovery -----------------------------------------------------------


def nfd_text(labels: dict[str, str]) -> str:
    lines = ["# Written by gpuhook agent: this node's GPUs. Rewritten whole on every change."]
    lines += [f"{k}={v}" for k, v in sorted(labels.items())]
    return "\n".join(lines) + "\n"


def parse_nfd(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def write_nfd(labels: dict[str, str], directory: str, name: str = NFD_FILE) -> bool:
    """Write the feature file atomically (a dotfile, which NFD skips, then rename); only
    when it changes. Labels gone from `labels` go from the file, and NFD removes them."""
    from ..fsutil import write_atomic

    data = nfd_text(labels).encode()
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return False
    except OSError:
        pass
    os.makedirs(directory, exist_ok=True)
    write_atomic(path, data, 0o644)
    return True


# -- the Node through the Kubernetes API (gpuhook.agent.kube) --------------------------------


@dataclasses.dataclass
class NodeSync:
    patch: dict  # every label sent, None for those removed
    removed: list[str]  # the keys removed
    uid: str | None  # the Node's
    foreign: dict[str, str]  # keys of `labels` outside gpuhook.dev/ somebody else set otherwise: their value, kept


def _map(d, key) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def owned_labels(node: dict, manager: str = AGENT_NAME) -> set[str]:
    """The label keys whose last change the API server records as `manager`'s
    (metadata.managedFields: a change moves a field to the manager that made it)."""
    out: set[str] = set()
    for entry in _map(node, "metadata").get("managedFields") or ():
        if isinstance(entry, dict) and entry.get("manager") == manager and not entry.get("subresource"):
            fields = _map(_map(_map(entry, "fieldsV1"), "f:metadata"), "f:labels")
            out.update(k[2:] for k in fields if isinstance(k, str) and k.startswith("f:"))
    return out


def sync_node_labels(api, labels: dict[str, str]) -> NodeSync:
    """Make the Node's labels `labels`: one GET, and a merge patch only when something
    differs. Only the agent's own labels (owned_labels) no longer in `labels` are removed:
    under gpuhook.dev/ in that patch, outside it (vendor_label: no GPU left, the key renamed
    or turned off) in a patch of its own, so that an admission policy that no longer allows
    that key (a rename) never holds back the others. A label of `labels` is set under
    gpuhook.dev/ whoever set it before; outside it, a key somebody else set to another value
    is left as it is (NodeSync.foreign)."""
    from .kubeclient import KubeError

    node = api.get_node()
    meta = node.get("metadata") or {}
    have = meta.get("labels") or {}
    owned = owned_labels(node)
    patch: dict[str, str | None] = {}
    foreign: dict[str, str] = {}
    for k, v in labels.items():
        if have.get(k) == v:
            continue
        if k.startswith(PREFIX) or k not in have or k in owned:
            patch[k] = v
        else:
            foreign[k] = have[k]
    unwanted = sorted(k for k in have if k not in labels and k in owned)
    removed = [k for k in unwanted if k.startswith(PREFIX)]
    stale = [k for k in unwanted if not k.startswith(PREFIX)]
    patch.update({k: None for k in removed})
    if patch:
        api.patch_labels(patch)
    if stale:
        try:
            api.patch_labels({k: None for k in stale})
        except KubeError as e:
            raise KubeError(f"removing the agent's label {', '.join(stale)}: {e}", e.status, e.kind) from None
        patch.update({k: None for k in stale})
    return NodeSync(patch, sorted(removed + stale), meta.get("uid"), foreign)
