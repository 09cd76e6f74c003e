"""`docker exec` into a `--runtime gpu-optional` container sees the GPUHOOK_* env (root).

A dockerd of the test's own (docker_harness.py: its data-root, exec-root, pidfile, socket; no
iptables, no bridge, vfs), with `runtimes["gpu-optional"]` in the daemon.json this test
writes, pointing at the installed gpuhook-runtime; a busybox image made with `docker import`.
dockerd builds an exec'd process from its own copy of the spec, as containerd does: the
wrapper adds what it recorded at create.
"""

from __future__ import annotations

import json
import os

import docker_harness
from conftest import is_root, requires, wrapper_path
from gpuhook.runtime import exec as execenv
from fakes import bundle

IMAGE = "localhost/gpuhook-exec-busybox:test"

pytestmark = requires(
    bool(is_root() and not docker_harness.missing_tools() and bundle.find_busybox() and wrapper_path()),
    "needs root, Debian's docker.io (dockerd, docker), containerd, runc, busybox-static and an installed "
    f"gpuhook-runtime; missing: {', '.join(docker_harness.missing_tools()) or 'none'}")


def test_docker_exec_sees_the_env_gpuhook_added(make_host, runtime, dockerd, tmp_path):
    rt = runtime(make_host("nvidia", mknod=True, gpus=2, libs=False))
    daemon_json = tmp_path / "daemon.json"
    d = dockerd(str(daemon_json), {k: v for k, v in rt.env.items() if k.startswith("GPUHOOK_")}, {})
    daemon_json.write_text(json.dumps({**d.settings(), "runtimes": {"gpu-optional": {"path": wrapper_path()}}}))
    d.start()
    d.import_busybox(IMAGE)
    cid = d.docker("run", "-d", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sleep", "600").stdout.strip()
    show = "echo accel=${GPUHOOK_ACCELERATOR:-none}; echo devices=${GPUHOOK_DEVICES:-none}; stat -c '%t:%T' /dev/nvidia1"
    out = d.docker("exec", cid, "sh", "-c", show).stdout.split()
    assert out[0] == "accel=nvidia" and out[1].count("nvidia:GPU-") == 2 and out[2] == "c3:1", out
    records = [r for r in rt.log_records() if r["container_id"] == cid]
    assert [r["decision"] for r in records] == ["injected"]
    exec_dir = os.path.join(rt.env["GPUHOOK_CACHE_DIR"], "exec")
    (key,) = os.listdir(exec_dir)  # dockerd's runtime root for gpu-optional, moby namespace
    exec_root = d.settings()["exec-root"]
    assert key.startswith(exec_root.replace("/", "%2F")) and os.listdir(os.path.join(exec_dir, key)) == [cid]
    # the default runtime (plain runc) on the same node: nothing
    plain = d.docker("run", "-d", "--network", "none", IMAGE, "sleep", "600").stdout.strip()
    out = d.docker("exec", plain, "sh", "-c", "echo accel=${GPUHOOK_ACCELERATOR:-none}").stdout.split()
    assert out == ["accel=none"]
    d.docker("rm", "-f", cid, plain)
    # `delete` is runc's alone: the record goes with the next injecting create under this root,
    # once it is older than a create may take (aged here), and the new container keeps its own
    record = os.path.join(exec_dir, key, cid)
    assert os.path.exists(record)
    old = os.stat(record).st_mtime - execenv.SWEEP_AFTER_S - 1
    os.utime(record, (old, old))
    cid2 = d.docker("run", "-d", "--runtime", "gpu-optional", "--network", "none", IMAGE, "sleep", "600").stdout.strip()
    assert os.listdir(os.path.join(exec_dir, key)) == [cid2]
    d.docker("rm", "-f", cid2)
