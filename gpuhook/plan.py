"""Policy: (Inventory, Request) -> Edits. Every decision about what a container gets lives here.

The probe only reports and the spec editor only applies; this module decides.
"""


import os
from .record import Record

from .edits import Edits, DeviceNode, Hook, Mount
from .inventory import Inventory, Node

SANDBOX_ANNOTATIONS = (
    ("io.kubernetes.cri.container-type", "sandbox"),  # containerd CRI
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),  # CRI-O
)
INJECT_ANNOTATION = "gpuhook.dev/inject"
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig", "/usr/sbin/ldconfig")
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
# A createContainer hook runs in the container's mount namespace before pivot_root, as root
# on the host. `ldconfig -r` chroots into the rootfs first, so no link in the image can lead
# it to a host path; a failure is reported but never stops the container.
LDCACHE_SCRIPT = ('l=$1; r=$2; shift 2; "$l" -r "$r" "$@" '
                  '|| echo "gpuhook: ldconfig in $r failed; driver libraries need LD_LIBRARY_PATH" >&2; exit 0')


class Request(Record, fields="env annotations rootfs device_paths"):
    """What the container brings: its env (dict), annotations (dict), absolute rootfs path
    (None when unknown), and the paths of device nodes its spec already has."""

    __slots__ = ()

    @property
    def is_sandbox(self) -> bool:
        return any(self.annotations.get(k) == v for k, v in SANDBOX_ANNOTATIONS)


def request_from_spec(spec: dict, bundle: str | None = None) -> Request:
    process = spec.get("process") if isinstance(spec.get("process"), dict) else {}
    env = {}
    for item in process.get("env") or ():
        if isinstance(item, str):
            k, _, v = item.partition("=")
            env[k] = v
    annotations = spec.get("annotations")
    annotations = {k: v for k, v in annotations.items() if isinstance(v, str)} if isinstance(annotations, dict) else {}
    root = spec.get("root")
    rootfs = root.get("path") if isinstance(root, dict) else None
    if isinstance(rootfs, str) and rootfs:
        if not rootfs.startswith("/"):
            rootfs = os.path.join(bundle, rootfs) if bundle else None
    else:
        rootfs = None
    linux = spec.get("linux") if isinstance(spec.get("linux"), dict) else {}
    paths = frozenset(d.get("path") for d in linux.get("devices") or () if isinstance(d, dict))
    return Request(env, annotations, rootfs and os.path.normpath(rootfs), paths)


def find_ldconfig() -> str | None:
    """The node's own ldconfig (the hook runs on the real node, not in a fake host root)."""
    return next((p for p in LDCONFIG_CANDIDATES if os.access(p, os.X_OK)), None)


def _node(n: Node) -> DeviceNode:
    return DeviceNode(n.path, n.type, n.major, n.minor, "rwm", n.file_mode, n.uid, n.gid)


def _on_host(root: str, path: str) -> str:
    """A node path as the runtime sees it: under the host root (tests, dry runs) or as is."""
    return path if root == "/" else root.rstrip("/") + path


def plan(inv: Inventory, req: Request, ldconfig: str | None = None) -> Edits:
    """The edits for one container. Empty Edits mean: leave the spec exactly as it is."""
    if req.is_sandbox or not inv.vendors:
        return Edits()
    if req.annotations.get(INJECT_ANNOTATION, "").strip().lower() in ("false", "0", "no", "off"):
        return Edits()
    nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    accelerators: list[str] = []
    ids: list[str] = []
    for v in inv.vendors:
        if not v.devices:
            continue
        accelerators.append(v.vendor)
        for d in v.devices:
            nodes.extend(_node(n) for n in d.nodes)
            ids.append(f"{v.vendor}:{d.id}")
        nodes.extend(_node(n) for n in v.control_nodes)
        mounts.extend(Mount(_on_host(inv.root, lib.path), lib.path) for lib in v.libraries)
        mounts.extend(Mount(_on_host(inv.root, b), b) for b in v.binaries)
    if not accelerators:
        return Edits()
    nodes = list(dict.fromkeys(nodes))
    env = (f"GPUHOOK_ACCELERATOR={','.join(accelerators)}", f"GPUHOOK_DEVICES={','.join(ids)}")
    hooks: tuple[Hook, ...] = ()
    lib_dirs = sorted({os.path.dirname(m.container_path) for m in mounts if ".so" in m.container_path})
    if lib_dirs and req.rootfs:
        ldconfig = ldconfig or find_ldconfig()
        if ldconfig:
            hooks = (Hook("createContainer", "/bin/sh",
                          ("sh", "-c", LDCACHE_SCRIPT, "gpuhook-ldcache", ldconfig, req.rootfs, *lib_dirs),
                          HOOK_ENV, 30),)
    return Edits(env, tuple(nodes), tuple(dict.fromkeys(mounts)), hooks, ())
