"""dockerd: the `gpu-optional` runtime in /etc/docker/daemon.json.

    "runtimes": {"gpu-optional": {"path": "/opt/gpuhook/bin/gpuhook-runtime"}}

dockerd hands `path` to containerd's runc shim as its runc binary, so gpuhook-runtime is
called exactly as containerd's CRI calls it; `docker run --runtime gpu-optional` (Compose:
`runtime: gpu-optional`) picks it. `default-runtime` is never touched: only containers that
ask for gpu-optional go through gpuhook.

The edit keeps every other key, in its order, and the file's indentation (JSON has no
comments to keep). dockerd reloads `runtimes` on SIGHUP (checked with dockerd 20.10, with
running containers kept), so `--restart signal` is a live reload.

Refused, before anything is written: a file that is not JSON, not an object, whose
`runtimes` is not an object, or whose `runtimes.gpu-optional` names another runtime.
"""

from __future__ import annotations

import json
import re

from . import InstallError
from .containerd import HANDLER

DEFAULT_CONFIG = "/etc/docker/daemon.json"
SOCKETS = ("/run/docker.sock", "/var/run/docker.sock")
RUNTIMES = "runtimes"


def _constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse(raw: bytes | None, where: str) -> dict:
    """daemon.json as a dict (key order kept); {} when the file is missing or blank.
    InstallError when it is not a JSON object or its `runtimes` is not an object."""
    if raw is None or not raw.strip():
        return {}
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_constant)
    except UnicodeDecodeError:
        raise InstallError(f"{where}: not UTF-8 text") from None
    except ValueError as e:
        raise InstallError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InstallError(f"{where}: not a JSON object (dockerd's config is one {{...}})")
    runtimes = doc.get(RUNTIMES)
    if RUNTIMES in doc and not isinstance(runtimes, dict):
        raise InstallError(f'{where}: "{RUNTIMES}" is a {_kind(runtimes)}, not an object of runtimes')
    return doc


def check(doc: dict, binary: str, where: str) -> None:
    """InstallError when `runtimes.gpu-optional` is there and is not ours."""
    current = (doc.get(RUNTIMES) or {}).get(HANDLER)
    if current is None and HANDLER not in (doc.get(RUNTIMES) or {}):
        return
    path = current.get("path") if isinstance(current, dict) else None
    if path != binary:
        what = f"names {path!r}" if isinstance(path, str) else f"is {json.dumps(current)[:80]}"
        raise InstallError(
            f"{where}: {RUNTIMES}.{HANDLER} already {what}, not {binary}: "
            f'point its "path" at {binary} or remove it, then run install again'
        )


def add_handler(doc: dict, binary: str) -> bool:
    """Add runtimes.gpu-optional (check() first); False when it is already there."""
    runtimes = doc.setdefault(RUNTIMES, {})
    if isinstance(runtimes.get(HANDLER), dict) and runtimes[HANDLER].get("path") == binary:
        return False
    runtimes[HANDLER] = {"path": binary}
    return True


def remove_handler(doc: dict, binary: str, drop_empty: bool) -> bool:
    """Remove runtimes.gpu-optional when it is ours (its path is `binary`); the `runtimes`
    key too when that leaves it empty and `drop_empty` (install had added it)."""
    runtimes = doc.get(RUNTIMES)
    if (
        not isinstance(runtimes, dict)
        or not isinstance(runtimes.get(HANDLER), dict)
        or runtimes[HANDLER].get("path") != binary
    ):
        return False
    del runtimes[HANDLER]
    if not runtimes and drop_empty:
        del doc[RUNTIMES]
    return True


def dumps(doc: dict, like: bytes | None) -> bytes:
    """JSON text of `doc`, indented as `like` (the file it replaces) was: its first indented
    line's indent, on one line when it was one line; two spaces for a new file."""
    text = (like or b"").decode("utf-8", "replace")
    m = re.search(r"^([ \t]+)\S", text, re.M)
    if m:
        indent: str | None = m.group(1)
    elif text.strip() and "\n" not in text.strip():
        indent = None
    else:
        indent = "  "
    out = json.dumps(doc, indent=indent, ensure_ascii=False)
    return (out + ("\n" if not text or text.endswith("\n") else "")).encode()


def _kind(value) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}.get(
        type(value), type(value).__name__
    )
