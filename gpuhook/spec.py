"""Apply Edits to an OCI runtime spec (a dict), and load/store a bundle's config.json.

apply() is idempotent (applying twice equals applying once), never duplicates a device the
spec already has, and keeps every field it does not know exactly as it was. Each device node
gets both a `linux.devices` entry and a `linux.resources.devices` allow rule: runc creates a
node listed in linux.devices but does not let the container open it without the rule.
"""

from __future__ import annotations

import os

from .edits import Edits


def _dict(parent: dict, key: str) -> dict:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _list(parent: dict, key: str) -> list:
    value = parent.get(key)
    if not isinstance(value, list):
        value = parent[key] = []
    return value


def apply(spec: dict, edits: Edits) -> dict:
    """Edit `spec` in place and return it. Empty edits leave it untouched."""
    if not edits:
        return spec
    if edits.env:
        env = _list(_dict(spec, "process"), "env")
        index = {e.partition("=")[0]: i for i, e in enumerate(env) if isinstance(e, str)}
        for item in edits.env:
            key = item.partition("=")[0]
            if key in index:
                env[index[key]] = item
            else:
                index[key] = len(env)
                env.append(item)
    if edits.device_nodes:
        linux = _dict(spec, "linux")
        devices = _list(linux, "devices")
        rules = _list(_dict(linux, "resources"), "devices")
        by_path = {d.get("path"): d for d in devices if isinstance(d, dict)}
        for n in edits.device_nodes:
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
            rule = {"allow": True, "type": n.type, "major": n.major, "minor": n.minor,
                    "access": n.permissions}
            if rule not in rules:
                rules.append(rule)
    if edits.mounts:
        mounts = _list(spec, "mounts")
        taken = {m.get("destination") for m in mounts if isinstance(m, dict)}
        for m in edits.mounts:
            if m.container_path not in taken:
                mounts.append({"destination": m.container_path, "type": m.type,
                               "source": m.host_path, "options": list(m.options)})
                taken.add(m.container_path)
    if edits.hooks:
        hooks = _dict(spec, "hooks")
        for h in edits.hooks:
            stage = _list(hooks, h.hook_name)
            entry = {"path": h.path, "args": list(h.args), "env": list(h.env)}
            if h.timeout is not None:
                entry["timeout"] = h.timeout
            if entry not in stage:
                stage.append(entry)
    if edits.additional_gids:
        user = _dict(_dict(spec, "process"), "user")
        gids = _list(user, "additionalGids")
        gids.extend(g for g in edits.additional_gids if g not in gids)
    return spec


def write_atomic(path: str, data: bytes, mode: int | None = None) -> None:
    """Write a whole file or nothing: temp file beside it, fsync, rename, fsync the directory."""
    d = os.path.dirname(os.path.abspath(path))
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = os.path.join(d, f".{os.path.basename(path)}.gpuhook-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
