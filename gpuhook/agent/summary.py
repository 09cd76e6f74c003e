"""What the agent tells of a probe: the summary it compares between probes (summarize, diff),
one line for people (describe), and the node Events a change makes (events)."""

from __future__ import annotations

from . import labels as labels_mod


def summarize(inv) -> dict:
    """What the agent compares between probes: devices by vendor:id, driver versions, and
    the vendors whose devices cannot be used (plan.unusable: e.g. no driver userspace yet)."""
    from ..plan import unusable

    bad = {}
    for v in inv.vendors:
        why = unusable(v) if v.devices else None
        if why:
            bad[v.vendor] = why[1]
    return {
        "devices": {f"{v.vendor}:{d.id}": d.model or "" for v in inv.vendors for d in v.devices},
        "drivers": {v.vendor: v.driver_version for v in inv.vendors if v.driver_version},
        "unusable": bad,
    }


def describe(inv) -> str:
    """One line for people: '2 GPUs: nvidia x2 (NVIDIA H100, driver 550.54.14)'; a vendor
    whose devices cannot be used is named with the reason."""
    from ..plan import unusable

    vendors = [v for v in inv.vendors if v.devices]
    if not vendors:
        return "no GPU: CPU-only node"
    parts, n = [], 0
    for v in vendors:
        why = unusable(v)
        extra = [
            x for x in (labels_mod.common_model(v.devices), v.driver_version and f"driver {v.driver_version}") if x
        ]
        if why:
            extra.append(f"not usable: {why[1]}")
        else:
            n += len(v.devices)
        parts.append(f"{v.vendor} x{len(v.devices)}" + (f" ({', '.join(extra)})" if extra else ""))
    total = sum(len(v.devices) for v in vendors)
    return f"{total} GPU{'s' if total != 1 else ''}{f' ({n} usable)' if n != total else ''}: " + ", ".join(parts)


def diff(old: dict, new: dict) -> dict:
    added = sorted(set(new["devices"]) - set(old["devices"]))
    removed = sorted(set(old["devices"]) - set(new["devices"]))
    drivers = {
        v: [old["drivers"].get(v), new["drivers"].get(v)]
        for v in sorted(set(old["drivers"]) | set(new["drivers"]))
        if old["drivers"].get(v) != new["drivers"].get(v)
    }
    before, after = old.get("unusable", {}), new.get("unusable", {})
    usable = {
        v: [before.get(v), after.get(v)] for v in sorted(set(before) | set(after)) if before.get(v) != after.get(v)
    }
    return {"added": added, "removed": removed, "driver_version": drivers, "unusable": usable}


def events(inv, summary: dict, change: dict | None) -> list[tuple[str, str, str]]:
    """The node Events (reason, message, type) of a probe whose summary changed: the first
    probe's (change None) or a change's, and the vendors that cannot be used when that is new."""
    out = []
    if change is None:
        out.append(("GPUInventory", describe(inv), "Normal"))
    else:
        parts = [f"+{d}" for d in change["added"]] + [f"-{d}" for d in change["removed"]]
        parts += [f"{v} driver {a or '-'} -> {b or '-'}" for v, (a, b) in change["driver_version"].items()]
        parts += [
            f"{v} {'not usable' if a else 'usable'} -> {'not usable: ' + b if b else 'usable'}"
            for v, (a, b) in change["unusable"].items()
        ]
        out.append(("GPUInventoryChanged", f"{describe(inv)} ({'; '.join(parts)})", "Normal"))
    if summary["unusable"] and (change is None or change["unusable"]):
        unusable = "; ".join(
            f"{v}: {why}: gpu-optional containers get none of its devices" for v, why in summary["unusable"].items()
        )
        out.append(("GPUUnusable", unusable, "Warning"))
    return out
