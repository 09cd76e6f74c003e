"""Apply Edits to an OCI runtime spec (a dict), and load/store a bundle's config.json.

apply() is idempotent (applying twice equals applying once), never duplicates a device the
spec already has, and keeps every field it does not know exactly as it was. Each device node
gets both a `linux.devices` entry and a `linux.resources.devices` allow rule: runc creates a
node listed in linux.devices but does not let the container open it without the rule.
"""

import errno
import os

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


def _write_all(fd: int, data: bytes, mode: int, sync: bool) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fchmod(fd, mode)
    if sync:
        os.fsync(fd)


def _unlink(name: str, dfd: int) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass


def _write_named(d: str, path: str, data: bytes, mode: int, sync: bool) -> None:
    """write_atomic's temp file with a name from the start (no O_TMPFILE there). A random
    part besides the pid: a temp file left by a killed writer whose pid is now another's (or
    the same pid in another pid namespace) must not make every write fail."""
    for attempt in range(8):
        tmp = os.path.join(d, f".{os.path.basename(path)}.gpuhook-{os.getpid()}-{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            break
        except FileExistsError:
            if attempt == 7:
                raise
    try:
        try:
            _write_all(fd, data, mode, sync)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: str, data: bytes, mode: int | None = None, sync_dir: bool = True, sync: bool = True) -> None:
    """Write a whole file or nothing: temp file beside it, fsync, rename, and fsync the
    directory too when the rename itself must survive a crash (node config, not a bundle:
    a bundle does not outlive a node crash). sync=False: no fsync at all, for a file that
    never outlives the process reading it (an exec's process file); readers still see the
    old file or the new one.

    The temp file has no name while it is written (O_TMPFILE): a writer killed then (the
    fresh interpreter or the runtime server, SIGKILL, OOM) leaves nothing behind. It gets
    one, .<name>.gpuhook.tmp, only for the rename, and the next write of the same file
    takes that name over: a writer killed between the two calls leaves a whole new file
    there, which the next writer (the front's fallback to Python after a server died)
    removes. Where the filesystem has no O_TMPFILE, or there is no /proc to link it from (a
    bare chroot), a named temp file as before."""
    d = os.path.dirname(path) or "."  # as the kernel reads it: never normalised ("link/.." is not ".")
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            _write_named(d, path, data, mode, sync)
        else:
            try:
                _write_all(fd, data, mode, sync)
                linked = _link_into_place(fd, dfd, os.path.basename(path))
            finally:
                os.close(fd)
            if not linked:  # no /proc (a bare chroot): the named way
                _write_named(d, path, data, mode, sync)
        if sync_dir:
            os.fsync(dfd)
    finally:
        os.close(dfd)


def _link_into_place(fd: int, dfd: int, name: str) -> bool:
    """The unnamed file fd as <dfd>/name: linked as .<name>.gpuhook.tmp, renamed over name.
    False when there is no /proc/self/fd to link it from (nothing written then)."""
    tmp = f".{name}.gpuhook.tmp"
    for _attempt in range(8):
        try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: O_TMPFILE's way to a name
            os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=dfd, follow_symlinks=True)
        except FileExistsError:  # a killed writer's (a whole file), or a writer's now: ours wins
            _unlink(tmp, dfd)
            continue
        except FileNotFoundError:
            return False
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return True
        except FileNotFoundError:  # another writer took the name over between the two calls
            continue
        except BaseException:
            _unlink(tmp, dfd)
            raise
    raise FileExistsError(f"{tmp}: taken over again and again")
