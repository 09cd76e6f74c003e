"""Just enough of kubelet for the CRI tests (test_e2e_cri, test_podevents, the sid tests):
pods and containers through a real containerd's CRI (cri_client), their logs read back, and
SHOW, the script whose output conftest.assert_8_nvidia_gpus reads."""

from __future__ import annotations

import json
import os
import uuid

from containerd_harness import CRI_NAMESPACE, IMAGE_NAME
from gpuhook.defaults import RUNTIME_HANDLER as HANDLER  # the handler `gpuhook install` configures

LIBDIR = "/usr/lib/x86_64-linux-gnu"
SHOW = ("for n in /dev/nvidia*; do [ -e $n ] && stat -c 'node %n %t:%T %F' $n; done; "
        "env | grep -E '^(GPUHOOK_|POD_)' | sort; echo accel=${GPUHOOK_ACCELERATOR:-none}; "
        "cat /dev/nvidia0 >/dev/null 2>/tmp/err && echo open ok || echo open: $(cat /tmp/err); "
        "grep -E 'libcuda' /proc/self/mountinfo | while read a b c d e f g; do echo mount $e $f; done; "
        "grep -c libcuda.so.1 /etc/ld.so.cache 2>/dev/null || echo ldcache-none; true")


class Kubelet:
    """Just enough of kubelet: pods with host network, each in a cgroup parent of its own,
    containers whose output goes to CRI log files that this class reads back."""

    def __init__(self, ctd, client, tmp_path) -> None:
        self.ctd = ctd
        self.cri = client
        self.logs = tmp_path / "pod-logs"

    def run_pod(self, name: str, handler: str = HANDLER, annotations: dict | None = None):
        cgroup_parent = f"/gpuhook-test-{uuid.uuid4().hex[:12]}"
        self.ctd.cgroup_parents.append(cgroup_parent)
        log_dir = self.logs / name
        log_dir.mkdir(parents=True, exist_ok=True)
        config = self.cri.sandbox_config(name, log_directory=str(log_dir), cgroup_parent=cgroup_parent,
                                         annotations=annotations)
        return self.cri.run_pod_sandbox(config, handler), config

    def run_to_completion(self, pod_id: str, config, name: str, script: str, timeout: float = 30):
        """Create, start and wait for a container; (its ContainerStatus, its output)."""
        cid = self.cri.create_container(pod_id, config, name, IMAGE_NAME, command=["sh", "-c", script],
                                        log_path=f"{name}/0.log", env={"POD_CONTAINER": name})
        self.cri.start_container(cid)
        status = self.cri.wait_exited(cid, timeout)
        return status, self.read_log(status.log_path)

    def read_log(self, path: str) -> str:
        """A CRI log file: `<time> <stream> <P|F> <text>` lines; the text, joined back."""
        out = []
        with open(path) as f:
            for line in f:
                ts, stream, tag, text = (line.rstrip("\n").split(" ", 3) + [""])[:4]
                out.append(text if tag == "F" else text + "\0")
        return "\n".join(out).replace("\0\n", "")

    def bundle_spec(self, cid: str) -> dict:
        path = os.path.join(self.ctd.state, "io.containerd.runtime.v2.task", CRI_NAMESPACE, cid, "config.json")
        with open(path) as f:
            return json.load(f)
