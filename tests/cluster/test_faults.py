"""Faults on a real cluster (tests/cluster/node.py), each on the NVIDIA node with gpuhook as its
DaemonSet installs it: the kubelet restarted mid-pod, containerd restarted, the agent's pod
deleted, the apiserver unreachable from the node for 30 s; and a static pod. In each, what a gpu-optional pod
gets and what the operator sees (its gpuhook.dev/accelerator label, its Event): docs/agent.md
and docs/runtime.md say the same.

The pods list their GPUs into an emptyDir at every start of their container (runN: the Nth
start) and wait there until the test writes exitN beside it (through the node's own
/var/lib/kubelet): the test reads what each container got without the API, and makes one exit
when it wants (restartPolicy Always: the kubelet makes a new container)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

import pytest
import yaml

import node
from containerd_harness import IMAGE_NAME


NAMESPACE = "gh-faults"
NV = node.NVIDIA
GPUS = [f"nvidia{i}" for i in range(8)]
REPORTER = "gpuhook.dev/agent"
TOLERATE_ALL = [{"operator": "Exists"}]
SCRIPT = r"""n=0; while [ -e /m/run$n ]; do n=$((n+1)); done
ls /dev | grep -E '^nvidia[0-9]+$' | sort > /m/.run$n; mv /m/.run$n /m/run$n
while [ ! -e /m/exit$n ]; do sleep 0.2; done
exit 1
"""


def pod(name: str) -> dict:
    """A gpu-optional pod on the NVIDIA node (SCRIPT); it tolerates the node's taints (the
    cut makes it unreachable: 2 s until eviction with this cluster's timers)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runtimeClassName": "gpu-optional", "restartPolicy": "Always", "tolerations": TOLERATE_ALL,
                     "nodeSelector": {"kubernetes.io/hostname": NV.name}, "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False,
                     "volumes": [{"name": "m", "emptyDir": {}}],
                     "containers": [{"name": "c", "image": IMAGE_NAME, "command": ["sh", "-c", SCRIPT],
                                     "volumeMounts": [{"name": "m", "mountPath": "/m"}]}]}}


@pytest.fixture(scope="module")
def c(gpuhook_installed):
    c = gpuhook_installed
    c.kubectl("create", "namespace", NAMESPACE)
    c.kubectl("label", "namespace", NAMESPACE, "gpuhook.dev/gpu-optional=allowed")
    yield c
    c.kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found", check=False)


def get(c: node.Cluster, name: str) -> dict:
    return c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").body


def start(c: node.Cluster, name: str) -> dict:
    """The pod made and its container's first start listed (run0); the pod as the API has it."""
    c.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod(name)))
    c.wait(lambda: get(c, name).get("metadata", {}).get("uid") and os.path.exists(run_file(c, name, 0)), 120,
           f"pod {name}'s container started")
    return get(c, name)


def volume(c: node.Cluster, name: str) -> str:
    uid = get(c, name)["metadata"]["uid"]
    return c.nodes[NV.name].var("lib", "kubelet", "pods", uid, "volumes", "kubernetes.io~empty-dir", "m")


def run_file(c: node.Cluster, name: str, n: int) -> str:
    return os.path.join(volume(c, name), f"run{n}")


def listed(c: node.Cluster, name: str, n: int) -> list[str]:
    with open(run_file(c, name, n)) as f:
        return f.read().split()


def agent_events(c: node.Cluster, name: str) -> list[dict]:
    items = c.cp.api("GET", f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name={name}").body
    return [e for e in items.get("items", []) if e.get("reportingComponent") == REPORTER]


def reported(c: node.Cluster, name: str, count: int = 1, timeout: float = 60) -> dict:
    """The pod's one GPUsInjected Event with `count`, and its label nvidia (waited for)."""
    def there():
        events = agent_events(c, name)
        label = get(c, name).get("metadata", {}).get("labels", {}).get("gpuhook.dev/accelerator")
        return len(events) == 1 and events[0]["count"] == count and label == "nvidia" and events[0]
    e = c.wait(there, timeout, f"pod {name}: one GPUsInjected Event (count {count}) and its label; "
               f"now {[(x['reason'], x['count']) for x in agent_events(c, name)]}")
    assert e["reason"] == "GPUsInjected" and "got 8 GPU device(s)" in e["message"], e
    return e


def container(c: node.Cluster, name: str) -> tuple[str, int]:
    (st,) = get(c, name)["status"]["containerStatuses"]
    return st.get("containerID", ""), st["restartCount"]


def agent_pids(n: node.Node) -> list[int]:
    """The agent's processes on node `n` (in its network namespace: the DaemonSet's pod runs
    in the host network), seen from here."""
    net = os.readlink(f"/proc/{n.init_pid}/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"agent" in argv and b"--root" in argv and os.readlink(f"/proc/{entry}/ns/net") == net:
                found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def agent_log(c: node.Cluster) -> list[dict]:
    name = node.agent_pods(c)[NV.name]["metadata"]["name"]
    out = c.kubectl("logs", "-n", node.AGENT_NAMESPACE, name).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def when(rec: dict) -> float:
    return datetime.fromisoformat(rec["time"]).timestamp()


def creates(c: node.Cluster, name: str) -> list[dict]:
    """The node log's create lines of the pod's containers."""
    with open(c.nodes[NV.name].var("log", "gpuhook.log")) as f:
        lines = [json.loads(x) for x in f if x.startswith("{")]
    return [x for x in lines if x.get("event") == "create" and x.get("pod_name") == name
            and x.get("decision") != "sandbox"]


def test_a_kubelet_restarted_mid_pod(c):
    """The kubelet killed and started again by the node's init (systemd's Restart=always): the
    running pod keeps its container and its GPUs, its label and Event are not made again, and
    a pod made after the restart gets its GPUs."""
    n = c.nodes[NV.name]
    start(c, "before-kubelet")
    assert listed(c, "before-kubelet", 0) == GPUS
    before = reported(c, "before-kubelet")
    ctr = container(c, "before-kubelet")
    old = n.daemon_pid("kubelet")
    n.enter(f"kill -KILL {old}")
    c.wait(lambda: n.daemon_pid("kubelet") not in (None, old), 30, "the kubelet started again")
    c.wait(lambda: c.ready(NV.name), 60, "node Ready again")
    start(c, "after-kubelet")
    assert listed(c, "after-kubelet", 0) == GPUS
    reported(c, "after-kubelet")  # the agent has read the node log past the restart
    assert container(c, "before-kubelet") == ctr and not os.path.exists(run_file(c, "before-kubelet", 1))
    shown = c.kubectl("exec", "-n", NAMESPACE, "before-kubelet", "--", "sh", "-c",
                      "ls /dev | grep -E '^nvidia[0-9]+$' | sort").stdout.split()
    assert shown == GPUS
    assert reported(c, "before-kubelet", timeout=1) == before  # the same Event, count 1, unchanged


def test_containerd_restarted(c):
    """`systemctl restart containerd` (the node's stand-in, through its init): the running pod
    stays (its shim keeps it), the handler is still in containerd's config, and a new pod gets
    its GPUs."""
    import tomllib

    n = c.nodes[NV.name]
    start(c, "before-containerd")
    before = reported(c, "before-containerd")
    ctr = container(c, "before-containerd")
    old = n.daemon_pid("containerd")
    n.enter("systemctl restart containerd", timeout=90)
    assert n.daemon_pid("containerd") not in (None, old)
    with open(n.path("/etc/containerd/config.toml"), "rb") as f:
        runtimes = tomllib.load(f)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["gpu-optional"]["options"]["BinaryName"].endswith("gpuhook-runtime"), runtimes["gpu-optional"]
    start(c, "after-containerd")
    assert listed(c, "after-containerd", 0) == GPUS
    reported(c, "after-containerd")
    assert container(c, "before-containerd") == ctr and not os.path.exists(run_file(c, "before-containerd", 1))
    shown = c.kubectl("exec", "-n", NAMESPACE, "before-containerd", "--", "sh", "-c",
                      "ls /dev | grep -E '^nvidia[0-9]+$' | sort").stdout.split()
    assert shown == GPUS
    assert reported(c, "before-containerd", timeout=1) == before


def test_the_agents_pod_deleted(c):
    """The agent's pod deleted while the node is held out of the DaemonSet (gpuhook.dev/install=
    false, its documented opt-out): a pod made while no agent runs gets its GPUs (the wrapper
    needs no agent) and no label yet; once the node is let back the DaemonSet makes a new agent
    pod, which reads the node log from where the last one stopped: that pod's label and Event
    come, and no pod reported before gets a second Event."""
    n = c.nodes[NV.name]
    start(c, "before-agent")
    before = reported(c, "before-agent")
    old = node.agent_pods(c)[NV.name]["metadata"]["name"]
    c.kubectl("label", "node", NV.name, "gpuhook.dev/install=false")
    try:
        c.kubectl("delete", "pod", "-n", node.AGENT_NAMESPACE, old, "--ignore-not-found", "--wait=true", "--timeout=60s")
        c.wait(lambda: not agent_pids(n) and NV.name not in node.agent_pods(c), 60, "no agent on the node")
        start(c, "while-away")
        assert listed(c, "while-away", 0) == GPUS
        assert [x["decision"] for x in creates(c, "while-away")] == ["injected"]
        assert agent_events(c, "while-away") == [] and not agent_pids(n)
        assert "gpuhook.dev/accelerator" not in get(c, "while-away")["metadata"].get("labels", {})
    finally:
        c.kubectl("label", "node", NV.name, "gpuhook.dev/install-")
    node.wait_installed(c, names=(NV.name,))
    assert node.agent_pods(c)[NV.name]["metadata"]["name"] != old
    reported(c, "while-away", timeout=90)
    caught = [x for x in agent_log(c) if x.get("event") == "creates.catching_up"]
    assert len(caught) == 1 and caught[0]["behind"] > 0, caught
    assert reported(c, "before-agent", timeout=1) == before


CUT_S = 30


def test_the_apiserver_unreachable_from_the_node_for_30_s(c):
    """Traffic from the NVIDIA node to the apiserver refused for CUT_S (a rule in the node's
    own network namespace): a container the kubelet makes meanwhile (a restart of a running
    pod's) gets its GPUs; the agent tries again with backoff, a few times, with little CPU;
    after the cut its Event arrives (count 2: the restarted container's)."""
    n = c.nodes[NV.name]
    start(c, "through-cut")
    reported(c, "through-cut")
    (pid,) = agent_pids(n)
    rule = f"OUTPUT -d {node.HOST_ADDRESS} -p tcp --dport {c.cp.port} -j REJECT --reject-with tcp-reset"
    cpu0, t0 = cpu_seconds(pid), time.time()
    n.enter(f"iptables -I {rule}")
    try:
        open(os.path.join(volume(c, "through-cut"), "exit0"), "w").close()  # the container exits: restarted
        c.wait(lambda: os.path.exists(run_file(c, "through-cut", 1)), CUT_S - 3, "the restarted container (run1)",
               period=0.2)
        made = time.time()
        while time.time() < t0 + CUT_S:
            time.sleep(0.5)
        cpu = cpu_seconds(pid) - cpu0
    finally:
        n.enter(f"iptables -D {rule}", check=False)
    t1 = time.time()
    assert listed(c, "through-cut", 1) == GPUS
    (first, second) = creates(c, "through-cut")
    assert second["decision"] == "injected" and t0 <= when(second) <= made + 1, (t0, second["time"])
    e = reported(c, "through-cut", count=2, timeout=60)
    arrived = time.time()
    log = [x for x in agent_log(c) if x.get("what") == "pod events" and when(x) >= t0]
    ok = next(x for x in log if x["event"] == "kube.ok")  # the agent's own word that the API is back
    retries = [x for x in log if x["event"] == "kube.retry" and when(x) <= when(ok)]
    print(f"the cut: {len(retries)} tries in {CUT_S} s, agent CPU {cpu:.2f} s, the Event {arrived - t1:.1f} s after;",
          [(x["time"], x["retry_in_s"]) for x in retries])
    assert pid in agent_pids(n)  # the same agent all along
    assert 2 <= len(retries) <= 8, retries  # 1, 2, 4, 8, 16 s: a few tries, not one per poll
    assert ok["after_failures"] == len(retries) and when(ok) >= t1 - 1, (ok, t1)
    assert cpu < 3.0, cpu
    assert e["series"]["count"] == 2


def test_a_static_pods_report_goes_to_its_mirror_pod(c):
    """A gpu-optional static pod (a manifest in the node's staticPodPath: the kubelet runs it with
    no API): it gets its GPUs, and its Event and label go to its mirror pod in the API, although
    its containers carry the kubelet's own UID for it (the manifest's hash), not the mirror's."""
    n = c.nodes[NV.name]
    body = pod("static")
    body["spec"].update(restartPolicy="Always", volumes=[])
    body["spec"]["containers"][0].update(
        command=["sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$' | sort; sleep 3600"], volumeMounts=[])
    manifest = n.path(os.path.join(node.STATIC_PODS, "gh-static.yaml"))
    with open(manifest + ".tmp", "w") as f:
        yaml.safe_dump(body, f)
    os.rename(manifest + ".tmp", manifest)  # the kubelet never reads half a manifest
    mirror = f"static-{NV.name}"
    try:
        def running():
            p = get(c, mirror)
            return p.get("kind") == "Pod" and p["status"].get("phase") == "Running"
        c.wait(running, 120, "the static pod's mirror pod Running")
        meta = get(c, mirror)["metadata"]
        static_uid = meta["annotations"]["kubernetes.io/config.mirror"]
        assert static_uid != meta["uid"]
        (line,) = creates(c, mirror)
        assert line["pod_uid"] == static_uid and line["decision"] == "injected", line
        assert c.kubectl("logs", "-n", NAMESPACE, mirror).stdout.split() == GPUS
        e = reported(c, mirror)
        assert e["involvedObject"]["uid"] == meta["uid"], e
    finally:
        os.unlink(manifest)
    c.wait(lambda: get(c, mirror).get("kind") != "Pod", 60, "the mirror pod gone with the manifest")
