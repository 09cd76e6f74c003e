"""Upgrade and restart without a window (issue 11, item 3).

- A bundle upgrade is atomic as a whole: real creates through the installed handler (real
  runc, fake GPU host) while a second bundle is installed over the first, again and again;
  every create starts and gets its GPUs.
- The install rewrites only what changed (the rest is hard-linked), keeps the previous version,
  prunes the older ones, and uninstall removes every version.
- SIGTERM to `gpuhook agent`: it exits within --grace and uninstalls nothing.
"""

from __future__ import annotations

import glob
import json
import os
import py_compile
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO, gpuhook, needs_runc
from gpuhook.install import build, files

PREFIX = "opt/gpuhook"
MARK_ENV = "GPUHOOK_TEST_UPGRADE_MARK"


def tree(root) -> dict:
    """Every entry under root: (kind, bytes or link target, inode); directories too."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = ("link", os.readlink(p), st.st_ino)
            elif os.path.isdir(p):
                out[os.path.relpath(p, root)] = ("dir", None, st.st_mode)
            else:
                out[os.path.relpath(p, root)] = ("file", open(p, "rb").read(), st.st_ino)
    return out


def small_bundle(path, extra: dict[str, str] | None = None) -> str:
    """The runtime's front, a module and the manifest."""
    contents = {"bin/gpuhook-runtime": open(os.path.join(REPO, "gpuhook/runtime/gpuhook-runtime"), "rb").read(),
                "lib/mod.py": "x = 1\n", **(extra or {})}
    for rel, text in contents.items():
        os.makedirs(os.path.join(path, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(path, rel), "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
    os.chmod(os.path.join(path, "bin/gpuhook-runtime"), 0o755)
    with open(os.path.join(path, files.MANIFEST), "w") as f:
        json.dump({"files": sorted(list(contents) + [files.MANIFEST])}, f)
    return str(path)


def crio_node(tmp_path, name="node"):
    node = tmp_path / name
    (node / "etc/crio").mkdir(parents=True)
    (node / "etc/crio/crio.conf").write_text('[crio.runtime]\ndefault_runtime = "runc"\n')
    return node


def test_one_changed_file_is_one_new_file_the_rest_hard_links(tmp_path):
    node = crio_node(tmp_path)
    before = tree(node)
    a = small_bundle(tmp_path / "a")
    out = gpuhook("install", "--host-root", node, "--bundle-dir", a, check=True).stdout
    assert "3 files, 3 written, 0 removed" in out
    dst = node / PREFIX
    first = files.current_version(str(dst))
    assert os.readlink(dst / ".current") == f".versions/{os.path.basename(first)}"
    for top in ("bin", "lib", files.MANIFEST):  # the handler's path and the rest: through .current
        assert os.readlink(dst / top) == f".current/{top}"
    assert (dst / "bin/gpuhook-runtime").read_bytes() == open(os.path.join(a, "bin/gpuhook-runtime"), "rb").read()
    assert "all up to date" in gpuhook("install", "--host-root", node, "--bundle-dir", a, check=True).stdout

    b = shutil.copytree(a, tmp_path / "b")
    (tmp_path / "b/lib/mod.py").write_text("x = 2\n")
    out = gpuhook("install", "--host-root", node, "--bundle-dir", b, check=True).stdout
    assert "3 files, 1 written, 0 removed, 2 unchanged linked" in out, out
    second = files.current_version(str(dst))
    assert second != first and os.path.isdir(first), "the previous version is kept"
    assert (dst / "lib/mod.py").read_text() == "x = 2\n"
    assert open(os.path.join(first, "lib/mod.py")).read() == "x = 1\n", "the old version is never written"
    for rel in ("bin/gpuhook-runtime", files.MANIFEST):  # unchanged: the very same inode
        assert os.stat(os.path.join(first, rel)).st_ino == os.stat(os.path.join(second, rel)).st_ino
    assert os.stat(os.path.join(first, "lib/mod.py")).st_ino != os.stat(os.path.join(second, "lib/mod.py")).st_ino

    # a third version: the first is removed once retired for the grace period, not before
    c = shutil.copytree(b, tmp_path / "c")
    (tmp_path / "c/lib/mod.py").write_text("x = 3\n")
    out = gpuhook("install", "--host-root", node, "--bundle-dir", c, check=True).stdout
    third = files.current_version(str(dst))
    assert os.path.isdir(first) and "removed:" not in out  # retired just now
    os.utime(second, (time.time() - files.RETIRE_GRACE - 5,) * 2)
    os.utime(first, (time.time() - files.RETIRE_GRACE - 5,) * 2)
    d = shutil.copytree(c, tmp_path / "d")
    (tmp_path / "d/lib/mod.py").write_text("x = 4\n")
    out = gpuhook("install", "--host-root", node, "--bundle-dir", d, check=True).stdout
    # the current one and the previous stay; those before went (retired long enough)
    assert sorted(os.listdir(dst / ".versions")) == sorted(
        os.path.basename(v) for v in (third, files.current_version(str(dst)))), out
    # (names are content hashes: their order is no version's age)
    assert os.path.basename(first) in out.partition("older versions removed: ")[2].partition("\n")[0].split(", "), out
    # back to a version still kept: a switch, nothing written
    out = gpuhook("install", "--host-root", node, "--bundle-dir", c, check=True).stdout
    assert "0 written" in out and (dst / "lib/mod.py").read_text() == "x = 3\n", out

    # uninstall: every version, the links, and the node as it was, byte for byte
    gpuhook("uninstall", "--host-root", node, check=True)
    nondirs = lambda t: {k: v for k, v in t.items() if v[0] != "dir"}  # noqa: E731 (empty parents stay, as before)
    assert nondirs(tree(node)) == nondirs(before) and not dst.exists()


def test_a_bundle_copied_file_by_file_becomes_an_old_version(tmp_path):
    """A node where an older gpuhook copied the bundle into /opt/gpuhook itself."""
    node = crio_node(tmp_path)
    a = small_bundle(tmp_path / "a")
    shutil.copytree(a, node / PREFIX)
    (node / "etc/gpuhook/backup").mkdir(parents=True)
    (node / "etc/gpuhook/backup/install-state.json").write_text(json.dumps(
        {"bundle": {"path": "/opt/gpuhook", "copied": True}, "runtime": "crio"}))
    b = small_bundle(tmp_path / "b", {"lib/mod.py": "x = 2\n", "lib/new.py": "y = 1\n"})
    out = gpuhook("install", "--host-root", node, "--bundle-dir", b, check=True).stdout
    assert "4 files, 3 written, 0 removed, 1 unchanged linked" in out, out  # mod.py, new.py, the manifest
    dst = node / PREFIX
    legacy = [v for v in os.listdir(dst / ".versions") if v.startswith("legacy-")]
    assert len(legacy) == 1 and f"({legacy[0]} kept" in out
    assert sorted(os.listdir(dst / ".versions" / legacy[0])) == ["bin", "gpuhook-bundle.json", "lib"]
    assert sorted(os.listdir(dst)) == [".current", ".versions", "bin", "gpuhook-bundle.json", "lib"]
    assert (dst / "lib/new.py").read_text() == "y = 1\n"
    gpuhook("uninstall", "--host-root", node, check=True)
    assert not dst.exists()


# -- the race: creates through the installed handler while the bundle is replaced ------------------

# Run as its own process: install the two bundles over each other until STOP exists, every rename
# the installer makes slowed down (a slow disk): any step of the upgrade that is not the whole
# of it is then a window a create can fall into.
INSTALLER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    delay = float(sys.argv[2])
    for name in ("replace", "rename"):
        real = getattr(os, name)
        def slow(*a, _real=real, **k):
            time.sleep(delay)
            return _real(*a, **k)
        setattr(os, name, slow)
    from gpuhook.install import files
    dst, stop, count, bundles = sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
    n = 0
    while not os.path.exists(stop):
        files.sync_bundle(bundles[n % len(bundles)], dst, False)
        n += 1
        with open(count, "w") as f:
            f.write(str(n))
""")


def upgraded(real_bundle: str, out: str) -> str:
    """The bundle with a new gpuhook whose runtime imports a module the old one lacks: a
    create that mixes the two (new runtime, no new module) fails to start Python."""
    subprocess.run(["cp", "-al", real_bundle, out], check=True)  # links: replace, never write in place
    site = glob.glob(os.path.join(out, "lib/python3*/site-packages/gpuhook"))[0]
    added = []
    for name, text in (("zz_upgrade_mark.py", f"import os\np = os.environ.get({MARK_ENV!r})\n"
                        "if p:\n    with open(p, 'a') as f:\n        f.write('new\\n')\n"),
                       ("runtime/__init__.py", open(os.path.join(site, "runtime", "__init__.py")).read()
                        + "\nfrom .. import zz_upgrade_mark  # noqa: E402,F401  (the test's upgrade)\n")):
        src = os.path.join(site, name)
        if os.path.exists(src):
            os.unlink(src)
        with open(src, "w") as f:
            f.write(text)
        pyc = py_compile.compile(src, cfile=None, doraise=True,
                                 invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        added += [os.path.relpath(src, out), os.path.relpath(pyc, out)]
    m = json.load(open(os.path.join(out, files.MANIFEST)))
    m["files"] = sorted(set(m["files"]) | set(added))
    os.unlink(os.path.join(out, files.MANIFEST))
    with open(os.path.join(out, files.MANIFEST), "w") as f:
        json.dump(m, f, indent=1)
    return out


@needs_runc
def test_creates_while_the_bundle_is_replaced_all_start_with_their_gpus(tmp_path, real_bundle, make_host, runtime):
    node = tmp_path / "node"
    dst = str(node / PREFIX)
    old = real_bundle
    new = upgraded(real_bundle, str(tmp_path / "bundle-new"))
    files.sync_bundle(old, dst, False)
    host = make_host("nvidia", mknod=True)
    rt = runtime(host)
    rt.env[MARK_ENV] = str(tmp_path / "marks")
    binary = os.path.join(dst, "bin", "gpuhook-runtime")
    stop, count = tmp_path / "stop", tmp_path / "count"
    installer = subprocess.Popen([sys.executable, "-c", INSTALLER, REPO, "0.05", dst, str(stop), str(count), new, old],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failures, runs = [], 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (runs < 30 or not count.exists() or int(count.read_text() or 0) < 6):
            if installer.poll() is not None:
                break
            cid = f"upg-{os.getpid()}-{runs}"
            b = rt.bundle(f"c{runs}", ["sh", "-c", "echo accel=$GPUHOOK_ACCELERATOR; ls /dev/nvidia0"])
            r = rt.run(b, cid, binary=binary)
            runs += 1
            if r.returncode != 0 or "accel=nvidia" not in r.stdout or "/dev/nvidia0" not in r.stdout:
                failures.append((cid, r.returncode, r.stdout[-300:], r.stderr[-600:]))
    finally:
        stop.touch()
        _, err = installer.communicate(timeout=120)
    assert installer.returncode == 0, err
    switches = int(count.read_text())
    assert not failures, f"{len(failures)} of {runs} creates failed during {switches} upgrades; first: {failures[0]}"
    marks = (tmp_path / "marks").read_text().count("new") if (tmp_path / "marks").exists() else 0
    print(f"{runs} creates, {switches} upgrades, {marks} creates ran the new bundle")
    # the race was real: many switches, creates from both versions
    assert switches >= 6 and 0 < marks < runs, (switches, marks, runs)
    assert sorted(os.listdir(os.path.join(dst, files.VERSIONS))) == sorted(
        files.tree_hash(b, files.manifest(b)["files"])[:16] for b in (old, new))
    assert files.remove_bundle(dst) and not os.path.exists(dst)


# -- SIGTERM to the agent -------------------------------------------------------------------------

@pytest.mark.parametrize("grace", [2.0])
def test_sigterm_exits_within_grace_and_uninstalls_nothing(tmp_path, make_host, grace):
    root = make_host("nvidia", mknod=False)
    os.makedirs(os.path.join(root, "etc/containerd"), exist_ok=True)
    with open(os.path.join(root, "etc/containerd/config.toml"), "w") as f:
        f.write("version = 2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["GPUHOOK_BUNDLE_DIR"] = small_bundle(tmp_path / "bundle")
    cmd = [sys.executable, "-m", "gpuhook", "agent", "--root", root, "--spec-root", root, "--no-udev",
           "--ready-file", str(tmp_path / "ready"), "--log-format", "json", "--interval", "60",
           "--grace", str(grace)]
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (tmp_path / "ready").exists() and p.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()
        installed = tree(root)
        assert os.path.isfile(os.path.join(root, PREFIX, "bin/gpuhook-runtime"))
        assert "gpuhook-runtime" in open(os.path.join(root, "etc/containerd/config.toml")).read()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=grace + 10)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert took < grace, took
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert records[-1]["event"] == "agent.stop" and records[-1]["reason"] == "SIGTERM", records[-1]
    assert not any("uninstall" in json.dumps(r) for r in records)
    # nothing undone: the bundle, the handler, the install state, the CDI specs, byte for byte
    assert tree(root) == installed
    assert not (tmp_path / "ready").exists()
