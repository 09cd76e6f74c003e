"""Play kubelet: CRI v1 over gRPC against a real containerd whose `gpu-optional` runtime handler
runs gpuhook-runtime, on a fake 8-GPU NVIDIA host (root).

The handler is written into the harness's config.toml here; the installer (`gpuhook install
--runtime containerd`) is to produce the same section.
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import gpuhook, needs_cri, nodes_of, records, wrapper_path
from containerd_harness import IMAGE_NAME
from gpuhook.runtime import exec as execenv
from kubelet import HANDLER, LIBDIR, SHOW, Kubelet

pytestmark = needs_cri

@pytest.fixture
def kubelet(make_host, runtime, containerd, cri_stubs, tmp_path):
    import cri_client

    rt = runtime(make_host("nvidia", mknod=True))
    ctd = containerd(rt, cri=True, runtimes={HANDLER: {"binary": wrapper_path(),
                                                       "pod_annotations": ["gpuhook.dev/*"]}})
    client = cri_client.CRIClient(ctd.address, cri_stubs)
    ctd.before_stop(client.close)
    ctd.before_stop(client.remove_all)  # runs first: pods go through CRI, as kubelet does it
    client.wait_image(IMAGE_NAME)
    k = Kubelet(ctd, client, tmp_path)
    k.rt = rt
    return k


POD_KEYS = ("pod_namespace", "pod_name", "pod_uid", "container_name")


def test_gpu_optional_pod_gets_the_hosts_gpus(kubelet):
    pod_id, config = kubelet.run_pod("gpu-pod")
    status, out = kubelet.run_to_completion(pod_id, config, "app", SHOW)
    assert status.exit_code == 0, out
    nodes = nodes_of(out)
    for minor in range(8):
        assert nodes[f"/dev/nvidia{minor}"] == (195, minor)
    assert nodes["/dev/nvidiactl"] == (195, 255)
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in out
    assert "accel=nvidia" in out and "POD_CONTAINER=app" in out
    mounts = [line.split()[1:] for line in out.splitlines() if line.startswith("mount ")]
    assert [m[0] for m in mounts] == [f"{LIBDIR}/libcuda.so.550.54.14", f"{LIBDIR}/libcuda.so"]
    assert all(m[1].split(",")[0] == "ro" for m in mounts)
    assert "ldcache-none" not in out and int(out.strip().splitlines()[-1]) >= 1  # hook wrote the cache
    rec = records(kubelet.rt, status.id)
    assert [r["decision"] for r in rec] == ["injected"]
    # the line names the pod, from the annotations containerd put in the spec
    assert {k: rec[0].get(k) for k in POD_KEYS} == {"pod_namespace": "default", "pod_name": "gpu-pod",
                                                    "pod_uid": "uid-gpu-pod", "container_name": "app"}
    # the pause container went through the handler too, and was left exactly alone
    assert [r["decision"] for r in records(kubelet.rt, pod_id)] == ["sandbox"]
    sandbox = kubelet.bundle_spec(pod_id)
    assert sandbox["annotations"]["io.kubernetes.cri.container-type"] == "sandbox"
    assert not any(e.startswith("GPUHOOK_") for e in sandbox["process"]["env"])
    assert not any("nvidia" in d.get("path", "") for d in sandbox["linux"].get("devices") or [])
    assert "hooks" not in sandbox or not sandbox["hooks"].get("createContainer")
    # exec (ExecSync: what `kubectl exec` uses) goes through the wrapper too, as `runc exec
    # --process FILE` with containerd's own copy of the process: the exec'd shell sees the
    # GPUHOOK_* env the container's first process got
    sleeper = kubelet.cri.create_container(pod_id, config, "sleeper", IMAGE_NAME,
                                           command=["sleep", "600"], log_path="sleeper/0.log")
    kubelet.cri.start_container(sleeper)
    r = kubelet.cri.exec_sync(sleeper, ["sh", "-c", "stat -c '%t:%T' /dev/nvidia7; env | grep ^GPUHOOK_ | sort; "
                                        "tr '\\0' '\\n' </proc/1/environ | grep ^GPUHOOK_ | sort"])
    assert r.exit_code == 0, r
    out = r.stdout.decode().split()
    assert out[0] == "c3:7" and "GPUHOOK_ACCELERATOR=nvidia" in out[1:3], out
    assert out[1:3] == out[3:5] and out[2].startswith("GPUHOOK_DEVICES=nvidia:GPU-"), out
    assert [r["decision"] for r in records(kubelet.rt, sleeper)] == ["injected"]
    assert not [r for r in kubelet.rt.log_records() if r["event"] == "exec"]  # nothing odd to say
    # the record is keyed by containerd's runc root for k8s.io; `delete` is runc's alone, and
    # a later create's sweep finds these containers gone from that root (aged: a minute on)
    exec_records = os.path.join(kubelet.rt.env["GPUHOOK_CACHE_DIR"], "exec")
    key = os.path.join(kubelet.ctd.runc_root, "k8s.io").replace("/", "%2F")
    assert sleeper in os.listdir(os.path.join(exec_records, key))
    record = execenv.record_path(kubelet.rt.env["GPUHOOK_CACHE_DIR"], os.path.join(kubelet.ctd.runc_root, "k8s.io"),
                                 sleeper, "runc")
    execenv.sweep(record, os.path.join(kubelet.ctd.runc_root, "k8s.io"), "runc", now=time.time() + 3600)
    assert sleeper in os.listdir(os.path.join(exec_records, key))  # it runs: kept, however old
    kubelet.cri.remove_all()
    left = os.listdir(os.path.join(exec_records, key))
    assert sleeper in left
    assert execenv.sweep(record, os.path.join(kubelet.ctd.runc_root, "k8s.io"), "runc",
                         now=time.time() + 3600) == len(left)
    assert os.listdir(os.path.join(exec_records, key)) == []


def test_inject_false_annotation_gets_nothing(kubelet):
    pod_id, config = kubelet.run_pod("no-gpu-pod", annotations={"gpuhook.dev/inject": "false",
                                                                 "other.example/ignored": "x",
                                                                 # a tenant naming another namespace's pod
                                                                 "io.kubernetes.cri.sandbox-namespace": "kube-system",
                                                                 "io.kubernetes.pod.namespace": "kube-system"})
    status, out = kubelet.run_to_completion(pod_id, config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out) == {}
    assert "accel=none" in out and "GPUHOOK_" not in out and "mount " not in out
    assert "open: cat: can't open '/dev/nvidia0': No such file or directory" in out
    assert "ldcache-none" in out
    (rec,) = records(kubelet.rt, status.id)
    assert rec["decision"] == "declined" and rec["reason"] == 'the pod says gpuhook.dev/inject: "false"'
    assert {k: rec.get(k) for k in POD_KEYS} == {"pod_namespace": "default", "pod_name": "no-gpu-pod",
                                                 "pod_uid": "uid-no-gpu-pod", "container_name": "app"}
    # pod_annotations = ["gpuhook.dev/*"] passed the opt-out, and only it, to the containers'
    # config.json; gpuhook left it as containerd wrote it (read from a running container's bundle)
    sleeper = kubelet.cri.create_container(pod_id, config, "sleeper", IMAGE_NAME,
                                           command=["sleep", "600"], log_path="sleeper/0.log")
    kubelet.cri.start_container(sleeper)
    for cid in (pod_id, sleeper):
        spec = kubelet.bundle_spec(cid)
        assert spec["annotations"]["gpuhook.dev/inject"] == "false"
        assert "other.example/ignored" not in spec["annotations"]
        assert not any(e.startswith("GPUHOOK_") for e in spec["process"]["env"])
        assert not any("nvidia" in d.get("path", "") for d in spec["linux"].get("devices") or [])
    assert [r["decision"] for r in records(kubelet.rt, sleeper)] == ["declined"]
    r = kubelet.cri.exec_sync(sleeper, ["sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}"])
    assert r.exit_code == 0 and r.stdout.decode().split() == ["accel=none"], r


def test_default_handler_does_not_go_through_gpuhook(kubelet):
    pod_id, config = kubelet.run_pod("plain-pod", handler="")
    status, out = kubelet.run_to_completion(pod_id, config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out) == {} and "accel=none" in out
    assert kubelet.rt.log_records() == []


def test_unconfigured_handler_is_refused(kubelet):
    import grpc

    with pytest.raises(grpc.RpcError) as e:
        kubelet.run_pod("lost-pod", handler="no-such-handler")
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert 'no runtime for "no-such-handler" is configured' in e.value.details()
    assert kubelet.cri.list_pod_sandbox() == []


# -- the handler as `gpuhook install` writes it, and as `gpuhook uninstall` takes it away ------

def test_installed_handler_through_cri_then_uninstalled(make_host, runtime, containerd, cri_stubs,
                                                        real_bundle, tmp_path):
    """The node as an operator gets it: containerd's own config.toml under a node root, edited
    by `gpuhook install --runtime containerd --restart none`, BinaryName at /opt/gpuhook (the
    host bundle, bind-mounted there for containerd only); after `gpuhook uninstall` and a
    restart, the handler is gone."""
    import cri_client
    import grpc

    node = tmp_path / "node"
    config = node / "etc" / "containerd" / "config.toml"

    def install(path):
        original[0] = open(path, "rb").read()
        gpuhook("install", "--runtime", "containerd", "--restart", "none", "--bundle-dir", real_bundle, "--host-root", node,
                check=True)

    original = [b""]
    rt = runtime(make_host("nvidia", mknod=True))
    ctd = containerd(rt, cri=True, config_path=str(config), edit_config=install,
                     binds={"/opt/gpuhook": str(node / "opt" / "gpuhook")})
    client = cri_client.CRIClient(ctd.address, cri_stubs)
    ctd.before_stop(client.close)
    ctd.before_stop(client.remove_all)
    client.wait_image(IMAGE_NAME)
    k = Kubelet(ctd, client, tmp_path)

    pod_id, pod_config = k.run_pod("installed")
    status, out = k.run_to_completion(pod_id, pod_config, "app", SHOW)
    assert status.exit_code == 0, out
    assert nodes_of(out)["/dev/nvidia3"] == (195, 3) and "accel=nvidia" in out
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in out
    # the bundled gpuhook-runtime (its own Python) did it, and left the pause container alone
    assert [r["decision"] for r in records(rt, status.id)] == ["injected"]
    assert [r["decision"] for r in records(rt, pod_id)] == ["sandbox"]
    # and an exec into a container of the installed handler sees the env (the bundled runtime too)
    sleeper = client.create_container(pod_id, pod_config, "sleeper", IMAGE_NAME, command=["sleep", "600"],
                                      log_path="sleeper/0.log")
    client.start_container(sleeper)
    r = client.exec_sync(sleeper, ["sh", "-c", "echo $GPUHOOK_ACCELERATOR"])
    assert r.exit_code == 0 and r.stdout.decode().split() == ["nvidia"], r

    client.remove_all()
    gpuhook("uninstall", "--runtime", "containerd", "--restart", "none", "--host-root", node, check=True)
    assert config.read_bytes() == original[0]
    ctd.restart()  # the gRPC channel reconnects by itself
    client.wait_image(IMAGE_NAME)
    with pytest.raises(grpc.RpcError) as e:
        k.run_pod("after-uninstall")
    assert 'no runtime for "gpu-optional" is configured' in e.value.details()
