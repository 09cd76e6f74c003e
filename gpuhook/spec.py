"""Apply Edits to an OCI runtime spec (a dict); check that a spec's fields are of the types runc reads.

apply() is idempotent (applying twice equals applying once), never duplicates a device the
spec already has, and keeps every field it does not know exactly as it was. Each device node
gets both a `linux.devices` entry and a `linux.resources.devices` allow rule: runc creates a
node listed in linux.devices but does not let the container open it without the rule.
"""

from .edits import Edits


class SpecError(ValueError):
    """The spec has a field of the wrong type where an edit must go: it is left alone, and
    the real runtime reports the problem in its own words."""


def _field(parent: dict, key: str, kind: type):
    """parent[key], created empty when absent or null (check() has refused every other type)."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = kind()
    return value


def _dict(parent: dict, key: str) -> dict:
    return _field(parent, key, dict)


def _list(parent: dict, key: str) -> list:
    return _field(parent, key, list)


# The fields gpuhook reads or edits, the JSON type the real runtime wants for each, and for
# their items. A spec where one has another type is not edited at all: gpuhook would read it
# otherwise than runc does, and runc refuses it anyway, in its own words.
_SHAPE: tuple[tuple[tuple[str, ...], type, type | None], ...] = (
    (("process",), dict, None),
    (("process", "env"), list, str),
    (("process", "user"), dict, None),
    (("process", "user", "additionalGids"), list, int),
    (("root",), dict, None),
    (("annotations",), dict, str),
    (("linux",), dict, None),
    (("linux", "devices"), list, dict),
    (("linux", "resources"), dict, None),
    (("linux", "resources", "devices"), list, dict),
    (("mounts",), list, dict),
    (("hooks",), dict, list),
)
# inside those items, the field gpuhook keys them by (apply: a device by its path, a mount by
# its destination), and the type runc wants for it
_ITEM_KEY = {("linux", "devices"): "path", ("mounts",): "destination"}


def check(spec: dict) -> None:
    """SpecError when a field that gpuhook reads or edits, or one of its items, has a type
    the real runtime would refuse (null counts as absent)."""
    for path, kind, item in _SHAPE:
        node: object = spec
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            continue
        where = ".".join(path)
        if not isinstance(node, kind):
            raise SpecError(f"{where} is a {type(node).__name__}, not a{'n object' if kind is dict else ' list'}")
        if item is None:
            continue
        items: list = list(node.values()) if isinstance(node, dict) else node  # type: ignore[assignment]
        for value in items:
            if not isinstance(value, item) or isinstance(value, bool):
                raise SpecError(f"{where} has an item of type {type(value).__name__}")
            if path == ("hooks",) and any(not isinstance(h, dict) for h in value):  # type: ignore[attr-defined]
                raise SpecError("hooks has an entry that is not an object")
            field = _ITEM_KEY.get(path)
            if field is not None and isinstance(value, dict) and not isinstance(value.get(field, ""), str | None):
                raise SpecError(f"{where} has an item whose {field} is a {type(value[field]).__name__}")


def apply(spec: dict, edits: Edits) -> dict:
    """Edit a copy of `spec` and return it; empty edits return `spec` itself, untouched.

    SpecError when a field that gpuhook reads or edits has the wrong type (check()); the
    input is never modified, whatever happens."""
    if not edits:
        return spec
    check(spec)
    spec = _copy(spec)
    if edits.env:
        _set_env(_list(_dict(spec, "process"), "env"), edits.env)
    if edits.device_nodes:
        _add_devices(_dict(spec, "linux"), edits.device_nodes)
    if edits.mounts:
        mounts = _list(spec, "mounts")
        taken = {m.get("destination") for m in mounts if isinstance(m, dict)}
        for m in edits.mounts:
            if m.container_path not in taken:
                mounts.append(
                    {"destination": m.container_path, "type": m.type, "source": m.host_path, "options": list(m.options)}
                )
                taken.add(m.container_path)
    if edits.hooks:
        hooks = _dict(spec, "hooks")
        for h in edits.hooks:
            stage = _list(hooks, h.hook_name)
            entry: dict = {"path": h.path, "args": list(h.args), "env": list(h.env)}
            if h.timeout is not None:
                entry["timeout"] = h.timeout
            if entry not in stage:
                stage.append(entry)
    if edits.additional_gids:
        user = _dict(_dict(spec, "process"), "user")
        gids = _list(user, "additionalGids")
        gids.extend(g for g in edits.additional_gids if g not in gids)
    return spec


def _set_env(env: list, items) -> None:
    """Each NAME=value of items into process.env: in place of the entry of that name, else appended."""
    index = {e.partition("=")[0]: i for i, e in enumerate(env) if isinstance(e, str)}
    for item in items:
        key = item.partition("=")[0]
        if key in index:
            env[index[key]] = item
        else:
            index[key] = len(env)
            env.append(item)


def _add_devices(linux: dict, nodes) -> None:
    """Each device node into linux.devices and its allow rule into linux.resources.devices; a
    path already taken by another device (a device plugin's) is left as it is."""
    devices = _list(linux, "devices")
    rules = _list(_dict(linux, "resources"), "devices")
    by_path = {d.get("path"): d for d in devices if isinstance(d, dict)}
    for n in nodes:
        have = by_path.get(n.path)
        if have is None:
            entry = {"path": n.path, "type": n.type, "major": n.major, "minor": n.minor}
            if n.file_mode is not None:
                entry["fileMode"] = n.file_mode
            if n.uid is not None:
                entry["uid"] = n.uid
            if n.gid is not None:
                entry["gid"] = n.gid
            devices.append(entry)
            by_path[n.path] = entry
        elif (have.get("type"), have.get("major"), have.get("minor")) != (n.type, n.major, n.minor):
            continue  # the path is taken by another device (a device plugin's): leave it
        rule = {"allow": True, "type": n.type, "major": n.major, "minor": n.minor, "access": n.permissions}
        if rule not in rules:
            rules.append(rule)


def _copy(value):
    """Deep copy of JSON data (faster than copy.deepcopy, and no import)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
