"""CRI-O: the `gpu-optional` handler as a drop-in, /etc/crio/crio.conf.d/99-gpuhook.toml.

CRI-O merges every file of crio.conf.d key by key (unlike containerd 1.x's imports), so a
drop-in of our own is the clean way: the operator's crio.conf is never touched and uninstall
is one unlink.

  runtime_type = "oci": gpuhook-runtime has runc's command line.
  runtime_root: the state directory CRI-O passes as `--root` to every call of the handler;
      runc keeps its containers there. Its own directory keeps gpu-optional containers apart
      from the default handler's (/run/runc).
  No allowed_annotations: that list only lets a handler act on CRI-O's own experimental
      `io.kubernetes.cri-o.*` annotations (and is deprecated in favour of workloads); pod
      annotations such as gpuhook.dev/* reach the OCI spec without it.
"""

from __future__ import annotations

import dataclasses
import os

from ..defaults import BIN_DIRS, RUNTIME_BINARY as BINARY, RUNTIME_HANDLER
from . import InstallError, files, journal, restart
from .files import host, sha256
from .runtimes import Adapter

HANDLER = RUNTIME_HANDLER
DROPIN = "/etc/crio/crio.conf.d/99-gpuhook.toml"
RUNTIME_ROOT = "/run/gpuhook-runc"
MARK = "# Written by `gpuhook install`"


def render(binary: str, nri: bool = False) -> bytes:
    """The drop-in: gpu-optional with `binary` as its runtime_path; `nri`: that is plain runc,
    and the drop-in turns CRI-O's NRI on, for gpuhook's plugin (gpuhook-nri.service)."""
    what = (
        "# plain runc, whose containers gpuhook's NRI plugin (gpuhook-nri.service) gives this node's\n"
        "# GPUs at create; NRI is turned on below (node settings: /etc/gpuhook/config.toml).\n"
        if nri
        else "# runc behind gpuhook-runtime, which adds this node's\n"
        "# GPUs to a container's config.json at create (node settings: /etc/gpuhook/config.toml).\n"
    )
    return (
        f"{MARK}; `gpuhook uninstall` removes it. Edits here are overwritten by the next install.\n"
        f"# The gpu-optional runtime handler: {what}"
        f"[crio.runtime.runtimes.{HANDLER}]\n"
        f'runtime_path = "{binary}"\n'
        'runtime_type = "oci"\n'
        f'runtime_root = "{RUNTIME_ROOT}"\n' + ("\n[crio.nri]\nenable_nri = true\n" if nri else "")
    ).encode()


# -- the adapter (runtimes.py): what install and uninstall do with CRI-O ------------------------

MARKS = ("/etc/crio", "/run/crio/crio.sock", "/var/run/crio/crio.sock")


@dataclasses.dataclass(frozen=True)
class Dropin:
    """The drop-in install writes."""

    runtime_path: str
    nri: bool

    def data(self) -> bytes:
        return render(self.runtime_path, self.nri)


def _read(root: str, front: str, mine: dict | None) -> Dropin:
    """The drop-in to write; for the NRI front, with the node's runc (InstallError: none)."""
    if front == "wrapper":
        return Dropin(BINARY, nri=False)
    from ..probe.host import Host

    h = Host(root)
    runc = next((f"{d}/runc" for d in BIN_DIRS if os.path.isfile(h.resolve(f"{d}/runc"))), None)
    if runc is None:
        raise InstallError(
            f"--front nri: no runc under {root} ({', '.join(BIN_DIRS)}) for the plain gpu-optional handler"
        )
    return Dropin(runc, nri=True)


def _install(root: str, state: dict, dry_run: bool, say: journal.Say, read: Dropin) -> bool:
    data = read.data()
    path = host(root, DROPIN)
    if files.read(path, DROPIN) == data:
        say(f"crio: {DROPIN}: handler gpu-optional already in place")
        return False
    if not dry_run:
        state["crio"] = {"dropin": DROPIN, "written": sha256(data)}
        journal.journal(root, state, "crio")
        files.write(path, data, 0o644, DROPIN)
    nri = "; NRI turned on ([crio.nri] enable_nri = true)" if read.nri else ""
    say(
        f"crio: {DROPIN}: {'would be ' if dry_run else ''}written "
        f"(handler gpu-optional, runtime_path {read.runtime_path}{nri})"
    )
    return True


def _uninstall(root: str, mine: dict | None, dry_run: bool, say: journal.Say) -> bool:
    path = host(root, DROPIN)
    raw = files.read(path, DROPIN)
    if raw is None:
        say(f"crio: {DROPIN} does not exist: nothing to remove")
        return False
    if not mine and not raw.startswith(MARK.encode()):
        say(f"crio: {DROPIN} was not written by gpuhook: left as it is")
        return False
    if not dry_run:
        files.remove(path, DROPIN)
    edited = " (it had been edited since install)" if mine and sha256(raw) != mine.get("written") else ""
    say(f"crio: {DROPIN} {'would be ' if dry_run else ''}removed{edited}")
    return True


ADAPTER = Adapter(
    name="crio",
    label="CRI-O",
    config=DROPIN,
    marks=MARKS,
    pods=True,
    # SIGHUP: a live reload (crio.conf(5) marks the runtimes table as reloadable); every crio
    # is told, there being no second CRI-O on a node to keep apart
    daemon=restart.Daemon(
        comm="crio",
        unit="crio.service",
        systemctl="restart",
        how="restart CRI-O (systemctl restart crio.service)",
        reloaded="restart: sent SIGHUP to crio (pid {pids}): CRI-O reloads its runtimes",
        # crio.conf(5) marks no [crio.nri] option as reloadable: turning NRI on takes a restart
        reload_fronts=("wrapper",),
    ),
    read=_read,
    install=_install,
    uninstall=_uninstall,
    ours=journal.ours(lambda raw: raw.startswith(MARK.encode()), DROPIN),
    fronts=("wrapper", "nri"),
)
