"""Minimal OCI bundles for demos, tests and benchmarks: a busybox-static rootfs and a spec."""

from __future__ import annotations

import json
import os
import shutil

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
APPLETS = (
    "sh",
    "ls",
    "cat",
    "grep",
    "env",
    "stat",
    "true",
    "echo",
    "sleep",
    "readlink",
    "head",
    "wc",
    "id",
    "sed",
    "sort",
    "cut",
    "tr",
)


def find_busybox() -> str | None:
    """A statically linked busybox (busybox-static); a dynamic one would need its libc."""
    for p in BUSYBOX_CANDIDATES:
        if os.path.exists(p):
            with open(p, "rb") as f:
                head = f.read(4096)
            if b"/lib64/ld-linux" not in head and b"/lib/ld-linux" not in head:
                return p
    return None


def make_rootfs(rootfs: str, busybox: str | None = None) -> None:
    busybox = busybox or find_busybox()
    if busybox is None:
        raise FileNotFoundError("no static busybox (apt-get install busybox-static)")
    for d in ("bin", "etc", "dev", "proc", "sys", "tmp"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(rootfs, "bin", "busybox"))
    for applet in APPLETS:
        link = os.path.join(rootfs, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    with open(os.path.join(rootfs, "etc", "ld.so.conf"), "w") as f:
        f.write("")


def spec(
    args: list[str], env: list[str] | None = None, annotations: dict | None = None, rootfs: str = "rootfs"
) -> dict:
    """A runc-style spec (what `runc spec` gives, non-terminal) running `args`."""
    s = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + list(env or []),
            "cwd": "/",
            "capabilities": {
                k: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                for k in ("bounding", "effective", "permitted", "ambient")
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": "gpuhook",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
            },
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
            "maskedPaths": ["/proc/kcore", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"],
        },
    }
    if annotations:
        s["annotations"] = dict(annotations)
    return s


def make_bundle(bundle: str, args: list[str], **kw) -> str:
    """bundle/rootfs + bundle/config.json; returns the config.json path."""
    make_rootfs(os.path.join(bundle, "rootfs"))
    path = os.path.join(bundle, "config.json")
    with open(path, "w") as f:
        json.dump(spec(args, **kw), f, indent=2)
    return path
