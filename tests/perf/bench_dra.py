"""The bench's DRA row (bench.py, `--case "DRA 1-GPU claim create+start"`): what a gpuhook.dev
claim adds to a container start, as the kubelet and containerd 2.1 (the Debian sid root) do it,
on the fake 8-GPU host.

`gpuhook dra` runs as a process, as on a node: the fake API on loopback holds the claims
(tests/dra_api.py), the checkpoint and the sockets are on disk (/var/lib/kubelet is), the CDI
specs it writes are the only directory containerd's CDI reads (cdi_spec_dirs). One containerd
with no NRI plugin, a runc pod per side. Each round runs, in a fresh random order, each after a
pause:

  runc      CreateContainer + StartContainer in a runc pod, no devices
  gpuhook   NodePrepareResources over the driver's unix socket, as the kubelet calls it,
            for a new claim allocated one GPU (the driver reads it from the API and writes its
            checkpoint), then the same create+start with the CDI ids it answered (CRI's
            CDI_devices, as the kubelet passes them): containerd's CDI injects that GPU's node,
            the driver's libraries, the ld-cache hook and the env
  no hook   `gpuhook` with its CDI ids of a copy of the driver's specs with no hooks (the kind
            nohook.gpuhook.dev/...): what of `gpuhook` is the ld-cache hook
  none      the same as `gpuhook` for a claim allocated `none`: the env only
  same      a runc pod given the GPU claim's device nodes and mounts through CRI (no CDI, no
            hook, no env): what of `gpuhook claim` is runc's work on the GPU itself

The claim is added to the API before the clock starts (the scheduler's work); its unprepare and
the container's removal come after it stops. The figure is the median of per-round differences
to `runc`; the prepare call's own time is reported beside it. Before anything is timed, a
container of a GPU claim must see that GPU's node and no other, libcuda in its ld cache and
GPUHOOK_ACCELERATOR=nvidia, and one of a `none` claim no GPU node and GPUHOOK_ACCELERATOR=cpu.
Then the driver's resident memory (VmRSS) and high-water mark (VmHWM) after serving every round.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for d in (os.path.join(REPO, "tests"), HERE):
    if d not in sys.path:
        sys.path.insert(0, d)

from bench_nri import PAUSE_S, Side, memory, on_sid_node  # noqa: E402

ROW = "DRA 1-GPU claim create+start"
NODE = "bench-node"
NOHOOK = "nohook."  # the kind prefix of the specs' copies with no hooks (the "no hook" side)
SHOW = "ls /dev/ | grep '^nvidia[0-9]'; echo accel=$GPUHOOK_ACCELERATOR; cat /etc/ld.so.cache 2>/dev/null | grep -c libcuda.so; true"


class Claims:
    """The kubelet's side of the driver: a claim added to the API, prepared over the driver's
    socket, unprepared after."""

    def __init__(self, api, endpoint: str):
        import grpc

        from gpuhook.dra import dra_pb2, dra_pb2_grpc

        self.api, self.pb, self.n = api, dra_pb2, 0
        self.channel = grpc.insecure_channel(f"unix://{endpoint}")
        self.stub = dra_pb2_grpc.DRAPluginStub(self.channel)

    def add(self, device: str) -> tuple[str, str, str]:
        from gpuhook.dra import DRIVER

        self.n += 1
        claim = ("bench", f"claim-{self.n}", f"uid-{self.n}")
        request = "gpu/none" if device == "none" else "gpu/gpu"
        self.api.add_claim(*claim, [{"request": request, "driver": DRIVER, "pool": NODE, "device": device}])
        return claim

    def prepare(self, claim: tuple[str, str, str]) -> list[str]:
        """The CDI ids the driver answered for the claim."""
        ns, name, uid = claim
        req = self.pb.NodePrepareResourcesRequest(claims=[self.pb.Claim(namespace=ns, name=name, uid=uid)])
        got = self.stub.NodePrepareResources(req, timeout=30).claims[uid]
        if got.error:
            raise SystemExit(f"bench: the DRA driver could not prepare {ns}/{name}: {got.error}")
        return [i for d in got.devices for i in d.cdi_device_ids]

    def unprepare(self, claim: tuple[str, str, str]) -> None:
        ns, name, uid = claim
        req = self.pb.NodeUnprepareResourcesRequest(claims=[self.pb.Claim(namespace=ns, name=name, uid=uid)])
        got = self.stub.NodeUnprepareResources(req, timeout=30).claims[uid]
        if got.error:
            raise SystemExit(f"bench: the DRA driver could not unprepare {ns}/{name}: {got.error}")
        with self.api.lock:
            del self.api.claims[(ns, name)]


class ClaimSide:
    """A runc pod whose container gets what a claim of `device` is prepared with."""

    def __init__(self, side: Side, claims: Claims, device: str, kind_prefix: str = ""):
        self.side, self.claims, self.device = side, claims, device
        self.kind_prefix = kind_prefix  # the answer's ids named in a copy of the specs of that kind (no hook)
        self.prepare_ms: list[float] = []

    def create_start(self, command: list[str]) -> tuple[float, str, tuple]:
        claim = self.claims.add(self.device)
        t = time.perf_counter()
        ids = self.claims.prepare(claim)
        prepared = (time.perf_counter() - t) * 1000
        self.side.edits = {"cdi_devices": [self.kind_prefix + i for i in ids]}
        ms, cid = self.side.create_start(command)
        self.prepare_ms.append(prepared)
        return prepared + ms, cid, claim

    def remove(self, cid: str, claim: tuple) -> None:
        self.side.remove(cid)
        self.claims.unprepare(claim)


def dra_row(rounds: int, tmp: str) -> tuple[dict, dict]:
    """(the row, the driver's memory in MiB and its prepare time)."""
    disk = tempfile.mkdtemp(prefix="gpuhook-bench-dra-", dir="/var/tmp")  # the kubelet's plugins dir is on disk
    try:
        with on_sid_node(tmp, "sid-dra") as (node, made):
            return _measure(rounds, tmp, disk, node, made)
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def _containerd(tmp: str, node: str, cdi_dir: str, image_tar: str, stubs, made: list):
    """The sid root's containerd with its default config, its CDI reading cdi_dir only."""
    import tomlkit

    import cri_client
    from containerd_harness import IMAGE_NAME, Containerd
    from sid_node import operator_config

    ctd = Containerd(os.path.join(tmp, "ctd-dra"), cri=True, debian_root=node, visible=(tmp, REPO))
    doc = tomlkit.parse(operator_config(node, ctd).decode())
    cri = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True, "containerd 2.x has CDI on by default"
    cri["cdi_spec_dirs"] = [cdi_dir]
    os.makedirs(os.path.dirname(ctd.config_path), exist_ok=True)
    with open(ctd.config_path, "w") as f:
        f.write(tomlkit.dumps(doc))
    ctd.start(write_config=False)
    client = cri_client.CRIClient(ctd.address, stubs)
    made.append((ctd, client))
    ctd.import_image(image_tar, "k8s.io")
    client.wait_image(IMAGE_NAME)
    return ctd, client


def _driver(tmp: str, disk: str, host: str, cdi_dir: str, api) -> tuple[subprocess.Popen, str]:
    """`gpuhook dra` for the fake host, once its slice is in the API and it serves; (it, its
    DRA socket)."""
    from dra_api import wait_for
    from fakes.kubeapi import write_kubeconfig
    from gpuhook.dra import DRIVER, driver

    kubeconfig = write_kubeconfig(os.path.join(tmp, "dra-kubeconfig"), api, ca="none")
    env = dict(os.environ, GPUHOOK_CONFIG=os.path.join(tmp, "no-node-config.toml"),
               GPUHOOK_CACHE_DIR=os.path.join(tmp, "dra-cache"), PYTHONPATH=REPO)
    out = os.path.join(tmp, "dra.out")
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuhook", "dra", "--root", host, "--spec-root", host, "--cdi-dir", cdi_dir,
             "--kubeconfig", kubeconfig, "--node", NODE, "--plugins-dir", f"{disk}/plugins",
             "--registry-dir", f"{disk}/registry", "--ldconfig", "/sbin/ldconfig", "--interval", "3600",
             "--log-format", "json"], env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    sock = os.path.join(driver.plugin_dir(DRIVER, f"{disk}/plugins"), driver.DRA_SOCKET)
    try:
        wait_for(lambda: proc.poll() is not None or (api.slices and os.path.exists(sock)))
    except AssertionError:
        proc.kill()
        raise SystemExit(f"bench: gpuhook dra did not start serving: {open(out).read()[-500:]}") from None
    if proc.poll() is not None:
        raise SystemExit(f"bench: gpuhook dra stopped: {open(out).read()[-500:]}")
    return proc, sock


def _without_hooks(cdi_dir: str) -> None:
    """A copy of each of the driver's specs with no hooks, of the kind NOHOOK + its kind, beside
    them (a file name that is not the driver's: it leaves them alone)."""
    import yaml

    for name in sorted(os.listdir(cdi_dir)):
        if name.startswith(NOHOOK):
            continue
        spec = yaml.safe_load(open(os.path.join(cdi_dir, name)))
        spec["kind"] = NOHOOK + spec["kind"]
        for edits in (spec.get("containerEdits") or {}, *(d.get("containerEdits") or {} for d in spec["devices"])):
            edits.pop("hooks", None)
        with open(os.path.join(cdi_dir, NOHOOK + name), "w") as f:
            yaml.safe_dump(spec, f)


def _measure(rounds: int, tmp: str, disk: str, node: str, made: list) -> tuple[dict, dict]:
    import cri_client
    from containerd_harness import build_busybox_image
    from dra_api import DRAFakeAPI
    from fakes import fakehost

    image_tar = os.path.join(tmp, "busybox-oci.tar")
    build_busybox_image(image_tar)
    stubs = cri_client.generate(os.path.join(tmp, "cri-stubs"))
    host = os.path.join(tmp, "dra-host")
    fakehost.nvidia(fakehost.FakeHost(host, mknod=True), gpus=8)
    cdi_dir = os.path.join(tmp, "dra-cdi")
    os.makedirs(cdi_dir)
    ctd, client = _containerd(tmp, node, cdi_dir, image_tar, stubs, made)
    api = DRAFakeAPI(node=NODE)
    proc = None
    try:
        proc, sock = _driver(tmp, disk, host, cdi_dir, api)
        gpus = [d["name"] for s in api.slices.values() for d in s["spec"]["devices"] if d["name"] != "none"]
        claims = Claims(api, sock)
        logs = os.path.join(tmp, "dra-pod-logs")
        sides = {"runc": Side(ctd, client, "runc", logs),
                 "gpuhook": ClaimSide(Side(ctd, client, "runc", logs), claims, gpus[0]),
                 "none": ClaimSide(Side(ctd, client, "runc", logs), claims, "none"),
                 "no hook": ClaimSide(Side(ctd, client, "runc", logs), claims, gpus[0], NOHOOK)}
        _without_hooks(cdi_dir)
        edits = _check_gpu(sides["gpuhook"], cdi_dir)
        _check_none(sides["none"])
        _check_nohook(sides["no hook"])
        sides["same"] = Side(ctd, client, "runc", logs, edits)
        _check_same(sides["same"])
        for s in sides.values():
            if isinstance(s, ClaimSide):
                s.prepare_ms.clear()
        times: dict[str, list[float]] = {k: [] for k in sides}
        prepare: dict[str, list[float]] = {k: [] for k, s in sides.items() if isinstance(s, ClaimSide)}
        for i in range(rounds + 2):  # two warm-up rounds
            got = {}
            for who in random.sample(list(sides), len(sides)):
                time.sleep(PAUSE_S)
                s = sides[who]
                if isinstance(s, ClaimSide):
                    got[who], cid, claim = s.create_start(["true"])
                    s.remove(cid, claim)
                else:
                    got[who], cid = s.create_start(["true"])
                    s.remove(cid)
            if i >= 2:
                for k, v in got.items():
                    times[k].append(v)
                for k in prepare:
                    prepare[k].append(sides[k].prepare_ms[-1])
        mem = memory(proc.pid)
        mem["prepare_ms"] = {k: round(statistics.median(v), 2) for k, v in prepare.items()}
        claims.channel.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        api.close()
    row = {"base": "runc", "rounds": rounds, "ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
           "added": {k: round(statistics.median(a - r for a, r in zip(v, times["runc"])), 2)
                     for k, v in times.items() if k != "runc"}}
    return row, mem


def _run_check(side, command: str) -> str:
    """The container's output (its exit 0 checked)."""
    if isinstance(side, ClaimSide):
        _ms, cid, claim = side.create_start(["sh", "-c", command])
    else:
        _ms, cid = side.create_start(["sh", "-c", command])
    cri = side.side.cri if isinstance(side, ClaimSide) else side.cri
    status = cri.wait_exited(cid, 30)
    text = open(status.log_path).read() if os.path.exists(status.log_path) else ""
    if isinstance(side, ClaimSide):
        side.remove(cid, claim)
    else:
        side.remove(cid)
    if status.exit_code != 0:
        raise SystemExit(f"bench: a check container exited {status.exit_code}: {text[-500:]}")
    return " ".join(line.split(" ", 3)[-1] for line in text.splitlines())  # CRI's log lines: time stream tag text


def _check_gpu(side: ClaimSide, cdi_dir: str) -> dict:
    """A GPU claim's container sees that GPU's node and no other GPU's, libcuda in its ld cache,
    GPUHOOK_ACCELERATOR=nvidia. The CRI edits of the `same` side: the CDI edits of the GPU's
    id (the spec's and the device's device nodes and mounts; no hook, no env)."""
    import yaml

    out = _run_check(side, SHOW)
    ids = side.side.edits["cdi_devices"]  # what the driver answered
    nodes, mounts = [], []
    for name in sorted(os.listdir(cdi_dir)):
        spec = yaml.safe_load(open(os.path.join(cdi_dir, name)))
        for d in spec.get("devices") or ():
            if f"{spec['kind']}={d['name']}" in ids:
                for edits in (spec.get("containerEdits") or {}, d.get("containerEdits") or {}):
                    nodes += [(n.get("hostPath", n["path"]), n["path"]) for n in edits.get("deviceNodes") or ()]
                    mounts += [(m["hostPath"], m["containerPath"]) for m in edits.get("mounts") or ()]
    own = [c for _h, c in nodes if os.path.basename(c)[len("nvidia"):].isdigit()]
    lines = out.split()
    gpu_nodes = [x for x in lines if x.startswith("nvidia")]
    if len(own) != 1 or gpu_nodes != [os.path.basename(own[0])] or "accel=nvidia" not in lines \
            or not lines[-1].isdigit() or int(lines[-1]) < 1:
        raise SystemExit(f"bench: the GPU claim's container did not get its GPU {own} exactly: {out[-500:]}")
    return {"devices": [(h, c) for h, c in nodes if os.path.exists(h)],  # CRI makes a device from a host node
            "mounts": [{"container_path": c, "host_path": h, "readonly": True} for h, c in mounts]}


def _check_none(side: ClaimSide) -> None:
    out = _run_check(side, SHOW)
    if [x for x in out.split() if x.startswith("nvidia")] or "accel=cpu" not in out.split():
        raise SystemExit(f"bench: the none claim's container got a GPU or no GPUHOOK_ACCELERATOR=cpu: {out[-500:]}")


def _check_same(side: Side) -> None:
    out = _run_check(side, SHOW)
    if len([x for x in out.split() if x.startswith("nvidia")]) != 1:
        raise SystemExit(f"bench: the runc pod given the claim's devices by CRI does not see one GPU: {out[-500:]}")


def _check_nohook(side: ClaimSide) -> None:
    out = _run_check(side, SHOW).split()
    if len([x for x in out if x.startswith("nvidia")]) != 1 or "accel=nvidia" not in out or out[-1] != "0":
        raise SystemExit(f"bench: the claim through the specs with no hooks did not get its GPU alone: {out[-20:]}")
