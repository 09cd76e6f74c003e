"""What the DRA driver publishes: the node's Inventory -> ResourceSlice objects. Pure: reads
no file and calls no API.

Devices (one pool per node, named after the node):
- a device per GPU, partition or accelerator the probe found, of any vendor, named
  `<vendor>-<its stable id>` (an NVIDIA UUID, a PCI address) so that the name survives a
  reboot that renumbers the GPUs; only those that gpuhook's CDI specs define (a vendor whose
  userspace is missing has no spec, so no device: it could not be prepared);
- one device `none` that may be allocated any number of times (allowMultipleAllocations):
  "no GPU", on every node, GPU or not.

Attributes (in the driver's domain, gpuhook.dev/<name>), the same name and type on every device
that has them: kind (gpu, partition, accel, dxg, or none), vendor (the vendor's name in
vendors.py; none for `none`), and, where the probe knows them, model, id, uuid and mig (NVIDIA:
whether the GPU has MIG instances, which come with it), pciBusID, parent (a partition's GPU),
index, driver (the kernel driver), driverVersion (a semantic version).

Capacity (gpuhook.dev/<name>): memory, the GPU's own memory in bytes where its kernel driver
states it (Device.memory: AMD, Intel xe), as a quantity in the form the API server writes back.
"""

from __future__ import annotations

import hashlib
import re

from .. import cdi
from ..inventory import Device, Inventory, VendorInventory
from ..record import Record
from . import DRIVER

NONE = "none"  # the `none` device's name and its kind attribute
MAX_DEVICES = 128  # a ResourceSlice's devices (resource/v1 ResourceSliceMaxDevices)
MAX_NAME = 63  # a device name is a DNS label
MAX_VALUE = 64  # a string or version attribute's value (DeviceAttributeMaxValueLength)
_SEMVER = re.compile(r"^(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*)){0,2}\Z")


class Published(Record):
    """One device of the node's pool: its name in the ResourceSlice, the CDI device that
    prepare gives a container for it, and the ResourceSlice's device object."""

    name: str
    cdi_id: str
    device: dict

    __slots__ = ()


def device_name(vendor: str, d: Device) -> str:
    """`<vendor>-<id>` as a DNS label (lower case, '-' for anything else); a digest of the id
    when that would be longer than a label may be."""
    label = re.sub(r"[^a-z0-9]+", "-", f"{vendor}-{d.id}".lower()).strip("-")
    if len(label) <= MAX_NAME:
        return label
    return f"{vendor}-{hashlib.sha256(d.id.encode()).hexdigest()[:16]}"


def _version(text: str | None) -> str | None:
    """A driver version as a semantic version (550.54.14; 550.54 -> 550.54.0), None when it
    is not one."""
    if not text or not _SEMVER.match(text):
        return None
    parts = text.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def quantity(n: int) -> str:
    """A whole number of bytes as a Kubernetes quantity in its canonical form, the one the API
    server gives back (so a slice read back equals the one written): a multiple of 1024 with
    the largest binary suffix that keeps it whole (68702699520 -> 65520Mi), else decimal with
    the largest SI suffix (16000000000 -> 16G, 1000001 -> 1000001)."""
    if n >= 1024 and n % 1024 == 0:
        base, suffixes = 1024, ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    else:
        base, suffixes = 1000, ("", "k", "M", "G", "T", "P", "E")
    i = 0
    while n and n % base == 0 and i < len(suffixes) - 1:
        n //= base
        i += 1
    return f"{n}{suffixes[i]}"


def _string(value: str) -> dict:
    return {"string": value[:MAX_VALUE]}


def attributes(v: VendorInventory, d: Device) -> dict:
    """The attributes users select a GPU on (see the module's docstring)."""
    attrs: dict[str, dict] = {"kind": _string(d.kind), "vendor": _string(v.vendor), "id": _string(d.id)}
    if v.vendor == "nvidia":  # the NVIDIA probe's id is the GPU's UUID
        from ..probe.nvidia import has_mig

        attrs["uuid"] = _string(d.id)
        attrs["mig"] = {"bool": has_mig(d)}
    if d.model:
        attrs["model"] = _string(d.model)
    if d.pci:
        attrs["pciBusID"] = _string(d.pci)
    if d.parent:
        attrs["parent"] = _string(d.parent)
    attrs["index"] = {"int": d.index}
    if d.driver:
        attrs["driver"] = _string(d.driver)
    version = _version(v.driver_version)
    if version:
        attrs["driverVersion"] = {"version": version}
    return attrs


def none_device() -> Published:
    device = {
        "name": NONE,
        "attributes": {"kind": _string(NONE), "vendor": _string(NONE)},
        "allowMultipleAllocations": True,
    }
    return Published(NONE, cdi.qualified(cdi.kind_of(cdi.NONE_CLASS), cdi.NONE), device)


def published(inv: Inventory, cdi_ids: frozenset[str]) -> tuple[Published, ...]:
    """The node's devices: each GPU that gpuhook's CDI specs define (`cdi_ids`:
    cdi.device_ids of the specs written), then `none`."""
    out = []
    for v in inv.vendors:
        for d in v.devices:
            cdi_id = cdi.qualified(cdi.kind_of(v.vendor), cdi.device_name(d))
            if cdi_id not in cdi_ids:
                continue
            name = device_name(v.vendor, d)
            device = {"name": name, "attributes": attributes(v, d)}
            if d.memory:
                device["capacity"] = {"memory": {"value": quantity(d.memory)}}
            out.append(Published(name, cdi_id, device))
    out.append(none_device())
    return tuple(out)


def slice_name(node: str, i: int) -> str:
    return f"{node}-{DRIVER}-{i}"


def resource_slices(node: str, devices: tuple[Published, ...], generation: int) -> list[dict]:
    """The node's pool as ResourceSlice objects of at most MAX_DEVICES devices each."""
    chunks = [devices[i : i + MAX_DEVICES] for i in range(0, len(devices), MAX_DEVICES)] or [()]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node, i)},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(chunks)},
                "devices": [p.device for p in chunk],
            },
        }
        for i, chunk in enumerate(chunks)
    ]
