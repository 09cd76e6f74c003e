"""A private dockerd for end-to-end tests (Debian's docker.io), and nothing left behind.

`Dockerd(base, config_path, ...)` runs `dockerd --config-file CONFIG` where the test's
daemon.json (`settings()`: its own data-root, exec-root, pidfile, socket, iptables off, no
bridge, the vfs storage driver, a cgroup parent of its own) is the file `gpuhook install
--host-root NODE --runtime docker` edits. dockerd runs in a mount namespace of its own:

  - a tmpfs on /run: its managed containerd, the shims' sockets (/run/containerd/s) and
    anything else under /run live and die with the namespace, away from other daemons on
    this machine (dockerd would use a system containerd at /run/containerd/containerd.sock);
  - `binds` {node path: source dir}: each source bind-mounted at its node path over a tmpfs on
    the parent (the host bundle at /opt/gpuhook, where daemon.json's runtime path points).

`debian_root=ROOT`: the dockerd and docker of another Debian root (tests/debroot.py: sid's
Docker 28) with ROOT as their real root, in PID and mount namespaces of their own; base_dir
and each of `visible` are mounted at the same path inside.

Environment given to it reaches the shims and so the runtime they call (GPUHOOK_CONFIG).
`stop()` removes every container, stops dockerd by its pid, kills whatever is left in its
mount namespace (only what it started), removes its cgroup parent in every hierarchy and
its directories.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid

from containerd_harness import _cgroup_hierarchies, busybox_layer, tail_of

DOCKERD = "dockerd"
COMPOSE = "docker-compose"  # Debian's docker-compose: 1.29 (Python) on Debian 12, 2.x on 13


def docker_cli() -> str | None:
    """The docker client of the docker.io package (next to its dockerd), else any on PATH."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")


def missing_tools() -> list[str]:
    return [t for t in (DOCKERD, "containerd", "containerd-shim-runc-v2", "runc", "unshare", COMPOSE)
            if shutil.which(t) is None] + ([] if docker_cli() else ["docker"])


class DockerError(Exception):
    pass


class Dockerd:
    def __init__(self, base_dir: str, config_path: str, *, env: dict[str, str] | None = None,
                 binds: dict[str, str] | None = None, debian_root: str | None = None,
                 visible: tuple[str, ...] = ()) -> None:
        self.base = os.path.abspath(base_dir)
        self.config_path = config_path
        self.socket = os.path.join(self.base, "docker.sock")
        self.pidfile = os.path.join(self.base, "docker.pid")
        self.log_path = os.path.join(self.base, "dockerd.log")
        self.cgroup_parent = f"/gpuhook-test-docker-{uuid.uuid4().hex[:8]}"
        self.env = dict(env or {})
        self.binds = dict(binds or {})
        self.proc: subprocess.Popen | None = None
        self.mnt_ns: str | None = None
        self._log = None
        self.debian_root = os.path.abspath(debian_root) if debian_root else None
        self.visible = tuple(dict.fromkeys((self.base, *map(os.path.abspath, visible))))
        self.daemon_pid: int | None = None  # dockerd's, in a Debian root (PID 1 of its namespace)

    def settings(self) -> dict:
        """dockerd's own keys for daemon.json: everything under base_dir."""
        return {
            "data-root": os.path.join(self.base, "data"),
            "exec-root": os.path.join(self.base, "exec"),
            "pidfile": self.pidfile,
            "hosts": [f"unix://{self.socket}"],
            "iptables": False,
            "ip6tables": False,
            "bridge": "none",
            "storage-driver": "vfs",
            "cgroup-parent": self.cgroup_parent,
            "log-level": "info",
        }

    def start(self, timeout: float = 60) -> None:
        os.makedirs(self.base, exist_ok=True)
        steps = ["mount -t tmpfs gpuhook-test /run"]
        for target, source in self.binds.items():
            parent = os.path.dirname(target)
            steps += [f"mount -t tmpfs gpuhook-test {shlex.quote(parent)}", f"mkdir -p {shlex.quote(target)}",
                      f"mount --bind {shlex.quote(source)} {shlex.quote(target)}"]
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-ec", "; ".join(steps) + '; exec "$@"',
               "sh", DOCKERD, "--config-file", self.config_path]
        if self.debian_root:
            import debroot

            assert not self.binds, "a Debian root brings its own mounts"
            inside = self.config_path
            if inside.startswith(self.debian_root + "/"):
                inside = inside[len(self.debian_root):]
            cmd = debroot.enter_argv(self.debian_root, "exec " + shlex.join([DOCKERD, "--config-file", inside]),
                                     binds=tuple((d, d) for d in self.visible), env=self.env)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, env=dict(os.environ, **self.env), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise DockerError(f"dockerd exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            self._note_namespace()
            if self.debian_root and self.daemon_pid is None:
                from containerd_harness import _first_child

                self.daemon_pid = _first_child(self.proc.pid)
            if (self.daemon_pid or not self.debian_root) and os.path.exists(self.socket) and \
                    self.docker("version", check=False, timeout=10).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise DockerError(f"dockerd did not answer on {self.socket} within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)
        self._note_namespace()
        assert self.mnt_ns is not None, "dockerd is not in a mount namespace of its own"

    def _note_namespace(self) -> None:
        """dockerd's mount namespace, once unshare has made it (the pid is dockerd's: unshare
        and sh exec); never ours, whose processes are not this harness's to kill."""
        try:
            ns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
        except OSError:
            return
        if ns != os.readlink("/proc/self/ns/mnt"):
            self.mnt_ns = ns

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 40) -> str:
        return tail_of(self.log_path, n)

    def docker(self, *args: str, check: bool = True, timeout: float = 120,
               input: bytes | None = None) -> subprocess.CompletedProcess:
        cli = ["nsenter", "-t", str(self.daemon_pid), "-m", "--", "docker"] if self.debian_root else [docker_cli()]
        r = subprocess.run([*cli, *args], env=self._client_env(), capture_output=True, timeout=timeout,
                           input=input, stdin=None if input is not None else subprocess.DEVNULL)
        r.stdout = r.stdout.decode("utf-8", "replace")
        r.stderr = r.stderr.decode("utf-8", "replace")
        if check and r.returncode != 0:
            raise DockerError(f"docker {' '.join(args)} failed ({r.returncode}):\n{r.stderr}{r.stdout}")
        return r

    def _client_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        env["DOCKER_HOST"] = f"unix://{self.socket}"
        env["DOCKER_CONFIG"] = os.path.join(self.base, "client")
        return env

    def compose(self, project_dir: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """docker-compose in `project_dir` (its compose.yaml), against this dockerd."""
        return subprocess.run([shutil.which(COMPOSE), *args], env=self._client_env(), cwd=project_dir,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def info(self) -> dict:
        return json.loads(self.docker("info", "--format", "{{json .}}").stdout)

    def import_busybox(self, name: str) -> None:
        """`docker import` of a busybox-static rootfs (with an /etc for the ld cache)."""
        self.docker("import", "-", name, input=busybox_layer())

    def restart(self, timeout: float = 60) -> None:
        """Stop dockerd (SIGTERM, as systemctl restart does) and start it again on the same
        daemon.json; its containers stop with it (no live-restore)."""
        self._terminate()
        self._kill_namespace()
        if self._log:
            self._log.close()
            self._log = None
        self.mnt_ns = None
        self.daemon_pid = None
        self.start(timeout)

    def _terminate(self) -> list[str]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        if self.daemon_pid:  # unshare --fork waits for it and does not pass SIGTERM on
            os.kill(self.daemon_pid, signal.SIGTERM)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return [f"dockerd {self.proc.pid} killed"]
        return []

    # -- cleanup -------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything this dockerd started; what had to be forced. Never raises."""
        forced: list[str] = []
        if self.proc is not None and self.proc.poll() is None:
            try:
                r = self.docker("ps", "-aq", check=False, timeout=30)
                ids = r.stdout.split() if r.returncode == 0 else []
                if ids:
                    self.docker("rm", "-f", *ids, check=False, timeout=120)
            except (OSError, subprocess.SubprocessError) as e:  # keep cleaning: dockerd stops them
                forced.append(f"docker rm: {e}")
        forced += self._terminate()
        forced += self._kill_namespace()
        forced += self._remove_cgroups()
        if self._log:
            self._log.close()
            self._log = None
        for d in ("data", "exec", "client"):
            shutil.rmtree(os.path.join(self.base, d), ignore_errors=True)
        return forced

    def namespace_pids(self) -> list[int]:
        """Processes still in dockerd's mount namespace (its containerd, shims)."""
        if self.mnt_ns is None or self.mnt_ns == os.readlink("/proc/self/ns/mnt"):
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == self.mnt_ns:
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def _kill_namespace(self) -> list[str]:
        forced = []
        deadline = time.monotonic() + 10
        while self.namespace_pids() and time.monotonic() < deadline:
            time.sleep(0.1)  # the managed containerd exits after dockerd
        for pid in self.namespace_pids():
            forced.append(f"pid {pid} killed")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return forced

    def cgroups(self) -> list[str]:
        return [os.path.join(h, self.cgroup_parent.strip("/")) for h in _cgroup_hierarchies()
                if os.path.isdir(os.path.join(h, self.cgroup_parent.strip("/")))]

    def _remove_cgroups(self) -> list[str]:
        forced = []
        for top in self.cgroups():
            for d in sorted((dp for dp, _, _ in os.walk(top)), key=lambda p: p.count("/"), reverse=True):
                for _ in range(50):
                    try:
                        os.rmdir(d)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
                else:
                    forced.append(f"cgroup {d} busy")
        return forced

    def leftovers(self) -> list[str]:
        return [f"pid {p}" for p in self.namespace_pids()] + [f"cgroup {c}" for c in self.cgroups()] + \
            [d for d in ("data", "exec") if os.path.exists(os.path.join(self.base, d))]
