"""Make the container runtime load its new config.

containerd (1.6, checked) has no config reload: SIGHUP is not handled and kills it on the
spot (exit by signal, no clean shutdown). So:

  signal   containerd: SIGTERM to the containerd that reads the config we edited (found
           through <host-root>/proc, matched by that file's inode), wait for it to exit
           cleanly, then wait for its supervisor to start a new one (containerd.service has
           Restart=always upstream and in Debian; a runtime run without a supervisor stays
           down, and we say so). Running containers are untouched: their shims live on.
           CRI-O: SIGHUP, a live reload: crio.conf(5) marks the runtimes table as reloadable
           (not tried here: no CRI-O package on Debian 12; an older CRI-O that does not
           reload runtimes needs --restart systemd).
           dockerd: SIGHUP to the dockerd that reads the daemon.json we edited (matched by
           its --config-file's inode): dockerd reloads `runtimes` live (checked with
           dockerd 20.10; running containers keep running).
  systemd  `systemctl restart containerd` (or crio) on the host: when the host root is not /
           (a pod with hostPID: true), in the mount namespace of the host's PID 1
           (setns(2) on <host-root>/proc/1/ns/mnt in the child, as `nsenter -t 1 -m`
           would, so the host's own systemctl runs: the image needs no nsenter).
           dockerd: `systemctl reload-or-restart docker.service`: docker.service reloads
           with SIGHUP (ExecReload), which loads the runtime and keeps the containers, where
           a plain restart would stop every container not under live-restore.
  none     nothing; the runtime loads the handler the next time it starts.

signal and systemd from a container need the host's PID namespace (hostPID: true).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time

from typing import Callable

from . import InstallError


@dataclasses.dataclass(frozen=True)
class Daemon:
    """How a runtime's running daemon is found and made to load its new config (each
    runtime's adapter has one)."""

    comm: str  # its /proc/PID/comm
    unit: str  # its systemd unit
    systemctl: str  # what `systemctl` does with the unit under --restart systemd
    how: str  # what an operator does by hand after --restart none
    # the config file a daemon reads, as a path from here (proc, pid, argv); None: not the daemon.
    # None for a runtime whose daemons are not told apart by config (every one is reloaded)
    config_of: Callable[[str, int, list[str]], str | None] | None = None
    # a live reload on SIGHUP: the line said after it ({pids}); None: no reload, so SIGTERM
    # and its supervisor starts it again
    reloaded: str | None = None
    # the fronts whose config edits that reload loads (CRI-O reloads its runtimes, not NRI's settings)
    reload_fronts: tuple[str, ...] = ("wrapper", "nri")


def config_path(proc: str, pid: int, config: str) -> str:
    """A daemon's config file `config` (absolute, or relative to its cwd) as a path from here."""
    base = os.path.join(proc, str(pid), "root") if config.startswith("/") else os.path.join(proc, str(pid), "cwd")
    return os.path.join(base, config.lstrip("/"))


def _proc(host_root: str) -> str:
    return os.path.join(host_root, "proc")


def host_pid_namespace(host_root: str) -> bool:
    """True when pids under <host-root>/proc are ours to signal: that procfs belongs to our
    PID namespace, so its `self` is our own pid (in another namespace it is another number,
    or nothing at all)."""
    try:
        return os.readlink(os.path.join(_proc(host_root), "self")) == str(os.getpid())
    except OSError:
        return False


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _alive(proc: str, pid: int) -> bool:
    stat = _read(os.path.join(proc, str(pid), "stat"))
    if stat is None:
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def find(daemon: Daemon, host_root: str, config_file: str | None = None) -> list[int]:
    """Pids of the runtime's daemon; where the daemon has a config_of, only those reading
    `config_file` (a path from here): other daemons on the machine are left alone."""
    proc = _proc(host_root)
    want = None
    if config_file is not None and daemon.config_of is not None:
        try:
            st = os.stat(config_file)
            want = (st.st_dev, st.st_ino)
        except OSError:
            return []
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    pids = []
    for entry in entries:
        if not entry.isdigit():
            continue
        comm = _read(os.path.join(proc, entry, "comm"))
        if comm is None or comm.strip().decode(errors="replace") != daemon.comm or not _alive(proc, int(entry)):
            continue
        if daemon.config_of is not None and want is not None and _reads(daemon, proc, int(entry)) != want:
            continue
        pids.append(int(entry))
    return sorted(pids)


def _reads(daemon: Daemon, proc: str, pid: int) -> tuple[int, int] | None:
    """(device, inode) of the config file the daemon `pid` reads; None when there is none."""
    assert daemon.config_of is not None
    argv = [
        a.decode(errors="replace") for a in (_read(os.path.join(proc, str(pid), "cmdline")) or b"").split(b"\0") if a
    ]
    path = daemon.config_of(proc, pid, argv)
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st else None


def restart(
    mode: str, name: str, daemon: Daemon, host_root: str, config_file: str | None, timeout: float = 30.0
) -> str:
    """Do it for the runtime `name`; one line saying what happened. InstallError when it could not be done."""
    if mode == "none":
        return f"restart: none asked; {name} loads the handler when it next starts"
    if mode == "systemd":
        return _systemctl(daemon, host_root, timeout)
    if not host_pid_namespace(host_root):
        raise InstallError(
            f"--restart signal: {_proc(host_root)} is not this PID namespace's (run in the host's: hostPID: true)"
        )
    pids = find(daemon, host_root, config_file)
    if not pids:
        return f"restart: {name} is not running; it loads the handler when it starts"
    if daemon.reloaded is not None:
        for pid in pids:
            _kill(pid, signal.SIGHUP)
        return daemon.reloaded.format(pids=", ".join(map(str, pids)))
    return _stop_and_wait(daemon, host_root, config_file, pids, timeout)


def _stop_and_wait(daemon: Daemon, host_root: str, config_file: str | None, pids: list[int], timeout: float) -> str:
    """SIGTERM to a daemon with no reload; then wait for it to exit and its supervisor to start it again."""
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    proc = _proc(host_root)
    deadline = time.monotonic() + timeout
    while any(_alive(proc, p) for p in pids):
        if time.monotonic() > deadline:
            raise InstallError(
                f"--restart signal: {daemon.comm} (pid {pids[0]}) did not exit within {timeout:g}s of SIGTERM"
            )
        time.sleep(0.05)
    while True:
        new = [p for p in find(daemon, host_root, config_file) if p not in pids]
        if new:
            return f"restart: {daemon.comm} stopped (SIGTERM, pid {pids[0]}); its supervisor started it again (pid {new[0]})"
        if time.monotonic() > deadline:
            raise InstallError(
                f"--restart signal: {daemon.comm} stopped (pid {pids[0]}) but nothing started it again "
                f"within {timeout:g}s: is it supervised ({daemon.unit} Restart=always)? "
                "Start it by hand"
            )
        time.sleep(0.1)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except OSError as e:
        raise InstallError(f"--restart signal: cannot signal pid {pid}: {e.strerror or e}") from None


def _host_mount_namespace(host_root: str):
    """A preexec_fn that moves the child into the mount namespace of the host's PID 1 (its
    root and cwd become that namespace's /), so what it execs next is the host's own file."""
    import ctypes

    path = os.path.join(_proc(host_root), "1", "ns", "mnt")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise InstallError(f"--restart systemd: cannot open {path}: {e.strerror or e}") from None
    setns = ctypes.CDLL(None, use_errno=True).setns  # os.setns is Python >= 3.12

    def enter() -> None:
        if setns(fd, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns into the host's mount namespace")

    return fd, enter


CLONE_NEWNS = 0x00020000


def _systemctl(daemon: Daemon, host_root: str, timeout: float) -> str:
    enter = systemctl([daemon.systemctl, daemon.unit], host_root, timeout)
    how = "" if daemon.systemctl == "restart" else f" {daemon.systemctl}"
    return (
        f"restart: {daemon.unit} {'restarted' if not how else 'reloaded'} "
        f"(systemctl{how}{' in the host mount namespace' if enter else ''})"
    )


def systemctl(args: list[str], host_root: str, timeout: float) -> bool:
    """The host's `systemctl ARGS` (in PID 1's mount namespace when the host root is not /);
    InstallError with its last line when it fails. True when it ran in the host's namespace."""
    cmd = ["systemctl", *args]
    fd, enter = None, None
    if os.path.realpath(host_root) != "/":
        if not host_pid_namespace(host_root):
            raise InstallError(
                "--restart systemd: not in the host's PID namespace, so the host's systemd "
                "cannot be reached (run with hostPID: true, or on the node)"
            )
        fd, enter = _host_mount_namespace(host_root)
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=max(timeout, 90.0), stdin=subprocess.DEVNULL, preexec_fn=enter
        )
    except FileNotFoundError:
        raise InstallError(
            f"--restart systemd: {cmd[0]} not found" + (" in the host's mount namespace" if enter else "")
        ) from None
    except subprocess.SubprocessError as e:  # preexec_fn failed: the child could not enter it
        if isinstance(e, subprocess.TimeoutExpired):
            raise InstallError(f"--restart systemd: `{' '.join(cmd)}` did not finish in time") from None
        raise InstallError(f"--restart systemd: cannot enter the host's mount namespace ({e})") from None
    except OSError as e:
        raise InstallError(f"--restart systemd: `{' '.join(cmd)}`: {e.strerror or e}") from None
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise InstallError(f"--restart systemd: `{' '.join(cmd)}` failed: {why}")
    return enter is not None
