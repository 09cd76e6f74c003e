"""A Kubernetes node of the test cluster: a Debian sid root with its own containerd, its own
kubelet and kube-proxy (the release the other helper builds, tests/cluster/gobuild.py), its
pods' network (CNI bridge + host-local) and a fake GPU host (tests/fakes/fakehost.py).

Each node is one process tree in namespaces of its own:
- network: `eth0`, a veth whose other end is on the host bridge BRIDGE (HOST_ADDRESS, where
  the apiserver listens); the node's address NET.<10 + index>, its pods' 10.252.<index>.0/24.
- mount: an overlay over the cached sid root (tests/debroot.py) as its real root
  (pivot_root), /var/lib/{containerd,kubelet} and /var/log plain directories of its own; a
  fresh /proc and /sys (its own PIDs, its own network devices), the host's cgroup
  hierarchies, a /dev of its own; and over those the fake host's files: /proc/driver,
  /proc/devices, its PCI devices, DRM and KFD classes and PCI drivers merged into /sys, its
  /dev nodes (real majors), its libraries (the node's own ldconfig lists them).
- PID: the node's init is PID 1 (INIT below, a shell): it starts containerd, kubelet and
  kube-proxy and starts each again when it exits (systemd's Restart=always), except while
  /run/node/<daemon>.down is there (a failed node). `systemctl` on the node is a stand-in
  (SYSTEMCTL): `restart containerd` restarts it through the init, as a node's systemd
  would; nothing else of systemd is there (no /run/systemd/system).
- cgroups: kubelet's cgroupRoot is CGROUP/<node> in every v1 hierarchy (cgroupfs driver).

Everything a node starts dies with its init (its PID namespace). A run killed from outside
leaves: the nodes' inits (their argv carries MARK), the bridge, the cgroups under CGROUP and the
directories under BASE. `cleanup_leftovers()` (called before each run, under LOCK) kills those
inits, deletes the bridge and the cgroups and removes BASE: the next run starts clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from controlplane import ADDRESS as HOST_ADDRESS  # the host's end of the bridge, the apiserver's
from controlplane import BRIDGE, CLUSTER_CIDR, PREFIX, SUBNET

BASE = os.environ.get("GPUHOOK_CLUSTER_DIR", "/var/tmp/gpuhook-cluster")
MARK = "gpuhook-cluster-node"  # in each node init's argv: what cleanup_leftovers kills
NET = SUBNET.rsplit(".", 1)[0]  # the nodes' addresses: NET.<10 + index>
POD_NET = CLUSTER_CIDR.split(".0.0/")[0]  # each node's pods: POD_NET.<index>.0/24
CGROUP = "gpuhook-cluster"
VETH_PREFIX = "ghn-"  # the host ends of the nodes' veths
CGROUP_FS = "/sys/fs/cgroup"
CNI_CONF = "10-gpuhook-cluster.conflist"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGES = "/var/lib/gpuhook-images"  # the node's view of BASE/images (image tars to import)
DAEMONS = ("containerd", "kubelet", "kube-proxy")
STATIC_PODS = "/etc/kubernetes/manifests"  # the kubelet's staticPodPath: pods it runs with no API
# The nodes' zone (their kubelets' --node-labels). The node lifecycle controller evicts per
# zone, and stops evicting in a zone where more than 55 % of over two nodes are NotReady
# (--unhealthy-zone-threshold; "partial disruption"): the Node objects with no kubelet that
# the admission tests make (NotReady for ever, no zone) must not count with these.
ZONE = "gpuhook-test"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    host: str  # the fake host: a fakehost.SCENARIOS name
    index: int  # 1..: its addresses
    labels: tuple[tuple[str, str], ...] = ()  # its kubelet's --node-labels (besides its zone)

    @property
    def address(self) -> str:
        return f"{NET}.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"{POD_NET}.{self.index}.0/24"


# the three nodes of the issue: 8 NVIDIA GPUs, AMD GPUs, none
NVIDIA = NodeSpec("node-nvidia", "nvidia", 1)
AMD = NodeSpec("node-amd", "amd", 2)
CPU = NodeSpec("node-cpu", "cpu", 3)
NODES = (NVIDIA, AMD, CPU)


class NodeError(RuntimeError):
    """A node could not be started; str() says why in one line (and where its logs are)."""


def run(argv: list[str], timeout: float = 60, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    if check and r.returncode != 0:
        raise NodeError(f"{shlex.join(argv)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r


# -- leftovers of an earlier run, the lock, the bridge -------------------------------------------

def marked_pids(mark: str = MARK) -> list[int]:
    """The processes of this harness still running: node inits (`mark` in their argv)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if mark.encode() in argv:
            found.append(int(entry))
    return found


def _cgroup_dirs(cgroup: str) -> list[str]:
    out = []
    for ctrl in sorted(os.listdir(CGROUP_FS)) if os.path.isdir(CGROUP_FS) else ():
        d = os.path.join(CGROUP_FS, ctrl, cgroup)
        if os.path.isdir(d):
            out.append(d)
    return out


def remove_cgroup_tree(top: str, timeout: float = 20) -> list[str]:
    """rmdir `top` and everything under it, deepest first (a cgroup goes once its tasks have);
    what is still there at the end."""
    deadline = time.monotonic() + timeout
    while os.path.isdir(top):
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda x: -x[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if not os.path.isdir(top) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [top] if os.path.isdir(top) else []


def cleanup_leftovers(mark: str = MARK, base: str = BASE, cgroup: str = CGROUP) -> list[str]:
    """Remove what an earlier (killed) run left: the node inits (and with each its PID
    namespace: kubelet, containerd, shims, containers), the cgroups, BASE; what was found,
    in words."""
    found = []
    pids = marked_pids(mark)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        found.append(f"node processes {pids}")
        deadline = time.monotonic() + 10
        while marked_pids(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
    # a node's network namespace, and its veth with it, goes a moment after its last process
    # (the kernel frees it later): a host end still there is deleted (the pair goes with it)
    for name in sorted(os.listdir("/sys/class/net")):
        if name.startswith(VETH_PREFIX) and mark == MARK:
            run(["ip", "link", "del", name], check=False)
            found.append(f"veth {name}")
    for d in _cgroup_dirs(cgroup):
        remove_cgroup_tree(d)
        found.append(d)
    if os.path.isdir(base):
        # the nodes' mounts were in their own mount namespaces: nothing of BASE is mounted here
        # (unless someone mounted it by hand: --one-file-system leaves that alone)
        run(["rm", "-rf", "--one-file-system", base], check=False, timeout=300)
        found.append(base)
    return found


# -- what a node's root holds --------------------------------------------------------------------

# The node's init: PID 1 of its PID namespace, in its root. Each daemon runs in a loop of its
# own, started again when it exits, held while /run/node/<daemon>.down is there.
INIT = r"""#!/bin/sh
# tests/cluster/node.py: the test node's init (its systemd's part: start the daemons, restart them)
mkdir -p /run/node /var/log/node
# kubelet and kube-proxy wait for node.py (the images first: no pull from a registry here)
touch /run/node/kubelet.down /run/node/kube-proxy.down
keep() {
  name=$1; shift
  while :; do
    if [ -e /run/node/$name.down ]; then sleep 0.2; continue; fi
    echo "--- $(date -u +%FT%T) start" >>/var/log/node/$name.log
    "$@" >>/var/log/node/$name.log 2>&1 &
    echo $! >/run/node/$name.pid
    wait $!
    echo "--- $(date -u +%FT%T) exit $?" >>/var/log/node/$name.log
    rm -f /run/node/$name.pid
    sleep 0.5
  done
}
keep containerd /usr/bin/containerd &
while [ ! -S /run/containerd/containerd.sock ]; do sleep 0.1; done
keep kubelet /usr/local/bin/kubelet --config=/etc/kubernetes/kubelet.yaml \
  --kubeconfig=/etc/kubernetes/kubelet.kubeconfig --hostname-override="$NODE_NAME" \
  --node-ip="$NODE_IP" --node-labels="topology.kubernetes.io/zone=$NODE_ZONE$NODE_LABELS" --v=1 &
keep kube-proxy /usr/local/bin/kube-proxy --config=/etc/kubernetes/kube-proxy.yaml --v=1 &
touch /run/node/started
while :; do wait; sleep 1; done
"""

# `systemctl` on the node: what gpuhook's --install-restart systemd runs (in PID 1's mount
# namespace). The node's init plays systemd: restarting containerd is ending it and waiting for
# the init to start it again; anything else systemd would do is refused, in one line.
SYSTEMCTL = r"""#!/bin/sh
# tests/cluster/node.py: the test node's stand-in for systemctl (its init is no systemd)
case "$1:$2" in
daemon-reload:*) exit 0 ;;
restart:containerd|restart:containerd.service)
  old=$(cat /run/node/containerd.pid 2>/dev/null)
  [ -n "$old" ] || { echo "containerd is not running" >&2; exit 1; }
  kill -TERM "$old"
  i=0
  until [ -S /run/containerd/containerd.sock ] && [ "$(cat /run/node/containerd.pid 2>/dev/null)" != "$old" ] \
        && ctr version >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -lt 600 ] || { echo "containerd did not come back" >&2; exit 1; }
    sleep 0.1
  done
  exit 0 ;;
esac
echo "systemctl $*: this test node has no systemd (only 'restart containerd' is played)" >&2
exit 1
"""


def containerd_config(default: str, sandbox_image: str) -> str:
    """The node's containerd's `containerd config default` with what this machine needs
    (../shared/docs/real-runtimes.md) and the node's CNI."""
    import tomlkit

    doc = tomlkit.parse(default)
    doc["disabled_plugins"] = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                               "io.containerd.snapshotter.v1.devmapper"]
    rt = doc["plugins"]["io.containerd.cri.v1.runtime"]
    rt["restrict_oom_score_adj"] = True  # no CAP_SYS_RESOURCE here
    rt["disable_apparmor"] = True
    rt["cni"]["bin_dirs"] = ["/opt/cni/bin"]
    rt["cni"]["conf_dir"] = "/etc/cni/net.d"
    doc["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] = sandbox_image
    return tomlkit.dumps(doc)


def cni_config(spec: NodeSpec) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "gpuhook-cluster",
        "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": spec.pod_cidr}]],
                              "routes": [{"dst": "0.0.0.0/0"}]}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1)


@dataclass(frozen=True)
class KubeletTimers:
    """The kubelet's share of how fast a failed node is noticed (the control plane has the rest)."""
    status_update: str = "2s"
    lease_seconds: int = 8


def kubelet_config(spec: NodeSpec, timers: KubeletTimers) -> str:
    """The KubeletConfiguration: cgroup v1 allowed (failCgroupV1: false, 1.35 and later), the
    cgroupfs driver under CGROUP/<node>, authentication and authorization through the apiserver,
    no image GC, evictions only when the machine is truly out, static pods from STATIC_PODS."""
    import yaml

    return yaml.safe_dump({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP}/{spec.name}",
        "failSwapOn": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "address": spec.address, "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": "/etc/kubernetes/ca.crt"}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local", "resolvConf": "/etc/kubernetes/resolv.conf",
        "nodeStatusUpdateFrequency": timers.status_update, "nodeLeaseDurationSeconds": timers.lease_seconds,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "localStorageCapacityIsolation": False, "maxPods": 30, "serializeImagePulls": False,
        "podPidsLimit": -1, "registerNode": True,
        "staticPodPath": STATIC_PODS,
    }, sort_keys=False)


def kube_proxy_config(spec: NodeSpec) -> str:
    import yaml

    return yaml.safe_dump({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": "/etc/kubernetes/kube-proxy.kubeconfig"},
        "hostnameOverride": spec.name, "mode": "iptables", "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": spec.address, "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
        # no conntrack sysctls (the machine's, not the node's)
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "1s"},
    }, sort_keys=False)


# -- a node ----------------------------------------------------------------------------------------

def _write(path: str, text: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)


class Node:
    """One node (see the module doc). start() returns once its init is up; a test waits for
    the Node object to be Ready through the API."""

    def __init__(self, spec: NodeSpec, sid_root: str, cp, binaries: dict[str, str],
                 timers: KubeletTimers = KubeletTimers(), sandbox_image: str = "", runtime_binaries: dict[str, str] | None = None):
        """binaries: kubelet, kube-proxy (files), cni (a directory); runtime_binaries: in-root
        path -> host file copied over it (another containerd or runc than sid's)."""
        self.spec, self.sid_root, self.cp = spec, sid_root, cp
        self.binaries, self.timers, self.sandbox_image = binaries, timers, sandbox_image
        self.runtime_binaries = runtime_binaries or {}
        self.dir = os.path.join(BASE, "nodes", spec.name)
        self.upper = os.path.join(self.dir, "upper")
        self.fakehost = os.path.join(self.dir, "fakehost")
        self.proc: subprocess.Popen | None = None
        self.init_pid: int | None = None

    # paths on the host of the node's own directories
    def var(self, *rel: str) -> str:
        return os.path.join(self.dir, "var", *rel)

    def log(self, daemon: str) -> str:
        return self.var("log", "node", f"{daemon}.log")

    def prepare(self) -> None:
        """The node's files: the fake host, the overlay's upper layer (configs, the stand-ins,
        the fake host's files outside /proc, /sys and /dev) and its own /var directories."""
        from fakes import fakehost

        spec = self.spec
        for d in ("upper", "work", "root", "images"):
            os.makedirs(os.path.join(self.dir, d), exist_ok=True)
        for d in ("lib/containerd", "lib/kubelet", "log/node", "log/pods", "log/containers"):
            os.makedirs(self.var(d), exist_ok=True)
        fakehost.build(self.fakehost, spec.host, mknod=True)
        # the fake host's files outside proc, sys, dev: libraries, nvidia-smi; its ld cache is the
        # node's ldconfig's to write (the sid root's libraries and these)
        for top in os.listdir(self.fakehost):
            if top in ("proc", "sys", "dev"):
                continue
            run(["cp", "-a", os.path.join(self.fakehost, top), self.upper + "/"])
        for rel in ("etc/ld.so.cache", "etc/ld.so.conf"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.upper, rel))
        up = lambda rel: os.path.join(self.upper, rel.lstrip("/"))  # noqa: E731
        _write(up("usr/sbin/gpuhook-node-init"), INIT, 0o755)
        _write(up("usr/bin/systemctl"), SYSTEMCTL, 0o755)
        built = self.runtime_binaries.get("/usr/bin/containerd")
        default = run([built, "config", "default"] if built else ["chroot", self.sid_root, "containerd", "config", "default"])
        _write(up("etc/containerd/config.toml"), containerd_config(default.stdout, self.sandbox_image))
        _write(up(f"etc/cni/net.d/{CNI_CONF}"), cni_config(spec))
        _write(up("etc/kubernetes/kubelet.yaml"), kubelet_config(spec, self.timers))
        _write(up("etc/kubernetes/kube-proxy.yaml"), kube_proxy_config(spec))
        # the control plane's kubeconfigs are self-contained (certificates inlined)
        os.makedirs(up("etc/kubernetes"), exist_ok=True)
        shutil.copy(self.cp.node_kubeconfig(spec.name), up("etc/kubernetes/kubelet.kubeconfig"))
        shutil.copy(self.cp.proxy_kubeconfig(), up("etc/kubernetes/kube-proxy.kubeconfig"))
        shutil.copy(self.cp.ca_cert, up("etc/kubernetes/ca.crt"))
        _write(up("etc/kubernetes/resolv.conf"), "# the test cluster has no DNS\n")
        _write(up("etc/hostname"), spec.name + "\n")
        _write(up("etc/machine-id"), f"{abs(hash(('gpuhook-cluster', spec.name))):032x}"[:32] + "\n")
        for rel in ("usr/local/bin/kubelet", "usr/local/bin/kube-proxy"):
            if not os.path.exists(up(rel)):
                _write(up(rel), "", 0o755)  # the mount point of a binary bound from the host
        # the runtime's binaries copied in, not bound: runc 1.5 seals its own binary before it
        # runs a container, and fails ("exec format error") on one bind-mounted over the root's
        for rel, src in self.runtime_binaries.items():
            os.makedirs(os.path.dirname(up(rel)), exist_ok=True)
            shutil.copy2(src, up(rel))
        os.makedirs(up("opt/cni/bin"), exist_ok=True)
        os.makedirs(up(STATIC_PODS), exist_ok=True)
        self._cgroups()

    def _cgroups(self) -> None:
        """CGROUP/<node> in every v1 hierarchy (kubelet's cgroupRoot must exist); cpuset's with
        the machine's CPUs and memory nodes, else no task could join it."""
        for ctrl in os.listdir(CGROUP_FS):
            top = os.path.join(CGROUP_FS, ctrl)
            if ctrl == "unified" or not os.path.ismount(top):
                continue
            for d in (os.path.join(top, CGROUP), os.path.join(top, CGROUP, self.spec.name)):
                os.makedirs(d, exist_ok=True)
                if ctrl == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        with open(os.path.join(os.path.dirname(d), f)) as src, open(os.path.join(d, f), "w") as dst:
                            dst.write(src.read())

    def start(self, timeout: float = 60) -> None:
        """Its namespaces and root (node.py's `init` below, in them), its veth, then its init:
        returns with its containerd up, its kubelet and kube-proxy held (recover() starts them)."""
        self.prepare()
        argv = ["unshare", "-m", "-n", "-p", "-u", "-f", "--propagation", "private",
                sys.executable, os.path.abspath(__file__), "init", json.dumps(self._init_args()), MARK]
        logf = open(os.path.join(self.dir, "init.log"), "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True, env={"PATH": PATH})
        logf.close()
        self.init_pid = self._child_of(self.proc.pid)
        host_end = f"{VETH_PREFIX}{self.spec.name.removeprefix('node-')}"[:15]
        run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", str(self.init_pid)])
        run(["ip", "link", "set", host_end, "master", BRIDGE, "up"])
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path("/run/node/started")) or not self.enter("ctr version", check=False).returncode == 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"node {self.spec.name} did not start: "
                                + self._tail(os.path.join(self.dir, "init.log")))
            time.sleep(0.1)

    def _child_of(self, pid: int, timeout: float = 10) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = f.read().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            time.sleep(0.01)
        raise NodeError(f"node {self.spec.name}: its init did not start")

    def _init_args(self) -> dict:
        binds = {"/usr/local/bin/kubelet": self.binaries["kubelet"],
                 "/usr/local/bin/kube-proxy": self.binaries["kube-proxy"],
                 "/opt/cni/bin": self.binaries["cni"],
                 "/var/lib/containerd": self.var("lib", "containerd"),
                 "/var/lib/kubelet": self.var("lib", "kubelet"),
                 "/var/log": self.var("log"),
                 IMAGES: os.path.join(BASE, "images")}
        return {"name": self.spec.name, "dir": self.dir, "lower": self.sid_root, "fakehost": self.fakehost,
                "binds": binds, "address": self.spec.address,
                "labels": "".join(f",{k}={v}" for k, v in self.spec.labels)}

    def path(self, inside: str) -> str:
        """A path of the node's root as seen from the host (through its init's /proc root)."""
        return f"/proc/{self.init_pid}/root/{inside.lstrip('/')}"

    def enter(self, command: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """A shell command in the node: its mount, network and PID namespaces, its root."""
        return run(["nsenter", "-t", str(self.init_pid), "-m", "-n", "-p", "-u", "-r", "-w", "/bin/sh", "-c", command],
                   timeout=timeout, check=check, env={"PATH": PATH})

    def import_image(self, tar: str) -> None:
        """`ctr -n k8s.io images import` of a tar in BASE/images (seen in the node at IMAGES)."""
        rel = os.path.relpath(tar, os.path.join(BASE, "images"))
        assert not rel.startswith(".."), f"{tar} is not under {BASE}/images"
        self.enter(f"ctr -n k8s.io images import --all-platforms {IMAGES}/{rel}", timeout=300)

    def fail(self) -> None:
        """The node fails: its kubelet, containerd and kube-proxy killed (SIGKILL) and held
        down; its pods' processes (their shims) go on, as on a node that lost its runtime."""
        self.enter("for d in " + " ".join(DAEMONS) + "; do touch /run/node/$d.down; done; "
                   "for d in " + " ".join(DAEMONS) + "; do [ -f /run/node/$d.pid ] && "
                   "kill -KILL $(cat /run/node/$d.pid) || true; done")

    def recover(self) -> None:
        """The node comes back: its init starts its daemons again."""
        self.enter("rm -f /run/node/*.down")

    def gpus(self) -> dict[str, str]:
        """gpuhook's probe of the node (its own view, through its init's root): GPU id -> its
        device node; what a device plugin advertises."""
        r = run([os.path.join(os.path.dirname(sys.executable), "gpuhook"), "probe", "--json", "--root",
                 self.path("/")])
        return {d["id"]: d["nodes"][0]["path"] for v in json.loads(r.stdout)["vendors"] for d in v["devices"]
                if d["kind"] == "gpu"}

    def checkpoint(self, resource: str = "nvidia.com/gpu") -> dict[str, list[str]]:
        """The kubelet's own device checkpoint: pod UID -> the ids of `resource` it allocated
        ({} before the kubelet wrote one)."""
        try:
            with open(self.var("lib", "kubelet", "device-plugins", "kubelet_internal_checkpoint")) as f:
                entries = json.load(f)["Data"]["PodDeviceEntries"] or []
        except FileNotFoundError:
            return {}
        out: dict[str, list[str]] = {}
        for e in entries:
            if e["ResourceName"] == resource:
                out.setdefault(e["PodUID"], []).extend(i for ids in e["DeviceIDs"].values() for i in ids)
        return out

    def daemon_pid(self, daemon: str) -> int | None:
        try:
            with open(self.path(f"/run/node/{daemon}.pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """The whole node: its init killed (and with it everything in its PID namespace), its
        cgroups removed."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.init_pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.init_pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        for ctrl in os.listdir(CGROUP_FS):
            remove_cgroup_tree(os.path.join(CGROUP_FS, ctrl, CGROUP, self.spec.name))

    @staticmethod
    def _tail(path: str, n: int = 15) -> str:
        try:
            with open(path, "rb") as f:
                return " | ".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return f"(no {path})"

    def logs(self) -> str:
        return "\n".join(f"--- {d}: {self._tail(self.log(d), 30)}" for d in DAEMONS)


# -- the cluster: the nodes on the control plane, the images in their containerds -------------------

# daemonset/examples/worker-deployment.yaml's image, which cannot be pulled here: imported under
# that name, a real Python (the gpuhook image's own bundled interpreter) with busybox beside it
PYTHON_IMAGE = "docker.io/library/python:3.12-slim"


def python_layer(rootfs: str) -> bytes:
    """A layer of the gpuhook image's root (its bundled Python, loader link, ld cache) with
    /usr/local/bin/python3 a link to that interpreter."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top in ("opt", "lib64", "etc/ld.so.cache", "etc/ld.so.conf"):
            if os.path.lexists(os.path.join(rootfs, top)):
                tar.add(os.path.join(rootfs, top), arcname=top)
        for d in ("usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("usr/local/bin/python3")
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, "/opt/gpuhook/libexec/python3", 0o777
        tar.addfile(info)
    return buf.getvalue()


def images(gpuhook_image: dict) -> list[str]:
    """The image tars every node imports (under BASE/images): the sandbox (busybox, also
    containerd_harness.IMAGE_NAME), PYTHON_IMAGE, and the gpuhook image of `make image`."""
    import containerd_harness

    d = os.path.join(BASE, "images")
    os.makedirs(d, exist_ok=True)
    busybox = os.path.join(d, "busybox.tar")
    containerd_harness.build_busybox_image(busybox)
    python = os.path.join(d, "python.tar")
    rootfs = os.path.join(gpuhook_image["base"], "context", "build", "image", "rootfs")
    containerd_harness.build_busybox_image(python, PYTHON_IMAGE, cmd=["python3"], extra_layers=(python_layer(rootfs),))
    gpuhook = os.path.join(d, "gpuhook.tar")
    shutil.copy(gpuhook_image["tar"], gpuhook)
    return [busybox, python, gpuhook]


class Cluster:
    """The control plane (cp) and its nodes (by name), with what the tests ask of them."""

    def __init__(self, cp, sid_root: str, binaries: dict[str, str], tars: list[str], log):
        self.cp, self.sid_root, self.binaries, self.tars, self.log = cp, sid_root, binaries, tars, log
        self.nodes: dict[str, Node] = {}

    def add(self, spec: NodeSpec, runtime_binaries: dict[str, str] | None = None) -> Node:
        """A node started and joined (its images imported before its kubelet starts); the
        caller waits for it to be Ready (wait_ready)."""
        n = Node(spec, self.sid_root, self.cp, self.binaries, sandbox_image=_sandbox_image(),
                 runtime_binaries=runtime_binaries)
        self.nodes[spec.name] = n
        started = time.monotonic()
        n.start()
        for tar in self.tars:
            n.import_image(tar)
        n.recover()  # its kubelet and kube-proxy start
        self.log(f"{spec.name} ({spec.host}) up in {time.monotonic() - started:.1f} s")
        return n

    def wait_ready(self, name: str, timeout: float = 180) -> None:
        try:
            self.wait(lambda: self.ready(name), timeout, f"node {name} Ready")
        except NodeError as e:
            raise NodeError(f"{e}; its kubelet: {Node._tail(self.nodes[name].log('kubelet'), 8)}") from None

    def remove(self, name: str) -> None:
        """The node stopped and its Node object deleted."""
        self.nodes.pop(name).stop()
        self.cp.api("DELETE", f"/api/v1/nodes/{name}")

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.cp.kubectl(*args, **kw)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait(self, check, timeout: float = 120, what: str = "", period: float = 0.5):
        """check() until it returns something true (returned); NodeError after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise NodeError(f"not within {timeout:.0f} s: {what or check}")
            time.sleep(period)

    def ready(self, name: str) -> bool:
        r = self.cp.api("GET", f"/api/v1/nodes/{name}")
        if r.status != 200:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in r.body["status"].get("conditions", []))

    def labels(self, name: str) -> dict:
        return self.cp.api("GET", f"/api/v1/nodes/{name}").body["metadata"].get("labels", {})

    def pods(self, namespace: str, selector: str = "") -> list[dict]:
        path = f"/api/v1/namespaces/{namespace}/pods" + (f"?labelSelector={selector}" if selector else "")
        return self.cp.api("GET", path).body["items"]

    def logs(self) -> str:
        return "\n".join(f"=== {name}\n{n.logs()}" for name, n in self.nodes.items())


@contextlib.contextmanager
def running(cp, sid_root: str, gpuhook_image: dict, specs: tuple[NodeSpec, ...] = NODES,
            runtime_binaries: dict[str, dict[str, str]] | None = None, log=None):
    """The nodes `specs` started on `cp` (each with the images imported before its kubelet
    starts), yielded as a Cluster once every one is Ready; all stopped at the end, and what
    an earlier killed run left removed first. runtime_binaries: node name -> its binaries."""
    import gobuild

    log = log or (lambda msg: print(f"node: {msg}", file=sys.stderr, flush=True))
    left = cleanup_leftovers()
    if left:
        log(f"removed what an earlier run left: {', '.join(left)}")
    try:
        bins = {"kubelet": cp.binary("kubelet"), "kube-proxy": cp.binary("kube-proxy"),
                "cni": gobuild.build("cni-plugins")}
        if runtime_binaries is None:
            runtime_binaries = {BUILT_RUNTIME_NODE: built_runtime()}
    except gobuild.Unavailable as e:
        raise NodeError(str(e)) from None
    cluster = Cluster(cp, sid_root, bins, images(gpuhook_image), log)
    try:
        for spec in specs:
            cluster.add(spec, (runtime_binaries or {}).get(spec.name))
        for spec in specs:
            cluster.wait_ready(spec.name)
        yield cluster
    finally:
        for name in list(cluster.nodes):
            cluster.remove(name)
        cleanup_leftovers()


# the node whose containerd and runc are built from the Go proxy (versions.CONTAINERD), not sid's
BUILT_RUNTIME_NODE = CPU.name


def built_runtime() -> dict[str, str]:
    """In-root path -> host file: the built containerd, its shim, ctr and runc, copied over sid's."""
    import gobuild

    d = gobuild.build("containerd")
    return {"/usr/bin/containerd": f"{d}/containerd", "/usr/bin/containerd-shim-runc-v2": f"{d}/containerd-shim-runc-v2",
            "/usr/bin/ctr": f"{d}/ctr", "/usr/sbin/runc": f"{d}/runc"}


def _sandbox_image() -> str:
    import containerd_harness

    return containerd_harness.IMAGE_NAME


# -- inside the node's namespaces, before its init (python3 node.py init ARGS) ---------------------

def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def _merge(real: str, fake: str, stage: str) -> None:
    """The directory `real` (in sysfs) becomes a tmpfs holding each of its entries (bound, or the
    same symlink) and each of `fake`'s over them."""
    os.makedirs(stage)
    _sh("mount", "-t", "tmpfs", "-o", "mode=755", "gh-merge", stage)
    for src_dir in (real, fake):
        for name in sorted(os.listdir(src_dir)):
            src, dst = os.path.join(src_dir, name), os.path.join(stage, name)
            if os.path.lexists(dst) and src_dir == fake:
                if os.path.isdir(dst) and not os.path.islink(dst):
                    subprocess.run(["umount", "-l", dst], check=False)
                    os.rmdir(dst)
                else:
                    subprocess.run(["umount", "-l", dst], check=False)
                    os.unlink(dst)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            if os.path.isdir(src):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _sh("mount", "--rbind", src, dst)
    _sh("mount", "--move", stage, real)


def init(args: dict) -> None:
    """Run as PID 1 of the node's new namespaces (start()): its root mounted and pivoted into,
    then its init (INIT) exec'd."""
    r = os.path.join(args["dir"], "root")
    fake = args["fakehost"]
    _sh("mount", "--make-rprivate", "/")
    _sh("mount", "-t", "overlay", "gh-node", "-o",
        f"lowerdir={args['lower']},upperdir={args['dir']}/upper,workdir={args['dir']}/work", r)
    # the node's /proc (its PIDs), /sys (its network devices) with the host's cgroups, its /dev
    _sh("mount", "-t", "proc", "proc", f"{r}/proc")
    _sh("mount", "-t", "sysfs", "sysfs", f"{r}/sys")
    _sh("mount", "--rbind", CGROUP_FS, f"{r}/sys/fs/cgroup")
    _sh("mount", "-t", "tmpfs", "-o", "mode=755,size=64m", "gh-dev", f"{r}/dev")
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9),
                               ("tty", 5, 0), ("kmsg", 1, 11)):
        os.mknod(f"{r}/dev/{name}", 0o020666, os.makedev(major, minor))
    for d in ("pts", "shm", "mqueue"):
        os.mkdir(f"{r}/dev/{d}")
    _sh("mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", f"{r}/dev/pts")
    os.symlink("pts/ptmx", f"{r}/dev/ptmx")
    _sh("mount", "-t", "tmpfs", "-o", "mode=1777", "shm", f"{r}/dev/shm")
    _sh("mount", "-t", "mqueue", "mqueue", f"{r}/dev/mqueue")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{r}/dev/{name}")
    # the fake host: its device nodes, /proc/driver and /proc/devices, its sysfs entries
    nodes = [f"{fake}/dev/{n}" for n in os.listdir(f"{fake}/dev") if n != "null"] if os.path.isdir(f"{fake}/dev") else []
    if nodes:
        _sh("cp", "-a", "--no-clobber", *nodes, f"{r}/dev/")
    if os.path.isdir(f"{fake}/proc/driver"):
        _sh("mount", "--rbind", f"{fake}/proc/driver", f"{r}/proc/driver")
    _sh("mount", "--bind", f"{fake}/proc/devices", f"{r}/proc/devices")
    stage = 0
    for rel in ("sys/devices/pci0000:00", "sys/class", "sys/bus/pci/drivers"):
        if os.path.isdir(f"{fake}/{rel}") and os.listdir(f"{fake}/{rel}"):
            stage += 1
            _merge(f"{r}/{rel}", f"{fake}/{rel}", f"{r}/run/.gh-merge-{stage}")  # (run: a tmpfs follows)
    _sh("mount", "-t", "tmpfs", "-o", "mode=755", "gh-run", f"{r}/run")
    _sh("mount", "-t", "tmpfs", "-o", "mode=1777", "gh-tmp", f"{r}/tmp")
    for inside, host in args["binds"].items():
        target = r + inside
        if os.path.isdir(host):
            os.makedirs(target, exist_ok=True)
        _sh("mount", "--bind", host, target)
    os.makedirs(f"{r}/.oldroot", exist_ok=True)
    os.chdir(r)
    _sh("pivot_root", ".", ".oldroot")
    os.chdir("/")
    _sh("mount", "--make-rshared", "/")  # as systemd makes a node's / (mountPropagation needs it)
    env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "NODE_NAME": args["name"], "NODE_IP": args["address"],
           "NODE_ZONE": ZONE, "NODE_LABELS": args["labels"]}
    subprocess.run(["umount", "-l", "/.oldroot"], check=True, env=env)
    subprocess.run(["ldconfig"], check=True, env=env)  # the fake host's libraries in the node's ld cache
    subprocess.run(["hostname", args["name"]], check=False, env=env)
    # the network: eth0 is moved in by the host (start()); lo, the address, the route to the bridge
    deadline = time.monotonic() + 20
    while subprocess.run(["ip", "link", "show", "eth0"], capture_output=True, env=env).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit("no eth0 in the node after 20 s")
        time.sleep(0.05)
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{args['address']}/{PREFIX}", "dev", "eth0"],
                ["ip", "link", "set", "eth0", "up"], ["ip", "route", "add", "default", "via", HOST_ADDRESS]):
        subprocess.run(cmd, check=True, env=env)
    os.execve("/usr/sbin/gpuhook-node-init", ["/usr/sbin/gpuhook-node-init", MARK], env)


if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "init":
    try:
        init(json.loads(sys.argv[2]))
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"node init: {e}", file=sys.stderr)
        sys.exit(1)


# -- the fixtures (tests/cluster/conftest.py imports them) ------------------------------------------

def _fixtures():
    import pytest

    @pytest.fixture(scope="session")
    def cluster(control_plane, sid_root, gpuhook_image):
        """The three nodes (NODES) Ready on the session's control plane."""
        with contextlib.ExitStack() as stack:
            why = None
            try:
                c = stack.enter_context(running(control_plane, sid_root, gpuhook_image))
            except NodeError as e:
                why = str(e)
            if why is not None:  # (outside the except: the one line, no chained exception)
                pytest.fail(f"no cluster: {why}", pytrace=False)
            yield c

    @pytest.fixture(scope="session")
    def gpuhook_installed(cluster, gpuhook_applied):
        """`kubectl apply -k daemonset/` done (gpuhook_applied) and, with nothing else done,
        the DaemonSet's pod Ready on every node and each node labelled runtime-ready."""
        why = None
        try:
            wait_installed(cluster)
        except NodeError as e:
            why = f"gpuhook not installed by its DaemonSet: {e}\n{cluster.logs()}"
        if why is not None:
            pytest.fail(why, pytrace=False)
        return cluster

    return cluster, gpuhook_installed


AGENT_NAMESPACE, AGENT_SELECTOR = "gpuhook-system", "app.kubernetes.io/name=gpuhook"


def agent_pods(cluster: Cluster) -> dict[str, dict]:
    """The DaemonSet's pods by node name."""
    return {p["spec"].get("nodeName"): p for p in cluster.pods(AGENT_NAMESPACE, AGENT_SELECTOR)}


def pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def wait_installed(cluster: Cluster, timeout: float = 240, names: tuple[str, ...] | None = None) -> None:
    """The DaemonSet's pod Ready on each node (`names`, default all) and the node runtime-ready."""
    for name in names or tuple(cluster.nodes):
        cluster.wait(lambda name=name: pod_ready(agent_pods(cluster).get(name) or {}), timeout,
                     f"the gpuhook pod Ready on {name}")
        cluster.wait(lambda name=name: cluster.labels(name).get("gpuhook.dev/runtime-ready") == "true", 60,
                     f"{name} labelled gpuhook.dev/runtime-ready=true")


cluster, gpuhook_installed = _fixtures()
