"""Node config, /etc/gpuhook/config.toml (GPUHOOK_CONFIG overrides the path).

Read on every container start with the stdlib tomllib, into a plain record. A missing
file means the defaults; an invalid one means the defaults plus the errors (which the
caller logs): never a node where no container can start. `gpuhook config check` validates
the same keys with a pydantic model (config_model.py) for humans.
"""

from __future__ import annotations

import os
from .record import Record

DEFAULT_PATH = "/etc/gpuhook/config.toml"
FAIL_MODES = ("open", "closed")


class Config(Record, fields="runtime host_root log_file fail_mode ldconfig",
                        defaults=(None, "/", "/var/log/gpuhook.log", "open", None)):
    """runtime: the real OCI runtime, a name on PATH or a path (None: first of runc, crun).
    host_root: where the node's / is (tests and dry runs point it at a fake host).
    log_file: one JSON line per create ("" disables). fail_mode: open | closed.
    ldconfig: the node's ldconfig for the ld-cache hook (None: found on the node)."""

    __slots__ = ()


_TYPES = {"runtime": str, "host_root": str, "log_file": str, "fail_mode": str, "ldconfig": str}


def config_path() -> str:
    return os.environ.get("GPUHOOK_CONFIG") or DEFAULT_PATH


def parse(text: str) -> tuple[Config, list[str]]:
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return Config(), [f"invalid TOML: {e}"]
    return from_dict(data)


def from_dict(data: dict) -> tuple[Config, list[str]]:
    errors = []
    values = {}
    for key, value in data.items():
        want = _TYPES.get(key)
        if want is None:
            errors.append(f"unknown key {key!r} ignored")
        elif not isinstance(value, want):
            errors.append(f"{key}: expected a string, got {type(value).__name__}; default used")
        else:
            values[key] = value
    if values.get("fail_mode", "open") not in FAIL_MODES:
        errors.append(f"fail_mode: {values.pop('fail_mode')!r} is not one of open, closed; 'open' used")
    if "host_root" in values and not values["host_root"].startswith("/"):
        errors.append(f"host_root: {values.pop('host_root')!r} is not an absolute path; '/' used")
    return Config(**values), errors


def load(path: str | None = None) -> tuple[Config, list[str]]:
    """(config, errors). Never raises."""
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        return Config(), []
    except OSError as e:
        return Config(), [f"cannot read {path}: {e.strerror or e}; defaults used"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Config(), [f"{path} is not UTF-8; defaults used"]
    config, errors = parse(text)
    return config, [f"{path}: {e}" for e in errors]


def find_runtime(name: str | None) -> str | None:
    """The real runtime's path: `name` (a path, or a name on PATH), else runc, else crun."""
    candidates = [name] if name else ["runc", "crun"]
    for c in candidates:
        if "/" in c:
            if os.access(c, os.X_OK) and not os.path.isdir(c):
                return c
            continue
        for d in (os.environ.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").split(":"):
            p = os.path.join(d or ".", c)
            if os.access(p, os.X_OK) and not os.path.isdir(p):
                return p
    return None
