"""The DaemonSet for real (root): the image `make image` builds (packaging/build-image.sh, no
registry), its pod template run the way kubelet runs it, and then a gpu-optional pod on that
node getting its GPUs through the bundle the pod installed.

Nothing of the DaemonSet is copied here: daemonset/ is rendered (`kubectl kustomize` where it
is installed, else the reader in test_install.py), and the pod template's image, command,
args, env, volumes with their mountPropagation, securityContext and readiness probe become CRI
calls (tests/cri_client.py) against a containerd of the test's own: RunPodSandbox (host
network, host PID), CreateContainer, StartContainer, and the readiness probe through ExecSync
every periodSeconds. The node's `/` is a throwaway fake GPU host (tests/fakes/fakehost.py) with its
own etc/containerd/config.toml; each hostPath is taken under it.

One thing the template asks cannot be given here: `--install-restart systemd|signal` would
restart this machine's containerd.service (this machine's PID 1 is no node's init). The test
plays systemd instead: it starts a containerd on the config the agent edited, which is what
the restart does on a node. That value alone is replaced (by `none`), nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import tomllib
import uuid

import pytest

from conftest import REPO, containerd_skip_reason, is_root, nodes_of, requires
from containerd_harness import IMAGE_NAME

pytestmark = [
    requires(containerd_skip_reason(cri=True) is None,
             containerd_skip_reason(cri=True) or ""),
    requires(is_root() and shutil.which("podman") is not None and shutil.which("ldconfig") is not None,
             "needs root, podman (the image build) and ldconfig"),
]

DAEMONSET_DIR = os.path.join(REPO, "daemonset")
HANDLER = "gpu-optional"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kubelet mounts the token
RESTART_FLAG = "--install-restart"
PROPAGATION = {None: "private", "None": "private", "HostToContainer": "host_to_container",
               "Bidirectional": "bidirectional"}
# run in the agent's container: gpuhook's --restart systemd step into PID 1's mount namespace
ENTER_PID1 = ("import glob, os, sys; sys.path.insert(0, glob.glob('/opt/gpuhook/lib/python3*/site-packages')[0]); "
              "from gpuhook.install import restart; fd, enter = restart._host_mount_namespace('/'); enter(); "
              "print(os.readlink('/proc/self/ns/mnt'))")
SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "echo accel=${GPUHOOK_ACCELERATOR:-none}; "
        "cat /dev/nvidia0 >/dev/null 2>/tmp/err && echo open ok || echo open: $(cat /tmp/err)")


# -- the manifests and the image --------------------------------------------------------------

def render() -> list[dict]:
    """daemonset/ as `kubectl apply -k` would send it."""
    import yaml

    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "kustomize", DAEMONSET_DIR], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return [d for d in yaml.safe_load_all(r.stdout) if d]
    from manifests import kustomize

    return kustomize()


def pod_template(docs: list[dict]) -> dict:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


# -- kubelet, for one pod template ---------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Kubelet:
    """Turns a pod template into CRI calls the way kubelet does, on a node whose / is `host`."""

    def __init__(self, ctd, cri, host: str, tmp_path, node_name: str) -> None:
        self.ctd, self.cri, self.host, self.tmp = ctd, cri, host, tmp_path
        self.node_name = node_name
        self.api_port = closed_port()  # the cluster's API server is nowhere: connections are refused

    def host_path(self, volume: dict) -> str:
        hp = volume.get("hostPath")
        assert hp is not None, f"volume {volume['name']}: only hostPath volumes can be given here"
        path = os.path.join(self.host, hp["path"].lstrip("/"))
        kind = hp.get("type", "")
        if kind == "DirectoryOrCreate":
            os.makedirs(path, exist_ok=True)
        elif kind == "Directory":
            assert os.path.isdir(path), f"hostPath {hp['path']} (type Directory) is not on the node"
        return path

    def env(self, container: dict, pod_name: str, namespace: str) -> dict:
        fields = {"spec.nodeName": self.node_name, "metadata.name": pod_name, "metadata.namespace": namespace}
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.api_port)}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            else:
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                assert path in fields, f"env {e['name']}: fieldRef {path} is not one this kubelet knows"
                env[e["name"]] = fields[path]
        return env

    def service_account(self, namespace: str) -> dict:
        """The projected token volume kubelet mounts (automountServiceAccountToken)."""
        d = self.tmp / "sa-token"
        d.mkdir(exist_ok=True)
        (d / "token").write_text("test-token-nobody-checks")
        (d / "namespace").write_text(namespace)
        return {"container_path": SA_DIR, "host_path": str(d), "readonly": True}

    def run(self, ds: dict, image: str, args_override=None):
        """RunPodSandbox + CreateContainer + StartContainer for the DaemonSet's one container;
        (pod id, container id, the container as the template has it, its log path)."""
        tpl = ds["spec"]["template"]
        spec = tpl["spec"]
        (c,) = spec["containers"]
        namespace = ds["metadata"].get("namespace", "default")
        pod_name = f"{ds['metadata']['name']}-{uuid.uuid4().hex[:5]}"
        assert spec.get("hostNetwork") is True, "no CNI here: only a host-network pod can run (and the agent needs it)"
        privileged = bool((c.get("securityContext") or {}).get("privileged"))
        host_pid = bool(spec.get("hostPID"))
        cgroup_parent = f"/gpuhook-test-{uuid.uuid4().hex[:12]}"
        self.ctd.cgroup_parents.append(cgroup_parent)
        log_dir = self.tmp / "pod-logs" / pod_name
        log_dir.mkdir(parents=True)
        sandbox = self.cri.sandbox_config(pod_name, namespace=namespace, log_directory=str(log_dir),
                                          cgroup_parent=cgroup_parent, labels=tpl["metadata"].get("labels"),
                                          host_pid=host_pid, privileged=privileged)
        pod_id = self.cri.run_pod_sandbox(sandbox)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = [{"container_path": m["mountPath"], "host_path": self.host_path(volumes[m["name"]]),
                   "readonly": bool(m.get("readOnly")), "propagation": PROPAGATION[m.get("mountPropagation")]}
                  for m in c.get("volumeMounts", [])]
        if spec.get("automountServiceAccountToken", True):
            mounts.append(self.service_account(namespace))
        args = list(c.get("args", []))
        if args_override:
            args = args_override(args)
        cid = self.cri.create_container(pod_id, sandbox, c["name"], image, command=c.get("command"), args=args,
                                        env=self.env(c, pod_name, namespace), log_path=f"{c['name']}/0.log",
                                        mounts=mounts, privileged=privileged, host_pid=host_pid)
        self.cri.start_container(cid)
        return pod_id, cid, c, str(log_dir / c["name"] / "0.log")

    def wait_ready(self, cid: str, probe: dict, timeout: float = 60) -> tuple[int, list]:
        """The exec readiness probe as kubelet runs it: after initialDelaySeconds, every
        periodSeconds, each within timeoutSeconds; (probes until the first success, results)."""
        cmd = probe["exec"]["command"]
        period = probe.get("periodSeconds", 10)
        limit = probe.get("timeoutSeconds", 1)
        time.sleep(probe.get("initialDelaySeconds", 0))
        deadline = time.monotonic() + timeout
        results = []
        while True:
            st = self.cri.container_status(cid).status
            assert st.state == self.cri.pb.CONTAINER_RUNNING, f"the agent's container is not running: {st}"
            t0 = time.monotonic()
            r = self.cri.exec_sync(cid, cmd, timeout=limit)
            results.append((r.exit_code, round(time.monotonic() - t0, 3), r.stderr.decode()[-200:]))
            if r.exit_code == 0:
                return len(results), results
            assert time.monotonic() < deadline, f"not ready after {timeout}s: {results}"
            time.sleep(period)


def read_log(path: str) -> list[dict]:
    """The container's CRI log: `<time> <stream> <P|F> <text>` lines, the agent's JSON records."""
    out = []
    with open(path) as f:
        for line in f:
            text = line.rstrip("\n").split(" ", 3)[3]
            try:
                out.append(json.loads(text))
            except ValueError:
                out.append({"event": "(not JSON)", "text": text})
    return out


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def agent_pid(ctd, ns_pid: int) -> int:
    """The pid here of the process that is `ns_pid` in the node's PID namespace (containerd's)."""
    want = os.readlink(f"/proc/{ctd.daemon_pid}/ns/pid")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != want:
                    continue
                with open(f"/proc/{entry}/status") as f:
                    nspid = next(line for line in f if line.startswith("NSpid:")).split()[1:]
            except (OSError, StopIteration):
                continue
            if int(nspid[-1]) == ns_pid:
                return int(entry)
    raise AssertionError(f"no process {ns_pid} in the node's PID namespace")


def restart_none(args: list[str]) -> list[str]:
    """The template's args with `--install-restart X` as `none` (see the module doc)."""
    if RESTART_FLAG in args:
        i = args.index(RESTART_FLAG)
        assert args[i + 1] in ("systemd", "signal", "none"), args
        return args[:i + 1] + ["none"] + args[i + 2:]
    return args


@pytest.fixture
def shared_host(make_host):
    """The node's /: a fake NVIDIA host, a mount point of its own made rshared, as systemd makes
    a node's / (containerd refuses mountPropagation HostToContainer from a private mount)."""
    host = make_host("nvidia", mknod=True)
    subprocess.run(["mount", "--bind", host, host], check=True)
    subprocess.run(["mount", "--make-rshared", host], check=True)
    yield host
    subprocess.run(["umount", "-l", host], capture_output=True)


# -- the tests ---------------------------------------------------------------------------------

def test_image_is_small_labelled_and_runs_gpuhook_from_the_bundle(gpuhook_image, real_bundle):
    from gpuhook import __version__

    (ds,) = [d for d in render() if d["kind"] == "DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["image"] == gpuhook_image["name"], "kustomization.yaml's images must name what `make image` builds"
    assert gpuhook_image["size"] <= 100_000_000, gpuhook_image["line"]  # grpcio (gpuhook dra): 19 MB of it
    labels = gpuhook_image["labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"].startswith("https://")
    podman = gpuhook_image["podman"].split()
    run = podman + ["--runtime", "runc", "run", "--rm", "--network", "none", "--ulimit", "nofile=20000:20000",
                    "--ulimit", "nproc=4096:4096", gpuhook_image["name"]]
    r = subprocess.run(run + ["gpuhook", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"gpuhook {__version__}", r.stderr
    # the agent's HTTPS (ssl, hashlib) loads; the interpreter's prefix is the bundle, which
    # `gpuhook install` copies to the node; no shell, no package manager
    script = ("import os, ssl, hashlib, sys; print(sys.prefix); "
              "print(all(not os.path.exists(p) for p in ('/bin/sh', '/bin', '/usr/bin/apt', '/sbin')))")
    r = subprocess.run(run + ["/opt/gpuhook/libexec/python3", "-IS", "-c", script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["/opt/gpuhook", "True"], r.stderr
    r = subprocess.run(run + ["gpuhook", "ready"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not ready" in r.stderr
    print(f"\n{gpuhook_image['line']} (built and saved in {gpuhook_image['seconds']:.1f}s)")


def test_daemonset_pod_installs_the_node_and_a_gpu_optional_pod_gets_the_gpus(
        shared_host, runtime, containerd, cri_stubs, gpuhook_image, tmp_path):
    import cri_client
    from gpuhook.agent import labels as labels_mod
    from gpuhook.install import core

    host = shared_host
    ds = pod_template(render())
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    rt = runtime(host)  # the node's gpuhook-runtime probes the fake host (GPUHOOK_CONFIG on containerd)
    node_config = os.path.join(host, "etc", "containerd", "config.toml")
    node_name = f"node-{uuid.uuid4().hex[:6]}"
    seen: dict = {}

    def daemonset_pod(config_path: str) -> None:
        """The node's containerd config is written and containerd is not started on it yet: the
        DaemonSet's pod runs (on a containerd of its own) and installs gpuhook there."""
        original = open(config_path, "rb").read()
        agent_ctd = containerd(rt, cri=True, pid_namespace=True)  # hostPID: a PID 1 the test owns
        agent_ctd.import_image(gpuhook_image["tar"], "k8s.io")
        cri = cri_client.CRIClient(agent_ctd.address, cri_stubs)
        agent_ctd.before_stop(cri.close)
        agent_ctd.before_stop(cri.remove_all)
        cri.wait_image(IMAGE_NAME)
        cri.wait_image(c["image"])
        kubelet = Kubelet(agent_ctd, cri, host, tmp_path, node_name)
        pod_id, cid, _, log_path = kubelet.run(ds, c["image"], restart_none)
        try:
            probes, results = kubelet.wait_ready(cid, c["readinessProbe"])
        except AssertionError:
            print("agent log:\n" + "\n".join(map(json.dumps, read_log(log_path))))
            raise
        seen["probes"] = results
        # the bundle (the image's own /opt/gpuhook) on the node, file for file
        with open(os.path.join(host, "opt", "gpuhook", "gpuhook-bundle.json")) as f:
            installed = json.load(f)
        with open(os.path.join(gpuhook_image["base"], "context", "build", "image", "rootfs", "opt", "gpuhook",
                               "gpuhook-bundle.json")) as f:
            assert installed == json.load(f)
        for rel in installed["files"]:
            assert os.path.isfile(os.path.join(host, "opt", "gpuhook", rel)), rel
        # the handler in the node's containerd config, the rest of it kept
        with open(config_path, "rb") as f:
            edited = tomllib.load(f)
        runtimes = edited["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
        assert runtimes[HANDLER]["options"]["BinaryName"] == core.BINARY
        assert tomllib.loads(original.decode())["root"] == edited["root"]
        # CDI specs and the NFD feature file under the node's /, the ready file in the pod
        cdi_dir = os.path.join(host, "var", "run", "cdi")
        specs = os.listdir(cdi_dir)
        assert specs and all(n.startswith("gpuhook") for n in specs), specs
        assert "nvidia7" in open(os.path.join(cdi_dir, specs[0])).read()
        nfd = open(os.path.join(host, "etc", "kubernetes", "node-feature-discovery", "features.d",
                                labels_mod.NFD_FILE)).read()
        assert "gpuhook.dev/runtime-ready=true" in nfd and "gpuhook.dev/accelerator=nvidia" in nfd
        r = cri.exec_sync(cid, c["readinessProbe"]["exec"]["command"])
        assert r.exit_code == 0
        # what --install-restart systemd does from this pod (replaced above): enter the mount
        # namespace of the host's PID 1 (hostPID, and privileged for setns), with gpuhook's own code
        r = cri.exec_sync(cid, ["/opt/gpuhook/libexec/python3", "-IS", "-c", ENTER_PID1])
        assert r.exit_code == 0 and r.stdout.decode().strip() == os.readlink(f"/proc/{agent_ctd.daemon_pid}/ns/mnt"), r
        # no API server: said once, and the agent keeps running, quietly (no crash loop, no busy loop)
        pid = agent_pid(agent_ctd, json.loads(cri.container_status(cid, verbose=True).info["info"])["pid"])
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(10)
        cpu = cpu_seconds(pid) - cpu0
        wall = time.monotonic() - t0
        st = cri.container_status(cid).status
        assert st.state == cri.pb.CONTAINER_RUNNING and agent_pid(agent_ctd, json.loads(
            cri.container_status(cid, verbose=True).info["info"])["pid"]) == pid
        assert cpu < 0.05 * wall, f"the idle agent used {cpu:.2f}s of CPU in {wall:.1f}s"
        records = read_log(log_path)
        events = [r.get("event") for r in records]
        print("\nagent log:\n" + "\n".join(map(json.dumps, records)))
        kube_errors = [r for r in records if r.get("event") == "kube.error"]
        # said, and once per request (the label sync, an Event), not again and again
        requests = [r["error"].split(":")[0] for r in kube_errors]
        assert requests and len(requests) == len(set(requests)), kube_errors
        assert all("Connection refused" in r["error"] for r in kube_errors), kube_errors
        start = next(r for r in records if r.get("event") == "agent.start")
        assert start["root"] == "/host" and start["node"] == node_name  # args and the downward API's NODE_NAME
        assert events.count("agent.start") == 1 and "ready" in events and "install" in events
        assert not any(r.get("level") == "error" for r in records), records
        seen.update(cpu=cpu, wall=wall, pod=pod_id)

    node_ctd = containerd(rt, cri=True, config_path=node_config, edit_config=daemonset_pod,
                          binds={core.PREFIX: os.path.join(host, core.PREFIX.lstrip("/"))})
    # containerd started on the config the agent edited (what --install-restart does on a node),
    # with the node's /opt/gpuhook at /opt/gpuhook: the handler runs the bundle the pod installed
    # the node's systemd starting the runtime server on its socket (gpuhook-runtime.socket, which
    # the agent's install writes): the installed bundle's own server, where the handler runs
    from fakes import runtime_server

    srv = runtime_server.start(["nsenter", "-t", str(node_ctd.proc.pid), "-m", "--",
                                os.path.join(core.PREFIX, "bin", "gpuhook"), "runtime-server"],
                               rt.env, stderr=subprocess.PIPE, text=True)
    node_ctd.before_stop(lambda: (srv.terminate(), srv.wait(timeout=10)))
    cri = cri_client.CRIClient(node_ctd.address, cri_stubs)
    node_ctd.before_stop(cri.close)
    node_ctd.before_stop(cri.remove_all)
    cri.wait_image(IMAGE_NAME)
    cgroup_parent = f"/gpuhook-test-{uuid.uuid4().hex[:12]}"
    node_ctd.cgroup_parents.append(cgroup_parent)
    log_dir = tmp_path / "gpu-pod-logs"
    log_dir.mkdir()
    config = cri.sandbox_config("gpu-pod", log_directory=str(log_dir), cgroup_parent=cgroup_parent)
    pod_id = cri.run_pod_sandbox(config, HANDLER)
    cid = cri.create_container(pod_id, config, "app", IMAGE_NAME, command=["sh", "-c", SHOW], log_path="app/0.log")
    cri.start_container(cid)
    status = cri.wait_exited(cid, 30)
    out = open(status.log_path).read()
    assert status.exit_code == 0, out
    nodes = nodes_of("\n".join(line.split(" ", 3)[3] for line in out.splitlines()))
    for minor in range(8):
        assert nodes[f"/dev/nvidia{minor}"] == (195, minor)
    assert "accel=nvidia" in out and "No such device or address" in out
    records = {r["container_id"]: r for r in rt.log_records()}
    assert records[cid]["decision"] == "injected" and records[pod_id]["decision"] == "sandbox"
    assert records[cid].get("runtime_server") is True, records[cid]  # the installed server made it
    print(f"\nagent: ready after {len(seen['probes'])} probe(s) {seen['probes']}; "
          f"idle CPU {seen['cpu']:.3f}s in {seen['wall']:.1f}s")
