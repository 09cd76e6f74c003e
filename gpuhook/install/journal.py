"""What every runtime's adapter shares: the install state's lists, and the journalled edit of
a runtime's config file (a byte copy of the original first, both hashes in the state, the
original given back byte for byte on uninstall when nobody changed the file since).
"""

from __future__ import annotations

import os
from typing import Callable

from . import InstallError, files
from .files import host, sha256

Say = Callable[[str], None]


def mark(state: dict, key: str, runtime: str, on: bool = True) -> None:
    """Add `runtime` to (or take it from) the state's list `key`."""
    names = set(state[key]) | {runtime} if on else set(state[key]) - {runtime}
    state[key] = sorted(names)


def journal(root: str, state: dict, runtime: str) -> None:
    """Before `runtime`'s config is changed: the state says gpuhook is installed for it and
    that it waits for a restart, saved, so that a kill after the change still restarts it."""
    mark(state, "runtimes", runtime)
    mark(state, "restart_pending", runtime)
    files.save_state(root, state)


def write_config(
    root: str,
    state: dict,
    key: str,
    name: str,
    backup: str,
    raw: bytes | None,
    new: bytes,
    first: dict | None = None,
    every: dict | None = None,
) -> dict:
    """Write a runtime's config file `name` (`raw` now, None when absent) as `new`: on the
    first change a byte copy of the original goes to `backup` for uninstall, and state[key]
    records both hashes. The state is saved first (the journal): a kill right after any
    write still knows the backup, and that `key` waits for a restart. `first`: more to
    record on the first change; `every`: more to record with each."""
    existed = raw is not None
    mine = state.get(key)
    if mine is None:
        mine = state[key] = {
            "config": name,
            "existed": existed,
            "backup": backup if existed else None,
            "original": sha256(raw),
            "restorable": True,
            **(first or {}),
        }
    elif sha256(raw) == mine.get("written"):
        # as we wrote it: that is also ours while a kill may leave it in place of the new one
        mine["previous"] = mine["written"]
    elif not as_written(mine, raw) and sha256(raw) != mine.get("original"):
        # Someone changed the file since we wrote it: the backup no longer equals "the file
        # without gpuhook", so uninstall will only remove our handler.
        mine["restorable"] = False
    mine["written"] = sha256(new)
    mine.update(every or {})
    journal(root, state, key)
    if mine.get("backup") and sha256(raw) == mine.get("original"):
        # the original, not yet ours: its copy (again, when a kill stopped the first)
        if sha256(files.read(host(root, backup), backup)) != mine["original"]:
            files.write(host(root, backup), raw or b"", 0o600, backup)
    files.write(host(root, name), new, None if existed else 0o644, name)
    return mine


def as_written(mine: dict, raw: bytes | None) -> bool:
    """The file is as install wrote it: its last write, or the one before while a kill may
    have stopped the last between the journal and the file."""
    return raw is not None and sha256(raw) in {h for h in (mine.get("written"), mine.get("previous")) if h}


def as_before(root: str, mine: dict | None, raw: bytes | None, backup: str) -> bytes | None:
    """What install edits: while the file is as install last wrote it and its original is at
    hand, that original (None: there was no file), so that a second install (another front,
    a newer gpuhook) leaves no trace of the first; else the file as it is now."""
    if not (mine and mine.get("restorable") and as_written(mine, raw)):
        return raw
    if not mine.get("existed"):
        return None
    saved = files.read(host(root, backup), backup) if mine.get("backup") else None
    return saved if saved is not None and sha256(saved) == mine.get("original") else raw


def restore(
    root: str, mine: dict | None, label: str, name: str, backup: str, raw: bytes | None, dry_run: bool, say: Say
) -> bool:
    """Undo install's write of `name` when nobody changed the file since: the original bytes
    back from `backup`, or the file removed when install had created it. False when that
    cannot be done (then only the handler is removed). Also finishes a restore that a kill
    stopped (the original back, its backup still there)."""
    would = "would be " if dry_run else ""
    if not (mine and mine.get("restorable") and raw is not None):
        return False
    path = host(root, name)
    saved = files.read(host(root, backup), backup) if mine.get("backup") else None
    if mine.get("existed") and sha256(raw) == mine.get("original") and sha256(saved) == mine.get("original"):
        if not dry_run:
            files.remove(host(root, backup), backup)
        say(f"{label}: {name}: the original is in place (an uninstall was stopped): {backup} {would}removed")
        return True
    if not as_written(mine, raw):
        return False
    if not mine.get("existed"):
        if not dry_run:
            files.remove(path, name)
        say(f"{label}: {name}: {would}removed (install had created it)")
        return True
    if saved is not None and sha256(saved) == mine.get("original"):
        if not dry_run:
            files.write(path, saved, None, name)
            files.remove(host(root, backup), backup)
        say(f"{label}: {name}: original {would}restored byte for byte from {backup}")
        return True
    say(f"{label}: {backup} is missing or changed: removing only the handler")
    return False


def only_handler_removed(root: str, mine: dict | None, label: str, backup: str, dry_run: bool) -> str:
    why = "changed since install" if mine else "no install record"
    keep = (
        f"; the pre-install copy stays in {backup}"
        if mine and mine.get("backup") and os.path.exists(host(root, backup))
        else ""
    )
    return f"{why}, so only the gpu-optional handler was {'' if not dry_run else 'to be '}removed{keep}"


def uninstall_edited(
    root: str, mine: dict | None, kind: str, name: str, backup: str, dry_run: bool, say: Say, edit, not_there: str
) -> bool:
    """Give a runtime's config file back (the backup, byte for byte, when it is unchanged since
    install), else take only gpuhook's handler out of it: edit(raw) -> the new bytes, or None
    when it holds none of gpuhook's (then `not_there` is said)."""
    path = host(root, name)
    raw = files.read(path, name)
    if restore(root, mine, kind, name, backup, raw, dry_run, say):
        return True
    if raw is None:
        say(f"{kind}: {name} does not exist: nothing to remove")
        return False
    new = edit(raw)
    if new is None:
        say(f"{kind}: {name}: {not_there}")
        return False
    if not dry_run:
        files.write(path, new, None, name)
    say(f"{kind}: {name}: {only_handler_removed(root, mine, kind, backup, dry_run)}")
    return True


def text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InstallError(f"{name}: not UTF-8 text") from None


def ours(recognise: Callable[[bytes], bool], name: str) -> Callable[[str], bool]:
    """Whether the node's `name` carries gpuhook's handler (recognise(bytes)); a file that
    cannot be read or parsed counts as ours: uninstall then says what is wrong with it."""

    def ours(root: str) -> bool:
        try:
            raw = files.read(host(root, name), name)
            return raw is not None and recognise(raw)
        except InstallError:
            return True

    return ours
