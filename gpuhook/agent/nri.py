"""The agent's NRI front (`gpuhook agent --front nri|auto`): `gpuhook nri` in a child process
of its own, supervised.

Which front: `wrapper` runs no plugin; `nri` runs it; `auto` runs it when the node's runtime
has NRI, which is a fact read once at start: its socket (`--nri-socket`, read inside
`--root` as if chrooted) is there, is a socket, and is owned by root. Anything else there (a
plain file, a socket of another user) is said once and no plugin runs.

The child is `gpuhook nri` started by a fresh interpreter (never a fork of the agent: it
shares none of the agent's state). With `--root` other than `/` it chroots there and runs the
node's installed bundle (cli/nri.py cmd_nri), so its node config, log, probe cache, ldconfig and
paths are the node's own, as under gpuhook-nri.service. It dies with the agent: SIGTERM when
the agent stops (SIGKILL after a grace), PR_SET_PDEATHSIG when the agent is gone without a
word. It exiting is logged and it is started again, after 1 s, then twice as long each time
up to 30 s; a child that ran a minute starts the count again. Its stderr lines become the
agent's log lines (`nri.said`).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time

FRONTS = ("wrapper", "nri", "auto")
DEFAULT_FRONT = "wrapper"  # as today: the wrapper needs no resident process
BACKOFF_FIRST, BACKOFF_MAX, STEADY_AFTER = 1.0, 30.0, 60.0
STOP_GRACE = 3.0  # SIGTERM, then this long, then SIGKILL
PR_SET_PDEATHSIG = 1
# the child's first lines: the package the agent runs, its death signal, then gpuhook's CLI
BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuhook.agent.nri import die_with_parent; "
    "die_with_parent(int(sys.argv.pop(1))) or sys.exit(0); from gpuhook.cli import main; sys.exit(main(sys.argv[1:]))"
)


def socket_fact(root: str, socket_path: str) -> str | None:
    """None when the NRI socket is one the runtime made (there, a socket, owned by root), else
    what is wrong with it, in words."""
    from ..probe.host import Host

    path = Host(root).resolve(socket_path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"no NRI socket at {socket_path}"
    except OSError as e:
        return f"{socket_path}: {e.strerror}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{socket_path} is not a socket"
    if st.st_uid != 0:
        return f"{socket_path} is owned by uid {st.st_uid}, not root"
    return None


def choose(front: str, root: str, socket_path: str) -> tuple[str, str | None]:
    """(the front to run, why the socket does not do) for --front."""
    if front == "wrapper":
        return "wrapper", None
    why = socket_fact(root, socket_path)
    if front == "auto":
        return ("nri" if why is None else "wrapper"), why
    return "nri", why


def child_argv(root: str, socket_path: str, rootfs_template: str) -> list[str]:
    """`gpuhook nri` for the node at `root`, run by the interpreter and package the agent runs."""
    flags = [f for f, on in (("-I", sys.flags.isolated), ("-S", sys.flags.no_site)) if on]
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.executable, *flags, "-c", BOOT, pkg_parent, str(os.getpid()), "nri", "--root", root,
            "--socket", socket_path, "--rootfs-template", rootfs_template]  # fmt: skip


def die_with_parent(parent: int) -> bool:
    """In the child, first: SIGTERM when the agent goes. False when it is gone already."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent  # else the agent went before the death signal was set


class Supervisor:
    """Runs `argv` until stop(): restarted with backoff whenever it exits."""

    def __init__(self, argv: list[str], log, ready=lambda: None, clock=time.monotonic) -> None:
        self.argv = argv
        self.log = log
        self.ready = ready  # None when the child may start now, else why not (said once per reason)
        self.clock = clock
        self.stop_event = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits = 0
        self.up = False
        self._last_pid = 0
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="gpuhook-nri", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        with self._lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.thread is not None:
            self.thread.join(STOP_GRACE)

    def _loop(self) -> None:
        # spawned from this thread, which lives as long as the supervision: PDEATHSIG follows
        # the thread that forked the child
        backoff, said = BACKOFF_FIRST, None
        while not self.stop_event.is_set():
            why = self.ready()
            if why is not None:
                if why != said:
                    self.log.warning("nri.waiting", reason=why, note="the NRI plugin starts once the socket is right")
                said = why
                self.stop_event.wait(BACKOFF_MAX)
                continue
            said = None
            started = self.clock()
            code = self._run_once()
            if self.stop_event.is_set():
                break
            ran = self.clock() - started
            backoff = BACKOFF_FIRST if ran >= STEADY_AFTER else backoff
            if code is not None:  # None: it did not start (said already)
                self.log.warning("nri.exited", pid=self._last_pid, code=code, ran_s=round(ran, 1), restart_in_s=backoff)
            self.stop_event.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _run_once(self) -> int | None:
        """Start the child and wait for it: its exit status (negative: a signal), None when it
        could not start."""
        try:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, close_fds=True)  # fmt: skip
        except OSError as e:
            self.log.error("nri.error", error=f"cannot start the NRI plugin: {e}", argv=self.argv[:1], retry=True)
            return None
        with self._lock:
            self.proc = proc
        if self.stop_event.is_set():  # stop() came while it started
            proc.terminate()
        self._last_pid = proc.pid
        self.starts += 1
        self.up = True
        self.log.info("nri.started", pid=proc.pid, restarts=self.starts - 1)
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:  # until the child closes it (it exited)
                line = raw.decode(errors="replace").rstrip()
                if line:
                    self.log.info("nri.said", pid=proc.pid, message=line[:2000])
            code = proc.wait()
        finally:
            self.up = False
            proc.stdout and proc.stdout.close()
        self.exits += 1
        if self.stop_event.is_set():
            self.log.info("nri.stopped", pid=proc.pid, code=code)
        return code
