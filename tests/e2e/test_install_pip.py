"""The plain-host path of docs/install.md (Without Kubernetes; README, Install): `pip install .`, then `gpuhook install` with no --bundle-dir.

install builds the host bundle from the interpreter it runs on (gpuhook/install/build.py,
as packaging/build-bundle.sh does) and copies it to <host root>/opt/gpuhook. The test makes a
throwaway venv, pip-installs a copy of this repository into it, installs, then removes the
venv and the copy: a container started with real runc through the handler that install wrote
into config.toml still gets the fake host's GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib

from conftest import REPO, gpuhook, is_root, nodes_of, ok, requires
from gpuhook import __version__
from fakes import bundle

CONFIG = "etc/containerd/config.toml"
V2_RUNTIMES = ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
SHOW = ("for n in /dev/nvidia*; do stat -c 'node %n %t:%T %F' $n; done; echo accel=$GPUHOOK_ACCELERATOR; "
        "cat /dev/nvidia0 >/dev/null 2>/tmp/err; echo open: $(cat /tmp/err)")
PLAIN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

needs_runc_root = requires(bool(is_root() and shutil.which("runc") and bundle.find_busybox()),
                           "needs root, runc and busybox-static (make deps installs them)")


def pip_install_repo(tmp_path) -> str:
    """A throwaway venv with `pip install <copy of this repo>` in it; its directory."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".hypothesis", "out"))
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    ok(subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300))
    env = dict(os.environ, **{"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    env.pop("PYTHONPATH", None)
    ok(subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], capture_output=True, text=True,
                      timeout=600, env=env, cwd=tmp_path))
    shutil.rmtree(src)
    return str(venv)


@needs_runc_root
def test_pip_install_then_install_then_the_venv_is_gone(tmp_path, make_host, runtime):
    venv = pip_install_repo(tmp_path)
    node = tmp_path / "node"
    node.mkdir()
    gpuhook = [os.path.join(venv, "bin", "gpuhook"), "install", "--host-root", str(node), "--runtime", "containerd",
               "--restart", "none"]
    env = dict(PLAIN_ENV, TMPDIR=str(tmp_path))  # where the bundle is built, then removed
    out = ok(subprocess.run(gpuhook, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path))
    # what was built, from what, and how big; one line per step as it starts
    assert f"building one from this Python ({venv}/bin/python" in out, out
    steps = [line for line in out.splitlines() if line.startswith("bundle: ")]
    assert any(line.startswith("bundle: copying the standard library") for line in steps), out
    assert any(line.startswith("bundle: compiling ") for line in steps), out
    built = next(line for line in steps if line.startswith("bundle: built in "))
    manifest = json.load(open(node / "opt/gpuhook/gpuhook-bundle.json"))
    version = os.path.realpath(node / "opt/gpuhook/.current")  # the installed version's own files
    size = sum(os.lstat(os.path.join(version, f)).st_size for f in manifest["files"])
    assert f"gpuhook {__version__}, Python " in built and f"{len(manifest['files'])} files, {size / 1e6:.1f} MB" in built
    assert {p.split("==")[0].lower() for p in manifest["packages"]} >= {"pydantic", "structlog", "pyudev", "tomlkit"}
    assert "site-packages/gpuhook/runtime/gpuhook-runtime" in " ".join(manifest["files"])
    assert f"bundle: /opt/gpuhook: {len(manifest['files'])} files, {len(manifest['files'])} written" in out
    assert not [n for n in os.listdir(tmp_path) if n.startswith("gpuhook-bundle-")]

    # a second install builds again and writes nothing: the build is reproducible
    before = {f: os.stat(node / "opt/gpuhook" / f).st_ino for f in manifest["files"]}
    again = ok(subprocess.run(gpuhook, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path))
    assert f"bundle: /opt/gpuhook: {len(manifest['files'])} files, all up to date" in again
    assert "handler gpu-optional already in place" in again
    assert {f: os.stat(node / "opt/gpuhook" / f).st_ino for f in manifest["files"]} == before

    shutil.rmtree(venv)

    # the handler as installed: containerd's config.toml names the bundle's gpuhook-runtime
    handler = tomllib.loads((node / CONFIG).read_text())
    for key in V2_RUNTIMES:
        handler = handler[key]
    binary = handler["gpu-optional"]["options"]["BinaryName"]
    assert binary == "/opt/gpuhook/bin/gpuhook-runtime"
    rt = runtime(make_host("nvidia", mknod=True))
    rt.env = dict(PLAIN_ENV, GPUHOOK_CONFIG=rt.config, GPUHOOK_CACHE_DIR=str(tmp_path / "cache"))
    b = rt.bundle("b", ["sh", "-c", SHOW])
    r = rt.run(b, f"pip-{os.getpid()}", binary=str(node) + binary)
    assert r.returncode == 0, r.stderr
    nodes = nodes_of(r.stdout)
    assert [nodes[f"/dev/nvidia{i}"] for i in range(8)] == [(195, i) for i in range(8)]
    assert nodes["/dev/nvidiactl"] == (195, 255)
    assert "accel=nvidia" in r.stdout
    assert "open: cat: can't open '/dev/nvidia0': No such device or address" in r.stdout
    assert rt.log_records()[-1]["decision"] == "injected"
    # and the CLI of the bundle runs with the venv gone
    r = subprocess.run([str(node / "opt/gpuhook/bin/gpuhook"), "--version"], env=PLAIN_ENV, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == f"gpuhook {__version__}", r.stderr


def test_dry_run_builds_nothing(tmp_path):
    node = tmp_path / "node"
    (node / "etc/containerd").mkdir(parents=True)
    out = gpuhook("install", "--host-root", node, "--runtime", "containerd", "--dry-run", env={"TMPDIR": str(tmp_path)},
                  check=True).stdout
    assert "bundle: no --bundle-dir: one would be built from this Python" in out
    assert sorted(os.listdir(tmp_path)) == ["node"] and os.listdir(node) == ["etc"]
