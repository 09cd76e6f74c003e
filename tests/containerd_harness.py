"""A private containerd for end-to-end tests, and a busybox-static OCI image to run in it.

`Containerd(base_dir, ...)` starts Debian's containerd (1.6) on its own root, state, gRPC and
ttrpc sockets and config.toml under `base_dir`, with the CRI plugin configured for this kind
of machine (restrict_oom_score_adj, host network only, a local sandbox image, a runc root of
its own) and any runtime handlers the test asks for. Environment variables given to it reach
the shims and so the OCI runtime they call (gpuhook-runtime reads GPUHOOK_CONFIG there).

`cleanup()` leaves nothing behind: CRI pods removed (through the callbacks registered with
`before_stop`), containerd tasks and containers deleted, containerd stopped by its pid, the
shims of its socket killed, `runc --root <root>/<ns> delete -f` for what is left, the cgroup
parents the test used removed, every mount under `base_dir` unmounted.

`Containerd(..., debian_root=ROOT)` runs the containerd of another Debian root (tests/debroot.py:
sid's containerd 2.x, runc 1.3) with ROOT as its real root and its own PID and mount
namespaces: base_dir (and each of `visible`) is mounted at the same path inside, so sockets,
state, logs and the node config read the same from both sides; `ctr` runs inside; stopping
containerd (PID 1 there) takes its shims and containers with it.

`build_busybox_image(path, name)` writes an OCI image layout tar (one uncompressed layer with
a static busybox and its applet links, config, manifest, index; digests computed here), which
`Containerd.import_image` imports with `ctr images import`.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tarfile
import threading
import time

CONTAINERD = "containerd"
CTR = "ctr"
RUNC = "runc"
SHIM_SOCKET_DIR = "/run/containerd/s"  # containerd 1.6 puts every shim's socket there
# containerd, its shims and ctr make directories here whatever the config says (shim sockets,
# ctr's fifos, and runc's state when a handler has no options.Root of its own)
RUN_DIR = "/run/containerd"
DEFAULT_RUNC_ROOT = "/run/containerd/runc"
CGROUP_ROOT = "/sys/fs/cgroup"
CRI_NAMESPACE = "k8s.io"
IMAGE_NAME = "localhost/gpuhook/busybox:test"
# Plugins that a test never needs: leaving them out makes containerd start sooner and quieter.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
    "io.containerd.monitor.v1.cgroups",
    "io.containerd.grpc.v1.cri",  # removed from this list when cri=True
)
APPLETS = ("sh", "ls", "cat", "grep", "env", "stat", "true", "echo", "sleep", "readlink", "head",
           "wc", "id", "mount", "test", "[", "tr", "cut", "sed", "base64")


def missing_tools() -> list[str]:
    """Names of what a containerd end-to-end test needs and this machine lacks."""
    from fakes import bundle

    missing = [t for t in (CONTAINERD, CTR, RUNC, "containerd-shim-runc-v2") if shutil.which(t) is None]
    if bundle.find_busybox() is None:
        missing.append("busybox-static")
    return missing


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


# -- the image ----------------------------------------------------------------------

def _goarch() -> str:
    m = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
            "s390x": "s390x", "riscv64": "riscv64", "i686": "386"}.get(m, m)


def _tar_add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o755,
             kind: bytes = tarfile.DIRTYPE, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    info.type = kind
    info.linkname = linkname
    if data is not None:
        info.type = tarfile.REGTYPE
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def busybox_layer(busybox: str | None = None) -> bytes:
    """An uncompressed layer tar: /bin/busybox, applet links, and the directories a
    container needs (/etc with an empty ld.so.conf: the ld-cache hook writes there)."""
    from fakes import bundle

    busybox = busybox or bundle.find_busybox()
    if busybox is None:
        raise FileNotFoundError("no static busybox (apt-get install busybox-static)")
    with open(busybox, "rb") as f:
        binary = f.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/lib", "var", "var/cache"):
            _tar_add(tar, d, mode=0o1777 if d == "tmp" else 0o755)
        _tar_add(tar, "bin/busybox", data=binary, mode=0o755)
        for applet in APPLETS:
            _tar_add(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, linkname="busybox", mode=0o777)
        _tar_add(tar, "etc/ld.so.conf", data=b"", mode=0o644)
        _tar_add(tar, "etc/passwd", data=b"root:x:0:0:root:/:/bin/sh\n", mode=0o644)
        _tar_add(tar, "etc/group", data=b"root:x:0:\n", mode=0o644)
    return buf.getvalue()


def build_busybox_image(path: str, name: str = IMAGE_NAME, cmd: list[str] | None = None,
                        busybox: str | None = None, extra_layers: tuple[bytes, ...] = ()) -> str:
    """Write an OCI image layout tar for `name` to `path`; returns the manifest digest.

    The default command sleeps until killed, so the same image serves as the CRI sandbox
    ("pause") image. extra_layers: uncompressed layer tars over the busybox one, in order."""
    layers = [busybox_layer(busybox), *extra_layers]
    digests = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    config = {
        "created": "1970-01-01T00:00:00Z",
        "architecture": _goarch(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": cmd or ["sleep", "2147483647"],
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": digests},  # uncompressed: digest == diff_id
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gpuhook tests: busybox-static"}]
        + [{"created": "1970-01-01T00:00:00Z", "created_by": "gpuhook tests: a layer over it"}] * len(extra_layers),
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": len(layer)}
                   for digest, layer in zip(digests, layers)],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": _goarch(), "os": "linux"},
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _tar_add(tar, "blobs")
        _tar_add(tar, "blobs/sha256")
        for digest, blob in (*zip(digests, layers), (config_digest, config_bytes), (manifest_digest, manifest_bytes)):
            _tar_add(tar, "blobs/sha256/" + digest.split(":", 1)[1], data=blob, mode=0o644)
        _tar_add(tar, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        _tar_add(tar, "index.json", data=json.dumps(index).encode(), mode=0o644)
    return manifest_digest


def build_gpuhook_image(base: str) -> dict:
    """`make image` itself (packaging/build-image.sh building its own bundle from the venv,
    default name) on a podman storage under `base`, then `podman save` (docker-archive) for
    `ctr images import`: {"name", "tar", "size", "labels", "config", "podman", "base", "line",
    "seconds"}. AssertionError with make's output when the build fails."""
    import tempfile

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # podman refuses a runroot over 50 characters: a short one of its own
    run = tempfile.mkdtemp(prefix="gh-run-", dir="/tmp")
    podman = (f"podman --root {base}/storage --runroot {run} --storage-driver vfs "
              "--events-backend none --cgroup-manager cgroupfs")
    env = dict(os.environ, PODMAN=podman, CONTEXT=os.path.join(base, "context"))
    started = time.monotonic()
    r = subprocess.run(["make", "-s", "-C", repo, "image"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout
    line = r.stdout.strip().splitlines()[-1]
    name = line.split(": ")[1]
    inspect = json.loads(subprocess.run(podman.split() + ["image", "inspect", name], capture_output=True,
                                        text=True, check=True).stdout)[0]
    tar = os.path.join(base, "image.tar")
    subprocess.run(podman.split() + ["save", "--format", "docker-archive", "-o", tar, name], check=True,
                   capture_output=True, timeout=120)
    return {"name": name, "tar": tar, "size": inspect["Size"], "labels": inspect["Config"].get("Labels") or {},
            "config": inspect["Config"], "podman": podman, "base": base, "line": line, "runroot": run,
            "seconds": time.monotonic() - started}


def remove_gpuhook_image(image: dict) -> None:
    """What build_gpuhook_image left: the podman storage and its runroot (the tar stays)."""
    subprocess.run(image["podman"].split() + ["rmi", "-a", "-f"], capture_output=True, timeout=120)
    shutil.rmtree(os.path.join(image["base"], "storage"), ignore_errors=True)
    shutil.rmtree(image["runroot"], ignore_errors=True)


def tail_of(path: str, n: int = 40) -> str:
    """The last n lines of a daemon's log, for an error message ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


# -- containerd -----------------------------------------------------------------------

class ContainerdError(RuntimeError):
    pass


class Containerd:
    """One containerd of the test's own. Use as a context manager, or call start() and,
    always, cleanup()."""

    def __init__(self, base_dir: str, *, env: dict[str, str] | None = None, cri: bool = True,
                 runtimes: dict[str, dict] | None = None, sandbox_image: str = IMAGE_NAME,
                 extra_toml: str = "", log_level: str = "info", config_path: str | None = None,
                 binds: dict[str, str] | None = None, pid_namespace: bool = False,
                 debian_root: str | None = None, visible: tuple[str, ...] = ()) -> None:
        """runtimes: CRI handlers, name -> {"binary": path (options.BinaryName, optional),
        "pod_annotations": [...], "container_annotations": [...]} (all optional); a handler
        "runc" with plain runc is always there and is the default. extra_toml is appended
        to the config. config_path: where config.toml goes (default: in base_dir); to let
        another tool edit it (an installer adding a handler), call write_config(), run the
        tool, then start(write_config=False). binds: {node path: source dir}: containerd (and
        the shims and runc it starts) runs in a mount namespace of its own where each source
        is bind-mounted at its node path, over a tmpfs on the parent, so nothing is created
        on this machine's root (e.g. the host bundle that `gpuhook install --host-root H`
        puts in H/opt/gpuhook, at /opt/gpuhook where the handler's BinaryName points); a
        source that is gone (an uninstall removed it) leaves the target empty.
        pid_namespace: containerd runs as PID 1 of a PID namespace of its own (and a mount
        namespace, slave to this one, with its /proc): a "node" whose init the test owns,
        for hostPID pods (no binds with it).
        debian_root: run that root's containerd, ctr and runc inside it (see the module doc);
        config_path may then be a path in the root's own tree (its etc/containerd/config.toml)."""
        self.base = os.path.abspath(base_dir)
        self.root = os.path.join(self.base, "root")
        self.state = os.path.join(self.base, "state")
        self.address = os.path.join(self.base, "containerd.sock")
        self.ttrpc_address = self.address + ".ttrpc"
        self.runc_root = os.path.join(self.base, "runc")  # the shims' options.Root
        self.config_path = config_path or os.path.join(self.base, "config.toml")
        self.log_path = os.path.join(self.base, "containerd.log")
        self.env = dict(env or {})
        self.cri = cri
        self.runtimes = dict(runtimes or {})
        self.sandbox_image = sandbox_image
        self.extra_toml = extra_toml
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.namespaces: set[str] = {CRI_NAMESPACE} if cri else set()
        self.cgroup_parents: list[str] = []  # cgroup paths (e.g. "/gpuhook-test-ab12") to remove
        self._before_stop: list = []
        self._log_file = None
        self._made_run_dir = False
        self.start_seconds: float | None = None
        self.binds = dict(binds or {})
        self.pid_namespace = pid_namespace
        self.daemon_pid: int | None = None  # containerd's pid (here), when not self.proc's
        self.debian_root = os.path.abspath(debian_root) if debian_root else None
        self.visible = tuple(dict.fromkeys((self.base, *map(os.path.abspath, visible))))

    # -- config ------------------------------------------------------------------
    def config_toml(self) -> str:
        disabled = [p for p in DISABLED_PLUGINS if not (self.cri and p == "io.containerd.grpc.v1.cri")]
        lines = [
            "version = 2",
            f"root = {_toml_str(self.root)}",
            f"state = {_toml_str(self.state)}",
            "disabled_plugins = [" + ", ".join(_toml_str(p) for p in disabled) + "]",
            "",
            "[grpc]",
            f"  address = {_toml_str(self.address)}",
            "[ttrpc]",
            f"  address = {_toml_str(self.ttrpc_address)}",
            "[debug]",
            f"  level = {_toml_str(self.log_level)}",
            "[metrics]",
            '  address = ""',
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {_toml_str(os.path.join(self.base, 'opt'))}",
        ]
        if self.cri:
            cri = 'plugins."io.containerd.grpc.v1.cri"'
            lines += [
                "",
                f"[{cri}]",
                f"  sandbox_image = {_toml_str(self.sandbox_image)}",
                "  restrict_oom_score_adj = true",  # root here lacks CAP_SYS_RESOURCE
                '  stream_server_address = "127.0.0.1"',
                '  stream_server_port = "0"',
                "  enable_selinux = false",
                "  disable_apparmor = true",
                "  max_concurrent_downloads = 1",
                f"[{cri}.cni]",
                f"  bin_dir = {_toml_str(os.path.join(self.base, 'cni', 'bin'))}",
                f"  conf_dir = {_toml_str(os.path.join(self.base, 'cni', 'net.d'))}",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
            ]
            handlers = {"runc": {}, **self.runtimes}
            for name, h in handlers.items():
                key = f'{cri}.containerd.runtimes.{_toml_str(name)}'
                lines += [f"[{key}]", '  runtime_type = "io.containerd.runc.v2"']
                for field in ("pod_annotations", "container_annotations"):
                    if h.get(field):
                        lines.append(f"  {field} = [" + ", ".join(_toml_str(a) for a in h[field]) + "]")
                lines += [f"[{key}.options]", f"  Root = {_toml_str(self.runc_root)}"]
                if h.get("binary"):
                    lines.append(f"  BinaryName = {_toml_str(h['binary'])}")
        if self.extra_toml:
            lines += ["", self.extra_toml]
        return "\n".join(lines) + "\n"

    # -- life cycle ----------------------------------------------------------------
    def __enter__(self) -> "Containerd":
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def write_config(self) -> str:
        os.makedirs(os.path.dirname(self.config_path), exist_ok=True)
        with open(self.config_path, "w") as f:
            f.write(self.config_toml())
        return self.config_path

    def start(self, timeout: float = 30, write_config: bool = True) -> None:
        for d in (self.base, self.root, self.state, os.path.join(self.base, "cni", "bin"),
                  os.path.join(self.base, "cni", "net.d")):
            os.makedirs(d, exist_ok=True)
        if write_config:
            self.write_config()
        self._made_run_dir = not self.debian_root and not os.path.isdir(RUN_DIR)
        self.daemon_pid = None  # a restart's containerd is another process
        env = dict(os.environ)
        env.update(self.env)
        self._log_file = open(self.log_path, "ab")
        started = time.monotonic()
        cmd = [CONTAINERD, "--config", self.config_path]
        if self.debian_root:
            import debroot

            assert not self.binds and not self.pid_namespace, "a Debian root brings its own namespaces"
            cmd = debroot.enter_argv(self.debian_root, "exec " + shlex.join([CONTAINERD, "--config", self.inside(self.config_path)]),
                                     binds=tuple((d, d) for d in self.visible), env=self.env)
        elif self.binds:
            steps = []
            for target, source in self.binds.items():
                parent = os.path.dirname(target)
                steps += [f"mount -t tmpfs gpuhook-test {shlex.quote(parent)}", f"mkdir -p {shlex.quote(target)}",
                          f"if [ -d {shlex.quote(source)} ]; then mount --bind {shlex.quote(source)} {shlex.quote(target)}; fi"]
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                   "; ".join(steps) + '; exec "$@"', "sh"] + cmd
        if self.pid_namespace:
            assert not self.binds, "pid_namespace and binds do not go together"
            cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "slave"] + cmd
        self.proc = subprocess.Popen(cmd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = started + timeout
        while True:
            if self.proc.poll() is not None:
                raise ContainerdError(f"containerd exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            if self.debian_root and self.daemon_pid is None:
                self.daemon_pid = _first_child(self.proc.pid)
            if os.path.exists(self.address) and (self.daemon_pid or not self.debian_root):
                r = self.ctr("version", check=False, timeout=10)
                if r.returncode == 0:
                    break
            if time.monotonic() > deadline:
                raise ContainerdError(f"containerd did not answer on {self.address} within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.02)
        self.start_seconds = time.monotonic() - started
        if self.pid_namespace:  # unshare --fork waits for containerd and ignores SIGTERM
            self.daemon_pid = _first_child(self.proc.pid)

    def inside(self, path: str) -> str:
        """`path` (of this machine) as the processes in the Debian root see it."""
        path = os.path.abspath(path)
        if self.debian_root and path.startswith(self.debian_root + "/"):
            return path[len(self.debian_root):]
        return path

    def enter(self, pid: bool = False) -> list[str]:
        """argv prefix that runs a command where containerd runs (its root's tools); pid: in
        its PID namespace too (the command then dies with containerd)."""
        if not self.debian_root:
            return []
        return ["nsenter", "-t", str(self.daemon_pid), "-m", *(["-p"] if pid else []), "--"]

    def log_tail(self, n: int = 40) -> str:
        return tail_of(self.log_path, n)

    # -- ctr -----------------------------------------------------------------------
    def ctr(self, *args: str, namespace: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [*self.enter(), CTR, "-a", self.address]
        if namespace:
            self.namespaces.add(namespace)
            cmd += ["-n", namespace]
        r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise ContainerdError(f"{' '.join(cmd + list(args))} failed ({r.returncode}):\n{r.stderr}{r.stdout}")
        return r

    def import_image(self, tar_path: str, namespace: str) -> None:
        if self.debian_root and not any(tar_path.startswith(d + "/") for d in self.visible):
            shutil.copy(tar_path, os.path.join(self.base, os.path.basename(tar_path)))
            tar_path = os.path.join(self.base, os.path.basename(tar_path))
        self.ctr("images", "import", tar_path, namespace=namespace)

    def run(self, namespace: str, image: str, cid: str, args: list[str], *, runc_binary: str | None = None,
            extra: list[str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """`ctr run --rm` with the runc root of this containerd, and the cgroup parent /<ns>
        (ctr's default) recorded for cleanup."""
        self.cgroup_parents.append("/" + namespace)
        opts = ["run", "--rm", "--runc-root", self.runc_root, "--fifo-dir", os.path.join(self.base, "fifo")]
        if runc_binary:
            opts += ["--runc-binary", runc_binary]
        return self.ctr(*opts, *(extra or []), image, cid, *args, namespace=namespace, check=False,
                        timeout=timeout)

    def restart(self, timeout: float = 30) -> None:
        """Stop containerd (SIGTERM, as a supervisor would) and start it again on the same
        config file, as edited since; shims and their containers keep running."""
        self._stop_containerd()
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        self.start(timeout, write_config=False)

    def before_stop(self, fn) -> None:
        """Call `fn()` first thing in cleanup (e.g. remove CRI pods through CRI)."""
        self._before_stop.append(fn)

    # -- cleanup -------------------------------------------------------------------
    def cleanup(self) -> list[str]:
        """Remove everything this containerd made; returns what had to be forced (for the
        curious: a clean test leaves it empty). Never raises."""
        forced: list[str] = []
        for fn in reversed(self._before_stop):
            try:
                fn()
            except Exception as e:  # keep cleaning
                forced.append(f"before_stop {fn!r}: {e}")
        self._before_stop.clear()
        if self.proc is not None and self.proc.poll() is None:
            forced += self._delete_leftover_containers()
        forced += self._stop_containerd()
        forced += self._kill_shims()
        forced += self._delete_runc_leftovers()
        forced += self._remove_cgroups()
        forced += self._unmount_all()
        forced += self._remove_run_dirs()
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        for d in (self.root, self.state, os.path.join(self.base, "opt")):
            shutil.rmtree(d, ignore_errors=True)
        return forced

    def _delete_leftover_containers(self) -> list[str]:
        forced = []
        r = self.ctr("namespaces", "ls", "-q", check=False, timeout=10)
        namespaces = set(r.stdout.split()) if r.returncode == 0 else set()
        for ns in sorted(namespaces | self.namespaces):
            tasks = self.ctr("tasks", "ls", "-q", namespace=ns, check=False, timeout=10)
            for tid in tasks.stdout.split() if tasks.returncode == 0 else ():
                forced.append(f"task {ns}/{tid}")
                self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", tid, namespace=ns, check=False, timeout=10)
                self.ctr("tasks", "delete", "-f", tid, namespace=ns, check=False, timeout=20)
            containers = self.ctr("containers", "ls", "-q", namespace=ns, check=False, timeout=10)
            for cid in containers.stdout.split() if containers.returncode == 0 else ():
                if ns != CRI_NAMESPACE:
                    forced.append(f"container {ns}/{cid}")
                self.ctr("containers", "delete", cid, namespace=ns, check=False, timeout=20)
        return forced

    def _stop_containerd(self) -> list[str]:
        if self.proc is None:
            return []
        forced = []
        if self.proc.poll() is None:
            try:
                os.kill(self.daemon_pid or self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                forced.append(f"containerd {self.proc.pid} killed")
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        self.proc = None
        return forced

    def shim_pids(self) -> list[tuple[int, dict[str, str]]]:
        """Shim processes started for this containerd: (pid, {flag: value})."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().decode("utf-8", "replace").split("\0")
            except OSError:
                continue
            if not argv or "containerd-shim" not in os.path.basename(argv[0]):
                continue
            flags = {}
            for i, a in enumerate(argv[:-1]):
                if a.startswith("-"):
                    flags[a.lstrip("-")] = argv[i + 1]
            if flags.get("address") == self.address:
                found.append((int(entry), flags))
        return found

    def _kill_shims(self) -> list[str]:
        forced = []
        shims = self.shim_pids()
        for pid, flags in shims:
            forced.append(f"shim {pid} ({flags.get('namespace')}/{flags.get('id')})")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while shims and time.monotonic() < deadline and self.shim_pids():
            time.sleep(0.02)
        for _, flags in shims:  # a killed shim leaves its socket behind
            key = os.path.join(self.address, flags.get("namespace", ""), flags.get("id", ""))
            sock = os.path.join(SHIM_SOCKET_DIR, hashlib.sha256(key.encode()).hexdigest())
            for p in (sock, sock + ".sock"):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        return forced

    def _delete_runc_leftovers(self) -> list[str]:
        """`runc delete -f` every container left whose bundle is in this containerd's state
        directory: in its own runc root, and in the shared default root (a handler with no
        options.Root, as an installer writes it)."""
        forced = []
        if self.debian_root:  # they died with containerd's PID namespace; runc is the root's
            shutil.rmtree(self.runc_root, ignore_errors=True)
            return forced
        for root, cid in self.runc_containers():
            forced.append(f"runc {root} {cid}")
            subprocess.run([RUNC, "--root", root, "delete", "-f", cid], capture_output=True, timeout=20)
        shutil.rmtree(self.runc_root, ignore_errors=True)
        return forced

    def runc_containers(self) -> list[tuple[str, str]]:
        """(runc root, id) of every runc container whose bundle is in this containerd's state."""
        found = []
        prefix = self.state.rstrip("/") + "/"
        for top in (self.runc_root, DEFAULT_RUNC_ROOT):
            for ns in sorted(os.listdir(top)) if os.path.isdir(top) else ():
                root = os.path.join(top, ns)
                r = subprocess.run([RUNC, "--root", root, "list", "--format", "json"], capture_output=True,
                                   text=True, timeout=20)
                try:
                    listed = json.loads(r.stdout or "null") or []
                except ValueError:
                    listed = []
                found += [(root, item["id"]) for item in listed
                          if str(item.get("bundle", "")).startswith(prefix) and item.get("id")]
        return found

    def _remove_cgroups(self) -> list[str]:
        """rmdir each cgroup parent the test used, deepest first, in every hierarchy."""
        forced = []
        for parent in dict.fromkeys(self.cgroup_parents):
            rel = parent.strip("/")
            if not rel:
                continue
            for h in _cgroup_hierarchies():
                top = os.path.join(h, rel)
                if not os.path.isdir(top):
                    continue
                dirs = [dp for dp, _, _ in os.walk(top)]
                for d in sorted(dirs, key=lambda p: p.count("/"), reverse=True):
                    for _ in range(50):
                        try:
                            os.rmdir(d)
                            break
                        except FileNotFoundError:
                            break
                        except OSError:  # EBUSY while the last task is still exiting
                            time.sleep(0.02)
                    else:
                        forced.append(f"cgroup {d} busy")
        return forced

    def _unmount_all(self) -> list[str]:
        forced = []
        prefix = self.base.rstrip("/") + "/"
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(3):
            points = []
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mp = line.split()[4].encode().decode("unicode_escape")
                    if mp.startswith(prefix):
                        points.append(mp)
            if not points:
                break
            for mp in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
                if libc.umount2(mp.encode(), 0) != 0:
                    libc.umount2(mp.encode(), 2)  # MNT_DETACH
                forced.append(f"mount {mp}")
        return forced

    def _remove_run_dirs(self) -> list[str]:
        """rmdir the empty directories of /run/containerd when this containerd made it:
        another containerd's shims may use it, so only while no shim runs at all."""
        if not self._made_run_dir or not os.path.isdir(RUN_DIR):
            return []
        deadline = time.monotonic() + 3
        while (other := _any_shim_running()):
            if time.monotonic() > deadline:
                return [f"{RUN_DIR} kept: a shim runs ({other})"]
            time.sleep(0.05)
        for dirpath, _, _ in sorted(os.walk(RUN_DIR), key=lambda w: w[0].count("/"), reverse=True):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
        return [f"{RUN_DIR} kept: not empty"] if os.path.isdir(RUN_DIR) else []


def _first_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _cgroup_hierarchies() -> list[str]:
    """The mounted cgroup hierarchies: each v1 controller's (and the hybrid's unified and
    name=systemd), or the one root of a pure v2 host."""
    if not os.path.isdir(CGROUP_ROOT):
        return []
    if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return [CGROUP_ROOT]
    return [os.path.join(CGROUP_ROOT, h) for h in sorted(os.listdir(CGROUP_ROOT))
            if os.path.isdir(os.path.join(CGROUP_ROOT, h)) and not os.path.islink(os.path.join(CGROUP_ROOT, h))]


def _any_shim_running() -> str:
    """A containerd shim alive ("pid comm state"; "" when none); a zombie waiting for init
    to reap it does not count."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm, _, rest = stat.partition("(")[2].rpartition(")")
            if comm.startswith("containerd-shim") and rest.split()[0] != "Z":
                return f"{entry} {comm} {rest.split()[0]}"
    return ""


def leftovers(c: Containerd) -> dict[str, list[str]]:
    """What of `c` is still on the machine after cleanup: for tests to assert it is nothing."""
    out: dict[str, list[str]] = {"processes": [], "mounts": [], "cgroups": []}
    out["processes"] = [f"shim {pid}" for pid, _ in c.shim_pids()]
    prefix = c.base.rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        out["mounts"] = [line.split()[4] for line in f if line.split()[4].startswith(prefix)]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == b"containerd" and c.config_path.encode() in argv:
                out["processes"].append(f"containerd {entry}")
    if c.debian_root and c.daemon_pid and os.path.exists(f"/proc/{c.daemon_pid}"):
        out["processes"].append(f"containerd {c.daemon_pid} (in {c.debian_root})")  # argv has its inside path
    out["processes"] += [f"runc container {root} {cid}" for root, cid in c.runc_containers()]
    for h in _cgroup_hierarchies():
        for parent in dict.fromkeys(c.cgroup_parents):
            p = os.path.join(h, parent.strip("/"))
            if parent.strip("/") and os.path.isdir(p):
                out["cgroups"].append(p)
    return {k: v for k, v in out.items() if v}


# -- a containerd as containerd.service runs it (for --restart signal) -----------------------

def containerd_config(base) -> str:
    os.makedirs(base, exist_ok=True)
    return f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.monitor.v1.cgroups"]

[grpc]
  address = "{base}/containerd.sock"

[ttrpc]
  address = "{base}/containerd-ttrpc.sock"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{base}/opt"

  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
"""


class Supervised:
    """containerd run the way containerd.service runs it (Restart=always), in a thread."""

    def __init__(self, config, logs):
        self.config, self.logs = str(config), logs
        self.runs: list[tuple[subprocess.Popen, str]] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stopping:
            log = os.path.join(self.logs, f"containerd-{len(self.runs) + 1}.log")
            with open(log, "wb") as f:
                p = subprocess.Popen(["containerd", "--config", self.config], stdout=f, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            self.runs.append((p, log))
            p.wait()
            time.sleep(0.1)

    def booted(self, n: int, timeout: float = 20) -> str:
        """The log of run `n` once containerd said it booted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.runs) >= n:
                text = open(self.runs[n - 1][1], errors="replace").read()
                if "containerd successfully booted" in text:
                    return text
            time.sleep(0.05)
        raise AssertionError(f"containerd run {n} did not boot")

    def stop(self):
        self.stopping = True
        for p, _ in self.runs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        self.thread.join(10)


def cri_runtimes(log: str) -> str:
    line = next(line for line in log.splitlines() if "Start cri plugin with config" in line)
    return line[line.index("Runtimes:map["):line.index("] NoPivot:")]
