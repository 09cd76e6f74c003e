"""Container edits: one CDI-shaped vocabulary (CDI's containerEdits) for every front end.

The planner produces Edits, spec.apply() writes them into an OCI spec, and the CDI
generator writes them into a CDI document. Immutable records (see record.py
for why not dataclasses).
"""

from .record import Record

BIND_RO = ("ro", "nosuid", "nodev", "rbind", "rprivate")


class DeviceNode(Record):
    """A node to create in the container and allow in its device cgroup."""

    path: str
    type: str
    major: int
    minor: int
    permissions: str = "rwm"
    file_mode: "int | None" = None
    uid: "int | None" = None
    gid: "int | None" = None

    __slots__ = ()

    def to_cdi(self) -> dict:
        d = {
            "path": self.path,
            "type": self.type,
            "major": self.major,
            "minor": self.minor,
            "permissions": self.permissions,
        }
        if self.file_mode is not None:
            d["fileMode"] = self.file_mode
        if self.uid is not None:
            d["uid"] = self.uid
        if self.gid is not None:
            d["gid"] = self.gid
        return d


class Mount(Record):
    host_path: str
    container_path: str
    type: str = "bind"
    options: "tuple[str, ...]" = BIND_RO

    __slots__ = ()

    def to_cdi(self) -> dict:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "type": self.type,
            "options": list(self.options),
        }


class Hook(Record):
    """An OCI hook. env is always explicit: a hook must never inherit the container's.
    kind: what it does (gpuhook.hook.LDCACHE, BYPATH), None for a hook gpuhook did not make;
    it is not written into specs (argv says it to the helper)."""

    hook_name: str
    path: str
    args: "tuple[str, ...]" = ()
    env: "tuple[str, ...]" = ()
    timeout: "int | None" = None
    kind: "str | None" = None

    __slots__ = ()

    def to_cdi(self) -> dict:
        d: dict = {"hookName": self.hook_name, "path": self.path, "args": list(self.args), "env": list(self.env)}
        if self.timeout is not None:
            d["timeout"] = self.timeout
        return d


class Edits(Record):
    """env: "KEY=value" strings. Everything is a tuple, in the order it is applied."""

    env: "tuple[str, ...]" = ()
    device_nodes: "tuple[DeviceNode, ...]" = ()
    mounts: "tuple[Mount, ...]" = ()
    hooks: "tuple[Hook, ...]" = ()
    additional_gids: "tuple[int, ...]" = ()

    __slots__ = ()

    def __bool__(self) -> bool:
        return any(self)

    def to_cdi(self) -> dict:
        """CDI containerEdits (only the keys that have something)."""
        d: dict = {}
        if self.env:
            d["env"] = list(self.env)
        if self.device_nodes:
            d["deviceNodes"] = [n.to_cdi() for n in self.device_nodes]
        if self.mounts:
            d["mounts"] = [m.to_cdi() for m in self.mounts]
        if self.hooks:
            d["hooks"] = [h.to_cdi() for h in self.hooks]
        if self.additional_gids:
            d["additionalGids"] = list(self.additional_gids)
        return d
