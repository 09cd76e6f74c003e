"""The runtimes clusters run in 2026, from a Debian sid root: containerd 2.x (config version
3, CDI on by default), runc 1.3, crun 1.28, podman 5.8, Docker 28 (root).

The root (tests/debroot.py) is built once per machine by debootstrap and cached outside the
checkout; each test gets a writable overlay of it as its node (`gpuhook install --host-root`
edits that), and the daemons run with it as their real root, in PID and mount namespaces of
their own (tests/containerd_harness.py, tests/docker_harness.py with `debian_root`). The
test's tmp dir is mounted at the same path inside, so the fake GPU host, gpuhook's node config
and log, sockets and pod logs read the same from both sides. Where Debian's archive cannot be
reached these tests fail with one line that says so; they never skip as root.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

import debroot
from conftest import assert_8_nvidia_gpus, gpuhook, is_root, log_records, nodes_of, requires
from containerd_harness import CRI_NAMESPACE, IMAGE_NAME, Containerd, leftovers
from sid_node import cdi_spec_for, in_namespace, operator_config

pytestmark = requires(is_root(), "needs root (debootstrap, mounts, pivot_root)")

# -- containerd 2.x: its own default config (version 3), gpuhook install, CRI -----------------

@pytest.fixture
def sid_containerd(node, tmp_path, busybox_image_tar, cri_stubs):
    """start(env) -> (Containerd, CRIClient) for the node's containerd on its own config
    (written by the test first, at node/etc/containerd/config.toml)."""
    import cri_client

    made = []
    ctd = Containerd(str(tmp_path / "ctd"), cri=True, debian_root=node, visible=(str(tmp_path),),
                     config_path=os.path.join(node, "etc/containerd/config.toml"))

    def start(env: dict):
        ctd.env = {k: v for k, v in env.items() if k.startswith("GPUHOOK_")}
        ctd.start(write_config=False)
        ctd.import_image(busybox_image_tar, CRI_NAMESPACE)
        client = cri_client.CRIClient(ctd.address, cri_stubs)
        ctd.before_stop(client.close)
        ctd.before_stop(client.remove_all)
        client.wait_image(IMAGE_NAME)
        made.append(client)
        return client

    ctd.start_with = start
    yield ctd
    forced = ctd.cleanup()
    assert not leftovers(ctd), leftovers(ctd)
    assert not [f for f in forced if not f.startswith("shim ")], forced


def test_install_into_containerd_2_config_and_a_cri_pod_gets_the_gpus(node, sid_containerd, make_host, runtime,
                                                                      real_bundle, tmp_path):
    import grpc
    from conftest import records
    from kubelet import SHOW, Kubelet

    ctd = sid_containerd
    config = os.path.join(node, "etc/containerd/config.toml")
    os.makedirs(os.path.dirname(config), exist_ok=True)
    original = operator_config(node, ctd)
    with open(config, "wb") as f:
        f.write(original)
    out = gpuhook("install", "--runtime", "containerd", "--restart", "none", "--bundle-dir", real_bundle, "--host-root", node, check=True).stdout
    assert "handler gpu-optional added (config version 3" in out, out

    rt = runtime(make_host("nvidia", mknod=True))
    client = ctd.start_with(rt.env)
    assert client.version().runtime_version.lstrip("v").startswith("2."), client.version()  # the root's, over CRI
    k = Kubelet(ctd, client, tmp_path)
    pod_id, pod_config = k.run_pod("sid-gpu")
    status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert_8_nvidia_gpus(out)
    assert nodes_of(out)["/dev/nvidiactl"] == (195, 255)
    assert [r["decision"] for r in records(rt, status.id)] == ["injected"]
    assert [r["decision"] for r in records(rt, pod_id)] == ["sandbox"]
    # ExecSync: containerd 2.x's exec goes through the wrapper too
    sleeper = client.create_container(pod_id, pod_config, "sleeper", IMAGE_NAME, command=["sleep", "600"],
                                      log_path="sleeper/0.log")
    client.start_container(sleeper)
    r = client.exec_sync(sleeper, ["sh", "-c", "env | grep ^GPUHOOK_ | sort"])
    assert r.exit_code == 0, r
    env = r.stdout.decode().split()
    assert "GPUHOOK_ACCELERATOR=nvidia" in env and any(e.startswith("GPUHOOK_DEVICES=nvidia:GPU-") for e in env), env

    assert all("runtime_server" not in r for r in records(rt, status.id))  # a fresh interpreter each time

    # the runtime server, started where containerd runs (its mount and PID namespaces, the
    # bundle's own Python), serves the next create
    from fakes import runtime_server

    srv_env = {"PATH": debroot.PATH, **{k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}}
    srv = runtime_server.start([*ctd.enter(pid=True), "/opt/gpuhook/bin/gpuhook", "runtime-server"], srv_env,
                               stderr=subprocess.PIPE, text=True)
    status, out = k.run_to_completion(pod_id, pod_config, "served", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out)["/dev/nvidia7"] == (195, 7) and "accel=nvidia" in out, out
    rec = records(rt, status.id)
    assert [r["decision"] for r in rec] == ["injected"] and rec[0].get("runtime_server") is True, rec

    # a plain runc pod on the same containerd is left alone
    plain_id, plain_config = k.run_pod("sid-plain", handler="runc")
    status, out = k.run_to_completion(plain_id, plain_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out) == {} and "accel=none" in out and "GPUHOOK_" not in out, out
    assert records(rt, status.id) == [] and records(rt, plain_id) == []

    client.remove_all()
    gpuhook("uninstall", "--runtime", "containerd", "--restart", "none", "--host-root", node, check=True)
    with open(config, "rb") as f:
        assert f.read() == original  # byte for byte
    ctd.restart()  # the gRPC channel reconnects by itself
    srv.wait(timeout=10)  # gone with the old containerd's PID namespace
    client.wait_image(IMAGE_NAME)
    with pytest.raises(grpc.RpcError) as e:
        k.run_pod("after-uninstall")
    assert 'no runtime for "gpu-optional" is configured' in e.value.details()


def test_containerd_2_cdi_takes_gpuhooks_spec_for_a_plain_runc_pod(node, sid_containerd, make_host, real_bundle,
                                                                   tmp_path):
    """No gpuhook at create at all: containerd's own CDI (on by default in 2.x) reads
    gpuhook's spec for a `cdi.k8s.io/` annotation on a pod of the default runc handler."""
    from kubelet import SHOW, Kubelet

    ctd = sid_containerd
    config = os.path.join(node, "etc/containerd/config.toml")
    os.makedirs(os.path.dirname(config), exist_ok=True)
    with open(config, "wb") as f:
        f.write(operator_config(node, ctd))
    host = make_host("nvidia", mknod=True)
    cdi_spec_for(node, host, real_bundle)
    ctd.visible += (real_bundle,)  # the spec's hook
    client = ctd.start_with({})
    k = Kubelet(ctd, client, tmp_path)
    pod_id, pod_config = k.run_pod("sid-cdi", handler="runc")
    cid = client.create_container(pod_id, pod_config, "app", IMAGE_NAME, command=["sh", "-c", SHOW],
                                  log_path="app/0.log", annotations={"cdi.k8s.io/gpuhook": "gpuhook.dev/gpu=all"})
    client.start_container(cid)
    status = client.wait_exited(cid, 30)
    out = k.read_log(status.log_path)
    assert status.exit_code == 0, out
    assert_8_nvidia_gpus(out)  # CDI's nodes and cgroup rules, the spec's ld-cache hook
    # and without the annotation, the same handler gives nothing
    plain = client.create_container(pod_id, pod_config, "plain", IMAGE_NAME, command=["sh", "-c", SHOW],
                                    log_path="plain/0.log")
    client.start_container(plain)
    status = client.wait_exited(plain, 30)
    out = k.read_log(status.log_path)
    assert status.exit_code == 0 and nodes_of(out) == {} and "accel=none" in out, out


# -- podman 5: the precreate hook, and CDI --------------------------------------------------

PODMAN_SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
               "echo accel=${GPUHOOK_ACCELERATOR:-none}; cat /dev/nvidia0 2>&1; true")


def test_podman_5_precreate_hook_and_cdi_device(node, make_host, real_bundle, tmp_path):
    from fakes import bundle

    host = make_host("nvidia", mknod=True)
    rootfs = tmp_path / "rootfs"
    bundle.make_rootfs(str(rootfs))
    config = tmp_path / "gpuhook.toml"
    config.write_text(f'host_root = "{host}"\nlog_file = "{tmp_path}/gpuhook.log"\n')
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    (hooks / "gpuhook.json").write_text(json.dumps({
        "version": "1.0.0",
        "hook": {"path": f"{real_bundle}/bin/gpuhook", "args": ["gpuhook", "precreate"],
                 "env": [f"GPUHOOK_CONFIG={config}", f"GPUHOOK_CACHE_DIR={tmp_path}/cache"]},
        "when": {"always": True}, "stages": ["precreate"]}))
    store = tmp_path / "podman"

    def podman(*options: str, devices: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        argv = ["podman", "--root", f"{store}/root", "--runroot", f"{store}/run", "--storage-driver", "vfs",
                "--events-backend", "file", "--cgroup-manager", "cgroupfs", "--runtime", "runc", *options]
        run = ["run", "--rm", "--network", "none", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
               *(a for d in devices for a in ("--device", d)), "--rootfs", str(rootfs), "sh", "-c", PODMAN_SHOW]
        return in_namespace(node, shlex.join(argv + run), (str(tmp_path), real_bundle, host),
                            env={"PODMAN_IGNORE_CGROUPSV1_WARNING": "1"})

    version = in_namespace(node, "podman --version", (str(tmp_path),)).stdout
    assert version.startswith("podman version 5."), version
    r = podman("--hooks-dir", str(hooks))
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert all(nodes[f"/dev/nvidia{m}"] == (195, m) for m in range(8)), r.stdout
    assert "accel=nvidia" in r.stdout and "No such device or address" in r.stdout, r.stdout

    # CDI: podman's own, from the spec the bundle wrote into the root's /etc/cdi; no hooks dir
    cdi_spec_for(node, host, real_bundle)
    r = podman(devices=("gpuhook.dev/gpu=all",))
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert all(nodes[f"/dev/nvidia{m}"] == (195, m) for m in range(8)), r.stdout
    assert "accel=nvidia" in r.stdout and "No such device or address" in r.stdout, r.stdout
    # neither: nothing
    r = podman()
    assert r.returncode == 0 and nodes_of(r.stdout) == {} and "accel=none" in r.stdout, r.stdout + r.stderr


# -- Docker 28: gpuhook install into daemon.json, --runtime gpu-optional, docker exec -------

def test_docker_28_runtime_gpu_optional_and_docker_exec(node, dockerd, make_host, runtime, real_bundle, tmp_path):
    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    daemon_json = os.path.join(node, "etc/docker/daemon.json")
    d = dockerd(daemon_json, {k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}, {},
                debian_root=node, visible=(str(tmp_path),))
    os.makedirs(os.path.dirname(daemon_json), exist_ok=True)
    with open(daemon_json, "w") as f:
        json.dump(d.settings(), f, indent=2)
    original = open(daemon_json, "rb").read()
    out = gpuhook("install", "--runtime", "docker", "--restart", "none", "--bundle-dir", real_bundle, "--host-root", node, check=True).stdout
    assert "gpu-optional" in out, out
    d.start()
    assert d.docker("version", "--format", "{{.Server.Version}}").stdout.startswith("28."), "sid's dockerd"
    image = "localhost/gpuhook-sid-busybox:test"
    d.import_busybox(image)
    cid = d.docker("run", "-d", "--runtime", "gpu-optional", "--network", "none", image, "sleep", "600").stdout.strip()
    show = "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; stat -c '%t:%T' /dev/nvidia1"
    out = d.docker("exec", cid, "sh", "-c", show).stdout.split()
    assert out[0] == "accel=nvidia" and out[1].count("nvidia:GPU-") == 2 and out[2] == "c3:1", out
    assert [r["decision"] for r in rt.log_records() if r["container_id"] == cid] == ["injected"]
    plain = d.docker("run", "-d", "--network", "none", image, "sleep", "600").stdout.strip()
    out = d.docker("exec", plain, "sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}; ls /dev").stdout.split()
    assert out[0] == "accel=none" and not [n for n in out if n.startswith("nvidia")], out
    d.docker("rm", "-f", cid, plain)
    d.stop()
    gpuhook("uninstall", "--runtime", "docker", "--restart", "none", "--host-root", node, check=True)
    assert open(daemon_json, "rb").read() == original


# -- crun 1.28 as the real runtime under the wrapper -----------------------------------------

CRUN_SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
             "echo accel=${GPUHOOK_ACCELERATOR:-none}; cat /dev/nvidia0 2>&1; true")


def test_crun_1_28_under_the_wrapper(node, make_host, real_bundle, tmp_path):
    """crun refuses this host's hybrid cgroup layout (its unified hierarchy has a controller),
    so it runs where /sys/fs/cgroup is cgroup2 alone: device rules are eBPF programs there,
    and the ENXIO/EPERM pair shows gpuhook's rule is what lets the container open the node."""
    from fakes import bundle

    host = make_host("nvidia", mknod=True)
    config = tmp_path / "gpuhook.toml"
    config.write_text(f'host_root = "{host}"\nlog_file = "{tmp_path}/gpuhook.log"\nruntime = "crun"\n')
    env = {"GPUHOOK_CONFIG": str(config), "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")}
    state = tmp_path / "crun-state"

    def run(binary: str, bundle_dir: str, cid: str) -> subprocess.CompletedProcess:
        return in_namespace(node, "mount -t cgroup2 gpuhook-test /sys/fs/cgroup && "
                            f"exec {binary} --root {state} run --bundle {bundle_dir} {cid}",
                            (str(tmp_path), real_bundle, host), env=env)

    assert in_namespace(node, "crun --version", (str(tmp_path),)).stdout.startswith("crun version 1.")
    b = str(tmp_path / "b")
    bundle.make_bundle(b, ["sh", "-c", CRUN_SHOW])
    r = run(f"{real_bundle}/bin/gpuhook-runtime", b, "crun-gpu")
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert all(nodes[f"/dev/nvidia{m}"] == (195, m) for m in range(8)), r.stdout
    assert "accel=nvidia" in r.stdout and "No such device or address" in r.stdout, r.stdout
    recs = log_records(str(tmp_path / "gpuhook.log"))
    assert [(x["container_id"], x["decision"]) for x in recs] == [("crun-gpu", "injected")]
    # the control: crun alone, the node listed but no rule: the eBPF program says no
    b2 = str(tmp_path / "b2")
    bundle.make_bundle(b2, ["sh", "-c", "cat /dev/nvidia0 2>&1; true"])
    with open(os.path.join(b2, "config.json")) as f:
        spec = json.load(f)
    spec["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    with open(os.path.join(b2, "config.json"), "w") as f:
        json.dump(spec, f)
    r = run("crun", b2, "crun-plain")
    assert r.returncode == 0 and "Operation not permitted" in r.stdout, r.stdout + r.stderr
