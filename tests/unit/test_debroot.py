"""tests/debroot.py: when a cached Debian root is stale, and one clear line (a failure, never
a skip) when Debian's archive cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import debroot
from conftest import REPO, TESTS, is_root

UNREACHABLE = "http://127.0.0.1:9/debian"  # the discard port: nothing listens


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(debroot, "CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(debroot, "MIRROR", UNREACHABLE)
    return tmp_path / "cache"


def stamp(cache, release="sid", **fields):
    root = cache / release
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/apt-get").write_text("")
    data = {"format": debroot.FORMAT, "release": release, "include": ["containerd", "runc"], "apt": [],
            "built": time.time(), **fields}
    (root / debroot.STAMP).write_text(json.dumps(data))
    return root


def test_stale_reasons(cache):
    assert debroot.stale_reason("sid", ("runc",)) == "missing"
    root = stamp(cache)
    assert debroot.stale_reason("sid", ("runc", "containerd")) is None
    assert debroot.stale_reason("sid", ("runc", "podman")) == "built without podman"
    assert debroot.stale_reason("sid", ("runc",), apt=("docker.io",)) == "built without docker.io"
    assert debroot.stale_reason("sid", ("runc",), must_have=("usr/bin/containerd",)) == "usr/bin/containerd is gone"
    stamp(cache, built=time.time() - 8 * debroot.DAY)
    assert debroot.stale_reason("sid", ("runc",)) == "built 8 days ago"  # sid moves daily
    stamp(cache, "trixie", built=time.time() - 8 * debroot.DAY)
    assert debroot.stale_reason("trixie", ("runc",)) is None  # a stable release hardly at all
    stamp(cache, format=debroot.FORMAT + 1)
    assert debroot.stale_reason("sid", ("runc",)) == "built by another version of tests/debroot.py"
    (root / debroot.STAMP).write_text("{not json")
    assert debroot.stale_reason("sid", ("runc",)) == "missing"


def test_unreachable_archive_is_one_line_and_leaves_nothing(cache):
    with pytest.raises(debroot.RootUnavailable) as e:
        with debroot.ensure("sid", ("runc",), log=lambda msg: None):
            pass
    line = str(e.value)
    assert "\n" not in line and line.startswith("cannot build the Debian sid root: Debian's archive cannot be reached")
    assert UNREACHABLE in line
    assert sorted(os.listdir(cache)) == [".sid.lock"]  # no half-built root


def test_a_fresh_root_is_used_without_the_archive(cache):
    root = stamp(cache)
    with debroot.ensure("sid", ("runc",), log=lambda msg: None) as got:
        assert got == str(root)


@pytest.mark.skipif(not is_root(), reason="make test-other-release needs root")
def test_make_target_says_one_line_when_the_archive_cannot_be_reached(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(TESTS, "debroot.py"), "suite", "--release", "trixie"],
                       env=dict(os.environ, GPUHOOK_TEST_ROOTS=str(tmp_path), GPUHOOK_DEBIAN_MIRROR=UNREACHABLE),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    said = [line for line in r.stderr.splitlines() if not line.startswith("debroot: ")]
    assert said == [f"test-other-release: cannot build the Debian trixie root: Debian's archive cannot be reached "
                    f"({UNREACHABLE}/dists/trixie/Release: [Errno 111] Connection refused)"], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not is_root(), reason="the sid tests run as root")
def test_sid_tests_fail_not_skip_when_the_archive_cannot_be_reached(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                        os.path.join(TESTS, "e2e", "test_sid_runtimes.py"), "-k", "podman"],
                       env=dict(os.environ, GPUHOOK_TEST_ROOTS=str(tmp_path), GPUHOOK_DEBIAN_MIRROR=UNREACHABLE),
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, r.stdout
    assert "skipped" not in r.stdout.splitlines()[-1], r.stdout
    assert "cannot build the Debian sid root: Debian's archive cannot be reached" in r.stdout, r.stdout


def test_two_processes_each_holding_a_root_can_take_the_others(cache):
    """A holds sid and asks for trixie while B holds trixie and asks for sid (two test runs, a
    module that uses both): roots that can serve are only read, so neither waits for the other."""
    stamp(cache, "sid")
    stamp(cache, "trixie")
    script = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import debroot; debroot.CACHE = sys.argv[2]\n"
        "first, second = sys.argv[3:5]\n"
        "with debroot.ensure(first, ('runc',)):\n"
        "    time.sleep(1)\n"
        "    with debroot.ensure(second, ('runc',)):\n"
        "        print('both', first, second)\n"
    )
    runs = [subprocess.Popen([sys.executable, "-c", script, TESTS, str(cache), a, b], stdout=subprocess.PIPE, text=True)
            for a, b in (("sid", "trixie"), ("trixie", "sid"))]
    outs = [r.communicate(timeout=20)[0] for r in runs]
    assert outs == ["both sid trixie\n", "both trixie sid\n"]
