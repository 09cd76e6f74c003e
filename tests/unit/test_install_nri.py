"""`gpuhook install --front nri` (and back to `--front wrapper`) on temp host roots.

The containerd configs are each release's real `containerd config default`
(tests/fixtures/containerd-config-default/, checked here against each release's binary: 1.6
Debian 12's, 1.7 Debian 13's, 2.1 sid's, this machine's own where it is that release, else
from a Debian root of that release), and the node's containerd binary, where the test needs
one, is the real one (a hard link):
- 1.6 (no NRI) refused with one line, nothing written;
- 1.7 (NRI off by default): NRI turned on, the handler plain runc;
- 2.x (NRI on by default): NRI left as it is;
- CRI-O: the drop-in with the node's runc and `[crio.nri] enable_nri = true`;
- every uninstall gives the config back byte for byte, and switching fronts leaves no trace
  of the other (gpuhook-nri.service against the runtime server's units).
The real containerd 2.1 running on what install wrote, with the plugin from the unit's
command line: tests/e2e/test_sid_nri.py.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import subprocess
import sys
import tomllib

import pytest

import debroot
import sid_node
from conftest import REPO, fake_systemctl, gpuhook as cli, is_root, run_as_pod
from gpuhook.install import containerd as ctd
from gpuhook import hook
from gpuhook.install import core, units

FIXTURES = os.path.join(REPO, "tests", "fixtures", "containerd-config-default")
CONFIG = "etc/containerd/config.toml"
DROPIN = "etc/crio/crio.conf.d/99-gpuhook.toml"
UNIT = "etc/systemd/system/gpuhook-nri.service"
SERVER_UNITS = [f"etc/systemd/system/{n}" for n in units.TEXTS]
NRI = "io.containerd.nri.v1.nri"
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# release -> (fixture, `containerd --version` contains, the Debian release whose containerd it
# is: this machine's own where it is that one, else that release's root, built (debroot) and
# held for this module where it is not cached)
RELEASES = {
    "1.6": ("1.6.20.toml", "1.6.20~ds1", "bookworm"),
    "1.7": ("1.7.24.toml", "1.7.24~ds1", "trixie"),
    "2.1": ("2.1.9.toml", "2.1.9", "sid"),
}
ROOTS = {  # a root's release -> how to ask debroot for it (the one the suite's other users ask for)
    "bookworm": {"include": (), "apt": ("containerd",), "must_have": ("usr/bin/containerd",)},
    "trixie": {"include": (), "apt": ("containerd",), "must_have": ("usr/bin/containerd",)},
    "sid": {"include": sid_node.PACKAGES, "must_have": sid_node.MUST_HAVE},
}
_HOLDS = contextlib.ExitStack()


@pytest.fixture(scope="module", autouse=True)
def _roots_held():
    with _HOLDS:
        yield


def fixture(release: str) -> bytes:
    with open(os.path.join(FIXTURES, RELEASES[release][0]), "rb") as f:
        return f.read()


def containerd_version(rootfs: str) -> str:
    """What the containerd of `rootfs` ("/": this machine) says of its version ("" for none)."""
    chroot = [] if rootfs == "/" else ["chroot", rootfs]
    try:
        return subprocess.run(chroot + ["/usr/bin/containerd", "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except OSError:
        return ""


def real_binary(release: str) -> str:
    """The release's containerd: this machine's where it is that one (a Debian 12 machine's is
    1.6, a Debian 13 one's 1.7), else its Debian root's (built where not cached: as root only;
    a skip otherwise). Never another release's binary: the fixtures are each release's."""
    _, version, release_root = RELEASES[release]
    if debroot.host_release() == release_root and version in containerd_version("/"):
        return "/usr/bin/containerd"
    if not is_root():
        pytest.skip(f"containerd {release} comes from a Debian {release_root} root: needs root")
    spec = ROOTS[release_root]
    root = _HOLDS.enter_context(debroot.ensure(release_root, spec["include"], apt=spec.get("apt", ()),
                                               must_have=spec["must_have"]))
    out = containerd_version(root)
    assert version in out, (f"{root}/usr/bin/containerd is {out.strip()!r}, not containerd {version}: "
                            "refresh tests/fixtures")
    return os.path.join(root, "usr/bin/containerd")


def rootfs_of(binary: str) -> str:
    """The root a real_binary() belongs to ("/": this machine's)."""
    return binary[: -len("/usr/bin/containerd")] or "/"


def make_node(tmp_path, config: bytes | None, containerd: str | None = None, systemd: bool = True):
    """A node with `config` as containerd's config.toml and the real `containerd` binary at
    /usr/bin (a hard link: tmp and the binaries share a file system here, else a copy)."""
    root = tmp_path / "node"
    (root / "etc/containerd").mkdir(parents=True)
    if systemd:
        (root / "etc/systemd/system").mkdir(parents=True)
    if config is not None:
        (root / CONFIG).write_bytes(config)
    if containerd:
        (root / "usr/bin").mkdir(parents=True)
        try:
            os.link(containerd, root / "usr/bin/containerd")
        except OSError:
            shutil.copy2(containerd, root / "usr/bin/containerd")
    return root


@pytest.fixture
def bundle_dir(tmp_path) -> str:
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    (b / "bin" / "gpuhook-runtime").write_text("#!/bin/sh\nexec runc \"$@\"\n")
    (b / "gpuhook-bundle.json").write_text('{"files": ["bin/gpuhook-runtime", "gpuhook-bundle.json"]}')
    return str(b)


def install(root, bundle_dir: str, front: str, runtime: str = "containerd") -> list[str]:
    said: list[str] = []
    core.install(core.Options(host_root=str(root), runtime=runtime, front=front, bundle_dir=bundle_dir), said.append)
    return said


def uninstall(root) -> list[str]:
    said: list[str] = []
    core.uninstall(core.Options(host_root=str(root)), said.append)
    return said


def tree(root) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = open(p, "rb").read() if not os.path.islink(p) else os.readlink(p)
    return out


def handler(doc: dict, version: int) -> dict:
    return doc["plugins"][CRI[version]]["containerd"]["runtimes"]["gpu-optional"]


def exec_start(root) -> list[str]:
    lines = [ln for ln in (root / UNIT).read_text().splitlines() if ln.startswith("ExecStart=")]
    assert len(lines) == 1, lines
    return lines[0][len("ExecStart="):].split()


# -- the captured configs and binaries are what they say -------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_each_fixture_is_its_releases_containerd_config_default(release):
    rootfs = rootfs_of(real_binary(release))
    chroot = [] if rootfs == "/" else ["chroot", rootfs]
    out = subprocess.run(chroot + ["/usr/bin/containerd", "config", "default"], capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout == fixture(release)


@pytest.mark.parametrize("release,nri", [("1.6", None), ("1.7", False), ("2.1", True)])
def test_a_containerd_binary_says_whether_it_has_nri_and_its_default(release, nri):
    assert ctd.binary_nri(real_binary(release)) is nri


# -- containerd: each release ------------------------------------------------------------------

def test_containerd_1_6_is_refused_with_one_line_and_nothing_written(tmp_path, bundle_dir):
    root = make_node(tmp_path, fixture("1.6"), real_binary("1.6"))
    before = tree(root)
    r = cli("install", "--host-root", root, "--runtime", "containerd", "--front", "nri", "--bundle-dir", bundle_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "gpuhook: --front nri: this containerd has no NRI (containerd 1.6 and before; 1.7 has it): "
        "upgrade containerd, or install with --front wrapper"]
    assert tree(root) == before
    # the wrapper is still there for it
    assert "handler gpu-optional added" in " ".join(install(root, bundle_dir, "wrapper"))


def test_containerd_1_7_gets_nri_turned_on_and_a_plain_runc_handler(tmp_path, bundle_dir):
    original = fixture("1.7")
    assert tomllib.loads(original.decode())["plugins"][NRI]["disable"] is True  # off by default in 1.7
    root = make_node(tmp_path, original)  # (no binary: the file's own NRI section says it is 1.7 or later)
    said = install(root, bundle_dir, "nri")
    assert any('NRI turned on ([plugins."io.containerd.nri.v1.nri"] disable = false)' in s for s in said), said
    text = (root / CONFIG).read_text()
    doc = tomllib.loads(text)
    assert doc["plugins"][NRI]["disable"] is False
    h = handler(doc, 2)
    runc = doc["plugins"][CRI[2]]["containerd"]["runtimes"]["runc"]
    assert h["runtime_type"] == "io.containerd.runc.v2" and "BinaryName" not in h.get("options", {}), h
    assert h["options"] == {k: v for k, v in runc["options"].items() if k != "BinaryName"}  # runc's own, copied
    assert h["pod_annotations"] == ["gpuhook.dev/*"]
    # nothing else changed: one line out (NRI's disable = true), the handler's lines in
    diff = list(difflib.ndiff(original.decode().splitlines(), text.splitlines()))
    assert [ln for ln in diff if ln.startswith("- ")] == ["-     disable = true"]
    added = [ln[2:] for ln in diff if ln.startswith("+ ")]
    assert "    disable = false" in added and all("gpu-optional" in ln or "=" in ln or not ln for ln in added), added
    assert exec_start(root) == ["/opt/gpuhook/bin/gpuhook", "nri"]  # the default socket, the default state
    assert not any((root / u).exists() for u in SERVER_UNITS)  # the wrapper's units: not for this front
    again = install(root, bundle_dir, "nri")  # a second run: nothing to do
    assert any("already in place" in s for s in again) and (root / CONFIG).read_text() == text, again
    uninstall(root)
    assert (root / CONFIG).read_bytes() == original and not (root / UNIT).exists()


def test_containerd_1_7_binary_turns_on_nri_for_a_file_that_does_not_say(tmp_path, bundle_dir):
    small = b'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
    root = make_node(tmp_path, small, real_binary("1.7"))
    install(root, bundle_dir, "nri")
    assert tomllib.loads((root / CONFIG).read_text())["plugins"][NRI] == {"disable": False}
    uninstall(root)
    assert (root / CONFIG).read_bytes() == small


def test_containerd_2_keeps_nri_as_it_is_on_by_default(tmp_path, bundle_dir):
    original = fixture("2.1")
    root = make_node(tmp_path, original)
    said = install(root, bundle_dir, "nri")
    assert not any("NRI turned on" in s for s in said), said
    doc = tomllib.loads((root / CONFIG).read_text())
    assert doc["plugins"][NRI] == tomllib.loads(original.decode())["plugins"][NRI]
    h = handler(doc, 3)
    assert h["runtime_type"] == "io.containerd.runc.v2" and not h.get("options", {}).get("BinaryName"), h
    uninstall(root)
    assert (root / CONFIG).read_bytes() == original


def test_containerd_2_binary_and_a_version_2_file_get_no_nri_section(tmp_path, bundle_dir):
    small = b'version = 2\n'
    root = make_node(tmp_path, small, real_binary("2.1"))
    install(root, bundle_dir, "nri")
    assert NRI not in tomllib.loads((root / CONFIG).read_text())["plugins"]


def test_an_nri_turned_off_in_containerd_2_is_turned_on_and_back(tmp_path, bundle_dir):
    original = fixture("2.1").replace(b"[plugins.'io.containerd.nri.v1.nri']\n    disable = false",
                                      b"[plugins.'io.containerd.nri.v1.nri']\n    disable = true")
    assert original != fixture("2.1")
    root = make_node(tmp_path, original)
    install(root, bundle_dir, "nri")
    assert tomllib.loads((root / CONFIG).read_text())["plugins"][NRI]["disable"] is False
    uninstall(root)
    assert (root / CONFIG).read_bytes() == original


def test_external_plugins_turned_off_and_no_binary_are_refused(tmp_path, bundle_dir):
    closed = fixture("1.7").replace(b"disable_connections = false", b"disable_connections = true")
    root = make_node(tmp_path, closed)
    r = cli("install", "--host-root", root, "--runtime", "containerd", "--front", "nri", "--bundle-dir", bundle_dir)
    assert r.returncode == 2 and "disable_connections = true" in r.stderr and len(r.stderr.splitlines()) == 1
    shutil.rmtree(tmp_path / "node")
    root = make_node(tmp_path, b"version = 2\n")  # no NRI section, no binary: cannot tell 1.6 from 1.7
    r = cli("install", "--host-root", root, "--runtime", "containerd", "--front", "nri", "--bundle-dir", bundle_dir)
    assert r.returncode == 2 and "to tell whether it has NRI" in r.stderr and len(r.stderr.splitlines()) == 1
    assert (root / CONFIG).read_bytes() == b"version = 2\n"


def test_the_plugins_unit_follows_the_configs_socket_and_state(tmp_path, bundle_dir):
    text = fixture("2.1").decode().replace("socket_path = '/var/run/nri/nri.sock'", "socket_path = '/run/k/nri.sock'")
    text = text.replace("state = '/run/containerd'", "state = '/run/k/containerd'")
    root = make_node(tmp_path, text.encode())
    install(root, bundle_dir, "nri")
    # the socket the config names; the rootfs wherever `state` is: the hook reads it from the bundle
    assert exec_start(root) == ["/opt/gpuhook/bin/gpuhook", "nri", "--socket", "/run/k/nri.sock"]
    # what the unit runs is the real `gpuhook nri` command line
    from gpuhook.cli import build_parser

    args = build_parser().parse_args(exec_start(root)[1:])
    assert args.socket == "/run/k/nri.sock" and args.rootfs_template == hook.ROOTFS_FROM_STATE


# -- switching fronts ----------------------------------------------------------------------------

def test_switching_fronts_leaves_no_trace_of_the_other(tmp_path, bundle_dir):
    original = fixture("1.7")
    fresh = {}
    for front in ("wrapper", "nri"):  # what one install of each leaves
        root = make_node(tmp_path / front, original)
        install(root, bundle_dir, front)
        fresh[front] = tree(root)
    root = make_node(tmp_path, original)
    for front in ("wrapper", "nri", "wrapper", "nri"):
        install(root, bundle_dir, front)
        got = tree(root)
        assert got.keys() == fresh[front].keys()
        assert {k: v for k, v in got.items() if "install-state" not in k} == \
            {k: v for k, v in fresh[front].items() if "install-state" not in k}, front
    uninstall(root)
    assert (root / CONFIG).read_bytes() == original and not (root / UNIT).exists()


def test_a_switch_after_the_operator_edited_the_file_undoes_only_gpuhooks_edits(tmp_path, bundle_dir):
    original = fixture("1.7")
    root = make_node(tmp_path, original)
    install(root, bundle_dir, "nri")
    with open(root / CONFIG, "a") as f:
        f.write("\n# the operator was here\n")
    install(root, bundle_dir, "wrapper")
    doc = tomllib.loads((root / CONFIG).read_text())
    assert doc["plugins"][NRI]["disable"] is True  # back as it was: NRI was gpuhook's to turn on
    assert handler(doc, 2)["options"]["BinaryName"] == "/opt/gpuhook/bin/gpuhook-runtime"
    assert not (root / UNIT).exists() and all((root / u).exists() for u in SERVER_UNITS)
    install(root, bundle_dir, "nri")
    uninstall(root)  # edited since install: only gpuhook's edits are taken out
    text = (root / CONFIG).read_text()
    assert "# the operator was here" in text and "gpu-optional" not in text
    assert tomllib.loads(text)["plugins"][NRI]["disable"] is True
    assert text.replace("\n# the operator was here\n", "") == original.decode()


def test_docker_has_no_nri_front(tmp_path, bundle_dir):
    root = tmp_path / "node"
    (root / "etc/docker").mkdir(parents=True)
    r = cli("install", "--host-root", root, "--runtime", "docker", "--front", "nri", "--bundle-dir", bundle_dir)
    assert r.returncode == 2 and r.stderr.strip() == "gpuhook: --front nri: not for dockerd (it has wrapper)"
    assert os.listdir(root) == ["etc"] and os.listdir(root / "etc") == ["docker"]


# -- CRI-O ----------------------------------------------------------------------------------------

def test_crio_gets_a_plain_runc_handler_and_nri_turned_on_in_its_drop_in(tmp_path, bundle_dir):
    root = tmp_path / "node"
    (root / "etc/crio/crio.conf.d").mkdir(parents=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    r = cli("install", "--host-root", root, "--runtime", "crio", "--front", "nri", "--bundle-dir", bundle_dir)
    assert r.returncode == 2 and "no runc under" in r.stderr and len(r.stderr.splitlines()) == 1
    (root / "usr/sbin").mkdir(parents=True)
    shutil.copy2(shutil.which("runc") or "/usr/sbin/runc", root / "usr/sbin/runc")
    said = install(root, bundle_dir, "nri", runtime="crio")
    assert any("runtime_path /usr/sbin/runc; NRI turned on ([crio.nri] enable_nri = true)" in s for s in said), said
    dropin = tomllib.loads((root / DROPIN).read_text())
    assert dropin["crio"]["runtime"]["runtimes"]["gpu-optional"] == {
        "runtime_path": "/usr/sbin/runc", "runtime_type": "oci", "runtime_root": "/run/gpuhook-runc"}
    assert dropin["crio"]["nri"] == {"enable_nri": True}
    assert exec_start(root) == ["/opt/gpuhook/bin/gpuhook", "nri"]
    install(root, bundle_dir, "wrapper", runtime="crio")  # and back: the wrapper's drop-in, no NRI, no plugin
    dropin = tomllib.loads((root / DROPIN).read_text())
    assert dropin["crio"]["runtime"]["runtimes"]["gpu-optional"]["runtime_path"] == "/opt/gpuhook/bin/gpuhook-runtime"
    assert "nri" not in dropin["crio"] and not (root / UNIT).exists()
    uninstall(root)
    assert not (root / DROPIN).exists()


def test_crio_is_not_sent_a_reload_that_would_not_turn_nri_on(tmp_path, bundle_dir):
    """CRI-O reloads its runtimes on SIGHUP but no [crio.nri] setting (crio.conf(5) marks none
    reloadable): --restart signal says it takes a restart, and the restart stays pending."""
    root = tmp_path / "node"
    (root / "etc/crio/crio.conf.d").mkdir(parents=True)
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/sbin/runc").write_text("#!/bin/sh\n")
    said: list[str] = []
    core.install(core.Options(host_root=str(root), runtime="crio", front="nri", restart="signal",
                              bundle_dir=bundle_dir), said.append)
    assert said[-1] == ("restart: not done: a reload of crio does not load the nri front's settings: "
                        "restart CRI-O (systemctl restart crio.service)"), said
    state = json.loads((root / "etc/gpuhook/backup/install-state.json").read_text())
    assert state["restart_pending"] == ["crio"] and state["fronts"] == {"crio": "nri"}


@pytest.mark.skipif(not is_root(), reason="needs root (unshare: a PID namespace of the test's own)")
def test_where_systemd_runs_the_plugins_unit_is_enabled_started_and_on_uninstall_stopped(tmp_path, bundle_dir):
    """/run/systemd/system on the node: install runs the host's systemctl (in its PID 1's mount
    namespace, from a pod's) to enable and start gpuhook-nri.service, whatever --restart says;
    uninstall stops and disables it before the file goes."""
    root = make_node(tmp_path, fixture("2.1"))
    (root / "run/systemd/system").mkdir(parents=True)
    os.symlink("/proc", root / "proc")
    record = tmp_path / "systemctl.argv"
    fake_systemctl(tmp_path / "bin", record)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    r = run_as_pod([sys.executable, "-m", "gpuhook", "install", "--host-root", root, "--runtime", "containerd",
                    "--front", "nri", "--bundle-dir", bundle_dir], tmp_path / "pid1.ns", env=env)
    assert r.returncode == 0 and "nri plugin: gpuhook-nri.service enabled and started" in r.stdout, r.stdout + r.stderr
    lines = record.read_text().splitlines()
    # not waited for: the unit is ready (Type=notify) once the runtime, restarted after, registers it
    assert lines[0::2] == ["daemon-reload", "enable --now --no-block gpuhook-nri.service",
                           "restart --no-block gpuhook-nri.service"]
    assert set(lines[1::2]) == {(tmp_path / "pid1.ns").read_text().strip()}  # the host's mount namespace
    record.unlink()
    r = run_as_pod([sys.executable, "-m", "gpuhook", "uninstall", "--host-root", root], tmp_path / "pid1.ns", env=env)
    assert r.returncode == 0, r.stderr
    assert record.read_text().splitlines()[0::2] == ["disable --now gpuhook-nri.service"]
    assert not (root / UNIT).exists() and (root / CONFIG).read_bytes() == fixture("2.1")


def test_install_again_without_front_keeps_the_installed_one(tmp_path, bundle_dir):
    """The boot unit (systemd/gpuhook-install.service) and the agent run install again with no
    --front: a node on NRI stays on NRI; a fresh node gets the wrapper."""
    root = make_node(tmp_path, fixture("2.1"))
    install(root, bundle_dir, "nri")
    nri = tree(root)
    r = cli("install", "--host-root", root, "--runtime", "auto", "--restart", "none", "--bundle-dir", bundle_dir)
    assert r.returncode == 0 and "front nri" in r.stdout.splitlines()[0], r.stdout + r.stderr
    assert tree(root) == nri
    uninstall(root)
    r = cli("install", "--host-root", root, "--runtime", "containerd", "--bundle-dir", bundle_dir)
    assert r.returncode == 0 and "BinaryName /opt/gpuhook/bin/gpuhook-runtime" in r.stdout, r.stdout


@pytest.mark.skipif(not is_root(), reason="needs root (a private mount namespace, chroot)")
@pytest.mark.parametrize("release", ["1.7", "2.1"])
def test_each_containerd_reads_what_install_wrote_with_nri_on_and_the_plain_handler(tmp_path, bundle_dir, release):
    """The release's own `containerd --config X config dump` (in its root, the file bound in
    a mount namespace of the test's own) on what `--front nri` wrote into its default config."""
    rootfs = rootfs_of(real_binary(release))
    node = make_node(tmp_path, fixture(release))
    install(node, bundle_dir, "nri")
    script = 'mount --bind "$1" "$2/tmp" && exec chroot "$2" /usr/bin/containerd --config /tmp/config.toml config dump'
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                        str(node / "etc/containerd"), rootfs], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    dump = tomllib.loads(r.stdout)
    version = dump["version"]
    assert dump["plugins"][NRI]["disable"] is False
    h = dump["plugins"][CRI[version]]["containerd"]["runtimes"]["gpu-optional"]
    assert h["runtime_type"] == "io.containerd.runc.v2" and h["pod_annotations"] == ["gpuhook.dev/*"]
    assert not h.get("options", {}).get("BinaryName")


def test_where_something_else_runs_the_plugin_install_writes_no_unit(tmp_path, bundle_dir):
    """Options.nri_unit=False (the DaemonSet's agent runs the plugin in its own process): the
    NRI front's config edits, no gpuhook-nri.service, and one an earlier install wrote goes."""
    root = make_node(tmp_path, fixture("2.1"))
    install(root, bundle_dir, "nri")
    assert (root / UNIT).exists()
    said: list[str] = []
    core.install(core.Options(host_root=str(root), runtime="containerd", front="nri", nri_unit=False,
                              bundle_dir=bundle_dir), said.append)
    assert not (root / UNIT).exists() and "nri plugin: /etc/systemd/system/gpuhook-nri.service removed" in said
    assert any("(plain runc, for gpuhook's NRI plugin) already in place" in s for s in said), said


def test_the_agent_with_front_nri_installs_the_nri_front_and_no_unit_of_its_own(tmp_path, bundle_dir, monkeypatch):
    """`gpuhook agent --front nri` runs the plugin itself: its install gives the node the plain
    runc handler and NRI, and no gpuhook-nri.service (a second plugin); --front wrapper after
    it gives the wrapper back with nothing of the NRI front left."""
    from gpuhook import log
    from gpuhook.agent import core as agent_core

    monkeypatch.setenv("GPUHOOK_BUNDLE_DIR", bundle_dir)
    original = fixture("1.7")
    root = make_node(tmp_path, original)
    agent_core.default_installer(agent_core.Options(root=str(root)), log.get(), "nri")()
    doc = tomllib.loads((root / CONFIG).read_text())
    assert doc["plugins"][NRI]["disable"] is False
    handler = doc["plugins"][CRI[2]]["containerd"]["runtimes"]["gpu-optional"]
    assert not handler.get("options", {}).get("BinaryName") and not (root / UNIT).exists()
    agent_core.default_installer(agent_core.Options(root=str(root)), log.get(), "wrapper")()
    doc = tomllib.loads((root / CONFIG).read_text())
    assert doc["plugins"][NRI]["disable"] is True  # as the node had it
    assert doc["plugins"][CRI[2]]["containerd"]["runtimes"]["gpu-optional"]["options"]["BinaryName"] \
        == "/opt/gpuhook/bin/gpuhook-runtime"


def test_the_plugins_unit_orders_it_after_the_runtime_and_before_the_kubelet_ready_once_registered():
    """At boot the kubelet's first pods find the plugin registered: the unit starts after the
    runtime, before the kubelet, and is ready only when the plugin says READY=1 (once the
    runtime synchronized it: nri/plugin.py), waited for at most TimeoutStartSec."""
    import configparser

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string(units.nri_text(("--socket", "/run/nri.sock")))
    assert unit["Unit"]["After"].split() == ["containerd.service", "crio.service"]
    assert unit["Unit"]["Before"] == "kubelet.service"
    assert (unit["Service"]["Type"], unit["Service"]["NotifyAccess"]) == ("notify", "all")
    assert unit["Service"]["TimeoutStartSec"] == str(units.NRI_START_TIMEOUT)
