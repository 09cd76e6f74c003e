"""The versions of the real cluster the suite proves gpuhook against: one place, read by the
builder (gobuild.py), the harness, the docs' check (tests/unit/test_docs.py) and the tests.

Each entry: the Go module and its version as the module proxy serves them, the directory under
tests/cluster/build/ whose go.mod pins it (with go.sum: what is built is what was checked), and
the main packages built from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Component:
    name: str  # the cache's key, with version: bin/<name>-<version>-<inputs>/
    module: str  # the Go module the binaries come from
    version: str
    module_dir: str  # under tests/cluster/build/: the go.mod (and go.sum) that pins it
    packages: tuple[str, ...]  # the main packages, each a binary named after its last element
    ldflags: tuple[str, ...] = ()  # -X stamps (a module-proxy build has no git to read them from)
    rename: tuple[tuple[str, str], ...] = ()  # (go build's name, the binary's): go names .../server/v3 "server"
    tags: tuple[str, ...] = ()  # go build -tags
    cgo: bool = False  # CGO_ENABLED=1: linked to the building machine's C libraries; else static


KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"


def _k8s_stamps(version: str) -> tuple[str, ...]:
    # what the release's own hack/lib/version.sh sets (else the binaries say v0.0.0-master)
    major, minor = version.lstrip("v").split(".")[:2]
    return (f"-X k8s.io/component-base/version.gitVersion={version}",
            f"-X k8s.io/component-base/version.gitMajor={major}",
            f"-X k8s.io/component-base/version.gitMinor={minor}")


KUBERNETES = Component(
    "kubernetes", "k8s.io/kubernetes", KUBERNETES_VERSION, "kubernetes",
    tuple(f"k8s.io/kubernetes/cmd/{c}" for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                                  "kubelet", "kube-proxy", "kubectl")),
    _k8s_stamps(KUBERNETES_VERSION))

ETCD = Component("etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION, "etcd", ("go.etcd.io/etcd/server/v3",),
                 rename=(("server", "etcd"),))

# the nodes' pod network: CNI's reference plugins (bridge, host-local, loopback, portmap)
CNI_PLUGINS_VERSION = "v1.10.0"
CNI_PLUGINS = Component(
    "cni-plugins", "github.com/containernetworking/plugins", CNI_PLUGINS_VERSION, "cni",
    tuple(f"github.com/containernetworking/plugins/plugins/{p}"
          for p in ("main/bridge", "ipam/host-local", "main/loopback", "meta/portmap")))

# one node's container runtime instead of Debian sid's (node.py: the CPU node's)
CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
CONTAINERD = Component(
    "containerd", "github.com/containerd/containerd/v2", CONTAINERD_VERSION, "containerd",
    (*(f"github.com/containerd/containerd/v2/cmd/{c}" for c in ("containerd", "containerd-shim-runc-v2", "ctr")),
     "github.com/opencontainers/runc"),
    # runc's seccomp (cgo, libseccomp-dev): containerd gives every pod sandbox its default profile
    tags=("seccomp",), cgo=True)

# by name
COMPONENTS = {c.name: c for c in (KUBERNETES, ETCD, CNI_PLUGINS, CONTAINERD)}
