"""`gpuhook dra` as a process: bad input is one line; running, it publishes the node's slices,
serves the kubelet, puts back an edited slice, drops a GPU that left and tells the pods that
held it, and stops on SIGTERM with its sockets gone and its prepared claims kept."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

from conftest import REPO
from dra_api import DRAFakeAPI, wait_for
from gpuhook.dra import DRIVER, dra_pb2, dra_pb2_grpc, driver, pluginregistration_pb2, pluginregistration_pb2_grpc
from fakes import fakehost
from fakes.kubeapi import write_kubeconfig

NODE = "node-1"
GPU0 = "nvidia-gpu-00000000-1111-2222-3333-444444444444"


def _gpuhook(*args: str, env: dict | None = None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "gpuhook", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env, **kw
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (["--root", "/nonexistent"], "gpuhook: --root /nonexistent: not a directory"),
        (["--interval", "0"], "gpuhook: --interval must be more than 0"),
        (["--plugins-dir", "plugins"], "gpuhook: --plugins-dir plugins: not an absolute path"),
        (["--context", "x"], "gpuhook: --context needs --kubeconfig"),
        (
            ["--max-cdi-version", "0.9.0"],
            "gpuhook: --max-cdi-version 0.9.0: one of 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0",
        ),
        (["--cdi-format", "toml"], None),  # argparse's own usage error
        (
            ["--kubeconfig", "/nonexistent"],
            "gpuhook: --kubeconfig /nonexistent: Configuration file /nonexistent not found",
        ),
        (
            [],
            "gpuhook: no Kubernetes API: run in a pod (its service account) or give --kubeconfig FILE "
            "(the allocations the kubelet asks to prepare are in ResourceClaims)",
        ),
        (["--interval", "soon"], None),  # argparse's own usage error
        (["--interval", "inf"], None),
    ],
)
def test_bad_input_is_one_line(args, line):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "NODE_NAME")}
    r = _gpuhook("dra", *args, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    if line is not None:
        assert r.stderr == line + "\n" and r.stdout == ""


def test_the_driver_running(tmp_path):
    base = tempfile.mkdtemp(prefix="dra-", dir="/tmp")  # unix socket paths are short
    api = DRAFakeAPI(node=NODE)
    fh = fakehost.FakeHost(str(tmp_path / "host"), mknod=False)
    fakehost.nvidia(fh, gpus=2)
    kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api, ca="none")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuhook", "dra", "--root", fh.root, "--kubeconfig", kubeconfig, "--node", NODE]
        + ["--plugins-dir", f"{base}/plugins", "--registry-dir", f"{base}/registry", "--cdi-dir", f"{base}/cdi"]
        + ["--interval", "0.2", "--ldconfig", "/sbin/ldconfig", "--log-format", "json"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    reg = f"{base}/registry/{DRIVER}-reg.sock"
    try:
        slice_name = f"{NODE}-{DRIVER}-0"
        devices = wait_for(
            lambda: [d["name"] for d in api.slices.get(slice_name, {}).get("spec", {}).get("devices", [])]
        )
        assert devices == [GPU0, "nvidia-gpu-00000001-1111-2222-3333-444444444445", "none"]
        assert sorted(os.listdir(f"{base}/cdi")) == [
            "gpuhook.dev-gpu.yaml",
            "gpuhook.dev-none.yaml",
            "gpuhook.dev-nvidia.yaml",
        ]

        wait_for(lambda: os.path.exists(reg))
        with grpc.insecure_channel(f"unix://{reg}") as ch:
            info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=10
            )
        assert info.endpoint == f"{base}/plugins/{DRIVER}/dra.sock"
        pod = api.add_pod("ml", "trainer", "pod-uid-1")
        api.add_claim(
            "ml",
            "trainer-gpu",
            "claim-1",
            [{"request": "gpu/gpu", "driver": DRIVER, "pool": NODE, "device": GPU0}],
            pods=(pod,),
        )
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            got = dra_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(
                    claims=[dra_pb2.Claim(namespace="ml", name="trainer-gpu", uid="claim-1")]
                ),
                timeout=10,
            )
        assert list(got.claims["claim-1"].devices[0].cdi_device_ids) == [
            "gpuhook.dev/nvidia=GPU-00000000-1111-2222-3333-444444444444"
        ]

        # someone else edits the slice: put back
        api.edit_slice(slice_name, lambda s: s["spec"]["devices"].pop())
        wait_for(lambda: len(api.slices[slice_name]["spec"]["devices"]) == 3)

        # the prepared GPU leaves the node: the slice drops it, the pod holding it is told
        shutil.rmtree(fh.p("/proc/driver/nvidia/gpus/0000:18:00.0"))
        wait_for(lambda: GPU0 not in [d["name"] for d in api.slices[slice_name]["spec"]["devices"]])
        ev = wait_for(lambda: api.pod_events())
        assert [(e["reason"], e["type"], e["involvedObject"]["name"], e["involvedObject"]["uid"]) for e in ev] == [
            ("GPULost", "Warning", "trainer", "pod-uid-1")
        ]
        assert ev[0]["message"] == f"{GPU0} left node {NODE}: ResourceClaim ml/trainer-gpu holds it"
        time.sleep(0.6)  # more rounds: told once
        assert len(api.pod_events()) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        api.close()
    try:
        assert proc.returncode == 0, err
        assert not os.path.exists(reg) and not os.path.exists(f"{base}/plugins/{DRIVER}/dra.sock")
        claims = json.load(open(f"{base}/plugins/{DRIVER}/{driver.CHECKPOINT}"))["claims"]
        assert list(claims) == ["claim-1"]  # the kubelet unprepares; a stop does not
        records = [json.loads(line) for line in err.splitlines()]
        events = [r["event"] for r in records]
        assert "dra.serving" in events and "dra.gpu.lost" in events and events[-1] == "dra.stopped"
        prepares = [(r["event"], r["claim"], r["uid"], r.get("source")) for r in records if "uid" in r]
        assert prepares[:2] == [
            (driver.PREPARE_CALLED, "ml/trainer-gpu", "claim-1", None),
            (driver.PREPARE_ANSWERED, "ml/trainer-gpu", "claim-1", driver.SOURCE_ALLOCATION),
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
