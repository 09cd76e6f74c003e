"""Shared fixtures for tests/unit, tests/e2e and tests/hardening: fake GPU hosts, busybox
bundles, the installed gpuhook-runtime, the containerd harness."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# The tests by what they test: unit/ (one module's behaviour), e2e/ (real containers through a
# runtime), hardening/ (hostile input, faults, load, fuzzing); perf/ is the benchmark. What
# they share is here, in the harnesses beside this file and in tests/fakes; a test module
# never imports another (tests/unit/test_suite_shape.py).
TESTS = os.path.dirname(os.path.abspath(__file__))
# fixtures kept beside what they serve: podman's CDI dir, the Debian sid node
pytest_plugins = ["podman_cdi", "sid_node"]

from fakes import bundle, fakehost  # noqa: E402

FIXTURES = os.path.join(REPO, "tests", "fixtures")


# -- `gpuhook ...` from this source tree: the one runner of the CLI ------------------------------

NO_CONFIG = "/nonexistent/gpuhook.toml"  # a GPUHOOK_CONFIG that is no file: the defaults, never the node's


def gpuhook(*args, env: dict | None = None, stdin: str | bytes | None = None, config: str | None = None,
            check: bool = False, text: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m gpuhook ARGS` (each str()'d) from this source tree, its output captured.
    env: over this process's environment; config: GPUHOOK_CONFIG (NO_CONFIG: the defaults;
    None: as the environment has it, so a --host-root command reads that root's); stdin: its
    input (else none); check: assert it exits 0, showing its output when not; text=False:
    bytes in and out."""
    full = dict(os.environ, **(env or {}))
    if config is not None:
        full["GPUHOOK_CONFIG"] = config
    r = subprocess.run([sys.executable, "-m", "gpuhook", *map(str, args)], cwd=REPO, env=full, capture_output=True,
                       text=text, timeout=timeout, input=stdin,
                       stdin=subprocess.DEVNULL if stdin is None else None)
    if check:
        ok(r)
    return r


def ok(r: subprocess.CompletedProcess) -> str:
    """Assert `r` exited 0 (its output in the message when not); its stdout."""
    assert r.returncode == 0, f"{r.args}: exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def refused(r: subprocess.CompletedProcess) -> str:
    """One clear line on stderr, exit 2, no traceback; that line."""
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuhook: "), r.stderr
    return lines[0]


def nodes_of(out: str) -> dict[str, tuple[int, int]]:
    """Lines "node PATH MAJOR:MINOR(hex) TYPE" (busybox stat -c '%n %t:%T %F') -> {path: (major, minor)}."""
    found = {}
    for line in out.splitlines():
        if line.startswith("node "):
            _, path, nums, *_ = line.split()
            major, minor = (int(x, 16) for x in nums.split(":"))
            found[path] = (major, minor)
    return found


def assert_8_nvidia_gpus(out: str) -> None:
    """What kubelet.SHOW printed in a container that got a fake 8-GPU NVIDIA host: its
    eight GPU nodes, the cgroup rule that lets it open one (ENXIO: no driver behind it, not
    EPERM), GPUHOOK_ACCELERATOR, and libcuda in its ld cache."""
    nodes = nodes_of(out)
    assert {p: nodes[p] for p in nodes if p[len("/dev/nvidia"):].isdigit()} == \
        {f"/dev/nvidia{m}": (195, m) for m in range(8)}, out
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in out, out  # the cgroup rule
    assert "accel=nvidia" in out, out
    assert "ldcache-none" not in out and int(out.strip().splitlines()[-1]) >= 1, out  # libcuda in its ld cache


def request(*, env: dict | None = None, annotations: dict | None = None, rootfs: str | None = "/run/b/rootfs",
            spec_devices: dict | None = None, mounts: tuple = (), userns: bool = False):
    """The one builder of plan.Request for tests: what a container brings (its env, annotations,
    rootfs, the devices and mounts its spec already has), by name."""
    from gpuhook.plan import Request

    return Request(dict(env or {}), dict(annotations or {}), rootfs, spec_devices, mounts, userns)


def create_line(decision="injected", pod="trainer-0", ns="ml", uid="uid-trainer-0", ctr="app", **kw) -> dict:
    """A create line of the node log as the agent reads it (test_podevents, test_follow_position)."""
    rec = {"time": "2026-01-01T00:00:00.000Z", "event": "create", "container_id": "c" * 64, "decision": decision,
           "pod_namespace": ns, "pod_name": pod, "pod_uid": uid, "container_name": ctr,
           "vendors": ["nvidia"] if decision == "injected" else [], "duration_ms": 12.5}
    if decision == "injected":
        rec["devices"] = ["nvidia:GPU-0", "nvidia:GPU-1"]
    rec.update(kw)
    return rec


def log_records(path: str) -> list[dict]:
    """The JSON lines of a gpuhook log (each create's line is written before the runtime runs)."""
    import json

    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def records(rt, cid: str) -> list[dict]:
    """The log records of one container (its id) of a conftest Runtime `rt`."""
    return [rec for rec in rt.log_records() if rec.get("container_id") == cid]


# -- a full disk: a small tmpfs of the test's own (root), for the node log's writers --------------

class FullDisk:
    """A tmpfs of `size` bytes at `path`: fill() takes every free page (a filler file), so
    that a file on it can grow only within its own last page; free() gives them back."""

    def __init__(self, path: str):
        self.path = path
        self.filler = os.path.join(path, "filler")

    def pad(self, log: str, slack: int) -> None:
        """Append one whole JSON line (event "pad") to `log` so that its last page has `slack`
        bytes left: a longer line than that does not fit once the disk is full."""
        import json

        page = os.sysconf("SC_PAGE_SIZE")
        size = os.path.getsize(log) if os.path.exists(log) else 0
        want = (size // page + 2) * page - slack - size  # the line's length, newline included
        empty = json.dumps({"time": "2026-01-01T00:00:00.000Z", "event": "pad", "x": ""}) + "\n"
        line = empty.replace('"x": ""', '"x": "' + "x" * (want - len(empty)) + '"')
        with open(log, "a") as f:
            f.write(line)
        assert os.path.getsize(log) % page == page - slack

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as f:
            for step in (1 << 16, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * step)
                except OSError:
                    pass

    def free(self) -> None:
        os.unlink(self.filler)


@pytest.fixture
def full_disk(tmp_path):
    """A FullDisk of 1 MiB, unmounted at the end (needs root: mount)."""
    if not is_root() and not REQUIRE_E2E:
        pytest.skip("needs root (mount a small tmpfs: a disk that fills)")
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "gpuhook-test-full", str(path)], check=True)
    try:
        yield FullDisk(str(path))
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# the runtime's front as `make` builds it in the source tree (gpuhook/runtime/gpuhook-runtime.c)
FRONT = os.path.join(REPO, "gpuhook", "runtime", "gpuhook-runtime")


def is_root() -> bool:
    return os.geteuid() == 0


def wrapper_path() -> str | None:
    """The gpuhook-runtime that `pip install .` put next to this interpreter (make test)."""
    p = os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime")
    return p if os.path.exists(p) else shutil.which("gpuhook-runtime")


# `make test` as root sets GPUHOOK_REQUIRE_E2E=1: there a missing tool fails the end-to-end
# tests instead of skipping them, so CI cannot pass without running them.
REQUIRE_E2E = os.environ.get("GPUHOOK_REQUIRE_E2E") == "1"


# a bundle's config.json for the runtime server's tests (a container with nothing of its own)
SERVER_SPEC = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["true"], "env": ["PATH=/bin"]},
               "linux": {}}


class ServerNode:
    """For the runtime server's tests: a cache dir, a fake 8-GPU host, a node config whose
    runtime records its argv (and fail_mode, unless None), a bundle; the front's Python is a
    stand-in that leaves a mark."""

    def __init__(self, tmp_path, make_host, fail_mode: str | None = None):
        import json

        self.tmp = tmp_path
        self.cache = str(tmp_path / "cache")
        self.host = make_host("nvidia", gpus=8)
        self.log = str(tmp_path / "gpuhook.log")
        self.argv_file = tmp_path / "runtime-argv"
        rt = tmp_path / "runc"
        rt.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {self.argv_file}\n')
        rt.chmod(0o755)
        self.config = tmp_path / "config.toml"
        self.config.write_text(f'runtime = "{rt}"\nhost_root = "{self.host}"\nlog_file = "{self.log}"\n'
                               + (f'fail_mode = "{fail_mode}"\n' if fail_mode is not None else ""))
        self.mark = tmp_path / "python-ran"
        py = tmp_path / "fake-python"
        py.write_text(f'#!/bin/sh\necho "$@" > {self.mark}\n')
        py.chmod(0o755)
        self.fake_python = str(py)
        self.bundle = tmp_path / "bundle"
        self.bundle.mkdir()
        (self.bundle / "config.json").write_text(json.dumps(SERVER_SPEC))
        self.proc: subprocess.Popen | None = None

    def env(self, **extra) -> dict:
        return {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(self.config), "GPUHOOK_CACHE_DIR": self.cache,
                "GPUHOOK_PYTHON": self.fake_python, **extra}

    def start_server(self, argv=None, **popen) -> subprocess.Popen:
        """The server (`gpuhook runtime-server`, or argv) with the node's environment, but the
        real Python: returned once its socket is there."""
        from fakes import runtime_server

        env = self.env()
        env.pop("GPUHOOK_PYTHON")
        self.proc = runtime_server.start(argv or [sys.executable, "-m", "gpuhook", "runtime-server"], env,
                                         cwd=self.tmp, **popen)
        return self.proc

    def front(self, *argv, binary=None, prefix=(), **env) -> subprocess.CompletedProcess:
        """The installed front (or binary), after prefix, with the node's environment and env."""
        if self.mark.exists():
            self.mark.unlink()
        return subprocess.run([*prefix, binary or wrapper_path(), *argv], env=self.env(**env), cwd=self.tmp,
                              capture_output=True, text=True, timeout=30)

def requires(ok: bool, reason: str):
    """skipif for end-to-end tests, except where they are required."""
    return pytest.mark.skipif(not ok and not REQUIRE_E2E, reason=reason)


needs_runc = requires(
    bool(is_root() and shutil.which("runc") and bundle.find_busybox() and wrapper_path()),
    "needs root, runc, busybox-static and an installed gpuhook-runtime (make test sets them up)")


def plan_on(inv, req, ldconfig=None, config=None, state_dir=None, helper=None):
    """plan() as a create runs it: the node state read first (probe/nodestate.py, from the
    inventory's root), then the pure plan. config None: the defaults, with no node log in the
    hooks' env (a dry plan). state_dir: the round robin's (None: no memory). ldconfig, helper:
    nodestate.read's (None: found on this machine)."""
    from gpuhook.config import Config
    from gpuhook.plan import plan
    from gpuhook.probe import nodestate

    config = config or Config(log_file="")
    return plan(inv, nodestate.read(inv, config, state_dir, ldconfig, helper), req, config)


@pytest.fixture
def make_host(tmp_path):
    """make_host("nvidia", mknod=True) -> path of a fake host root."""
    def make(scenario: str, mknod: bool | None = None, name: str | None = None, **kw) -> str:
        root = str(tmp_path / (name or f"host-{scenario.replace('+', '-')}"))
        if kw:
            fh = fakehost.FakeHost(root, mknod=is_root() if mknod is None else mknod)
            getattr(fakehost, scenario)(fh, **kw)
        else:
            fakehost.build(root, scenario, mknod=mknod)
        return root
    return make


class Runtime:
    """Runs containers through gpuhook-runtime with a node config of the test's own."""

    def __init__(self, tmp_path, host_root: str, **config):
        self.tmp = tmp_path
        self.state = str(tmp_path / "runc-state")
        self.log = str(tmp_path / "gpuhook.log")
        self.config = str(tmp_path / "gpuhook.toml")
        lines = [f'host_root = "{host_root}"', f'log_file = "{self.log}"']
        lines += [f'{k} = "{v}"' for k, v in config.items()]
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.env = dict(os.environ, GPUHOOK_CONFIG=self.config, GPUHOOK_CACHE_DIR=str(tmp_path / "cache"))
        self.ids: list[str] = []

    def bundle(self, name: str, args: list[str], **kw) -> str:
        b = str(self.tmp / name)
        bundle.make_bundle(b, args, **kw)
        return b

    def run(self, bundle_dir: str, cid: str, binary: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        binary = binary or wrapper_path()
        self.ids.append(cid)
        return subprocess.run([binary, "--root", self.state, "--log", str(self.tmp / f"{cid}.runc.log"),
                               "--log-format", "json", "run", "--bundle", bundle_dir, cid],
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def log_records(self) -> list[dict]:
        return log_records(self.log)

    def cleanup(self) -> None:
        for cid in self.ids:
            subprocess.run(["runc", "--root", self.state, "delete", "--force", cid], capture_output=True)


@pytest.fixture
def runtime(tmp_path):
    made = []

    def make(host_root: str, **config) -> Runtime:
        rt = Runtime(tmp_path, host_root, **config)
        made.append(rt)
        return rt
    yield make
    for rt in made:
        rt.cleanup()


# -- containerd end-to-end (test_e2e_containerd.py, test_e2e_cri.py) ------------------------

def containerd_skip_reason(cri: bool = False) -> str | None:
    """Why the containerd tests cannot run here, in words; None when they can."""
    import containerd_harness

    if not is_root():
        return "needs root (containerd, runc and mknod of GPU nodes)"
    missing = containerd_harness.missing_tools()
    if wrapper_path() is None:
        missing.append("an installed gpuhook-runtime (make venv)")
    if cri:
        import cri_client

        why = cri_client.available()
        if why:
            missing.append(why)
    if missing:
        return "missing: " + ", ".join(missing) + " (apt-get install containerd runc busybox-static; make venv)"
    return None


needs_containerd = pytest.mark.skipif(containerd_skip_reason() is not None,
                                      reason=containerd_skip_reason() or "")
needs_cri = pytest.mark.skipif(containerd_skip_reason(cri=True) is not None,
                               reason=containerd_skip_reason(cri=True) or "")


@pytest.fixture(scope="session")
def busybox_image_tar(tmp_path_factory) -> str:
    """An OCI image layout tar of a busybox-static image (containerd_harness.IMAGE_NAME)."""
    import containerd_harness

    path = str(tmp_path_factory.mktemp("image") / "busybox-oci.tar")
    containerd_harness.build_busybox_image(path)
    return path


@pytest.fixture
def containerd(tmp_path, busybox_image_tar):
    """containerd(rt, namespace=..., cri=..., runtimes=...) -> a started harness Containerd
    whose env carries the node config of `rt` (a conftest Runtime) to gpuhook-runtime, with
    the busybox image imported into `namespace` (k8s.io when cri). config_path and
    edit_config(path) let another tool change the written config.toml before containerd
    starts (e.g. `gpuhook install --host-root H --runtime containerd` on
    H/etc/containerd/config.toml). At teardown everything is cleaned up, and the test fails
    if anything was left behind."""
    import containerd_harness

    made = []

    def make(rt: Runtime, namespace: str = "gpuhook-test", cri: bool = False,
             runtimes: dict | None = None, config_path: str | None = None,
             edit_config=None, binds: dict | None = None,
             pid_namespace: bool = False) -> containerd_harness.Containerd:
        env = {k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}
        c = containerd_harness.Containerd(str(tmp_path / f"ctd{len(made)}"), env=env, cri=cri,
                                          runtimes=runtimes, config_path=config_path, binds=binds,
                                          pid_namespace=pid_namespace)
        made.append(c)
        c.write_config()
        if edit_config:
            edit_config(c.config_path)
        c.start(write_config=False)
        c.import_image(busybox_image_tar, containerd_harness.CRI_NAMESPACE if cri else namespace)
        return c
    yield make
    left = {}
    for c in made:
        forced = c.cleanup()
        if forced:  # cleaned up all the same, but the test did not end cleanly by itself
            import warnings

            warnings.warn(f"containerd cleanup had to force: {forced}")
        if containerd_harness.leftovers(c):
            left[c.base] = containerd_harness.leftovers(c)
    assert not left, f"left behind: {left}"


@pytest.fixture(scope="session")
def cri_stubs(tmp_path_factory):
    """(api_pb2, api_pb2_grpc) generated from tests/cri/api.proto for this session."""
    import cri_client

    return cri_client.generate(str(tmp_path_factory.mktemp("cri-stubs")))


@pytest.fixture(scope="session")
def gpuhook_image(tmp_path_factory):
    """`make image` itself (packaging/build-image.sh building its own bundle from the venv,
    default name) on a podman storage of this test's own; then `podman save` for `ctr images
    import` (containerd_harness.build_gpuhook_image)."""
    import containerd_harness

    image = containerd_harness.build_gpuhook_image(str(tmp_path_factory.mktemp("gpuhook-image")))
    yield image
    containerd_harness.remove_gpuhook_image(image)


@pytest.fixture(scope="session")
def real_bundle(tmp_path_factory) -> str:
    """The self-contained host bundle, built once per run by packaging/build-bundle.sh."""
    if shutil.which("ldd") is None:
        pytest.skip("the bundle build needs ldd (apt-get install libc-bin)")
    out = tmp_path_factory.mktemp("bundle") / "gpuhook"
    r = subprocess.run([os.path.join(REPO, "packaging", "build-bundle.sh"), str(out)],
                       env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return str(out)


# -- a pod's view of a node: `--restart systemd` from a container ----------------------------

# A static stand-in for the node's ldconfig: it makes /found in the root it runs in, which under
# gpuhook-hook is the container root the hook chose (its isolated root).
MARKER_LDCONFIG_C = '#include <fcntl.h>\nint main(void) { return open("/found", O_CREAT | O_WRONLY, 0644) < 0; }\n'


@pytest.fixture(scope="session")
def marker_ldconfig(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("marker-ldconfig")
    (d / "marker.c").write_text(MARKER_LDCONFIG_C)
    subprocess.run(["gcc", "-static", "-O2", "-o", str(d / "ldconfig"), str(d / "marker.c")], check=True,
                   capture_output=True)
    return str(d / "ldconfig")


def fake_systemctl(bin_dir, record, fail_line: str | None = None) -> None:
    """A stand-in `systemctl` in bin_dir: appends its argv, then the mount namespace it runs
    in, to `record`; fails with `fail_line` on stderr when given."""
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "systemctl")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {record}\nreadlink /proc/self/ns/mnt >> {record}\n'
                + (f"echo '{fail_line}' >&2; exit 1\n" if fail_line else ""))
    os.chmod(path, 0o755)


def run_as_pod(argv: list[str], pid1_ns_file, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run argv as a hostPID pod's process would run: a PID namespace of its own whose PID 1
    (the "host's init") stays in one mount namespace, written to pid1_ns_file, while argv
    runs in another (the container's). Root only (unshare)."""
    script = ('readlink /proc/self/ns/mnt > "$0"; '
              'unshare --mount --propagation private "$@"')
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script, str(pid1_ns_file),
                           *map(str, argv)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# -- the Kubernetes API (fakes.kubeapi) and the inventories the label tests share ---

@pytest.fixture
def fake_api():
    """fake_api(**kw) -> a started fakes.kubeapi.FakeAPI; all closed at the end."""
    from fakes.kubeapi import FakeAPI

    made = []

    def make(**kw) -> FakeAPI:
        api = FakeAPI(**kw)
        made.append(api)
        return api
    yield make
    for api in made:
        api.close()


def _label_inventories():
    from gpuhook.inventory import Device, Library, Node, VendorInventory

    nv = VendorInventory("nvidia", tuple(Device("nvidia", "gpu", i, f"GPU-{i}", (Node(f"/dev/nvidia{i}", "c", 195, i),),
                                                model="NVIDIA H100 80GB HBM3") for i in range(2)),
                         libraries=(Library("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "libcuda.so.1",
                                            "compute"),),
                         driver_version="550.54.14")
    intel = VendorInventory("intel", (Device("intel", "gpu", 0, "0000:00:02.0", (), model="Intel UHD 770"),))
    return nv, intel


# two H100s with a driver version, an Intel iGPU: what the node-label tests label
NV, INTEL = _label_inventories()


# -- the node agent (tests/unit/test_agent.py and the tests of what it writes) ---------------

@pytest.fixture
def logs():
    """gpuhook's log (gpuhook.log) as JSON lines in memory, debug and up: logs() -> its records."""
    import io
    import json

    from gpuhook import log

    out = io.StringIO()
    log.configure(stream=out, fmt="json", level="debug")
    yield lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    log.configure(stream=io.StringIO(), fmt="json")


def make_agent(tmp_path, root, **kw):
    """An agent (gpuhook.agent.core.Agent) on the host root `root`, writing its CDI specs to
    tmp_path/cdi and its NFD file to tmp_path/nfd, without udev, install or an API unless
    given: opts={...} over those Options, the rest to Agent."""
    from gpuhook import log
    from gpuhook.agent import core as agent_mod

    opts = dict(root=root, spec_root=root, interval=60.0, debounce=0.3, cdi_dir=str(tmp_path / "cdi"),
                nfd_dir=str(tmp_path / "nfd"), install=False, udev=False, ready_file=str(tmp_path / "ready"),
                ldconfig="/sbin/ldconfig")
    opts.update(kw.pop("opts", {}))
    kw.setdefault("kube", None)
    return agent_mod.Agent(agent_mod.Options(**opts), log=log.get(), **kw)


def read_state(tmp_path) -> tuple[dict, dict]:
    """What a CDI registry and NFD see now of make_agent's files: {kind: spec}, {label: value}.
    Raises on anything that does not parse: a half-written file would."""
    from gpuhook import cdi
    from gpuhook.agent import labels
    from fakes.cdi_yaml import load_yaml

    specs = {}
    d = tmp_path / "cdi"
    for name in sorted(os.listdir(d)) if d.is_dir() else ():
        if name.startswith("."):
            continue  # CDI reads *.yaml/*.json, NFD skips dotfiles: the temporary files
        try:
            text = (d / name).read_text()
        except FileNotFoundError:
            continue  # removed between listdir and open: the node lost that vendor
        spec = load_yaml(text)
        cdi.validate(spec)
        specs[spec["kind"]] = spec
    try:
        text = (tmp_path / "nfd" / "gpuhook").read_text()
    except FileNotFoundError:
        return specs, {}
    assert text.endswith("\n") and text.startswith("# Written by gpuhook")
    found = labels.parse_nfd(text)
    assert "gpuhook.dev/accelerator" in found, text
    # gpuhook.dev/ labels, and gpu.type (the node config's vendor_label) = the primary vendor
    assert all(labels.valid_key(k) or (k == "gpu.type" and v == found["gpuhook.dev/accelerator"])
               for k, v in found.items()), text
    return specs, found


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    """gpuhook's caches (probe, config, exec records) in the test's own directory, unless
    the test sets one: an agent or a create in a test never writes the node's /run/gpuhook."""
    if not os.environ.get("GPUHOOK_CACHE_DIR"):
        monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "gpuhook-cache"))


@pytest.fixture(autouse=True)
def _fresh_log(monkeypatch):
    """gpuhook.log configures itself on the stderr of the moment: a test's logger never writes to
    an earlier test session's closed capture (mutmut runs pytest several times in one process)."""
    if "gpuhook.log" in sys.modules:
        monkeypatch.setattr(sys.modules["gpuhook.log"], "_configured", False)


# -- dockerd (test_e2e_docker.py, test_e2e_docker_exec.py) -------------------------------------

@pytest.fixture
def dockerd(tmp_path):
    """dockerd(config_path, env, binds, **kw) -> a Dockerd whose daemon.json the test wrote
    (Dockerd.settings()) before start(). Stopped and cleaned up at the end; the test fails
    when anything of it is left."""
    import tempfile

    import docker_harness

    made = []

    def make(config_path: str, env: dict, binds: dict, **kw) -> "docker_harness.Dockerd":
        # a short base: dockerd's managed containerd puts sockets under exec-root
        d = docker_harness.Dockerd(tempfile.mkdtemp(prefix="gh-dockerd-", dir="/tmp"), config_path, env=env,
                                   binds=binds, **kw)
        made.append(d)
        return d
    yield make
    left = {}
    for d in made:
        d.stop()
        if d.leftovers():
            left[d.base] = d.leftovers()
        else:
            import shutil

            shutil.rmtree(d.base, ignore_errors=True)
    assert not left, f"left behind: {left}"
