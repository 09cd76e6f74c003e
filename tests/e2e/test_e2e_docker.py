"""Docker end to end: `gpuhook install --runtime docker` on a real dockerd (Debian's docker.io).

The test's dockerd reads NODE/etc/docker/daemon.json (its own data-root, exec-root, pidfile,
socket, no iptables, no bridge, vfs; see docker_harness.py), the file gpuhook install edits;
the host bundle that install copies to NODE/opt/gpuhook is at /opt/gpuhook for dockerd alone
(a mount namespace of its own), where daemon.json's runtime path points.

  1. a container runs (plain runc), then `gpuhook install --restart signal`: dockerd gets
     SIGHUP, reloads its runtimes (`docker info` lists gpu-optional with our path), keeps its
     pid, its default runtime and the running container;
  2. `docker run --runtime gpu-optional` on a fake 8-GPU NVIDIA host: the nodes with their
     numbers, the cgroup allows them (ENXIO, not EPERM), libcuda in the container's ld
     cache, GPUHOOK_ACCELERATOR=nvidia; the same through a Compose file with
     `runtime: gpu-optional`; on a CPU-only host the container runs untouched;
  3. `gpuhook uninstall --restart signal`: daemon.json byte for byte, the runtime gone from
     the live dockerd, the running container still running;
  4. beside a running containerd (supervised as containerd.service runs it): installed for each
     on its own, `uninstall --runtime containerd` takes containerd's handler only, plain
     uninstall the rest.
"""

from __future__ import annotations

import json
import os
import time


from conftest import gpuhook, is_root, nodes_of, requires
from containerd_harness import Supervised, containerd_config, cri_runtimes
from fakes import bundle

import docker_harness

BINARY = "/opt/gpuhook/bin/gpuhook-runtime"
IMAGE = "localhost/gpuhook/busybox:docker-test"
SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; "
        "[ -e /dev/nvidia0 ] && { cat /dev/nvidia0 >/dev/null 2>/tmp/err; echo open: $(cat /tmp/err); }; "
        "echo ldcache=$(grep -c libcuda.so.1 /etc/ld.so.cache 2>/dev/null || echo 0); true")

COMPOSE = """\
services:
  worker:
    image: {image}
    runtime: gpu-optional
    network_mode: none
    command: ["sh", "-c", {show}]
"""

pytestmark = requires(bool(is_root() and not docker_harness.missing_tools() and bundle.find_busybox()),
                      "needs root, Debian's docker.io (dockerd, docker), containerd, runc and busybox-static "
                      f"(make deps installs them); missing: {', '.join(docker_harness.missing_tools()) or 'none'}")


def runtimes(d: docker_harness.Dockerd) -> dict:
    return d.info()["Runtimes"]


def wait_for(check, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def test_docker_run_gets_the_gpus_through_the_installed_runtime(tmp_path, make_host, runtime, real_bundle, dockerd):
    gpu_host = make_host("nvidia", mknod=True)
    cpu_host = make_host("cpu")
    rt = runtime(gpu_host)  # its node config reaches gpuhook-runtime through dockerd's environment
    env = {"GPUHOOK_CONFIG": rt.config, "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")}

    node = tmp_path / "node"
    (node / "etc" / "docker").mkdir(parents=True)
    (node / "opt" / "gpuhook").mkdir(parents=True)  # bind-mounted at /opt/gpuhook for dockerd; install fills it
    os.symlink("/proc", node / "proc")  # the "host's" /proc: this machine's (for --restart signal)
    daemon_json = node / "etc" / "docker" / "daemon.json"
    d = dockerd(str(daemon_json), env, {"/opt/gpuhook": str(node / "opt" / "gpuhook")})
    original = (json.dumps(d.settings(), indent=4) + "\n").encode()
    daemon_json.write_bytes(original)
    d.start()
    d.import_busybox(IMAGE)
    assert "gpu-optional" not in runtimes(d)
    keep = d.docker("run", "-d", "--network", "none", IMAGE, "sleep", "600").stdout.strip()
    started = d.docker("inspect", "-f", "{{.State.StartedAt}}", keep).stdout.strip()

    # 1. install, and dockerd reloads on SIGHUP
    out = gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", real_bundle,
                  "--restart", "signal", check=True, timeout=300).stdout
    assert f"restart: sent SIGHUP to dockerd (pid {d.pid})" in out, out
    doc = json.loads(daemon_json.read_text())
    assert list(doc) == list(d.settings()) + ["runtimes"]
    assert doc["runtimes"] == {"gpu-optional": {"path": BINARY}}
    live = wait_for(lambda: runtimes(d).get("gpu-optional"), "dockerd lists the gpu-optional runtime")
    assert live["path"] == BINARY
    info = d.info()
    assert info["DefaultRuntime"] == "runc"
    assert d.proc.poll() is None  # the same dockerd: a reload, not a restart
    assert d.docker("inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", keep).stdout.split() == ["true", started]
    assert d.docker("exec", keep, "echo", "alive").stdout.strip() == "alive"

    # 2. a GPU host: the nodes, the cgroup rules, the libraries, the env
    r = d.docker("run", "--rm", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sh", "-c", SHOW)
    nodes = nodes_of(r.stdout)
    assert [nodes[f"/dev/nvidia{i}"] for i in range(8)] == [(195, i) for i in range(8)], r.stdout
    assert nodes["/dev/nvidiactl"] == (195, 255)
    assert nodes["/dev/nvidia-uvm"] == (510, 0)
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in r.stdout  # not EPERM
    assert "accel=nvidia" in r.stdout
    assert r.stdout.count(",nvidia:GPU-") == 7
    assert "ldcache=0" not in r.stdout and "ldcache=" in r.stdout
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected" and rec["vendors"] == ["nvidia"], rec

    # the Compose file of docs/install.md (Docker): `runtime: gpu-optional`
    project = tmp_path / "compose"
    project.mkdir()
    (project / "compose.yaml").write_text(COMPOSE.format(image=IMAGE, show=json.dumps(SHOW.replace("$", "$$"))))  # $$: no interpolation
    name = f"gh{os.getpid()}"
    r = d.compose(str(project), "-p", name, "run", "--rm", "-T", "worker")
    assert r.returncode == 0, r.stderr
    assert nodes_of(r.stdout)["/dev/nvidia7"] == (195, 7) and "accel=nvidia" in r.stdout, r.stdout + r.stderr
    assert d.compose(str(project), "-p", name, "down").returncode == 0
    rec = rt.log_records()[-1]
    assert rec["decision"] == "injected" and rec["container_id"] != keep

    # the default runtime is not gpuhook's
    r = d.docker("run", "--rm", "--network", "none", IMAGE, "sh", "-c", SHOW)
    assert "accel=none" in r.stdout and not nodes_of(r.stdout)
    assert rt.log_records()[-1] == rec

    # a CPU-only host: the container runs untouched
    with open(rt.config, "w") as f:
        f.write(f'host_root = "{cpu_host}"\nlog_file = "{rt.log}"\n')
    r = d.docker("run", "--rm", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sh", "-c", SHOW)
    assert "accel=none" in r.stdout and "devices=none" in r.stdout and not nodes_of(r.stdout)
    assert rt.log_records()[-1]["decision"] == "no-gpu"

    # 3. uninstall: the bytes back, the runtime gone from the live daemon, the container kept
    out = gpuhook("uninstall", "--host-root", node, "--restart", "signal", "--keep-bundle", check=True, timeout=300).stdout
    assert "original restored byte for byte" in out and f"sent SIGHUP to dockerd (pid {d.pid})" in out
    assert daemon_json.read_bytes() == original
    assert d.proc.poll() is None
    assert d.docker("inspect", "-f", "{{.State.Running}} {{.State.StartedAt}}", keep).stdout.split() == ["true", started]
    # dockerd reloads runtimes only from a file that sets the key, and this one has none:
    # uninstall says so; the next start of dockerd has no gpu-optional
    assert 'now has no "runtimes"' in out and "until its next restart" in out
    d.docker("rm", "-f", keep)
    d.restart()
    assert "gpu-optional" not in runtimes(d)
    r = d.docker("run", "--rm", "--runtime", "gpu-optional", "--network", "none", IMAGE, "true", check=False)
    assert r.returncode != 0 and "gpu-optional" in r.stderr


def test_uninstall_reload_drops_the_runtime_when_the_file_keeps_runtimes(tmp_path, make_host, runtime,
                                                                       real_bundle, dockerd):
    """An operator's daemon.json with a runtimes object of its own: install adds ours beside
    it, uninstall gives the bytes back and the SIGHUP drops gpu-optional from the live daemon."""
    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    node = tmp_path / "node"
    (node / "etc" / "docker").mkdir(parents=True)
    (node / "opt" / "gpuhook").mkdir(parents=True)
    os.symlink("/proc", node / "proc")
    daemon_json = node / "etc" / "docker" / "daemon.json"
    d = dockerd(str(daemon_json), {"GPUHOOK_CONFIG": rt.config}, {"/opt/gpuhook": str(node / "opt" / "gpuhook")})
    settings = dict(d.settings(), runtimes={"plain-runc": {"path": "/usr/bin/runc"}})
    original = json.dumps(settings, indent="\t").encode()  # no final newline, tabs
    daemon_json.write_bytes(original)
    d.start()
    d.import_busybox(IMAGE)
    assert "plain-runc" in runtimes(d) and "gpu-optional" not in runtimes(d)
    gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", real_bundle, "--restart", "signal", check=True, timeout=300)
    wait_for(lambda: "gpu-optional" in runtimes(d), "dockerd lists the gpu-optional runtime")
    assert json.loads(daemon_json.read_text())["runtimes"] == {"plain-runc": {"path": "/usr/bin/runc"},
                                                               "gpu-optional": {"path": BINARY}}
    r = d.docker("run", "--rm", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sh", "-c", SHOW)
    assert nodes_of(r.stdout)["/dev/nvidia1"] == (195, 1) and "accel=nvidia" in r.stdout
    out = gpuhook("uninstall", "--host-root", node, "--restart", "signal", check=True, timeout=300).stdout
    assert "original restored byte for byte" in out and "now has no" not in out
    assert daemon_json.read_bytes() == original
    wait_for(lambda: "gpu-optional" not in runtimes(d), "dockerd drops the gpu-optional runtime")
    assert runtimes(d)["plain-runc"]["path"] == "/usr/bin/runc"


def test_docker_and_containerd_side_by_side(tmp_path, make_host, runtime, real_bundle, dockerd):
    """A Kubernetes node whose containerd serves the kubelet and which runs dockerd too, both
    daemons running: gpuhook installed for each on its own (`--runtime auto` says what it
    found), `uninstall --runtime containerd` takes containerd's handler (its file byte for
    byte, containerd restarted) and keeps dockerd's and the shared bundle (a gpu-optional
    container still gets its GPUs through dockerd), plain uninstall takes the rest."""
    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    node = tmp_path / "node"
    for d_ in ("etc/docker", "etc/containerd", "opt/gpuhook"):
        (node / d_).mkdir(parents=True)
    os.symlink("/proc", node / "proc")
    ctd_toml = node / "etc" / "containerd" / "config.toml"
    ctd_original = containerd_config(tmp_path / "ctd").encode()
    ctd_toml.write_bytes(ctd_original)
    daemon_json = node / "etc" / "docker" / "daemon.json"
    d = dockerd(str(daemon_json), {"GPUHOOK_CONFIG": rt.config}, {"/opt/gpuhook": str(node / "opt" / "gpuhook")})
    # a runtimes object of the operator's: dockerd's SIGHUP then drops ours on uninstall
    docker_original = (json.dumps(dict(d.settings(), runtimes={"plain-runc": {"path": "/usr/bin/runc"}}),
                                  indent=2) + "\n").encode()
    daemon_json.write_bytes(docker_original)
    d.start()
    d.import_busybox(IMAGE)
    sup = Supervised(ctd_toml, tmp_path / "ctd")
    try:
        assert "gpu-optional" not in cri_runtimes(sup.booted(1))
        gpuhook("install", "--host-root", node, "--runtime", "containerd", "--bundle-dir", real_bundle,
                "--restart", "signal", check=True, timeout=300)
        assert "gpu-optional:{Type:io.containerd.runc.v2" in cri_runtimes(sup.booted(2))
        assert "gpu-optional" not in runtimes(d)

        (node / "var" / "lib" / "kubelet").mkdir(parents=True)
        out = gpuhook("install", "--host-root", node, "--bundle-dir", real_bundle, "--restart", "signal", check=True, timeout=300).stdout
        assert ("runtime auto: found dockerd (/etc/docker/daemon.json); containerd (/etc/containerd/config.toml); "
                "a kubelet (/var/lib/kubelet): installing for containerd, the kubelet's runtime, and dockerd "
                "beside it") in out, out
        assert "containerd: /etc/containerd/config.toml: handler gpu-optional already in place" in out
        assert f"restart: sent SIGHUP to dockerd (pid {d.pid})" in out, out
        wait_for(lambda: "gpu-optional" in runtimes(d), "dockerd lists the gpu-optional runtime")
        assert len(sup.runs) == 2  # containerd's config unchanged: not restarted

        out = gpuhook("uninstall", "--host-root", node, "--runtime", "containerd", "--restart", "signal", check=True, timeout=300).stdout
        assert "kept for docker (still installed)" in out, out
        assert ctd_toml.read_bytes() == ctd_original
        assert "gpu-optional" not in cri_runtimes(sup.booted(3))
        assert runtimes(d)["gpu-optional"]["path"] == BINARY
        r = d.docker("run", "--rm", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sh", "-c", SHOW)
        assert nodes_of(r.stdout)["/dev/nvidia1"] == (195, 1) and "accel=nvidia" in r.stdout, r.stdout

        out = gpuhook("uninstall", "--host-root", node, "--restart", "signal", check=True, timeout=300).stdout
        assert "runtime docker" in out.splitlines()[0], out
        assert daemon_json.read_bytes() == docker_original
        wait_for(lambda: "gpu-optional" not in runtimes(d), "dockerd drops the gpu-optional runtime")
        assert len(sup.runs) == 3  # containerd's handler had gone already: not restarted again
        assert not (node / "opt" / "gpuhook").exists() and not (node / "etc" / "gpuhook").exists()
    finally:
        sup.stop()
