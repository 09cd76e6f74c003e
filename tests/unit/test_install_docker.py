"""gpuhook install --runtime docker: runtimes["gpu-optional"] in /etc/docker/daemon.json.

On temp host roots: every other key and its order kept, the file's indentation kept, a
missing file created, bad files refused with one line and nothing written, idempotent,
uninstall byte for byte (or only our runtime when the file was edited since), --runtime auto,
--restart systemd in PID 1's mount namespace, with a stand-in systemctl. The real dockerd is in test_e2e_docker.py.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import fake_systemctl, run_as_pod

DAEMON_JSON = "etc/docker/daemon.json"
BACKUP = "etc/gpuhook/backup/docker-daemon.json"
STATE = "etc/gpuhook/backup/install-state.json"
BINARY = "/opt/gpuhook/bin/gpuhook-runtime"

# a daemon.json as an operator has it: nvidia's runtime, a default-runtime, a tab indent
OPERATOR = """{
\t"log-driver": "json-file",
\t"log-opts": {"max-size": "10m", "max-file": "3"},
\t"default-runtime": "runc",
\t"runtimes": {
\t\t"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}
\t},
\t"data-root": "/srv/docker",
\t"features": {"buildkit": true}
}
"""


from conftest import gpuhook, ok, refused  # noqa: E402  (the install tests' runners)


@pytest.fixture
def fake_bundle(tmp_path) -> str:
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    (b / "bin" / "gpuhook-runtime").write_text("#!/bin/sh\nexec runc \"$@\"\n")
    (b / "bin" / "gpuhook-runtime").chmod(0o755)
    (b / "gpuhook-bundle.json").write_text(json.dumps({"files": ["bin/gpuhook-runtime", "gpuhook-bundle.json"]}))
    return str(b)


def node_with(tmp_path, text: str | bytes | None, name: str = "node"):
    root = tmp_path / name
    (root / "etc" / "docker").mkdir(parents=True)
    if text is not None:
        (root / DAEMON_JSON).write_bytes(text.encode() if isinstance(text, str) else text)
    return root


def tree(root) -> dict:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_ino, st.st_mtime_ns, open(p, "rb").read())
    return out


def test_runtime_added_everything_else_kept_and_uninstall_restores_the_bytes(tmp_path, fake_bundle):
    node = node_with(tmp_path, OPERATOR)
    out = ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    assert f"docker: /etc/docker/daemon.json: runtime gpu-optional added (path {BINARY}; default-runtime unchanged)" in out
    text = (node / DAEMON_JSON).read_text()
    after = json.loads(text)
    before = json.loads(OPERATOR)
    assert list(after) == list(before)  # same keys, same order
    assert {k: v for k, v in after.items() if k != "runtimes"} == {k: v for k, v in before.items() if k != "runtimes"}
    assert list(after["runtimes"]) == ["nvidia", "gpu-optional"]
    assert after["runtimes"]["nvidia"] == before["runtimes"]["nvidia"]
    assert after["runtimes"]["gpu-optional"] == {"path": BINARY}
    assert after["default-runtime"] == "runc"
    assert text.startswith('{\n\t"log-driver"') and text.endswith("}\n")  # the file's tab indent
    assert (node / BACKUP).read_text() == OPERATOR
    assert os.stat(node / BACKUP).st_mode & 0o777 == 0o600

    first = tree(node)
    out = ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    assert "runtime gpu-optional already in place" in out and "restart: not done" in out
    assert tree(node) == first  # nothing rewritten

    out = ok(gpuhook("uninstall", "--host-root", node))  # the state knows it is docker
    assert "docker: /etc/docker/daemon.json: original restored byte for byte" in out
    assert (node / DAEMON_JSON).read_text() == OPERATOR
    assert sorted(os.listdir(node / "etc")) == ["docker"] and os.listdir(node / "etc/docker") == ["daemon.json"]


def test_missing_file_is_created_and_removed_again(tmp_path, fake_bundle):
    node = tmp_path / "node"
    node.mkdir()
    out = ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    assert "runtime gpu-optional written to a new file" in out
    assert json.loads((node / DAEMON_JSON).read_text()) == {"runtimes": {"gpu-optional": {"path": BINARY}}}
    assert os.stat(node / DAEMON_JSON).st_mode & 0o777 == 0o644
    assert not (node / BACKUP).exists()
    assert "removed (install had created it)" in ok(gpuhook("uninstall", "--host-root", node))
    assert not (node / DAEMON_JSON).exists()


@pytest.mark.parametrize("text, indent", [('{"debug": true}\n', None), ('{\n    "debug": true\n}', "    "),
                                          ("", "  "), ("  \n", "  ")])
def test_layout_follows_the_file(tmp_path, fake_bundle, text, indent):
    node = node_with(tmp_path, text)
    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    new = (node / DAEMON_JSON).read_text()
    doc = json.loads(new)
    assert doc["runtimes"] == {"gpu-optional": {"path": BINARY}}
    assert new == json.dumps(doc, indent=indent) + ("\n" if text.endswith("\n") or not text.strip() else "")
    ok(gpuhook("uninstall", "--host-root", node))
    assert (node / DAEMON_JSON).read_text() == text


def test_operator_edit_between_install_and_uninstall_is_kept(tmp_path, fake_bundle):
    node = node_with(tmp_path, '{\n  "log-level": "info"\n}\n')
    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    doc = json.loads((node / DAEMON_JSON).read_text())
    doc["log-level"] = "debug"
    doc["runtimes"]["crun"] = {"path": "/usr/bin/crun"}
    (node / DAEMON_JSON).write_text(json.dumps(doc, indent=2) + "\n")
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "changed since install, so only the gpu-optional handler was removed" in out
    assert json.loads((node / DAEMON_JSON).read_text()) == {"log-level": "debug",
                                                            "runtimes": {"crun": {"path": "/usr/bin/crun"}}}

    # the runtimes key install added goes with our runtime when nothing else is in it
    node = node_with(tmp_path, '{"log-level": "info"}', name="node2")
    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    doc = json.loads((node / DAEMON_JSON).read_text())
    doc["debug"] = True
    (node / DAEMON_JSON).write_text(json.dumps(doc))
    ok(gpuhook("uninstall", "--host-root", node))
    assert (node / DAEMON_JSON).read_text() == '{"log-level": "info", "debug": true}'


def test_uninstall_without_state_removes_only_a_runtime_of_ours(tmp_path):
    theirs = {"runtimes": {"gpu-optional": {"path": "/usr/local/bin/other"}}}
    node = node_with(tmp_path, json.dumps(theirs))
    out = ok(gpuhook("uninstall", "--host-root", node, "--runtime", "docker"))
    assert "no gpu-optional runtime of gpuhook's" in out
    assert json.loads((node / DAEMON_JSON).read_text()) == theirs
    ours = {"debug": False, "runtimes": {"gpu-optional": {"path": BINARY}, "x": {"path": "/x"}}}
    (node / DAEMON_JSON).write_text(json.dumps(ours))
    assert "no install record, so only the gpu-optional handler was removed" in \
        ok(gpuhook("uninstall", "--host-root", node, "--runtime", "docker"))
    assert json.loads((node / DAEMON_JSON).read_text()) == {"debug": False, "runtimes": {"x": {"path": "/x"}}}


@pytest.mark.parametrize("case, text, words", [
    ("not json", '{"debug": true,}', "not valid JSON"),
    ("nan", '{"x": NaN}', "not valid JSON"),
    ("not utf-8", b'{"x": "\xff"}', "not UTF-8"),
    ("not an object", '["runtimes"]', "not a JSON object"),
    ("runtimes a list", '{"runtimes": ["gpu-optional"]}', '"runtimes" is a list, not an object'),
    ("runtimes a string", '{"runtimes": "runc"}', '"runtimes" is a string'),
    ("another path", '{"runtimes": {"gpu-optional": {"path": "/usr/bin/nvidia-container-runtime"}}}',
     "runtimes.gpu-optional already names '/usr/bin/nvidia-container-runtime'"),
    ("no path", '{"runtimes": {"gpu-optional": {"runtimeType": "io.containerd.runsc.v1"}}}',
     "runtimes.gpu-optional already is {\"runtimeType\""),
    ("null", '{"runtimes": {"gpu-optional": null}}', "runtimes.gpu-optional already is null"),
    ("a directory", None, "cannot read it"),
])
def test_bad_daemon_json_is_refused_and_nothing_is_written(tmp_path, fake_bundle, case, text, words):
    node = node_with(tmp_path, text)
    if text is None:
        (node / DAEMON_JSON).mkdir()
    before = tree(node)
    line = refused(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    assert words in line and "/etc/docker/daemon.json" in line, line
    assert tree(node) == before
    assert sorted(os.listdir(node)) == ["etc"] and os.listdir(node / "etc") == ["docker"]


def test_dry_run_writes_nothing(tmp_path, fake_bundle):
    node = node_with(tmp_path, OPERATOR)
    before = tree(node)
    out = ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle,
                     "--dry-run", "--restart", "signal"))
    assert "runtime gpu-optional would be added" in out and "docker would be restarted" in out
    assert tree(node) == before


@pytest.mark.parametrize("marks, expected", [
    (["etc/docker/daemon.json"], "docker"),
    (["run/docker.sock"], "docker"),
    (["var/run/docker.sock"], "docker"),
    (["run/docker.sock", "etc/containerd/config.toml", "run/containerd/containerd.sock"], "docker"),  # a Docker host
    (["run/docker.sock", "etc/containerd/config.toml", "var/lib/kubelet/"], "containerd and docker"),  # both
    (["etc/docker/daemon.json", "etc/crio/", "var/lib/kubelet/"], "crio and docker"),
    (["etc/containerd/config.toml", "var/lib/kubelet/"], "containerd"),  # a Kubernetes node
    (["run/docker.sock", "var/lib/kubelet/"], "docker"),  # cri-dockerd
])
def test_runtime_auto(tmp_path, fake_bundle, marks, expected):
    node = tmp_path / "node"
    for m in marks:
        p = node / m
        if m.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("{}\n" if m.endswith(".json") else "version = 2\n" if m.endswith(".toml") else "")
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--dry-run"))
    assert f"runtime {expected} " in out.splitlines()[0], out


def test_var_run_link_is_resolved_inside_the_host_root(tmp_path, fake_bundle):
    """/var/run -> /run on the node is the node's /run, not this machine's."""
    node = tmp_path / "node"
    (node / "var").mkdir(parents=True)
    (node / "run").mkdir()
    os.symlink("/run", node / "var" / "run")
    (node / "etc/containerd").mkdir(parents=True)
    (node / "etc/containerd/config.toml").write_text("version = 2\n")
    assert "runtime containerd" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--dry-run"))
    (node / "run/docker.sock").touch()
    assert "runtime docker" in ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--dry-run"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare: a PID namespace of the test's own)")
@pytest.mark.parametrize("fails", [False, True])
def test_restart_systemd_reloads_docker_service_in_pid1s_mount_namespace(tmp_path, fake_bundle, fails):
    """From a pod (host root not /): `systemctl reload-or-restart docker.service` in the mount
    namespace of the host's PID 1: docker.service reloads with SIGHUP, so running containers
    are kept. PID 1 is the test's own and a stand-in systemctl records what it was asked."""
    node = node_with(tmp_path, "{}\n")
    os.symlink("/proc", node / "proc")
    record = tmp_path / "systemctl.argv"
    fake_systemctl(tmp_path / "bin", record, "Job for docker.service failed." if fails else None)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    r = run_as_pod([sys.executable, "-m", "gpuhook", "install", "--host-root", node, "--runtime", "docker",
                    "--bundle-dir", fake_bundle, "--restart", "systemd"], tmp_path / "pid1.ns", env=env)
    argv, ns = record.read_text().splitlines()
    assert argv == "reload-or-restart docker.service"
    assert ns == (tmp_path / "pid1.ns").read_text().strip()
    if fails:
        assert "Job for docker.service failed." in refused(r)
        assert json.loads((node / STATE).read_text())["restart_pending"] == ["docker"]
    else:
        assert "restart: docker.service reloaded (systemctl reload-or-restart in the host mount namespace)" in ok(r)
        assert json.loads((node / STATE).read_text())["restart_pending"] == []


def content(root) -> dict:
    """Every directory and file under root, files by their bytes (not inode or mtime)."""
    out = {}
    for d, dirs, names in os.walk(root):
        out.update({os.path.relpath(os.path.join(d, n), root): "dir" for n in dirs})
        out.update({os.path.relpath(os.path.join(d, n), root): open(os.path.join(d, n), "rb").read() for n in names})
    return out


def test_docker_and_containerd_side_by_side(tmp_path, fake_bundle):
    """Installed for each runtime on its own; `uninstall --runtime X` takes X's handler only
    (its file byte for byte) and keeps the other's and the shared files; plain uninstall
    takes the rest."""
    node = node_with(tmp_path, OPERATOR)
    (node / "etc/containerd").mkdir()
    (node / "etc/containerd/config.toml").write_text("version = 2\n")
    (node / "opt").mkdir()  # as on every node (uninstall leaves it)
    pristine = content(node)
    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    out = ok(gpuhook("install", "--host-root", node, "--runtime", "containerd", "--bundle-dir", fake_bundle))
    assert "handler gpu-optional written" in out or "handler gpu-optional added" in out
    ctd = (node / "etc/containerd/config.toml").read_text()
    assert "gpu-optional" in ctd and BINARY in ctd
    assert json.loads((node / DAEMON_JSON).read_text())["runtimes"]["gpu-optional"] == {"path": BINARY}
    assert json.loads((node / STATE).read_text())["runtimes"] == ["containerd", "docker"]
    both = content(node)
    assert "already in place" in ok(gpuhook("install", "--host-root", node, "--runtime", "docker",
                                            "--bundle-dir", fake_bundle))
    assert content(node) == both

    out = ok(gpuhook("uninstall", "--host-root", node, "--runtime", "docker"))
    assert "kept for containerd (still installed)" in out, out
    assert (node / DAEMON_JSON).read_text() == OPERATOR  # byte for byte
    assert (node / "etc/containerd/config.toml").read_text() == ctd  # the other's handler kept
    assert (node / "opt/gpuhook/bin/gpuhook-runtime").exists() and (node / "etc/gpuhook/config.toml").exists()
    assert json.loads((node / STATE).read_text())["runtimes"] == ["containerd"]
    one_left = content(node)
    out = ok(gpuhook("uninstall", "--host-root", node, "--runtime", "docker"))  # again: nothing more to do
    assert "gpuhook is not installed for docker on this node (it is for containerd)" in out, out
    assert content(node) == one_left

    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    assert content(node) == both
    out = ok(gpuhook("uninstall", "--host-root", node))  # every runtime
    assert "runtime containerd and docker" in out.splitlines()[0]
    assert content(node) == pristine


def test_runtime_auto_on_a_kubelet_node_with_dockerd_installs_for_both(tmp_path, fake_bundle):
    node = node_with(tmp_path, "{}\n")
    (node / "etc/containerd").mkdir()
    (node / "etc/containerd/config.toml").write_text("version = 2\n")
    (node / "var/lib/kubelet").mkdir(parents=True)
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle))
    assert "runtime containerd and docker" in out.splitlines()[0], out
    assert ("runtime auto: found dockerd (/etc/docker/daemon.json); containerd (/etc/containerd/config.toml); "
            "a kubelet (/var/lib/kubelet): installing for containerd, the kubelet's runtime, and dockerd beside it"
            in out.splitlines()), out
    assert "gpu-optional" in (node / "etc/containerd/config.toml").read_text()
    assert "gpu-optional" in json.loads((node / DAEMON_JSON).read_text())["runtimes"]
    # a Docker host (no kubelet): dockerd alone, and why the containerd there is left alone
    (node / "var/lib/kubelet").rmdir()
    out = ok(gpuhook("install", "--host-root", node, "--bundle-dir", fake_bundle, "--dry-run"))
    assert "runtime docker " in out.splitlines()[0], out
    assert "installing for dockerd: no kubelet (the containerd there runs dockerd's containers, not pods" in out


def test_a_state_of_one_runtime_from_before_is_read(tmp_path, fake_bundle):
    """An install state written before side-by-side installs (one `runtime`, a boolean
    `restart_pending`): an install for dockerd adds to it, and uninstall takes both."""
    node = node_with(tmp_path, OPERATOR)
    (node / "etc/containerd").mkdir()
    (node / "etc/containerd/config.toml").write_text("version = 2\n")
    (node / "opt").mkdir()
    pristine = content(node)
    ok(gpuhook("install", "--host-root", node, "--runtime", "containerd", "--bundle-dir", fake_bundle))
    old = json.loads((node / STATE).read_text())
    old["runtime"] = old.pop("runtimes")[0]
    old["restart_pending"] = bool(old["restart_pending"])
    (node / STATE).write_text(json.dumps(old))
    ok(gpuhook("install", "--host-root", node, "--runtime", "docker", "--bundle-dir", fake_bundle))
    state = json.loads((node / STATE).read_text())
    assert (state["runtimes"], state["restart_pending"], "runtime" in state) == (
        ["containerd", "docker"], ["containerd", "docker"], False)
    out = ok(gpuhook("uninstall", "--host-root", node))
    assert "runtime containerd and docker" in out.splitlines()[0]
    assert content(node) == pristine
