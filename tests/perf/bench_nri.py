"""The bench's NRI row (bench.py, `--case "NRI 8-GPU create+start"`): what `gpuhook nri` adds to
a CRI create+start on the fake 8-GPU host, on containerd 2.1 from the Debian sid root.

Two containerds of the same root, each with NRI on (its default): one with gpuhook's plugin
connected, one with none. Each round runs, in a fresh random order, each after a pause:

  runc      CreateContainer + StartContainer in a runc pod, on the containerd with no plugin
  gpuhook   the same in a gpu-optional pod (a plain runc handler: no wrapper), with the plugin:
            its adjustment (8 GPUs, the driver's libraries, the ld-cache hook) and runc doing it
  other     the same in a runc pod on the plugin's containerd (the plugin's empty answer)
  same      a runc pod with no plugin given the plugin's devices and mounts through CRI (no
            hook, no env): what of `gpuhook` is runc's work on the GPUs themselves
  no hook   `gpuhook` on a third containerd whose plugin has no rootfs template: no ld-cache hook
  noop hook `gpuhook` on a fourth containerd whose plugin's hook is a static program that does
            nothing: what runc's running a createContainer hook costs, whatever the hook does

The figure is the median of per-round differences to `runc`. Before anything is timed a
gpu-optional container must see /dev/nvidia7 and libcuda in its ld cache. Then the plugin's
resident memory (VmRSS) and high-water mark (VmHWM) after serving every round.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for d in (os.path.join(REPO, "tests"),):
    if d not in sys.path:
        sys.path.insert(0, d)

ROW = "NRI 8-GPU create+start"
HANDLER = "gpu-optional"
PAUSE_S = 0.02
CHECK = "ls /dev/nvidia7 && grep -c libcuda.so /etc/ld.so.cache"
NOOP = "int main(void) { return 0; }\n"  # the "noop hook" side's hook
# `gpuhook nri` with the planner's hook helper replaced by argv[1] (the "noop hook" side)
WITH_HELPER = ("import sys; import gpuhook.hook as h; helper = sys.argv.pop(1); h.package_helper = lambda: helper; "
               "from gpuhook.cli import main; sys.exit(main(sys.argv[1:]))")


class Side:
    """One containerd, one pod of `handler` in it; create+start timed, remove not."""

    def __init__(self, ctd, client, handler: str, logs: str, edits: dict | None = None) -> None:
        self.ctd, self.cri, self.n = ctd, client, 0
        self.edits = edits or {}
        name = f"{handler}-{len(ctd.cgroup_parents)}"
        parent = f"/gpuhook-bench-{os.getpid()}-{name}"
        ctd.cgroup_parents.append(parent)
        os.makedirs(os.path.join(logs, name), exist_ok=True)
        self.config = client.sandbox_config(f"bench-{name}", log_directory=os.path.join(logs, name),
                                            cgroup_parent=parent)
        self.pod = client.run_pod_sandbox(self.config, handler)

    def create_start(self, command: list[str]) -> tuple[float, str]:
        from containerd_harness import IMAGE_NAME

        self.n += 1
        t = time.perf_counter()
        cid = self.cri.create_container(self.pod, self.config, f"c{self.n}", IMAGE_NAME, command=command,
                                        log_path=f"c{self.n}.log", **self.edits)
        self.cri.start_container(cid)
        return (time.perf_counter() - t) * 1000, cid

    def remove(self, cid: str) -> None:
        self.cri.wait_exited(cid, 30)
        self.cri.remove_container(cid)


def memory(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        kib = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if k in ("VmRSS", "VmHWM")}
    return {"rss": round(kib["VmRSS"] / 1024, 1), "hwm": round(kib["VmHWM"] / 1024, 1)}


def nri_row(rounds: int, tmp: str) -> tuple[dict, dict]:
    """(the row, the plugin's memory in MiB)."""
    with on_sid_node(tmp, "sid") as (node, made):
        return _measure(rounds, tmp, node, made)


@contextlib.contextmanager
def on_sid_node(tmp: str, name: str):
    """(sid's root overlaid under tmp/name, a list to append (containerd, CRI client) to): every containerd
    appended is emptied of its containers and stopped on the way out, the last started first."""
    import debroot
    from sid_node import MUST_HAVE, PACKAGES, RELEASE

    with debroot.ensure(RELEASE, PACKAGES, must_have=MUST_HAVE) as sid, \
            debroot.overlay(sid, os.path.join(tmp, name)) as node:
        made: list = []
        try:
            yield node, made
        finally:
            for ctd, client in reversed(made):
                try:
                    client.remove_all()
                    client.close()
                finally:
                    ctd.cleanup()


def _host(tmp: str) -> str:
    """The fake 8-GPU host."""
    from fakes import fakehost

    host = os.path.join(tmp, "nri-host")
    fakehost.nvidia(fakehost.FakeHost(host, mknod=True), gpus=8)
    return host


def _plugin(tmp: str, host: str, name: str, sock: str, template: str,
            helper: str | None = None) -> tuple[subprocess.Popen, str]:
    """`gpuhook nri` on `sock` with a node config (and log) of its own, once registered; (it, its log).
    helper: the hook helper the planner names instead of gpuhook-hook."""
    config = os.path.join(tmp, f"{name}.toml")
    log = os.path.join(tmp, f"{name}.log")
    with open(config, "w") as f:
        f.write(f'host_root = "{host}"\nlog_file = "{log}"\nldconfig = "/sbin/ldconfig"\n')
    env = dict(os.environ, GPUHOOK_CONFIG=config, GPUHOOK_CACHE_DIR=os.path.join(tmp, f"{name}-cache"), PYTHONPATH=REPO)
    out = os.path.join(tmp, f"{name}.out")
    with open(out, "wb") as f:
        head = [sys.executable, "-c", WITH_HELPER, helper] if helper else [sys.executable, "-m", "gpuhook"]
        plugin = subprocess.Popen([*head, "nri", "--socket", sock, "--rootfs-template", template], env=env, cwd=REPO,
                                  stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while b"configured by containerd" not in open(out, "rb").read():
        if plugin.poll() is not None or time.monotonic() > deadline:
            plugin.kill()
            raise SystemExit(f"bench: the NRI plugin did not register: {open(out).read()[-500:]}")
        time.sleep(0.05)
    return plugin, log


def _containerd(tmp: str, node: str, name: str, image_tar: str, stubs, made: list):
    import cri_client
    from containerd_harness import IMAGE_NAME, Containerd
    from sid_node import nri_config

    ctd = Containerd(os.path.join(tmp, name), cri=True, debian_root=node, visible=(tmp, REPO))
    sock = os.path.join(tmp, name, "nri", "nri.sock")
    os.makedirs(os.path.dirname(ctd.config_path), exist_ok=True)
    with open(ctd.config_path, "wb") as f:
        f.write(nri_config(node, ctd, sock))
    ctd.start(write_config=False)
    client = cri_client.CRIClient(ctd.address, stubs)
    made.append((ctd, client))
    ctd.import_image(image_tar, "k8s.io")
    client.wait_image(IMAGE_NAME)
    return ctd, client, sock


def _measure(rounds: int, tmp: str, node: str, made: list) -> tuple[dict, dict]:
    import cri_client
    from containerd_harness import build_busybox_image

    image_tar = os.path.join(tmp, "busybox-oci.tar")
    build_busybox_image(image_tar)
    stubs = cri_client.generate(os.path.join(tmp, "cri-stubs"))
    host = _host(tmp)
    with_plugin, client_a, sock = _containerd(tmp, node, "ctd-nri", image_tar, stubs, made)
    plain, client_b, _ = _containerd(tmp, node, "ctd-plain", image_tar, stubs, made)
    no_hook, client_c, sock_c = _containerd(tmp, node, "ctd-nri-no-hook", image_tar, stubs, made)
    noop_hook, client_d, sock_d = _containerd(tmp, node, "ctd-nri-noop-hook", image_tar, stubs, made)
    noop = os.path.join(tmp, "noop-hook")
    with open(noop + ".c", "w") as f:
        f.write(NOOP)
    subprocess.run(["gcc", "-static", "-O2", "-o", noop, noop + ".c"], check=True)
    plugins: list[subprocess.Popen] = []
    try:
        from gpuhook.hook import ROOTFS_FROM_STATE  # the hook finds each rootfs in its bundle (the default)

        plugin, log = _plugin(tmp, host, "nri-plugin", sock, ROOTFS_FROM_STATE)
        plugins.append(plugin)
        plugins.append(_plugin(tmp, host, "nri-plugin-no-hook", sock_c, "")[0])  # '': no ld-cache hook
        plugins.append(_plugin(tmp, host, "nri-plugin-noop-hook", sock_d, ROOTFS_FROM_STATE, noop)[0])
        logs = os.path.join(tmp, "nri-pod-logs")
        sides = {"runc": Side(plain, client_b, "runc", logs), "gpuhook": Side(with_plugin, client_a, HANDLER, logs),
                 "other": Side(with_plugin, client_a, "runc", logs), "no hook": Side(no_hook, client_c, HANDLER, logs),
                 "noop hook": Side(noop_hook, client_d, HANDLER, logs)}
        record = _check(sides["gpuhook"], log)
        sides["same"] = Side(plain, client_b, "runc", logs, {
            # CRI makes a device from a host node: the few the fake host has no file for are left out
            "devices": [(host + n, n) for n in record["nodes"] if os.path.exists(host + n)],
            "mounts": [{"container_path": m, "host_path": host + m, "readonly": True} for m in record["mounts"]]})
        _check(sides["same"], None)
        _check(sides["no hook"], None)
        _check(sides["noop hook"], None)
        times: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(rounds + 2):  # two warm-up rounds
            got = {}
            for who in random.sample(list(sides), len(sides)):
                time.sleep(PAUSE_S)
                got[who], cid = sides[who].create_start(["true"])
                sides[who].remove(cid)
            if i >= 2:
                for k, v in got.items():
                    times[k].append(v)
        mem = memory(plugin.pid)
        own = [r["duration_ms"] for r in map(json.loads, open(log)) if r.get("decision") == "injected"]
        mem["plugin_ms"] = round(statistics.median(own), 2)  # its own time per create, as its log line says
    finally:
        for p in plugins:
            p.terminate()
            p.wait(10)
    row = {"base": "runc", "rounds": rounds, "ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
           "added": {k: round(statistics.median(a - r for a, r in zip(v, times["runc"])), 2)
                     for k, v in times.items() if k != "runc"}}
    return row, mem


def _check(side: Side, log: str | None) -> dict:
    """A gpu-optional container through the plugin sees its GPUs and libcuda in its ld cache
    (log: the plugin's; its line for the container returned). None: a container that must see
    the GPU nodes only (given by CRI, or by the plugin with no hook)."""
    _ms, cid = side.create_start(["sh", "-c", CHECK if log else "ls /dev/nvidia7"])
    status = side.cri.wait_exited(cid, 30)
    text = open(status.log_path).read() if os.path.exists(status.log_path) else ""
    side.remove(cid)
    if log is None:
        if status.exit_code != 0 or "/dev/nvidia7" not in text:
            raise SystemExit(f"bench: a container that should have the GPU nodes has not: {text[-500:]}")
        return {}
    lines = [r for r in map(json.loads, open(log)) if r.get("container_id") == cid] if os.path.exists(log) else []
    last = text.strip().splitlines()[-1].split(" ", 3)[-1] if text.strip() else ""
    if status.exit_code != 0 or [r.get("decision") for r in lines] != ["injected"] or "/dev/nvidia7" not in text \
            or not last.isdigit() or int(last) < 1:
        raise SystemExit(f"bench: the NRI plugin's container did not get the GPUs (exit {status.exit_code}, "
                         f"lines {lines}): {text[-500:]}")
    return lines[0]
