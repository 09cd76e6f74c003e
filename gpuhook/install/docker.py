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
import os
import re

from ..defaults import RUNTIME_BINARY as BINARY, RUNTIME_HANDLER as HANDLER
from . import InstallError, files, journal, restart
from .files import host
from .runtimes import Adapter

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


# -- the adapter (runtimes.py): what install and uninstall do with dockerd ----------------------

BACKUP = files.STATE_DIR + "/docker-daemon.json"


def _read(root: str, front: str, mine: dict | None) -> tuple[bytes | None, dict]:
    """(original bytes or None, document), checked before anything is written."""
    raw = files.read(host(root, DEFAULT_CONFIG), DEFAULT_CONFIG)
    doc = parse(raw, DEFAULT_CONFIG)
    check(doc, BINARY, DEFAULT_CONFIG)
    return raw, doc


def _install(root: str, state: dict, dry_run: bool, say: journal.Say, read) -> bool:
    name = DEFAULT_CONFIG
    raw, doc = read
    had_runtimes = RUNTIMES in doc
    if not add_handler(doc, BINARY):
        say(f"docker: {name}: runtime gpu-optional already in place")
        return False
    if dry_run:
        say(f"docker: {name}: runtime gpu-optional would be added (path {BINARY})")
        return True
    new = dumps(doc, raw)
    mine = journal.write_config(
        root, state, "docker", name, BACKUP, raw, new, first={"added_runtimes": not had_runtimes}
    )
    say(
        f"docker: {name}: runtime gpu-optional {'added' if raw is not None else 'written to a new file'} "
        f"(path {BINARY}; default-runtime unchanged)"
        + (f"; original kept in {BACKUP}" if raw is not None and mine.get("backup") else "")
    )
    return True


def _uninstall(root: str, mine: dict | None, dry_run: bool, say: journal.Say) -> bool:
    name = DEFAULT_CONFIG

    def edit(raw: bytes) -> bytes | None:
        doc = parse(raw, name)
        drop_empty = bool(mine and mine.get("added_runtimes"))
        return dumps(doc, raw) if remove_handler(doc, BINARY, drop_empty=drop_empty) else None

    not_there = f"no gpu-optional runtime of gpuhook's ({BINARY}): left as it is"
    changed = journal.uninstall_edited(root, mine, "docker", name, BACKUP, dry_run, say, edit, not_there)
    after = files.read(host(root, name), name) if not dry_run else None
    if changed and not dry_run and RUNTIMES not in parse(after, name):
        # dockerd reloads `runtimes` only when the file sets the key (checked, dockerd 20.10)
        say(
            f'docker: {name} now has no "runtimes", and a reload keeps the runtimes a running '
            "dockerd has: it lists gpu-optional until its next restart (containers asking for it fail to "
            "start once /opt/gpuhook is removed)"
        )
    return changed


def _daemon_config(proc: str, pid: int, argv: list[str]) -> str:
    """The daemon.json a dockerd reads (--config-file, default /etc/docker/daemon.json), as
    a path from here."""
    config = DEFAULT_CONFIG
    for i, arg in enumerate(argv[1:], 1):
        flag, eq, value = arg.partition("=")
        if flag == "--config-file":
            config = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return restart.config_path(proc, pid, config)


def _found(root: str, marks: tuple[str, ...]) -> list[str]:
    """The marks there, each resolved inside the root (its links followed as the node would
    follow them, never out of the root), a dangling name counted too."""
    from ..probe.host import Host

    h = Host(root)
    return [p for p in marks if os.path.lexists(h.resolve(p))]


ADAPTER = Adapter(
    name="docker",
    label="dockerd",
    config=DEFAULT_CONFIG,
    marks=(DEFAULT_CONFIG,) + SOCKETS,
    pods=False,
    kubelet_shim="cri-dockerd",
    found=_found,
    # dockerd reloads `runtimes` on SIGHUP; docker.service's reload is that SIGHUP (ExecReload),
    # where a restart would stop every container not under live-restore
    daemon=restart.Daemon(
        comm="dockerd",
        unit="docker.service",
        systemctl="reload-or-restart",
        how="reload dockerd (systemctl reload docker.service, or SIGHUP to dockerd)",
        config_of=_daemon_config,
        reloaded=(
            "restart: sent SIGHUP to dockerd (pid {pids}): dockerd reloads its runtimes, "
            "running containers keep running (`docker info` lists the runtimes it has)"
        ),
    ),
    read=_read,
    install=_install,
    uninstall=_uninstall,
    ours=journal.ours(lambda raw: remove_handler(parse(raw, DEFAULT_CONFIG), BINARY, drop_empty=False), DEFAULT_CONFIG),
)
