"""`gpuhook install` and `gpuhook uninstall`: the steps, and what each leaves on the host.

One node may have gpuhook for several container runtimes side by side (containerd for the
kubelet and dockerd beside it): each runtime is an Adapter (runtimes.py; one file per runtime:
the file it edits, how it is read, edited and given back, how its daemon reloads). The bundle, the node
config and the runtime server's units are shared: they go with the last runtime's uninstall.

install (every step is skipped when its result is already there: a second run writes nothing)
  1. the host bundle -> /opt/gpuhook, as a new version switched in as a whole by one rename
     (files.VERSIONS; not when gpuhook runs from that very bundle: the .deb);
     with no --bundle-dir from a pip install, one is built first (build.py) in a temporary
     directory, from the interpreter and the gpuhook package running this
  2. /etc/gpuhook/config.toml, only when absent: the operator's file is never overwritten
  3. each runtime: containerd's config.toml edited in place, or dockerd's daemon.json, after a
     byte copy of the original in /etc/gpuhook/backup/; or CRI-O's drop-in
  4. /etc/gpuhook/backup/install-state.json: what was done, with the hash of each file as
     written; then the restart, only when the runtime's config changed (or an earlier change
     still waits for one)

uninstall undoes it, for one runtime (--runtime X: the others' handlers and the shared files
stay) or for every runtime installed (the default): config.toml (daemon.json) gets the
original bytes back when nobody changed it since install wrote it; otherwise only our handler
is removed and the backup stays.

Both can be killed at any point and finished by running them again. The state file is the
journal: what a step is about to write is saved in it first (a runtime's record, its backup,
its pending restart, the node config), every write is a whole file or nothing, a step whose
result is already there is skipped, and the state goes last. What a kill leaves that no
record names is recognisable and swept: a writer's temp file (files.sweep), a bundle version
half copied or a bundle half removed (a .versions directory is install's alone; a package's
bundle carries defaults.PACKAGE_MARK instead).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

from .. import defaults
from . import devlinks
from . import InstallError, files, restart, runtimes
from .files import host, sha256
from .journal import journal as _journal, mark as _mark

PREFIX = defaults.INSTALL_PREFIX
BINARY = defaults.RUNTIME_BINARY
NODE_CONFIG = defaults.CONFIG_FILE
KUBELET_MARK = "/var/lib/kubelet"  # a Kubernetes node: its CRI runtime, not dockerd, serves pods

NODE_CONFIG_TEXT = """\
# gpuhook node config, read by gpuhook-runtime at every container create.
# Written once by `gpuhook install` and never overwritten: it is yours to edit.
# Every line below is commented out: the defaults apply.

# The real OCI runtime gpuhook-runtime execs: a name on PATH or a path (default: runc, else crun).
# runtime = "runc"

# One JSON line per container create; "" turns the log off.
# log_file = "/var/log/gpuhook.log"

# open: a failure in gpuhook starts the container unchanged (on CPU); closed: the create fails.
# fail_mode = "open"
"""


@dataclasses.dataclass
class Options:
    host_root: str = "/"
    runtime: str = "auto"  # containerd | crio | docker | auto
    # install only: wrapper | nri (runtimes.FRONTS); None: the one installed (the boot unit and
    # the agent run install again without one), wrapper on a fresh node
    front: str | None = None
    # --front nri: gpuhook-nri.service runs the plugin; False where something else runs it (the
    # agent's own process in the DaemonSet): then no unit, and one of an earlier install goes
    nri_unit: bool = True
    restart: str = "none"  # signal | systemd | none
    bundle_dir: str | None = None
    dry_run: bool = False
    keep_bundle: bool = False  # uninstall only
    restart_timeout: float = 30.0


Say = Callable[[str], None]


def _root(path: str) -> str:
    if not os.path.isdir(path):
        raise InstallError(f"--host-root {path}: not a directory")
    return os.path.abspath(path)


def choose(root: str, say: Say) -> list[str]:
    """--runtime auto: the runtimes to install for, said with what was found and why.
    With a kubelet: its CRI runtime (the first of runtimes.NAMES found: containerd when its
    config or socket is there, else CRI-O), and a daemon of its own (dockerd) too when it is
    there (CI runners, build nodes, workstations; a node with dockerd alone: cri-dockerd).
    Without a kubelet: that daemon when it is there (a Docker host has containerd too, but
    that containerd runs dockerd's containers, not pods); else the CRI runtime."""
    from ..probe.host import Host

    adapters = runtimes.every().values()
    found = {a.name: a.found(root, a.marks) for a in adapters}
    kubelet = os.path.isdir(Host(root).resolve(KUBELET_MARK))
    cri = next((a.name for a in adapters if a.pods and found[a.name]), None)
    daemons = [a for a in adapters if not a.pods and found[a.name]]
    if not (cri or daemons):
        each = [f"{a.label} ({', '.join(a.marks)})" for a in adapters]
        raise InstallError(f"--runtime auto: no {', '.join(each[:-1])} nor {each[-1]} under {root}; pass --runtime")
    label = " and ".join(a.label for a in daemons)
    if daemons and (not kubelet or not cri):
        chosen = [a.name for a in daemons]
        why = f"{label}, the kubelet's runtime ({daemons[0].kubelet_shim})" if kubelet else f"{label}: no kubelet"
        if cri:
            why += f" (the {cri} there runs {label}'s containers, not pods; `--runtime {cri}` adds it too)"
    else:
        assert cri is not None  # (no CRI runtime with a daemon went above)
        chosen = [cri] + [a.name for a in daemons]
        why = (f"{cri}, the kubelet's runtime" if kubelet else cri) + (f", and {label} beside it" if daemons else "")
    marks = {a.label: found[a.name] for a in sorted(adapters, key=lambda a: a.pods)}
    marks["a kubelet"] = [KUBELET_MARK] if kubelet else []
    said = "; ".join(f"{what} ({', '.join(paths)})" for what, paths in marks.items() if paths)
    say(f"runtime auto: found {said}: installing for {why}")
    return chosen


def _bundle_source(opts: Options) -> str | None:
    """The bundle to copy; None when there is none and install builds one (a pip install)."""
    src = opts.bundle_dir or os.environ.get("GPUHOOK_BUNDLE_DIR") or files.running_bundle()
    if src and not os.path.isdir(src):
        raise InstallError(f"--bundle-dir {src}: not a directory")
    return src


def _build_bundle(say: Say) -> tuple[str, str]:
    """Build the host bundle from the interpreter and the gpuhook running this, as
    packaging/build-bundle.sh does, in a temporary directory: (that directory, the bundle)."""
    from . import build

    tmp = tempfile.mkdtemp(prefix="gpuhook-bundle-")
    out = os.path.join(tmp, "gpuhook")
    say(
        f"bundle: no --bundle-dir: building one from this Python ({sys.executable}) and this gpuhook, "
        "as packaging/build-bundle.sh does"
    )
    try:
        started = time.monotonic()
        record = build.build(out, lambda line: say(f"bundle: {line}"))
        say(f"bundle: built in {time.monotonic() - started:.1f}s: {build.describe(record, out)}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, out


# -- install -----------------------------------------------------------------------------


def _one_at_a_time(step: Callable[[Options, Say, str], None]) -> Callable[[Options, Say], None]:
    """install and uninstall: under the node's lock (files.node_lock), but for a dry run."""

    def run(opts: Options, say: Say) -> None:
        root = _root(opts.host_root)
        if opts.dry_run:
            step(opts, say, root)
            return
        with files.node_lock(root, say):
            step(opts, say, root)

    run.__doc__ = step.__doc__
    return run


@_one_at_a_time
def install(opts: Options, say: Say, root: str) -> None:
    found: list[str] = []
    chosen = choose(root, found.append) if opts.runtime == "auto" else [opts.runtime]
    state = _load_state(root)
    before = copy.deepcopy(state)
    installed = sorted({_fronts(state)[rt] for rt in chosen if rt in _fronts(state)})
    front: str = opts.front or (installed[0] if len(installed) == 1 else "wrapper")
    opts = dataclasses.replace(opts, front=front)
    say(
        f"gpuhook install: host root {root}, runtime {' and '.join(chosen)}"
        + (f", front {front}" if front != "wrapper" else "")
        + (" (dry run: nothing is written)" if opts.dry_run else "")
    )
    for line in found:
        say(line)
    # refuse a config we cannot edit, or a front a runtime cannot have, before anything is written
    for a in (runtimes.get(rt) for rt in chosen):
        if front not in a.fronts:
            raise InstallError(
                f"--front {front}: not for {a.label} (it has {' or '.join(a.fronts)})"
                + ("; --runtime names the runtimes to install for" if opts.runtime == "auto" else "")
            )
    reads = {rt: runtimes.get(rt).read(root, front, state.get(rt)) for rt in chosen}
    _bundle_step(root, opts, state, say)
    _node_config_step(root, opts.dry_run, state, say)
    devlinks.install_step(root, opts.dry_run, say)  # /dev/char links of the GPU nodes: left on uninstall
    fronts = {**_fronts(state), **{rt: front for rt in chosen}}
    if "wrapper" in fronts.values():
        _install_server_units(root, opts, say)
    else:  # (an install of the wrapper front before: no trace of it left)
        _uninstall_server_units(root, opts, say)
    nri = [rt for rt in chosen if front == "nri" and opts.nri_unit]
    if nri:
        _install_nri_unit(root, opts, runtimes.get(nri[0]).plugin_args(reads[nri[0]]), say)
    elif "nri" not in fronts.values() or not opts.nri_unit:
        _uninstall_nri_unit(root, opts, say)

    changed = {rt: runtimes.get(rt).install(root, state, opts.dry_run, say, reads[rt]) for rt in chosen}
    if opts.dry_run:
        for rt in chosen:
            say(_dry_restart(opts, rt, changed[rt] or rt in state["restart_pending"]))
        return
    for rt in chosen:
        _mark(state, "runtimes", rt)
    state["fronts"] = fronts
    if state != before:
        files.save_state(root, state)  # before the restart: a failed one is retried next time
    files.sweep(host(root, files.STATE))  # what a killed write of it left, when nothing changed now
    for rt in chosen:
        if _restart(opts, rt, root, state, say):
            files.save_state(root, state)


def _bundle_step(root: str, opts: Options, state: dict, say: Say) -> None:
    src = _bundle_source(opts)
    if src is None and opts.dry_run:
        say(
            f"bundle: no --bundle-dir: one would be built from this Python ({sys.executable}) and this gpuhook, "
            f"and copied to {PREFIX}"
        )
        return
    built = None
    if src is None:
        built, src = _build_bundle(say)
    try:
        _install_bundle(root, src, state, opts.dry_run, say)
    finally:
        if built:
            shutil.rmtree(built, ignore_errors=True)


def _node_config_step(root: str, dry_run: bool, state: dict, say: Say) -> None:
    path = host(root, NODE_CONFIG)
    if os.path.lexists(path):
        say(f"node config: {NODE_CONFIG} exists: kept as it is")
        return
    if not dry_run:
        state["node_config"] = {"path": NODE_CONFIG, "written": sha256(NODE_CONFIG_TEXT.encode())}
        files.save_state(root, state)  # first: a kill right after the write still knows it is ours
        files.write(path, NODE_CONFIG_TEXT.encode(), 0o644, NODE_CONFIG)
    say(f"node config: {NODE_CONFIG} {'would be ' if dry_run else ''}written (all defaults)")


def _load_state(root: str) -> dict:
    """The install state, with `runtimes` (installed for) and `restart_pending` (runtimes
    whose config changed since their last restart) as sorted lists; a state written before
    side-by-side installs (one `runtime`, a boolean `restart_pending`) read as such."""
    state = files.load_state(root)
    if "runtime" in state:
        old = state.pop("runtime")
        state.setdefault("runtimes", [old] if isinstance(old, str) else [])
    pending = state.get("restart_pending")
    if isinstance(pending, bool):
        state["restart_pending"] = list(state.get("runtimes") or []) if pending else []
    for key in ("runtimes", "restart_pending"):
        value = state.get(key)
        state[key] = sorted({v for v in value if v in runtimes.NAMES} if isinstance(value, list) else set())
    return state


def _fronts(state: dict) -> dict[str, str]:
    """Each installed runtime's front, from the state's `fronts` (wrapper where a state
    written before fronts, or saved by a journal step before the install's end, does not say)."""
    fronts = state.get("fronts") if isinstance(state.get("fronts"), dict) else {}
    assert isinstance(fronts, dict)
    return {rt: fronts[rt] if fronts.get(rt) in runtimes.FRONTS else "wrapper" for rt in state["runtimes"]}


def _install_server_units(root: str, opts: Options, say: Say) -> None:
    """The runtime server's units (units.py) on a node with systemd; with --restart systemd
    its socket enabled and started. Optional: a failure here is a line, not a failed install."""
    from . import units

    unit_dir = host(root, units.UNIT_DIR)
    if not os.path.isdir(unit_dir):
        say(
            f"runtime server: no {units.UNIT_DIR} on this node: not installed (gpuhook-runtime starts Python per create)"
        )
        return
    changed = [
        name
        for name, text in units.TEXTS.items()
        if not os.path.isfile(os.path.join(unit_dir, name))
        or open(os.path.join(unit_dir, name), "rb").read() != text.encode()
    ]
    if changed and not opts.dry_run:
        for name in changed:
            files.write(os.path.join(unit_dir, name), units.TEXTS[name].encode(), 0o644, f"{units.UNIT_DIR}/{name}")
    names = " and ".join(units.TEXTS)
    say(
        f"runtime server: {units.UNIT_DIR}/{{{names}}} "
        + (f"{'would be ' if opts.dry_run else ''}written" if changed else "up to date")
    )
    enable = ["enable", "--now", units.SOCKET_UNIT]
    if opts.restart != "systemd" or opts.dry_run:
        say(
            f"runtime server: not started (--restart {opts.restart}): systemctl daemon-reload && systemctl {' '.join(enable)}"
        )
        return
    try:
        for args in (["daemon-reload"], enable):
            restart.systemctl(args, root, opts.restart_timeout)
        say(f"runtime server: {units.SOCKET_UNIT} enabled and listening (systemctl {' '.join(enable)})")
    except InstallError as e:
        say(f"runtime server: not started ({e}); gpuhook-runtime starts Python per create")


def _uninstall_server_units(root: str, opts: Options, say: Say) -> None:
    from . import units

    unit_dir = host(root, units.UNIT_DIR)
    if not opts.dry_run:
        for n in units.TEXTS:
            files.sweep(os.path.join(unit_dir, n))  # an install killed while writing it
    ours = [
        n
        for n in units.TEXTS
        if os.path.isfile(os.path.join(unit_dir, n))
        and units.MARK.encode() in open(os.path.join(unit_dir, n), "rb").read()
    ]
    if not ours:
        return
    if opts.restart == "systemd" and not opts.dry_run:
        try:
            restart.systemctl(["disable", "--now", *units.TEXTS], root, opts.restart_timeout)
        except InstallError as e:
            say(f"runtime server: {e}")
    for n in ours:
        if not opts.dry_run:
            files.remove(os.path.join(unit_dir, n))
        say(f"runtime server: {units.UNIT_DIR}/{n} {'would be ' if opts.dry_run else ''}removed")


def _systemd_runs(root: str) -> bool:
    """systemd is the node's init (sd_booted(3): /run/systemd/system is there)."""
    return os.path.isdir(host(root, "/run/systemd/system"))


def _install_nri_unit(root: str, opts: Options, args: tuple[str, ...], say: Say) -> None:
    """gpuhook-nri.service (`gpuhook nri ARGS`), written, enabled and started where systemd
    runs; without systemd, the line says what to run instead."""
    from . import units

    name, text = units.NRI_UNIT, units.nri_text(args)
    path = host(root, f"{units.UNIT_DIR}/{name}")
    command = " ".join([f"{PREFIX}/bin/gpuhook", "nri", *args])
    if not os.path.isdir(os.path.dirname(path)):
        say(f"nri plugin: no {units.UNIT_DIR} on this node: no unit written; run `{command}` under a supervisor")
        return
    changed = files.read(path, name) != text.encode()
    if changed and not opts.dry_run:
        files.write(path, text.encode(), 0o644, f"{units.UNIT_DIR}/{name}")
    said = f"{'would be ' if opts.dry_run else ''}written" if changed else "up to date"
    say(f"nri plugin: {units.UNIT_DIR}/{name} {said} ({command})")
    if opts.dry_run or not _systemd_runs(root):
        say(f"nri plugin: not started (systemd is not running here): systemctl enable --now {name}")
        return
    try:
        # --no-block: the unit is ready (Type=notify) once the runtime has registered the plugin,
        # which may be after the runtime's restart below
        starts = (["enable", "--now", "--no-block", name],) + ((["restart", "--no-block", name],) if changed else ())
        for cmd in (["daemon-reload"], *starts):
            restart.systemctl(cmd, root, opts.restart_timeout)
        say(f"nri plugin: {name} enabled and started (ready once the runtime has registered it)")
    except InstallError as e:
        say(f"nri plugin: not started ({e}): gpu-optional pods start without their GPUs until it runs")


def _uninstall_nri_unit(root: str, opts: Options, say: Say) -> None:
    """gpuhook-nri.service, when it is gpuhook's (its mark): stopped, disabled and removed."""
    from . import units

    path = host(root, f"{units.UNIT_DIR}/{units.NRI_UNIT}")
    if not opts.dry_run:
        files.sweep(path)  # an install killed while writing it
    if not os.path.isfile(path) or units.NRI_MARK.encode() not in (files.read(path, units.NRI_UNIT) or b""):
        return
    if _systemd_runs(root) and not opts.dry_run:
        try:
            restart.systemctl(["disable", "--now", units.NRI_UNIT], root, opts.restart_timeout)
        except InstallError as e:
            say(f"nri plugin: {e}")
    if not opts.dry_run:
        files.remove(path, f"{units.UNIT_DIR}/{units.NRI_UNIT}")
    say(f"nri plugin: {units.UNIT_DIR}/{units.NRI_UNIT} {'would be ' if opts.dry_run else ''}removed")


def _install_bundle(root: str, src: str, state: dict, dry_run: bool, say: Say) -> None:
    files.manifest(src)
    dst = host(root, PREFIX)
    would = "would be " if dry_run else ""
    if files.is_installed(src, dst):
        say(f"bundle: {PREFIX} is the bundle this gpuhook runs from: left as it is")
        state.setdefault("bundle", {"path": PREFIX, "copied": False})
    else:
        r = files.sync_bundle(src, dst, dry_run)
        if not (r.written or r.removed or r.previous):
            say(f"bundle: {PREFIX}: {r.files} files, all up to date")
        else:
            now = f"; now {files.VERSIONS}/{r.version}" if r.version else ""
            kept = f" ({r.previous} kept for creates still running from it)" if r.previous else ""
            pruned = f"; older versions removed: {', '.join(r.pruned)}" if r.pruned else ""
            say(
                f"bundle: {PREFIX}: {r.files} files, {r.written} {would}written, {r.removed} {would}removed, "
                f"{r.linked} unchanged {'would be ' if dry_run else ''}linked{now}{kept}{pruned}"
            )
        state["bundle"] = {"path": PREFIX, "copied": True}


def _dry_restart(opts: Options, runtime: str, pending: bool) -> str:
    if not pending:
        return f"restart: {runtime}: not needed"
    if opts.restart == "none":
        return f"restart: {runtime} would need one (--restart none: not done)"
    return f"restart: {runtime} would be restarted (--restart {opts.restart})"


def _restart(opts: Options, runtime: str, root: str, state: dict, say: Say) -> bool:
    """Restart the runtime when a change waits for it; True when that cleared the wait."""
    if runtime not in state["restart_pending"]:
        say(f"restart: not needed ({runtime}'s config is unchanged)")
        return False
    adapter = runtimes.get(runtime)
    front = _fronts(state).get(runtime, "wrapper")
    config_file = host(root, adapter.config)
    if (
        opts.restart == "none"
        and restart.host_pid_namespace(root)
        and not restart.find(adapter.daemon, root, config_file)
    ):
        say(f"restart: {runtime} is not running: it loads the handler when it starts")
    elif opts.restart == "none":
        say(f"restart: not done (--restart none): {adapter.daemon.how} to load its new config")
        return False
    elif opts.restart == "signal" and adapter.daemon.reloaded and front not in adapter.daemon.reload_fronts:
        say(
            f"restart: not done: a reload of {runtime} does not load the {front} front's settings: {adapter.daemon.how}"
        )
        return False
    else:
        say(restart.restart(opts.restart, runtime, adapter.daemon, root, config_file, opts.restart_timeout))
    _mark(state, "restart_pending", runtime, on=False)
    return True


# -- uninstall ---------------------------------------------------------------------------


@_one_at_a_time
def uninstall(opts: Options, say: Say, root: str) -> None:
    had_state = os.path.lexists(host(root, files.STATE))
    state = _load_state(root)
    installed = state["runtimes"]
    if opts.runtime == "auto":
        # every runtime installed for; with no state, every one whose config has our handler
        targets = installed if had_state else [n for n, a in runtimes.every().items() if a.ours(root)]
    else:
        targets = [opts.runtime]
    others = (
        [n for n in installed if n not in targets]
        if had_state
        else [n for n, a in runtimes.every().items() if n not in targets and a.ours(root)]
    )
    say(
        f"gpuhook uninstall: host root {root}, runtime {' and '.join(targets) or 'none left'}"
        f"{' (dry run: nothing is changed)' if opts.dry_run else ''}"
    )
    if not had_state:
        say(f"no install state ({files.STATE}): removing only what is recognisably gpuhook's")
    elif opts.runtime != "auto" and opts.runtime not in installed:
        # (or an uninstall of it was stopped after its state was saved: this finishes it)
        say(
            f"gpuhook is not installed for {opts.runtime} on this node"
            + (f" (it is for {' and '.join(installed)})" if installed else "")
            + f": only what is recognisably gpuhook's in {runtimes.get(opts.runtime).config} is removed"
        )

    for rt in targets:
        was_pending = rt in state["restart_pending"]
        if had_state and not opts.dry_run:
            _journal(root, state, rt)  # a kill during the edit still restarts it on the next run
        changed = runtimes.get(rt).uninstall(root, state.get(rt), opts.dry_run, say)
        if opts.dry_run:
            say(_dry_restart(opts, rt, changed or was_pending))
            continue
        files.sweep(host(root, runtimes.get(rt).config))  # an install killed while writing it
        state.pop(rt, None)
        state["fronts"] = {n: f for n, f in _fronts(state).items() if n != rt}
        _mark(state, "runtimes", rt, on=False)
        _mark(state, "restart_pending", rt, on=changed or was_pending)
        if had_state:
            files.save_state(root, state)
    if "nri" not in (_fronts(state).get(rt) for rt in others):
        _uninstall_nri_unit(root, opts, say)
    if others:
        say(
            f"kept for {' and '.join(others)} (still installed): the bundle {PREFIX}, the node config "
            f"{NODE_CONFIG}, the runtime server's units; `gpuhook uninstall` takes them all"
        )
    else:
        _uninstall_shared(root, opts, state, say)
    if not opts.dry_run:
        for rt in sorted(set(targets) | (set(state["restart_pending"]) - set(others))):
            if _restart(opts, rt, root, state, say) and had_state:
                files.save_state(root, state)
    if not others:
        _uninstall_bundle(root, opts, state, say)


def _uninstall_shared(root: str, opts: Options, state: dict, say: Say) -> None:
    """What every runtime shares, once none is left: the node config, what the agent wrote,
    the runtime server's units."""
    would = "would be " if opts.dry_run else ""
    mine = state.get("node_config")
    path = host(root, NODE_CONFIG)
    if mine and files.sha256(files.read(path, NODE_CONFIG)) == mine.get("written"):
        if not opts.dry_run:
            files.remove(path, NODE_CONFIG)
        say(f"node config: {NODE_CONFIG} {would}removed (unchanged since install)")
    elif os.path.exists(path):
        say(f"node config: {NODE_CONFIG} kept ({'edited since install' if mine else 'not written by install'})")

    # What the agent wrote for this node: the NFD feature file (it says runtime-ready=true, and
    # NFD would put the label back) and the CDI specs. Host paths resolved inside the root.
    from ..cdi import DEFAULT_DIR as CDI_DIR, FILE_PREFIX as CDI_PREFIX
    from ..defaults import LOG_POSITION, NFD_FEATURES
    from ..probe.host import Host

    h = Host(root)
    agent_files = [h.resolve(NFD_FEATURES), h.resolve(LOG_POSITION)]
    cdi_dir = h.resolve(CDI_DIR)
    agent_files += [
        os.path.join(cdi_dir, n)
        for n in (os.listdir(cdi_dir) if os.path.isdir(cdi_dir) else ())
        if n.startswith(CDI_PREFIX) and n.endswith((".yaml", ".json"))
    ]
    for path in agent_files:
        if os.path.lexists(path):
            if not opts.dry_run:
                files.remove(path)
            say(f"agent file: {h.node_path(path)} {would}removed")

    _uninstall_server_units(root, opts, say)


def _uninstall_bundle(root: str, opts: Options, state: dict, say: Say) -> None:
    """The bundle, once no runtime uses it; then the state, last."""
    dst = host(root, PREFIX)
    if opts.keep_bundle:
        say(f"bundle: {PREFIX} kept (--keep-bundle)")
    elif (running := files.running_bundle()) and files.is_installed(running, dst):
        say(f"bundle: {PREFIX} kept: it is the gpuhook running this uninstall (remove it afterwards)")
    elif os.path.lexists(host(root, defaults.PACKAGE_MARK)):
        say(f"bundle: {PREFIX} kept: installed by a package ({defaults.PACKAGE_MARK})")
    elif files.versioned(dst) or ((state.get("bundle") or {}).get("copied") and files.is_bundle(dst)):
        # a versioned bundle is install's alone, whole or half removed by a killed uninstall
        n = 0 if opts.dry_run else files.remove_bundle(dst)
        say(f"bundle: {PREFIX}: {'would be removed' if opts.dry_run else f'{n} files removed'} (every version)")
    elif os.path.isdir(dst) and not os.path.islink(dst) and not os.listdir(dst):
        os.rmdir(dst) if not opts.dry_run else None  # made by an install killed right after
    elif os.path.exists(dst):
        say(f"bundle: {PREFIX} kept (not copied by install)")
    if opts.dry_run:
        return
    files.drop_state(root)
    for d in (files.STATE_DIR, os.path.dirname(NODE_CONFIG)):
        files.sweep_dir(host(root, d))  # temp files of writers killed in there: all ours
        try:
            os.rmdir(host(root, d))  # only when empty
        except OSError:
            pass
