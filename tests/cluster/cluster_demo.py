"""The seed's outage, replayed on a real cluster (`make cluster-demo`; tests/cluster/test_outage.py
asserts on the same run): three nodes (NVIDIA with 8 GPUs, AMD, CPU-only; tests/cluster/node.py),
gpuhook installed by `kubectl apply -k daemonset/` alone, then

- the seed's Deployment, daemonset/examples/worker-deployment.yaml as it is (its image,
  python:3.12-slim, imported under that name: node.PYTHON_IMAGE), in a namespace opted in to
  gpu-optional; and beside it the mistake the README warns of: the same Deployment asking for
  `nvidia.com/gpu: 1` instead of gpu-optional (mistake_manifest()), served by a device plugin
  on the NVIDIA node (deviceplugin.py);
- the NVIDIA node fails (its kubelet, containerd and kube-proxy killed): NotReady, the pods
  evicted, the worker's replacement on the AMD node, with the AMD GPUs; the mistake's stays
  Pending, with the scheduler's reason;
- the AMD node fails too: the worker runs on the CPU node, on CPU;
- the NVIDIA node comes back: a new replica of the worker goes there, not to the CPU node; then
  the AMD node comes back.

Each step goes on a timeline (seconds since the first failure, node, pod, accelerator), printed
as it happens. Only the cluster's timers are short (controlplane.Timers, node.KubeletTimers),
not the manifest's."""

from __future__ import annotations

import copy
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field

import node

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER_MANIFEST = os.path.join(REPO, "daemonset", "examples", "worker-deployment.yaml")
NAMESPACE = "gh-outage"
WORKER, MISTAKE = "gpu-optional-worker", "gpu-required-worker"
ACCELERATOR = re.compile(r"^accelerator: (.*)$", re.M)  # the worker's first line


def worker_manifest() -> dict:
    import yaml

    with open(WORKER_MANIFEST) as f:
        return yaml.safe_load(f)


def mistake_manifest() -> dict:
    """The worker as the README's mistake: `nvidia.com/gpu: 1` requested, no gpu-optional (its
    own name and labels; nothing else changed)."""
    d = copy.deepcopy(worker_manifest())
    d["metadata"]["name"] = MISTAKE
    d["spec"]["replicas"] = 1
    d["spec"]["selector"]["matchLabels"] = {"app": MISTAKE}
    tpl = d["spec"]["template"]
    tpl["metadata"]["labels"] = {"app": MISTAKE}
    del tpl["spec"]["runtimeClassName"]
    tpl["spec"]["containers"][0]["resources"].setdefault("limits", {})["nvidia.com/gpu"] = 1
    return d


@dataclass
class Step:
    t: float  # seconds since the first failure (negative: before it)
    node: str
    pod: str
    accelerator: str
    what: str


@dataclass
class Outage:
    cluster: node.Cluster
    out: object = sys.stdout
    steps: list[Step] = field(default_factory=list)
    t0: float | None = None
    plugin: object = None
    seen: dict = field(default_factory=dict)  # pod -> what was said of it already
    printed: dict = field(default_factory=dict)  # pod -> its accelerator line
    mistake_message: str = ""  # the scheduler's, on the mistake's pod after the NVIDIA node failed
    new: tuple | None = None  # (pod, accelerator) of the replica added after the nodes came back

    # -- what the cluster says -------------------------------------------------------------------

    def say(self, node_name: str, pod: str, accelerator: str, what: str) -> None:
        t = time.monotonic() - self.t0 if self.t0 is not None else 0.0
        step = Step(round(t, 1), node_name, pod, accelerator, what)
        self.steps.append(step)
        print(f"{step.t:7.1f}s  {node_name:12} {pod:36} {accelerator:10} {what}", file=self.out, flush=True)

    def pods(self, app: str) -> list[dict]:
        return self.cluster.pods(NAMESPACE, f"app={app}")

    def accelerator(self, pod: dict) -> str | None:
        """What the worker printed (its first line), None before it did."""
        name = pod["metadata"]["name"]
        if name not in self.printed:
            r = self.cluster.kubectl("logs", "-n", NAMESPACE, name, check=False, timeout=20)
            m = ACCELERATOR.search(r.stdout) if r.returncode == 0 else None
            if m is None:
                return None
            self.printed[name] = m.group(1)
        return self.printed[name]

    def running(self, app: str) -> list[tuple[dict, str]]:
        """(pod, accelerator) of the app's live pods (not being deleted) that run and printed."""
        out = []
        for p in self.pods(app):
            if p["metadata"].get("deletionTimestamp") or p["status"].get("phase") != "Running":
                continue
            acc = self.accelerator(p)
            if acc is not None:
                out.append((p, acc))
        return out

    def watch(self) -> None:
        """One look at both apps' pods: what changed goes on the timeline."""
        for app in (WORKER, MISTAKE):
            for p in self.pods(app):
                name, node_name = p["metadata"]["name"], p["spec"].get("nodeName") or "-"
                if p["metadata"].get("deletionTimestamp"):
                    state = "evicted (terminating)"
                elif p["status"].get("phase") == "Running":
                    state = "running"
                else:
                    cond = next((c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"), {})
                    why = str(cond.get("message")).split(". preemption:")[0]  # the scheduler's reason
                    state = f"pending: {why}" if cond.get("status") == "False" else "pending"
                if self.seen.get(name) == state:
                    continue
                self.seen[name] = state
                acc = (self.accelerator(p) or "?") if state == "running" else "-"
                self.say(node_name, name, acc, state)

    # -- the steps -----------------------------------------------------------------------------

    def prepare(self, stub_dir: str) -> None:
        """The namespace opted in to gpu-optional (daemonset/gpu-optional-admission.yaml), the
        device plugin on the NVIDIA node."""
        import deviceplugin

        c = self.cluster
        c.kubectl("create", "namespace", NAMESPACE)
        c.kubectl("label", "namespace", NAMESPACE, "gpuhook.dev/gpu-optional=allowed")
        nv = c.nodes[node.NVIDIA.name]
        self.plugin = deviceplugin.DevicePlugin(nv.var("lib", "kubelet", "device-plugins"), nv.gpus(), stub_dir)
        self.plugin.start()
        c.wait(lambda: c.cp.api("GET", f"/api/v1/nodes/{node.NVIDIA.name}").body["status"]
               .get("allocatable", {}).get("nvidia.com/gpu") == "8", 60, "nvidia.com/gpu: 8 on the NVIDIA node")

    def deploy(self) -> None:
        import yaml

        """The mistake first (its GPU allocated before the worker's containers are made), then
        the worker, each until its pods run."""
        c = self.cluster
        c.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(mistake_manifest()))
        c.wait(lambda: len(self.running(MISTAKE)) == 1, 180, "the mistake's pod running")
        c.kubectl("apply", "-n", NAMESPACE, "-f", WORKER_MANIFEST)
        replicas = worker_manifest()["spec"]["replicas"]
        c.wait(lambda: len(self.running(WORKER)) == replicas, 180, "the worker's pods running")
        self.watch()

    def fail(self, spec: node.NodeSpec) -> None:
        if self.t0 is None:
            self.t0 = time.monotonic()
        self.cluster.nodes[spec.name].fail()
        self.say(spec.name, "-", "-", "node fails: kubelet, containerd, kube-proxy killed")

    def wait_node(self, spec: node.NodeSpec, ready: bool, timeout: float = 120) -> None:
        c = self.cluster

        def check():
            self.watch()
            return c.ready(spec.name) == ready
        c.wait(check, timeout, f"{spec.name} {'Ready' if ready else 'NotReady'}")
        self.say(spec.name, "-", "-", "node Ready" if ready else "node NotReady")

    def wait_worker_off(self, down: set[str], timeout: float = 180) -> list[tuple[dict, str]]:
        """Until every replica of the worker runs (and printed) on a node not in `down`."""
        c = self.cluster
        replicas = worker_manifest()["spec"]["replicas"]

        def check():
            self.watch()
            live = self.running(WORKER)
            return live if len(live) == replicas and all(p["spec"]["nodeName"] not in down for p, _ in live) else None
        return c.wait(check, timeout, f"the worker's {replicas} pods running off {sorted(down)}")

    def mistake_pending(self) -> str:
        """The scheduler's message on the mistake's live pod (it must be Pending)."""

        def check():
            self.watch()
            for p in self.pods(MISTAKE):
                if p["metadata"].get("deletionTimestamp"):
                    continue
                cond = next((x for x in p["status"].get("conditions", []) if x["type"] == "PodScheduled"), {})
                if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                    return cond["message"]
            return None
        return self.cluster.wait(check, 60, "the mistake's replacement Unschedulable")

    def recover(self, spec: node.NodeSpec) -> None:
        self.cluster.nodes[spec.name].recover()
        self.say(spec.name, "-", "-", "node comes back: its daemons started again")

    def new_worker_pod(self) -> tuple[dict, str]:
        """One more replica (kubectl scale): where the scheduler puts a new pod now."""
        c = self.cluster
        before = {p["metadata"]["name"] for p, _ in self.running(WORKER)}
        replicas = worker_manifest()["spec"]["replicas"] + 1
        c.kubectl("scale", "-n", NAMESPACE, f"deployment/{WORKER}", f"--replicas={replicas}")

        def check():
            self.watch()
            new = [(p, a) for p, a in self.running(WORKER) if p["metadata"]["name"] not in before]
            return new[0] if new else None
        return c.wait(check, 120, "the new replica running")

    def close(self) -> None:
        """The device plugin stopped, the namespace (and the Deployments in it) deleted."""
        if self.plugin is not None:
            self.plugin.stop()
        self.cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)


# The moments replay() stops at for a test's checks, in order.
DEPLOYED, NVIDIA_FAILED, AMD_FAILED, NVIDIA_BACK = "deployed", "NVIDIA failed", "AMD failed", "NVIDIA back"


def replay(cluster: node.Cluster, out=sys.stdout, check=None) -> Outage:
    """The whole outage (the module doc); the Outage with its timeline. `check(outage, moment)`,
    when given, is called at each moment above (what `make cluster-demo` shows is what the
    test checks). Raises NodeError or AssertionError with what went wrong."""
    o = Outage(cluster, out)
    stubs = tempfile.mkdtemp(prefix="gh-dp-")

    def at(moment: str) -> None:
        if check is not None:
            check(o, moment)

    try:
        print(f"{'t':>8}  {'node':12} {'pod':36} {'accel':10} what", file=out)
        o.prepare(stubs)
        o.deploy()
        at(DEPLOYED)
        o.fail(node.NVIDIA)
        o.wait_node(node.NVIDIA, ready=False)
        o.wait_worker_off({node.NVIDIA.name})
        o.mistake_message = o.mistake_pending()
        at(NVIDIA_FAILED)
        o.fail(node.AMD)
        o.wait_node(node.AMD, ready=False)
        o.wait_worker_off({node.NVIDIA.name, node.AMD.name})
        at(AMD_FAILED)
        o.recover(node.NVIDIA)
        o.wait_node(node.NVIDIA, ready=True)
        o.new = o.new_worker_pod()
        at(NVIDIA_BACK)
        o.recover(node.AMD)
        o.wait_node(node.AMD, ready=True)
    finally:
        o.close()
    return o


def summary(o: Outage) -> list[str]:
    """What the timeline comes to: each failure's time to the replacement running, and the
    mistake's reason for staying Pending."""
    lines = []
    for failed, to in ((node.NVIDIA, node.AMD), (node.AMD, node.CPU)):
        fail = next(s.t for s in o.steps if s.node == failed.name and s.what.startswith("node fails"))
        first = next(s for s in o.steps if s.what == "running" and s.t > fail and s.node == to.name)
        lines.append(f"the {failed.host.upper()} node failed at {fail:.1f} s: the worker's replacement ran on "
                     f"{first.node} ({first.accelerator}) {first.t - fail:.1f} s later")
    lines.append(f"the mistake's pod (nvidia.com/gpu: 1) stayed Pending: {o.mistake_message.split('. preemption')[0]}")
    return lines


def main() -> int:
    """`make cluster-demo`: the control plane and three nodes on this machine, gpuhook
    installed by its DaemonSet, the outage replayed; the timeline printed, then everything
    stopped. The first run builds the cluster's components (gobuild.py), later ones reuse them."""
    import shutil

    import containerd_harness
    import controlplane
    import debroot
    import gobuild
    import sid_node

    if os.geteuid() != 0:
        print("cluster-demo: needs root (namespaces, a bridge, real containers)", file=sys.stderr)
        return 2
    began = time.monotonic()
    base = tempfile.mkdtemp(prefix="gh-cluster-image-", dir="/var/tmp")
    try:
        with controlplane.ControlPlane() as cp, \
                debroot.ensure(sid_node.RELEASE, sid_node.PACKAGES, must_have=sid_node.MUST_HAVE) as sid:
            image = containerd_harness.build_gpuhook_image(base)
            applied = cp.kubectl("apply", "-k", os.path.join(REPO, "daemonset")).stdout.splitlines()
            print(f"kubectl apply -k daemonset/: {len(applied)} objects created")
            with node.running(cp, sid, image) as cluster:
                node.wait_installed(cluster)
                print(f"\ncluster up, gpuhook installed on {len(cluster.nodes)} nodes by its DaemonSet: "
                      f"{time.monotonic() - began:.0f} s since start\n")
                for spec in node.NODES:
                    labels = cluster.labels(spec.name)
                    print(f"  {spec.name:12} gpu.type={labels.get('gpu.type', '-'):7} "
                          f"gpuhook.dev/accelerator={labels.get('gpuhook.dev/accelerator')} "
                          f"gpu.count={labels.get('gpuhook.dev/gpu.count')}")
                print()
                o = replay(cluster)
            containerd_harness.remove_gpuhook_image(image)
    except (node.NodeError, gobuild.Unavailable, controlplane.ControlPlaneError, debroot.RootUnavailable,
            AssertionError) as e:
        print(f"cluster-demo: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    for line in summary(o):
        print(line)
    print(f"cluster-demo: {time.monotonic() - began:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    REPO]
    sys.exit(main())
