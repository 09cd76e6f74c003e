"""gpuhook install / uninstall on temp host roots, checked against the real thing.

- containerd: the stock `containerd config default` (version 2), a version 3 sample, a
  version 1 file (refused). After install, the real `containerd --config X config dump` shows
  the gpu-optional handler with our BinaryName and pod_annotations, and every other line of
  the dump is unchanged. Install twice = same bytes; uninstall = the original bytes; an
  operator's edit in between is kept.
- CRI-O: the drop-in, written and removed.
- --restart signal against a real containerd run under a tiny supervisor; SIGHUP shown not
  to be a reload.
- The host bundle (packaging/build-bundle.sh): the bundled gpuhook-runtime's create path with
  an empty environment, and in a chroot that has nothing but busybox.
- The .deb (packaging/build-deb.sh), the systemd unit, the DaemonSet manifests.
"""

from __future__ import annotations

import configparser
import difflib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib

import pytest

from conftest import REPO, fake_systemctl, gpuhook, is_root, ok, refused, run_as_pod
from containerd_harness import Supervised, containerd_config, cri_runtimes
from gpuhook import __version__
from fakes import bundle, fakehost
from gpuhook.install import containerd as ctd
from gpuhook.install import core

CONFIG = "etc/containerd/config.toml"
BACKUP = "etc/gpuhook/backup/containerd-config.toml"
STATE = "etc/gpuhook/backup/install-state.json"
CRIO_DROPIN = "etc/crio/crio.conf.d/99-gpuhook.toml"
BINARY = "/opt/gpuhook/bin/gpuhook-runtime"
V2_RUNTIMES = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'

needs_containerd = pytest.mark.skipif(shutil.which("containerd") is None,
                                      reason="needs Debian's containerd (make deps installs it)")
needs_root_containerd = pytest.mark.skipif(not (is_root() and shutil.which("containerd")),
                                           reason="needs root and containerd to run a real containerd")

V3_SAMPLE = """\
# containerd 2.x (config version 3), trimmed from `containerd config default`
version = 3
root = '/var/lib/containerd'
state = '/run/containerd'

[grpc]
  address = '/run/containerd/containerd.sock'

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.k8s.io/pause:3.10'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          runtime_path = ''
          pod_annotations = []
          container_annotations = []
          privileged_without_host_devices = false
          sandboxer = 'podsandbox'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            Root = ''
            # this node runs the systemd cgroup driver
            SystemdCgroup = true

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dir = '/opt/cni/bin'
      conf_dir = '/etc/cni/net.d'
"""


# -- helpers -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stock() -> str:
    """What `containerd config default` prints (Debian's containerd 1.6: version 2)."""
    if shutil.which("containerd") is None:
        pytest.skip("needs Debian's containerd (make deps installs it)")
    return subprocess.run(["containerd", "config", "default"], capture_output=True, text=True, check=True).stdout


def edit(text: str, pattern: str, repl: str, every: bool = False) -> str:
    """An operator's edit of a `containerd config default` line, written as a pattern that
    matches what every release's default holds (1.6 and 1.7 differ in values, spacing and
    sections): exactly one match (`every`: at least one) and a change, so that an edit can
    never silently do nothing."""
    out, n = re.subn(pattern, repl, text, flags=re.MULTILINE)
    assert n == 1 or (every and n > 1), f"{pattern!r} matched {n} lines of the default config"
    assert out != text, f"{pattern!r}: the default already says {repl!r}"
    return out


# the sandbox image line any version 2 default has (pause:3.6 in containerd 1.6, 3.8 in 1.7)
SANDBOX_IMAGE = r'^(\s*sandbox_image = )"[^"]*"$'
MIRROR = r'\1"registry.example/pause:3.9"  # mirror'


def dump(path) -> list[str]:
    r = subprocess.run(["containerd", "--config", str(path), "config", "dump"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def inserted(before: list[str], after: list[str]) -> list[str]:
    """The lines `after` adds to `before`; fails when anything else differs."""
    ops = [op for op in difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes() if op[0] != "equal"]
    assert [op[0] for op in ops] == ["insert"], "\n".join(difflib.unified_diff(before, after, lineterm=""))
    return after[ops[0][3]:ops[0][4]]


def v2_runtimes(lines: list[str]) -> dict:
    return tomllib.loads("\n".join(lines))["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


@pytest.fixture
def fake_bundle(tmp_path) -> str:
    """A two-file bundle (the runtime's front and the manifest): enough for the config tests."""
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    shutil.copy2(os.path.join(REPO, "gpuhook", "runtime", "gpuhook-runtime"), b / "bin" / "gpuhook-runtime")
    (b / "gpuhook-bundle.json").write_text(json.dumps({"files": ["bin/gpuhook-runtime", "gpuhook-bundle.json"]}))
    return str(b)


def make_node(tmp_path, config: str | None = None, name: str = "node"):
    root = tmp_path / name
    (root / "etc" / "containerd").mkdir(parents=True)
    if config is not None:
        (root / CONFIG).write_text(config)
    return root


def snapshot(root) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mtime_ns, st.st_ino, open(p, "rb").read() if os.path.isfile(p) else None)
    return out


# -- containerd config ---------------------------------------------------------------------

@needs_containerd
def test_stock_v2_config_gets_the_handler_and_nothing_else_changes(tmp_path, stock, fake_bundle):
    node = make_node(tmp_path, stock)
    before = dump(node / CONFIG)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "handler gpu-optional added (config version 2" in out
    after = dump(node / CONFIG)
    added = inserted(before, after)
    assert [line.strip() for line in added if line.strip()][0] == f'[{V2_RUNTIMES}.gpu-optional]'
    mine = v2_runtimes(after)["gpu-optional"]
    assert mine["runtime_type"] == "io.containerd.runc.v2"
    assert mine["pod_annotations"] == ["gpuhook.dev/*"]
    assert mine["options"]["BinaryName"] == BINARY
    assert mine["options"]["SystemdCgroup"] is False  # copied from runc
    # the file itself: the handler was inserted, every other line is the operator's
    inserted(stock.splitlines(), (node / CONFIG).read_text().splitlines())
    assert (node / BACKUP).read_text() == stock
    assert os.path.exists(node / "opt/gpuhook/bin/gpuhook-runtime")


@needs_containerd
def test_handler_sections_out_of_order_are_handled(tmp_path, stock, fake_bundle):
    """A handler appended at the end of the file (a common way to add kata or gVisor) makes
    tomlkit hand out a proxy of the out-of-order `runtimes` tables."""
    kata = stock + ('\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]\n'
                    '  runtime_type = "io.containerd.kata.v2"\n')
    node = make_node(tmp_path, kata)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    runtimes = v2_runtimes(dump(node / CONFIG))
    assert runtimes["gpu-optional"]["options"]["BinaryName"] == BINARY
    assert runtimes["kata"]["runtime_type"] == "io.containerd.kata.v2" and "runc" in runtimes
    installed = (node / CONFIG).read_bytes()
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert (node / CONFIG).read_bytes() == installed  # idempotent there too
    ok(gpuhook("uninstall", "--host-root", node))
    assert (node / CONFIG).read_text() == kata


@needs_containerd
def test_handler_copies_the_default_runc_options(tmp_path, stock, fake_bundle):
    systemd = edit(stock, r"^(\s*SystemdCgroup = )false$", r"\1true")
    systemd = edit(systemd, r'^(\s*Root = )""$', r'\1"/run/runc-k8s"')
    node = make_node(tmp_path, systemd)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    runtimes = v2_runtimes(dump(node / CONFIG))
    assert runtimes["gpu-optional"]["options"]["SystemdCgroup"] is True
    assert runtimes["gpu-optional"]["options"]["Root"] == "/run/runc-k8s"
    assert runtimes["runc"]["options"]["BinaryName"] == ""  # the default handler is untouched


@needs_containerd
def test_install_twice_changes_nothing_and_uninstall_restores_the_bytes(tmp_path, stock, fake_bundle):
    node = make_node(tmp_path, stock)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    first = snapshot(node)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert snapshot(node) == first  # same bytes, same inodes: nothing rewritten, no new backup
    assert "already in place" in out and "all up to date" in out

    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "restored byte for byte" in out
    assert (node / CONFIG).read_bytes() == stock.encode()
    assert sorted(os.path.relpath(p, node) for p in glob.glob(f"{node}/**", recursive=True)) == \
        [".", "etc", "etc/containerd", "etc/containerd/config.toml", "opt"]


@needs_containerd
def test_operator_edit_between_install_and_uninstall_is_kept(tmp_path, stock, fake_bundle):
    node = make_node(tmp_path, stock)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    cfg = node / CONFIG
    cfg.write_text(edit(cfg.read_text(), SANDBOX_IMAGE, MIRROR))
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "changed since install, so only the gpu-optional handler was removed" in out
    assert "gpu-optional" not in cfg.read_text()
    assert "# mirror" in cfg.read_text()
    result = dump(cfg)
    cfg.write_text(edit(stock, SANDBOX_IMAGE, MIRROR))
    assert result == dump(cfg)  # exactly the operator's config, without ours


@needs_containerd
def test_reinstall_after_operator_rewrote_the_file(tmp_path, stock, fake_bundle):
    """The operator put back their own file (without our handler): install adds it again,
    and uninstall then removes only the handler: the old backup would lose their change."""
    node = make_node(tmp_path, stock)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    cfg = node / CONFIG
    theirs = edit(stock, r"^(\s*max_concurrent_downloads = )\d+$", r"\g<1>8", every=True)  # 1.7: CRI and transfer
    cfg.write_text(theirs)
    assert "handler gpu-optional added" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert (node / BACKUP).read_text() == stock  # the first backup stays
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "only the gpu-optional handler was removed" in out
    assert cfg.read_text() == theirs


@needs_containerd
def test_config_without_handlers_keeps_the_builtin_runc(tmp_path, fake_bundle):
    """containerd replaces its built-in handler map as soon as the file sets one handler."""
    node = make_node(tmp_path, "version = 2\n")
    before = v2_runtimes(dump(node / CONFIG))
    assert list(before) == ["runc"]
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    after = v2_runtimes(dump(node / CONFIG))
    assert sorted(after) == ["gpu-optional", "runc"]
    assert after["runc"]["runtime_type"] == before["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert after["gpu-optional"]["options"] == {"BinaryName": BINARY}
    ok(gpuhook("uninstall", "--host-root", node))
    assert (node / CONFIG).read_text() == "version = 2\n"


@needs_containerd
def test_no_config_file_but_a_socket(tmp_path, fake_bundle):
    node = make_node(tmp_path)
    (node / "run" / "containerd").mkdir(parents=True)
    (node / "run" / "containerd" / "containerd.sock").touch()
    assert "written to a new file" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert sorted(v2_runtimes(dump(node / CONFIG))) == ["gpu-optional", "runc"]
    assert "removed (install had created it)" in ok(gpuhook("uninstall", "--host-root", node))
    assert not (node / CONFIG).exists()


# containerd 2.4's `containerd config default` (version 4: the grpc, ttrpc and metrics servers'
# sections moved under [plugins]; the CRI plugin's did not), trimmed
V4_SAMPLE = """\
version = 4
root = '/var/lib/containerd'
state = '/run/containerd'

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          sandboxer = 'podsandbox'

          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            BinaryName = ''
            SystemdCgroup = false

  [plugins.'io.containerd.nri.v1.nri']
    disable = false

  [plugins.'io.containerd.server.v1.grpc']
    address = '/run/containerd/containerd.sock'
"""


def test_v4_config(tmp_path, fake_bundle):
    """containerd 2.4's config version 4 (tests/cluster: the CPU node's containerd v2.4.2, whose
    DaemonSet pod could not install before): the handler where version 3 has it, NRI on."""
    for front in ("wrapper", "nri"):
        node = make_node(tmp_path, V4_SAMPLE, name=f"node-{front}")
        out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--front", front))
        assert "config version 4" in out, out
        text = (node / CONFIG).read_text()
        inserted(V4_SAMPLE.splitlines(), text.splitlines())
        runtimes = tomllib.loads(text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        assert runtimes["gpu-optional"]["options"].get("BinaryName", "") == (BINARY if front == "wrapper" else "")
        assert tomllib.loads(text)["plugins"]["io.containerd.nri.v1.nri"] == {"disable": False}
        ok(gpuhook("uninstall", "--host-root", node))
        assert (node / CONFIG).read_text() == V4_SAMPLE


def test_v3_config(tmp_path, fake_bundle):
    node = make_node(tmp_path, V3_SAMPLE)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "config version 3" in out
    text = (node / CONFIG).read_text()
    inserted(V3_SAMPLE.splitlines(), text.splitlines())
    assert "# this node runs the systemd cgroup driver" in text
    runtimes = tomllib.loads(text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    mine = runtimes["gpu-optional"]
    assert mine["runtime_type"] == "io.containerd.runc.v2"
    assert mine["pod_annotations"] == ["gpuhook.dev/*"]
    assert mine["sandboxer"] == "podsandbox"
    assert mine["options"] == {"BinaryName": BINARY, "Root": "", "SystemdCgroup": True}
    assert "io.containerd.grpc.v1.cri" not in tomllib.loads(text)["plugins"]
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert (node / CONFIG).read_text() == text
    ok(gpuhook("uninstall", "--host-root", node))
    assert (node / CONFIG).read_text() == V3_SAMPLE


def test_version_1_is_refused_and_nothing_is_written(tmp_path, fake_bundle):
    v1 = '# containerd 1.x without a version line\nroot = "/var/lib/containerd"\n[plugins.cri]\n  sandbox_image = "pause"\n'
    node = make_node(tmp_path, v1)
    line = refused(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "config version 1" in line and CONFIG in line
    assert (node / CONFIG).read_text() == v1
    assert sorted(os.listdir(node)) == ["etc"] and os.listdir(node / "etc") == ["containerd"]


def test_drop_in_that_replaces_the_cri_section_is_refused(tmp_path, stock, fake_bundle):
    node = make_node(tmp_path, edit(stock, r"^imports = \[\]$", 'imports = ["/etc/containerd/conf.d/*.toml"]'))
    (node / "etc/containerd/conf.d").mkdir()
    (node / "etc/containerd/conf.d/10-mirror.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n')
    line = refused(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "/etc/containerd/conf.d/10-mirror.toml" in line and "replaces" in line
    assert not (node / "opt").exists()


@pytest.mark.parametrize("case", ["no host root", "invalid toml", "config is a directory", "not utf-8",
                                  "no bundle dir", "not a bundle", "no runtime found", "bad state file"])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, fake_bundle, case):
    node = make_node(tmp_path, "version = 2\n")
    args = ["install", "--host-root", node, "--bundle-dir", fake_bundle]
    if case == "no host root":
        args[2] = tmp_path / "nowhere"
    elif case == "invalid toml":
        (node / CONFIG).write_text("version = 2\n[plugins\n")
    elif case == "config is a directory":
        (node / CONFIG).unlink()
        (node / CONFIG).mkdir()
    elif case == "not utf-8":
        (node / CONFIG).write_bytes(b"version = 2\n# \xff\xfe\n")
    elif case == "no bundle dir":
        args[4] = tmp_path / "no-bundle"
    elif case == "not a bundle":
        args[4] = tmp_path
    elif case == "no runtime found":
        args[2] = tmp_path / "empty"
        os.mkdir(args[2])
    elif case == "bad state file":
        (node / STATE).parent.mkdir(parents=True)
        (node / STATE).write_text("{not json")
    line = refused(gpuhook(*args))
    assert len(line) < 400
    if case not in ("no host root", "no runtime found"):
        assert not (node / "opt").exists()


@pytest.mark.parametrize("case", ["no host root", "invalid toml", "bad state file"])
def test_uninstall_bad_input_gives_one_line_and_exit_2(tmp_path, case):
    node = make_node(tmp_path, "version = 2\n[plugins\n")
    if case == "no host root":
        node = tmp_path / "nowhere"
    elif case == "bad state file":
        (node / STATE).parent.mkdir(parents=True)
        (node / STATE).write_text("[]]")
    refused(gpuhook("uninstall", "--host-root", node))


def test_dry_run_writes_nothing(tmp_path, fake_bundle):
    node = make_node(tmp_path, V3_SAMPLE)
    before = snapshot(node)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--dry-run", "--restart", "systemd"))
    assert "would be added" in out and "2 would be written" in out and "restart: containerd would be restarted (--restart systemd)" in out
    assert snapshot(node) == before


# -- CRI-O and the node config -----------------------------------------------------------------

def test_crio_drop_in(tmp_path, fake_bundle):
    node = tmp_path / "node"
    (node / "etc/crio/crio.conf.d").mkdir(parents=True)
    (node / "etc/crio/crio.conf").write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))  # auto: CRI-O
    assert "runtime crio" in out
    drop = tomllib.loads((node / CRIO_DROPIN).read_text())
    assert drop == {"crio": {"runtime": {"runtimes": {"gpu-optional": {
        "runtime_path": BINARY, "runtime_type": "oci", "runtime_root": "/run/gpuhook-runc"}}}}}
    first = snapshot(node)
    assert "already in place" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert snapshot(node) == first
    ok(gpuhook("uninstall", "--host-root", node))
    assert not (node / CRIO_DROPIN).exists()
    assert (node / "etc/crio/crio.conf").read_text() == '[crio.runtime]\ndefault_runtime = "runc"\n'
    assert not (node / "opt/gpuhook").exists() and not (node / "etc/gpuhook").exists()


def test_node_config_is_written_once_and_never_overwritten(tmp_path, fake_bundle):
    node = make_node(tmp_path, "version = 2\n")
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    written = (node / "etc/gpuhook/config.toml").read_text()
    assert tomllib.loads(written) == {}  # all defaults, commented
    from gpuhook.config import parse
    assert parse(written) == parse("")
    ok(gpuhook("uninstall", "--host-root", node))
    assert not (node / "etc/gpuhook").exists()  # unchanged since install: removed

    mine = 'fail_mode = "closed"\nlog_file = "/var/log/mine.log"\n'
    (node / "etc/gpuhook").mkdir()
    (node / "etc/gpuhook/config.toml").write_text(mine)
    assert "exists: kept" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "kept" in ok(gpuhook("uninstall", "--host-root", node))
    assert (node / "etc/gpuhook/config.toml").read_text() == mine


def test_bundle_update_replaces_changed_files_and_removes_stale_ones(tmp_path, fake_bundle):
    node = make_node(tmp_path, "version = 2\n")
    extra = os.path.join(fake_bundle, "lib", "old.py")
    os.makedirs(os.path.dirname(extra))
    open(extra, "w").write("old\n")
    manifest = {"files": ["bin/gpuhook-runtime", "gpuhook-bundle.json", "lib/old.py"]}
    open(os.path.join(fake_bundle, "gpuhook-bundle.json"), "w").write(json.dumps(manifest))
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert (node / "opt/gpuhook/lib/old.py").exists()
    os.unlink(extra)
    os.rmdir(os.path.dirname(extra))
    open(os.path.join(fake_bundle, "bin", "gpuhook-runtime"), "a").write("# new\n")
    open(os.path.join(fake_bundle, "gpuhook-bundle.json"), "w").write(json.dumps({"files": manifest["files"][:2]}))
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "2 written, 1 removed" in out
    assert not (node / "opt/gpuhook/lib").exists()
    assert (node / "opt/gpuhook/bin/gpuhook-runtime").read_bytes().endswith(b"# new\n")
    assert os.access(node / "opt/gpuhook/bin/gpuhook-runtime", os.X_OK)


# -- restart, with a real containerd ---------------------------------------------------------

@needs_root_containerd
def test_restart_signal_restarts_the_real_containerd_that_reads_the_config(tmp_path, fake_bundle):
    node = make_node(tmp_path, containerd_config(tmp_path / "ctd"))
    os.symlink("/proc", node / "proc")  # the "host's" /proc: this machine's
    bystander_cfg = tmp_path / "other.toml"
    bystander_cfg.write_text(containerd_config(tmp_path / "other"))
    bystander = Supervised(bystander_cfg, tmp_path)
    sup = Supervised(node / CONFIG, tmp_path / "ctd")
    try:
        first = sup.booted(1)
        bystander.booted(1)
        assert "gpu-optional" not in cri_runtimes(first)
        out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--restart", "signal"))
        assert "its supervisor started it again" in out, out
        second = sup.booted(2)
        assert sup.runs[0][0].returncode == 0  # SIGTERM: a clean shutdown
        assert "gpu-optional:{Type:io.containerd.runc.v2" in cri_runtimes(second)
        assert f"BinaryName:{BINARY}" in cri_runtimes(second)
        assert "PodAnnotations:[gpuhook.dev/*]" in cri_runtimes(second)
        # nothing changed: no restart; and the other containerd was never touched
        assert "restart: not needed" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle,
                                                   "--restart", "signal"))
        assert len(sup.runs) == 2 and len(bystander.runs) == 1 and bystander.runs[0][0].poll() is None
        # uninstall restarts it too, and the handler is gone
        ok(gpuhook("uninstall", "--host-root", node, "--restart", "signal"))
        assert "gpu-optional" not in cri_runtimes(sup.booted(3))
    finally:
        sup.stop()
        bystander.stop()


@needs_root_containerd
def test_restart_signal_says_so_when_nothing_brings_containerd_back(tmp_path, fake_bundle):
    node = make_node(tmp_path, containerd_config(tmp_path / "ctd"))
    os.symlink("/proc", node / "proc")
    p = subprocess.Popen(["containerd", "--config", str(node / CONFIG)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(tmp_path / "ctd" / "containerd.sock"):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        reaper = threading.Thread(target=p.wait, daemon=True)  # an unsupervised parent
        reaper.start()
        line = refused(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--restart", "signal",
                               "--restart-timeout", "1"))
        assert "nothing started it again" in line
        assert p.returncode == 0
        state = json.loads((node / STATE).read_text())
        assert state["restart_pending"] == ["containerd"]  # the next install with a restart mode retries
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@needs_root_containerd
def test_containerd_sighup_is_not_a_reload(tmp_path):
    """Why --restart signal sends SIGTERM: containerd dies on SIGHUP, without a clean stop
    (checked with 1.6, 1.7 and 2.1)."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(containerd_config(tmp_path / "ctd"))
    log = tmp_path / "log"
    with open(log, "wb") as f:
        # as its service starts it: SIGHUP not ignored (a suite run under nohup would pass that on)
        p = subprocess.Popen(["containerd", "--config", str(cfg)], stdout=f, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 20
        while "successfully booted" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        p.send_signal(signal.SIGHUP)
        assert p.wait(10) == -signal.SIGHUP
        assert "Stop CRI service" not in log.read_text(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_restart_signal_needs_the_hosts_pid_namespace(tmp_path, fake_bundle):
    node = make_node(tmp_path, "version = 2\n")
    line = refused(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--restart", "signal"))
    assert "hostPID" in line
    assert json.loads((node / STATE).read_text())["restart_pending"] == ["containerd"]


@pytest.mark.skipif(not is_root(), reason="needs root (unshare: a PID namespace of the test's own)")
@pytest.mark.parametrize("fails", [False, True])
def test_restart_systemd_runs_the_hosts_systemctl_in_pid1s_mount_namespace(tmp_path, fake_bundle, fails):
    """From a container (host root not /, hostPID): `systemctl restart containerd.service` runs
    in the mount namespace of the host's PID 1, not the container's (setns, as `nsenter -t 1
    -m` would: the image has no nsenter). Here PID 1 is the test's own, in a PID namespace of
    its own, and a stand-in systemctl records its argv and namespace: no systemd is touched."""
    node = make_node(tmp_path, "version = 2\n")
    os.symlink("/proc", node / "proc")
    record = tmp_path / "systemctl.argv"
    fake_systemctl(tmp_path / "bin", record, "Failed to restart containerd.service: Unit containerd.service not found."
                   if fails else None)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    r = run_as_pod([sys.executable, "-m", "gpuhook", "install", "--host-root", node, "--bundle-dir", fake_bundle,
                    "--restart", "systemd"], tmp_path / "pid1.ns", env=env)
    argv, ns = record.read_text().splitlines()
    assert argv == "restart containerd.service"
    assert ns == (tmp_path / "pid1.ns").read_text().strip()  # PID 1's, not the one gpuhook ran in
    if fails:
        assert "Unit containerd.service not found" in refused(r)
        assert json.loads((node / STATE).read_text())["restart_pending"] == ["containerd"]
    else:
        assert "containerd.service restarted (systemctl in the host mount namespace)" in ok(r)
        assert json.loads((node / STATE).read_text())["restart_pending"] == []


def test_restart_systemd_needs_the_hosts_pid_namespace(tmp_path, fake_bundle):
    node = make_node(tmp_path, "version = 2\n")  # no procfs of ours at <host>/proc: no hostPID
    line = refused(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--restart", "systemd"))
    assert "hostPID" in line


# -- the host bundle ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def node_with_bundle(tmp_path_factory, real_bundle) -> str:
    """A node root with nothing but busybox, where `gpuhook install` put the real bundle."""
    root = tmp_path_factory.mktemp("bundled") / "node"
    if bundle.find_busybox():
        bundle.make_rootfs(str(root))
    (root / "etc/crio").mkdir(parents=True)
    out = ok(gpuhook("install", "--host-root", root, "--bundle-dir", real_bundle))
    files = json.load(open(os.path.join(real_bundle, "gpuhook-bundle.json")))["files"]
    assert f"bundle: /opt/gpuhook: {len(files)} files, {len(files)} written" in out
    return str(root)


def test_bundle_create_path_runs_with_an_empty_environment(tmp_path, node_with_bundle, make_host):
    node = node_with_bundle
    b = str(tmp_path / "ctr")
    bundle.make_bundle(b, ["sh"])
    cfg = tmp_path / "gpuhook.toml"
    cfg.write_text(f'host_root = "{make_host("nvidia")}"\nruntime = "/bin/true"\nlog_file = "{tmp_path}/gpuhook.log"\n')
    env = {"GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")}  # env -i: no PATH at all
    r = subprocess.run([f"{node}/opt/gpuhook/bin/gpuhook-runtime", "--root", str(tmp_path / "state"), "create",
                        "--bundle", b, "c1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    record = json.loads(open(tmp_path / "gpuhook.log").read().splitlines()[-1])
    assert record["decision"] == "injected" and record["vendors"] == ["nvidia"], record
    spec = json.load(open(os.path.join(b, "config.json")))
    assert "GPUHOOK_ACCELERATOR=nvidia" in spec["process"]["env"]
    # ...and that Python is the bundle's own, with its own libc
    r = subprocess.run([f"{node}/opt/gpuhook/bin/python3", "-S", "-c",
                        "import sys; print(sys.prefix); print(open('/proc/self/maps').read())"],
                       env={}, capture_output=True, text=True, timeout=60)
    prefix, maps = r.stdout.split("\n", 1)
    # one installed version, resolved once (/opt/gpuhook/bin is a link into .versions/<hash>)
    version = os.path.realpath(f"{node}/opt/gpuhook/.current")
    assert os.path.dirname(version) == f"{node}/opt/gpuhook/.versions"
    assert prefix == version
    libc = {line.split()[-1] for line in maps.splitlines() if "libc.so" in line}
    assert libc == {f"{version}/lib/libc.so.6"}


@pytest.mark.skipif(not is_root() or bundle.find_busybox() is None, reason="needs root (chroot) and busybox-static")
def test_bundle_runs_in_a_chroot_with_nothing_but_busybox(node_with_bundle):
    """No host libc, no host Python: the chroot has busybox, the bundle and a fake GPU host."""
    root = node_with_bundle
    if not os.path.exists(f"{root}/gpuhost"):
        fakehost.build(f"{root}/gpuhost", "nvidia", mknod=False)
        bundle.make_bundle(f"{root}/ctr", ["sh"])
    with open(f"{root}/etc/gpuhook/config.toml", "w") as f:
        f.write('host_root = "/gpuhost"\nruntime = "/bin/true"\nlog_file = "/gpuhook.log"\n')
    assert not glob.glob(f"{root}/lib*/**/libc.so*", recursive=True) and not glob.glob(f"{root}/usr/bin/python*")
    r = subprocess.run(["/usr/sbin/chroot", root, "/opt/gpuhook/bin/gpuhook-runtime", "--root", "/run/runc",
                        "create", "--bundle", "/ctr", "c1"], env={}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    record = json.loads(open(f"{root}/gpuhook.log").read().splitlines()[-1])
    assert record["decision"] == "injected", record
    assert "GPUHOOK_ACCELERATOR=nvidia" in json.load(open(f"{root}/ctr/config.json"))["process"]["env"]
    r = subprocess.run(["/usr/sbin/chroot", root, "/opt/gpuhook/bin/gpuhook", "--version"], env={},
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == f"gpuhook {__version__}", r.stderr


def test_bundled_gpuhook_installs_itself(tmp_path, real_bundle):
    node = tmp_path / "node"
    (node / "etc/crio").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run([os.path.join(real_bundle, "bin", "gpuhook"), "install", "--host-root", str(node)],
                       env=env, capture_output=True, text=True, timeout=120)
    files = json.load(open(os.path.join(real_bundle, "gpuhook-bundle.json")))["files"]
    assert f"bundle: /opt/gpuhook: {len(files)} files, {len(files)} written" in ok(r)
    # the .deb's case: the bundle is already the node's /opt/gpuhook
    mine = str(node / "opt/gpuhook/bin/gpuhook")
    r = subprocess.run([mine, "install", "--host-root", str(node)], env=env, capture_output=True, text=True, timeout=120)
    assert "is the bundle this gpuhook runs from" in ok(r)
    r = subprocess.run([mine, "uninstall", "--host-root", str(node)], env=env, capture_output=True, text=True, timeout=120)
    assert "kept: it is the gpuhook running this uninstall" in ok(r)
    assert not (node / CRIO_DROPIN).exists()


# -- packaging -------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_deb_package(tmp_path, real_bundle):
    r = subprocess.run([os.path.join(REPO, "packaging", "build-deb.sh"), str(tmp_path / "out"), real_bundle],
                       env=dict(os.environ, GPUHOOK_DEB_COMPRESSION="none"), capture_output=True, text=True, timeout=300)
    deb = ok(r).strip()
    assert os.path.basename(deb).startswith(f"gpuhook_{__version__}_")
    listing = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True, check=True).stdout
    entries = {line.split()[-1]: line.split()[0] for line in listing.splitlines()}
    for path in ("./opt/gpuhook/bin/gpuhook-runtime", "./opt/gpuhook/bin/gpuhook", "./opt/gpuhook/bin/python3",
                 "./opt/gpuhook/libexec/python3"):
        assert entries[path] == "-rwxr-xr-x", path
    assert entries["./lib/systemd/system/gpuhook-install.service"] == "-rw-r--r--"
    assert entries["./opt/gpuhook/.installed-by-package"] == "-rw-r--r--"  # defaults.PACKAGE_MARK
    assert "./opt/gpuhook/lib/python3.11/site-packages/gpuhook/runtime/__init__.py" in entries or \
        any(p.endswith("/site-packages/gpuhook/runtime/__init__.py") for p in entries)
    assert all(line.split()[1] == "root/root" for line in listing.splitlines())
    field = lambda name: subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True).stdout.strip()  # noqa: E731
    assert (field("Package"), field("Version"), field("Depends")) == ("gpuhook", __version__, "")
    ctrl = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", deb, str(ctrl)], check=True)
    assert sorted(os.listdir(ctrl)) == ["control", "postinst", "prerm"]
    postinst = (ctrl / "postinst").read_text()
    for line in postinst.splitlines():  # enables the unit; installs and restarts nothing itself
        if "gpuhook install" in line or "restart" in line:
            assert line.strip().startswith("echo"), line
    # what it installs runs: unpack and use it the way the unit does
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    (root / "etc/crio").mkdir(parents=True)
    r = subprocess.run([str(root / "opt/gpuhook/bin/gpuhook"), "install", "--host-root", str(root), "--restart", "none"],
                       env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert "is the bundle this gpuhook runs from" in ok(r)
    # another gpuhook's uninstall (not the package's own) tells the bundle apart by its mark
    out = ok(gpuhook("uninstall", "--host-root", root, "--restart", "none"))
    assert "bundle: /opt/gpuhook kept: installed by a package (/opt/gpuhook/.installed-by-package)" in out
    assert (root / "opt/gpuhook/bin/gpuhook-runtime").exists()


def test_a_package_bundle_is_told_apart_by_its_mark_not_by_the_state(tmp_path, fake_bundle):
    """A bundle with the package's mark stays; one that install copied goes, even when the
    state that said so is gone and the bundle is half removed (an uninstall killed in it)."""
    node = make_node(tmp_path, "version = 2\n")
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    mark = node / "opt/gpuhook/.installed-by-package"
    mark.write_text("gpuhook (.deb)\n")
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "bundle: /opt/gpuhook kept: installed by a package (/opt/gpuhook/.installed-by-package)" in out
    assert (node / "opt/gpuhook/bin/gpuhook-runtime").exists()
    mark.unlink()
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    for name in ("bin", "gpuhook-bundle.json", ".current"):  # what a killed removal takes first
        (node / "opt/gpuhook" / name).unlink()
    (node / STATE).unlink()
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "bundle: /opt/gpuhook:" in out and "removed" in out, out
    assert not (node / "opt/gpuhook").exists()


def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(REPO, "systemd", "gpuhook-install.service"))
    assert unit["Service"]["Type"] == "oneshot"
    assert set(unit["Unit"]["Before"].split()) >= {"containerd.service", "crio.service"}
    assert "Requires" not in unit["Unit"] and "RequiredBy" not in unit["Install"]
    argv = unit["Service"]["ExecStart"].split()
    assert argv[0] == core.PREFIX + "/bin/gpuhook" and argv[1] == "install"
    assert argv[argv.index("--restart") + 1] == "none"
    assert unit["Unit"]["ConditionPathExists"] == argv[0]


def test_containerfile_is_from_scratch_with_the_bundle():
    """No distribution to pull: FROM scratch, one COPY of the tree packaging/build-image.sh lays
    out (the bundle at /opt/gpuhook), the OCI labels; the context sends nothing else."""
    text = open(os.path.join(REPO, "packaging", "Containerfile")).read()
    steps = [line.split()[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert steps == ["FROM", "ARG", "LABEL", "COPY", "ENV", "CMD"]
    assert "FROM scratch" in text and "RUN " not in text
    assert "COPY build/image/rootfs/ /" in text
    for label in ("source", "version", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text
    assert 'org.opencontainers.image.version="${VERSION}"' in text
    script = open(os.path.join(REPO, "packaging", "build-image.sh")).read()
    assert "build/image/rootfs" in script and "--pull=never" in script
    ignore = open(os.path.join(REPO, ".containerignore")).read().split()
    assert [w for w in ignore if not w.startswith("#")][-2:] == ["*", "!build/image/rootfs"]


# -- the DaemonSet ---------------------------------------------------------------------------

from manifests import DAEMONSET, kustomize, load_yaml  # noqa: E402


def validate(doc: dict) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")
    kv.validate(doc, kv.latest_version(), strict=True)


def test_kustomization_builds_and_every_manifest_is_valid():
    docs = kustomize()
    for doc in docs:
        validate(doc)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {("Namespace", "gpuhook-system"), ("ServiceAccount", "gpuhook"), ("ClusterRole", "gpuhook-node"),
                     ("ClusterRoleBinding", "gpuhook-node"), ("Role", "gpuhook-node-events"),
                     ("RoleBinding", "gpuhook-node-events"), ("ValidatingAdmissionPolicy", "gpuhook-own-node-labels"),
                     ("ValidatingAdmissionPolicyBinding", "gpuhook-own-node-labels"),
                     ("DaemonSet", "gpuhook"), ("RuntimeClass", "gpu-optional"),
                     ("ClusterRole", "gpuhook-pods"), ("ClusterRoleBinding", "gpuhook-pods")} | {
                     (k, n) for n in ("gpuhook-gpu-optional", "gpuhook-pod-accelerator-label", "gpuhook-agent-pods",
                                      "gpuhook-agent-events")
                     for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")}  # test_admission.py
    by_kind = {d["kind"]: d for d in docs if d["metadata"]["name"] in ("gpuhook", "gpuhook-node", "gpuhook-node-events",
                                                                      "gpuhook-own-node-labels", "gpu-optional",
                                                                      "gpuhook-system")}
    rc = by_kind["RuntimeClass"]
    assert rc["handler"] == ctd.HANDLER
    assert rc["scheduling"]["nodeSelector"] == {"gpuhook.dev/runtime-ready": "true"}
    assert by_kind["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    (pods_role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpuhook-pods"]
    assert pods_role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
                                  {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]
    assert by_kind["Role"]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert by_kind["Role"]["metadata"]["namespace"] == "default"  # where Node events live
    assert by_kind["DaemonSet"]["metadata"]["namespace"] == by_kind["ServiceAccount"]["metadata"]["namespace"] == "gpuhook-system"
    vap = by_kind["ValidatingAdmissionPolicy"]["spec"]
    assert "authentication.kubernetes.io/node-name" in vap["validations"][0]["expression"]
    assert by_kind["ValidatingAdmissionPolicyBinding"]["spec"]["validationActions"] == ["Deny"]
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True and c["securityContext"]["privileged"] is True
    assert c["image"] == f"localhost/gpuhook:{__version__}"  # what `make image` builds
    assert c["command"] + c["args"] == ["gpuhook", "agent", "--root", "/host", "--install-restart", "systemd", "--front",
                                        "wrapper"]
    assert c["readinessProbe"]["exec"]["command"] == ["gpuhook", "ready"]  # no shell in the image
    assert set(c["resources"]) == {"requests", "limits"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert mounts["host"]["mountPath"] == "/host" and vols["host"]["hostPath"]["path"] == "/"
    assert mounts["udev"]["readOnly"] is True and vols["udev"]["hostPath"]["path"] == "/run/udev"
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert downward == {"NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace",  # its own pod: podres.py
                        "POD_NAME": "metadata.name"}
    lines = open(os.path.join(DAEMONSET, "daemonset.yaml")).read().splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip() == "privileged: true")
    assert lines[i - 1].strip().startswith("#"), "privileged needs its reason beside it"


def test_gpuhook_ready_is_the_readiness_probe(tmp_path):
    """`gpuhook ready` (the DaemonSet's probe: the image has no `test`) answers from the file the
    agent writes, without loading the agent (it runs every periodSeconds)."""
    from gpuhook.agent import core as agent
    from gpuhook import defaults

    assert agent.READY_FILE == defaults.READY_FILE  # the agent writes where the probe looks
    ready = tmp_path / "ready"
    r = gpuhook("ready", "--ready-file", ready)
    assert r.returncode == 1 and r.stderr.startswith("gpuhook: not ready: ") and len(r.stderr.splitlines()) == 1
    ready.write_text("2026-01-01T00:00:00Z\n")
    assert gpuhook("ready", "--ready-file", ready).returncode == 0
    r = subprocess.run([sys.executable, "-c", "import sys; from gpuhook.cli import main; main(['ready']); "
                        "print('gpuhook.agent.core' in sys.modules)"], cwd=REPO, capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr


def test_examples_are_valid_and_gpu_optional():
    examples = {os.path.basename(p): load_yaml(p) for p in sorted(glob.glob(os.path.join(DAEMONSET, "examples", "*.yaml")))}
    assert {"worker-deployment.yaml", "print-accelerator-pod.yaml", "uninstall-node.yaml"} <= set(examples)
    for docs in examples.values():
        for doc in docs:
            validate(doc)
    (worker,) = examples["worker-deployment.yaml"]
    spec = worker["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "gpu-optional"
    (pref,) = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["preference"]["matchExpressions"] == [
        {"key": "gpu.type", "operator": "In", "values": ["nvidia", "amd", "intel"]}]  # test_scheduling_labels.py
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["nodeAffinity"]
    assert "nvidia.com/gpu" not in json.dumps(worker)
    (pod,) = examples["print-accelerator-pod.yaml"]
    assert pod["spec"]["runtimeClassName"] == "gpu-optional"
    assert "GPUHOOK_ACCELERATOR" in " ".join(pod["spec"]["containers"][0]["command"])
    (un,) = examples["uninstall-node.yaml"]
    assert un["spec"]["containers"][0]["command"][:2] == ["gpuhook", "uninstall"]


def test_the_agent_runs_from_the_bundle(tmp_path, real_bundle, make_host):
    """The DaemonSet image runs the bundle's gpuhook: the agent (HTTPS to the API: ssl) too."""
    root = make_host("nvidia", mknod=False, gpus=1, libs=False)
    r = subprocess.run([os.path.join(real_bundle, "bin", "gpuhook"), "agent", "--root", root, "--no-install",
                        "--once", "--no-udev", "--cdi-dir", str(tmp_path / "cdi"), "--nfd-dir", str(tmp_path / "nfd"),
                        "--ready-file", str(tmp_path / "ready"), "--log-format", "json"],
                       env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert (tmp_path / "ready").exists()
    assert "gpuhook.dev/accelerator=nvidia" in (tmp_path / "nfd" / "gpuhook").read_text()
    r = subprocess.run([os.path.join(real_bundle, "bin", "python3"), "-c", "import ssl, hashlib; print('ok')"],
                       env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.stdout.strip() == "ok", r.stderr


def test_uninstall_removes_what_the_agent_wrote(tmp_path, stock, fake_bundle):
    """The NFD feature file says runtime-ready=true: left behind, NFD would put the label
    back on a node without the handler. The CDI specs go too (other CDI specs stay), and the
    agent's position in the node log."""
    node = make_node(tmp_path, stock)
    ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    nfd = node / "etc/kubernetes/node-feature-discovery/features.d"
    cdi = node / "var/run/cdi"
    nfd.mkdir(parents=True)
    cdi.mkdir(parents=True)
    (nfd / "gpuhook").write_text("gpuhook.dev/runtime-ready=true\n")
    (nfd / "other").write_text("x=1\n")
    (cdi / "gpuhook.dev-nvidia.yaml").write_text("{}")
    (cdi / "gpuhook.dev-gpu.json").write_text("{}")
    (cdi / "nvidia.yaml").write_text("{}")
    position = node / "var/lib/gpuhook/agent-log-position.json"  # where the agent stopped reading the log
    position.parent.mkdir(parents=True)
    position.write_text("{}")
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "agent file: /etc/kubernetes/node-feature-discovery/features.d/gpuhook removed" in out
    assert sorted(os.listdir(nfd)) == ["other"] and sorted(os.listdir(cdi)) == ["nvidia.yaml"]
    assert "agent file: /var/lib/gpuhook/agent-log-position.json removed" in out and not position.exists()


# -- the runtime server's units (install/units.py) -----------------------------------------

def test_server_units_written_on_a_systemd_node_and_removed_on_uninstall(tmp_path, fake_bundle):
    from gpuhook.install import units

    node = make_node(tmp_path, "version = 2\n")
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "runtime server: no /etc/systemd/system on this node: not installed" in out
    (node / "etc/systemd/system").mkdir(parents=True)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    for name, text in units.TEXTS.items():
        assert (node / "etc/systemd/system" / name).read_text() == text
    assert "written" in out and "systemctl daemon-reload && systemctl enable --now gpuhook-runtime.socket" in out
    assert "runtime server: /etc/systemd/system/{gpuhook-runtime.socket and gpuhook-runtime.service} up to date" in ok(
        gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    other = node / "etc/systemd/system/other.service"
    other.write_text("[Service]\n")
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert not any((node / "etc/systemd/system" / n).exists() for n in units.TEXTS) and other.exists()
    assert "runtime server: /etc/systemd/system/gpuhook-runtime.socket removed" in out


@pytest.mark.skipif(not is_root(), reason="needs root (unshare: a PID namespace of the test's own)")
def test_server_socket_enabled_with_restart_systemd(tmp_path, fake_bundle):
    node = make_node(tmp_path, "version = 2\n")
    (node / "etc/systemd/system").mkdir(parents=True)
    os.symlink("/proc", node / "proc")
    record = tmp_path / "systemctl.argv"
    fake_systemctl(tmp_path / "bin", record)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    r = run_as_pod([sys.executable, "-m", "gpuhook", "install", "--host-root", node, "--bundle-dir", fake_bundle,
                    "--restart", "systemd"], tmp_path / "pid1.ns", env=env)
    assert "gpuhook-runtime.socket enabled and listening" in ok(r)
    lines = record.read_text().splitlines()
    assert lines[0::2][:3] == ["daemon-reload", "enable --now gpuhook-runtime.socket", "restart containerd.service"]
    assert set(lines[1::2]) == {(tmp_path / "pid1.ns").read_text().strip()}
    record.unlink()
    r = run_as_pod([sys.executable, "-m", "gpuhook", "uninstall", "--host-root", node, "--restart", "systemd"],
                   tmp_path / "pid1.ns", env=env)
    ok(r)
    assert record.read_text().splitlines()[0] == "disable --now gpuhook-runtime.socket gpuhook-runtime.service"


def test_one_install_at_a_time_on_a_node(tmp_path, fake_bundle):
    """The boot unit, the agent and an operator may run install together: the second waits
    for the first (an flock on the node's /etc), says so, then does its own run."""
    import fcntl

    from gpuhook.install import files as install_files

    node = make_node(tmp_path, "version = 2\n")
    fd = os.open(node / install_files.LOCK_DIR.lstrip("/"), os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    proc = subprocess.Popen([sys.executable, "-m", "gpuhook", "install", "--host-root", str(node), "--bundle-dir",
                             fake_bundle], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()
        assert "gpu-optional" not in (node / CONFIG).read_text()  # nothing written while it waits
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for another gpuhook install or uninstall on this node to finish" in out
    assert "gpu-optional" in (node / CONFIG).read_text()
