"""A node from a Debian sid root, for the tests of the runtimes clusters run in 2026
(test_sid_runtimes, test_sid_nri): the cached root and a writable overlay of it per test
(fixtures sid_root and node: a pytest plugin, tests/conftest.py registers it), tools run
inside it, containerd 2.x's own default config, gpuhook's CDI specs written inside it."""

from __future__ import annotations

import os
import subprocess

import pytest

import debroot
from containerd_harness import IMAGE_NAME, Containerd
from kubelet import HANDLER, LIBDIR  # noqa: F401 (the sid tests' too)

RELEASE = "sid"
# what these tests run inside the root (docker.io has no `docker` in sid: docker-cli)
PACKAGES = ("containerd", "runc", "crun", "podman", "docker.io", "docker-cli", "busybox-static",
            "ca-certificates", "iproute2")
MUST_HAVE = ("usr/bin/containerd", "usr/bin/ctr", "usr/sbin/runc", "usr/bin/crun", "usr/bin/podman", "usr/sbin/dockerd",
             "usr/bin/docker")


@pytest.fixture(scope="session")
def sid_root():
    """The cached sid root (built when missing or stale), held shared for the session."""
    try:
        with debroot.ensure(RELEASE, PACKAGES, must_have=MUST_HAVE) as root:
            yield root
    except debroot.RootUnavailable as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def node(sid_root, tmp_path):
    """A writable overlay of the sid root: this test's node."""
    with debroot.overlay(sid_root, str(tmp_path / "sid")) as root:
        yield root


def in_root(node: str, argv: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    """Run a tool of the root (chroot is enough for what starts no container)."""
    r = subprocess.run(["chroot", node, *argv], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert not check or r.returncode == 0, f"{argv}: exit {r.returncode}\n{r.stderr}"
    return r


def operator_config(node: str, ctd: Containerd) -> bytes:
    """`containerd config default` of the root's containerd with what this machine needs
    (../shared/docs/real-runtimes.md, "Newer runtimes") and the harness's paths."""
    import tomlkit

    doc = tomlkit.parse(in_root(node, ["containerd", "config", "default"]).stdout)
    assert doc["version"] == 3, "sid's containerd writes config version 3"
    doc["root"], doc["state"] = ctd.root, ctd.state
    doc["grpc"]["address"], doc["ttrpc"]["address"] = ctd.address, ctd.ttrpc_address
    doc["disabled_plugins"] = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                               "io.containerd.snapshotter.v1.devmapper"]
    plugins = doc["plugins"]
    plugins["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"] = True  # no CAP_SYS_RESOURCE here
    plugins["io.containerd.cri.v1.runtime"]["disable_apparmor"] = True
    plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] = IMAGE_NAME
    return tomlkit.dumps(doc).encode()


def nri_config(root: str, ctd: Containerd, socket_path: str) -> bytes:
    """The operator config with gpu-optional as a plain runc handler (runc's own entry,
    copied: no BinaryName) and NRI's socket at `socket_path` (NRI itself is on by default)."""
    import tomlkit

    doc = tomlkit.parse(operator_config(root, ctd).decode())
    runtimes = doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    runtimes[HANDLER] = tomlkit.parse(tomlkit.dumps({"x": runtimes["runc"]}))["x"]
    assert runtimes[HANDLER].get("options", {}).get("BinaryName", "") == ""  # runc itself
    nri = doc["plugins"]["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False, "containerd 2.x has NRI on by default"
    nri["socket_path"] = socket_path
    return tomlkit.dumps(doc).encode()


def in_namespace(node: str, command: str, visible: tuple[str, ...], env: dict | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a shell command with the node as its real root (what starts containers needs it),
    `visible` mounted at the same paths."""
    argv = debroot.enter_argv(node, command, binds=tuple((d, d) for d in dict.fromkeys(visible)), env=env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def cdi_spec_for(node: str, host: str, real_bundle: str) -> None:
    """gpuhook's CDI specs for the fake host `host`, written by the bundle's gpuhook inside the
    root where its runtimes read them (/etc/cdi): the spec's host paths are the fake host's
    (visible inside at the same path), its ld-cache hook the bundle's and the root's ldconfig."""
    r = in_namespace(node, f"{real_bundle}/bin/gpuhook cdi generate --root {host} --spec-root {host} "
                     "--output-dir /etc/cdi --ldconfig /sbin/ldconfig", (host, real_bundle),
                     env={"GPUHOOK_CONFIG": "/nonexistent/gpuhook.toml"})
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(node, "etc/cdi/gpuhook.dev-gpu.yaml")), os.listdir(os.path.join(node, "etc/cdi"))
