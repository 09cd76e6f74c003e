"""`gpuhook install` and `gpuhook uninstall`: the steps, and what each leaves on the host.

install (every step is skipped when its result is already there: a second run writes nothing)
  1. the host bundle -> /opt/gpuhook, as a new version switched in as a whole by one rename
     (files.VERSIONS; not when gpuhook runs from that very bundle: the .deb);
     with no --bundle-dir from a pip install, one is built first (build.py) in a temporary
     directory, from the interpreter and the gpuhook package running this
  2. /etc/gpuhook/config.toml, only when absent: the operator's file is never overwritten
  3. the runtime: containerd's config.toml edited in place, or dockerd's daemon.json, after a
     byte copy of the original in /etc/gpuhook/backup/; or CRI-O's drop-in
  4. /etc/gpuhook/backup/install-state.json: what was done, with the hash of each file as
     written; then the restart, only when the runtime's config changed (or an earlier change
     still waits for one)

uninstall undoes it: config.toml (daemon.json) gets the original bytes back when nobody changed
it since install wrote it; otherwise only our handler is removed and the backup stays.
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
from . import InstallError, containerd, crio, docker, files, restart
from .files import host, sha256

PREFIX = defaults.INSTALL_PREFIX
BINARY = defaults.RUNTIME_BINARY
NODE_CONFIG = defaults.CONFIG_FILE
BACKUP = files.STATE_DIR + "/containerd-config.toml"
DOCKER_BACKUP = files.STATE_DIR + "/docker-daemon.json"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CRIO_MARKS = ("/etc/crio", "/run/crio/crio.sock", "/var/run/crio/crio.sock")
DOCKER_MARKS = (docker.DEFAULT_CONFIG,) + docker.SOCKETS
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


def detect(root: str) -> str:
    """--runtime auto: dockerd when its config or socket is there and the node runs no
    kubelet; else containerd when its config or socket is there, else CRI-O, else dockerd.
    (A Docker host has containerd too: dockerd runs its containers through it.)"""
    from ..probe.host import Host

    h = Host(root)
    has_docker = any(os.path.lexists(h.resolve(p)) for p in DOCKER_MARKS)
    if has_docker and not os.path.isdir(h.resolve(KUBELET_MARK)):
        return "docker"
    if os.path.exists(host(root, containerd.DEFAULT_CONFIG)) or os.path.exists(host(root, CONTAINERD_SOCKET)):
        return "containerd"
    if any(os.path.exists(host(root, p)) for p in CRIO_MARKS):
        return "crio"
    if has_docker:
        return "docker"
    raise InstallError(
        f"--runtime auto: no containerd ({containerd.DEFAULT_CONFIG}, {CONTAINERD_SOCKET}), "
        f"CRI-O ({', '.join(CRIO_MARKS)}) nor dockerd ({', '.join(DOCKER_MARKS)}) under {root}; "
        "pass --runtime"
    )


def _config_file(root: str, runtime: str) -> str | None:
    """The runtime's config file we edit, as a path from here (what --restart signal matches)."""
    return {"containerd": host(root, containerd.DEFAULT_CONFIG), "docker": host(root, docker.DEFAULT_CONFIG)}.get(
        runtime
    )


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
    runtime = detect(root) if opts.runtime == "auto" else opts.runtime
    state = files.load_state(root)
    if state.get("runtime") not in (None, runtime):
        raise InstallError(
            f"gpuhook is installed for {state['runtime']} on this node; "
            "run `gpuhook uninstall` first to switch runtimes"
        )
    before = copy.deepcopy(state)
    would = "would be " if opts.dry_run else ""
    say(
        f"gpuhook install: host root {root}, runtime {runtime}{' (dry run: nothing is written)' if opts.dry_run else ''}"
    )

    # refuse a config we cannot edit before anything is written
    read = _read_containerd(root) if runtime == "containerd" else _read_docker(root) if runtime == "docker" else None
    src = _bundle_source(opts)
    if src is None and opts.dry_run:
        say(
            f"bundle: no --bundle-dir: one would be built from this Python ({sys.executable}) and this gpuhook, "
            f"and copied to {PREFIX}"
        )
    else:
        built = None
        if src is None:
            built, src = _build_bundle(say)
        try:
            _install_bundle(root, src, state, opts.dry_run, say)
        finally:
            if built:
                shutil.rmtree(built, ignore_errors=True)

    path = host(root, NODE_CONFIG)
    if os.path.lexists(path):
        say(f"node config: {NODE_CONFIG} exists: kept as it is")
    else:
        if not opts.dry_run:
            files.write(path, NODE_CONFIG_TEXT.encode(), 0o644, NODE_CONFIG)
            state["node_config"] = {"path": NODE_CONFIG, "written": sha256(NODE_CONFIG_TEXT.encode())}
        say(f"node config: {NODE_CONFIG} {would}written (all defaults)")
    devlinks.install_step(root, opts.dry_run, say)  # /dev/char links of the GPU nodes: left on uninstall
    _install_server_units(root, opts, say)

    if runtime == "containerd":
        changed = _install_containerd(root, state, opts.dry_run, say, read)
    elif runtime == "docker":
        changed = _install_docker(root, state, opts.dry_run, say, read)
    else:
        changed = _install_crio(root, state, opts.dry_run, say)
    config_file = _config_file(root, runtime)
    state["runtime"] = runtime
    state["restart_pending"] = bool(changed or state.get("restart_pending"))
    if opts.dry_run:
        say(_dry_restart(opts, runtime, state["restart_pending"]))
        return
    if state != before:
        files.save_state(root, state)  # before the restart: a failed one is retried next time
    if _restart(opts, runtime, root, config_file, state, say):
        files.save_state(root, state)


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


def _read_containerd(root: str) -> tuple[bytes | None, object, int]:
    """(original bytes or None, document, version), checked before anything is written.
    No config.toml: containerd runs on its built-in defaults; a version 2 file with only the
    handlers keeps them (containerd 2.x reads version 2 too)."""
    name = containerd.DEFAULT_CONFIG
    raw = files.read(host(root, name), name)
    doc, version = containerd.parse(_text(raw, name) if raw is not None else "version = 2\n", name)
    shadows = containerd.shadowing_imports(doc, version, root, name)
    if shadows:
        raise InstallError(
            f"{shadows[0]} (imported by {name}) sets the {containerd.CRI_PLUGIN[version]} plugin's "
            f"section, which replaces {name}'s when containerd loads it: add the gpu-optional "
            "handler there by hand, or fold that file into config.toml, then run install again"
        )
    return raw, doc, version


def _install_containerd(root: str, state: dict, dry_run: bool, say: Say, read) -> bool:
    name = containerd.DEFAULT_CONFIG
    raw, doc, version = read
    existed = raw is not None
    if not containerd.add_handler(doc, version, BINARY):
        say(f"containerd: {name}: handler gpu-optional already in place (config version {version})")
        return False
    new = containerd.dumps(doc).encode()
    if dry_run:
        say(f"containerd: {name}: handler gpu-optional would be added (config version {version})")
        return True
    mine = _write_config(root, state, "containerd", name, BACKUP, raw, new)
    say(
        f"containerd: {name}: handler gpu-optional {'added' if existed else 'written to a new file'} "
        f"(config version {version}, BinaryName {BINARY})"
        + (f"; original kept in {BACKUP}" if existed and mine.get("backup") else "")
    )
    return True


def _write_config(
    root: str, state: dict, key: str, name: str, backup: str, raw: bytes | None, new: bytes, first: dict | None = None
) -> dict:
    """Write a runtime's config file `name` (`raw` now, None when absent) as `new`: on the
    first change a byte copy of the original goes to `backup` for uninstall, and state[key]
    records both hashes. The state is saved first: a crash right after the write still
    knows the backup. `first`: more to record on the first change."""
    existed = raw is not None
    mine = state.get(key)
    if mine is None:
        if existed:
            files.write(host(root, backup), raw or b"", 0o600, backup)
        mine = state[key] = {
            "config": name,
            "existed": existed,
            "backup": backup if existed else None,
            "original": sha256(raw),
            "restorable": True,
            **(first or {}),
        }
    elif sha256(raw) not in (mine.get("written"), mine.get("original")):
        # Someone changed the file since we wrote it: the backup no longer equals "the file
        # without gpuhook", so uninstall will only remove our handler.
        mine["restorable"] = False
    mine["written"] = sha256(new)
    files.save_state(root, state)
    files.write(host(root, name), new, None if existed else 0o644, name)
    return mine


def _read_docker(root: str) -> tuple[bytes | None, dict]:
    """(original bytes or None, document), checked before anything is written."""
    name = docker.DEFAULT_CONFIG
    raw = files.read(host(root, name), name)
    doc = docker.parse(raw, name)
    docker.check(doc, BINARY, name)
    return raw, doc


def _install_docker(root: str, state: dict, dry_run: bool, say: Say, read) -> bool:
    name = docker.DEFAULT_CONFIG
    raw, doc = read
    had_runtimes = docker.RUNTIMES in doc
    if not docker.add_handler(doc, BINARY):
        say(f"docker: {name}: runtime gpu-optional already in place")
        return False
    if dry_run:
        say(f"docker: {name}: runtime gpu-optional would be added (path {BINARY})")
        return True
    mine = _write_config(
        root,
        state,
        "docker",
        name,
        DOCKER_BACKUP,
        raw,
        docker.dumps(doc, raw),
        first={"added_runtimes": not had_runtimes},
    )
    say(
        f"docker: {name}: runtime gpu-optional {'added' if raw is not None else 'written to a new file'} "
        f"(path {BINARY}; default-runtime unchanged)"
        + (f"; original kept in {DOCKER_BACKUP}" if raw is not None and mine.get("backup") else "")
    )
    return True


def _install_crio(root: str, state: dict, dry_run: bool, say: Say) -> bool:
    data = crio.render(BINARY)
    path = host(root, crio.DROPIN)
    if files.read(path, crio.DROPIN) == data:
        say(f"crio: {crio.DROPIN}: handler gpu-optional already in place")
        return False
    if not dry_run:
        files.write(path, data, 0o644, crio.DROPIN)
        state["crio"] = {"dropin": crio.DROPIN, "written": sha256(data)}
    say(f"crio: {crio.DROPIN}: {'would be ' if dry_run else ''}written (handler gpu-optional, runtime_path {BINARY})")
    return True


def _text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InstallError(f"{name}: not UTF-8 text") from None


def _dry_restart(opts: Options, runtime: str, pending: bool) -> str:
    if not pending:
        return "restart: not needed"
    if opts.restart == "none":
        return f"restart: {runtime} would need one (--restart none: not done)"
    return f"restart: {runtime} would be restarted (--restart {opts.restart})"


def _restart(opts: Options, runtime: str, root: str, config_file: str | None, state: dict, say: Say) -> bool:
    """Restart the runtime when a change waits for it; True when that cleared the wait."""
    if not state.get("restart_pending"):
        say(f"restart: not needed ({runtime}'s config is unchanged)")
        return False
    if opts.restart == "none" and restart.host_pid_namespace(root) and not restart.find(runtime, root, config_file):
        say(f"restart: {runtime} is not running: it loads the handler when it starts")
    elif opts.restart == "none":
        say(f"restart: not done (--restart none): {restart.HOW[runtime]} to load its new config")
        return False
    else:
        say(restart.restart(opts.restart, runtime, root, config_file, opts.restart_timeout))
    state["restart_pending"] = False
    return True


# -- uninstall ---------------------------------------------------------------------------


@_one_at_a_time
def uninstall(opts: Options, say: Say, root: str) -> None:
    state = files.load_state(root)
    runtime = state.get("runtime")
    if runtime and opts.runtime not in ("auto", runtime):
        raise InstallError(f"gpuhook was installed for {runtime} on this node, not {opts.runtime}")
    if not runtime:
        runtime = detect(root) if opts.runtime == "auto" else opts.runtime
    say(
        f"gpuhook uninstall: host root {root}, runtime {runtime}{' (dry run: nothing is changed)' if opts.dry_run else ''}"
    )
    if not state:
        say(f"no install state ({files.STATE}): removing only what is recognisably gpuhook's")

    if runtime == "containerd":
        changed = _uninstall_containerd(root, state.get("containerd"), opts.dry_run, say)
    elif runtime == "docker":
        changed = _uninstall_docker(root, state.get("docker"), opts.dry_run, say)
    else:
        changed = _uninstall_crio(root, state.get("crio"), opts.dry_run, say)
    config_file = _config_file(root, runtime)

    mine = state.get("node_config")
    path = host(root, NODE_CONFIG)
    if mine and files.sha256(files.read(path, NODE_CONFIG)) == mine.get("written"):
        if not opts.dry_run:
            files.remove(path, NODE_CONFIG)
        say(f"node config: {NODE_CONFIG} {'would be ' if opts.dry_run else ''}removed (unchanged since install)")
    elif os.path.exists(path):
        say(f"node config: {NODE_CONFIG} kept ({'edited since install' if mine else 'not written by install'})")

    # What the agent wrote for this node: the NFD feature file (it says runtime-ready=true, and
    # NFD would put the label back) and the CDI specs. Host paths resolved inside the root.
    from ..cdi import DEFAULT_DIR as CDI_DIR, FILE_PREFIX as CDI_PREFIX
    from ..agent.labels import NFD_DIR, NFD_FILE
    from ..probe.host import Host

    h = Host(root)
    agent_files = [h.resolve(f"{NFD_DIR}/{NFD_FILE}")]
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
            say(f"agent file: {h.node_path(path)} {'would be ' if opts.dry_run else ''}removed")

    _uninstall_server_units(root, opts, say)

    if opts.dry_run:
        say(_dry_restart(opts, runtime, bool(changed or state.get("restart_pending"))))
        return
    state.pop("containerd", None)
    state.pop("docker", None)
    state.pop("crio", None)
    state.pop("node_config", None)
    state["restart_pending"] = bool(changed or state.get("restart_pending"))
    files.save_state(root, state)
    _restart(opts, runtime, root, config_file, state, say)

    bundle = state.get("bundle") or {}
    dst = host(root, PREFIX)
    if opts.keep_bundle:
        say(f"bundle: {PREFIX} kept (--keep-bundle)")
    elif (running := files.running_bundle()) and files.is_installed(running, dst):
        say(f"bundle: {PREFIX} kept: it is the gpuhook running this uninstall (remove it afterwards)")
    elif bundle.get("copied") and os.path.exists(os.path.join(dst, files.MANIFEST)):
        n = files.remove_bundle(dst)
        say(f"bundle: {PREFIX}: {n} files removed (every version)")
    elif os.path.exists(dst):
        say(f"bundle: {PREFIX} kept ({'installed by a package' if bundle else 'not copied by install'})")
    files.drop_state(root)
    for d in (files.STATE_DIR, os.path.dirname(NODE_CONFIG)):
        try:
            os.rmdir(host(root, d))  # only when empty
        except OSError:
            pass


def _restore(
    root: str, mine: dict | None, label: str, name: str, backup: str, raw: bytes | None, dry_run: bool, say: Say
) -> bool:
    """Undo install's write of `name` when nobody changed the file since: the original bytes
    back from `backup`, or the file removed when install had created it. False when that
    cannot be done (then only the handler is removed)."""
    would = "would be " if dry_run else ""
    if not (mine and mine.get("restorable") and raw is not None and sha256(raw) == mine.get("written")):
        return False
    path = host(root, name)
    if not mine.get("existed"):
        if not dry_run:
            files.remove(path, name)
        say(f"{label}: {name}: {would}removed (install had created it)")
        return True
    saved = files.read(host(root, backup), backup)
    if saved is not None and sha256(saved) == mine.get("original"):
        if not dry_run:
            files.write(path, saved, None, name)
            files.remove(host(root, backup), backup)
        say(f"{label}: {name}: original {would}restored byte for byte from {backup}")
        return True
    say(f"{label}: {backup} is missing or changed: removing only the handler")
    return False


def _only_handler_removed(root: str, mine: dict | None, label: str, backup: str, dry_run: bool) -> str:
    why = "changed since install" if mine else "no install record"
    keep = (
        f"; the pre-install copy stays in {backup}"
        if mine and mine.get("backup") and os.path.exists(host(root, backup))
        else ""
    )
    return f"{why}, so only the gpu-optional handler was {'' if not dry_run else 'to be '}removed{keep}"


def _uninstall_edited(
    root: str, mine: dict | None, kind: str, name: str, backup: str, dry_run: bool, say: Say, edit, not_there: str
) -> bool:
    """Give a runtime's config file back (the backup, byte for byte, when it is unchanged since
    install), else take only gpuhook's handler out of it: edit(raw) -> the new bytes, or None
    when it holds none of gpuhook's (then `not_there` is said)."""
    path = host(root, name)
    raw = files.read(path, name)
    if _restore(root, mine, kind, name, backup, raw, dry_run, say):
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
    say(f"{kind}: {name}: {_only_handler_removed(root, mine, kind, backup, dry_run)}")
    return True


def _uninstall_containerd(root: str, mine: dict | None, dry_run: bool, say: Say) -> bool:
    name = containerd.DEFAULT_CONFIG

    def edit(raw: bytes) -> bytes | None:
        doc, version = containerd.parse(_text(raw, name), name)
        return containerd.dumps(doc).encode() if containerd.remove_handler(doc, version) else None

    return _uninstall_edited(
        root, mine, "containerd", name, BACKUP, dry_run, say, edit, "no gpu-optional handler: left as it is"
    )


def _uninstall_docker(root: str, mine: dict | None, dry_run: bool, say: Say) -> bool:
    changed = _uninstall_docker_file(root, mine, dry_run, say)
    after = files.read(host(root, docker.DEFAULT_CONFIG), docker.DEFAULT_CONFIG) if not dry_run else None
    if changed and not dry_run and docker.RUNTIMES not in docker.parse(after, docker.DEFAULT_CONFIG):
        # dockerd reloads `runtimes` only when the file sets the key (checked, dockerd 20.10)
        say(
            f'docker: {docker.DEFAULT_CONFIG} now has no "runtimes", and a reload keeps the runtimes a running '
            "dockerd has: it lists gpu-optional until its next restart (containers asking for it fail to "
            "start once /opt/gpuhook is removed)"
        )
    return changed


def _uninstall_docker_file(root: str, mine: dict | None, dry_run: bool, say: Say) -> bool:
    name = docker.DEFAULT_CONFIG

    def edit(raw: bytes) -> bytes | None:
        doc = docker.parse(raw, name)
        drop_empty = bool(mine and mine.get("added_runtimes"))
        return docker.dumps(doc, raw) if docker.remove_handler(doc, BINARY, drop_empty=drop_empty) else None

    return _uninstall_edited(
        root,
        mine,
        "docker",
        name,
        DOCKER_BACKUP,
        dry_run,
        say,
        edit,
        f"no gpu-optional runtime of gpuhook's ({BINARY}): left as it is",
    )


def _uninstall_crio(root: str, mine: dict | None, dry_run: bool, say: Say) -> bool:
    path = host(root, crio.DROPIN)
    raw = files.read(path, crio.DROPIN)
    if raw is None:
        say(f"crio: {crio.DROPIN} does not exist: nothing to remove")
        return False
    if not mine and not raw.startswith(crio.MARK.encode()):
        say(f"crio: {crio.DROPIN} was not written by gpuhook: left as it is")
        return False
    if not dry_run:
        files.remove(path, crio.DROPIN)
    edited = " (it had been edited since install)" if mine and sha256(raw) != mine.get("written") else ""
    say(f"crio: {crio.DROPIN} {'would be ' if dry_run else ''}removed{edited}")
    return True
