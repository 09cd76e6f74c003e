"""The sh front (gpuhook/runtime/gpuhook-runtime) and Python say each fact once, and agree.

Its lists are compared with Python's (the global flags with runtime.GLOBAL_VALUE_FLAGS, the
create/exec value flags, where a GPU can show up with probe.SIGNS, the bundle's loader with
install.build), and the front's GPU-present check is run against the probe on every fake host
kind. Also: POSIX sh only (dash, busybox sh), a `date` without %N, a log file that is a link."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import REPO, is_root, log_records
from gpuhook.testing import fakehost
from gpuhook import defaults, probe, runtime
from gpuhook.install import build
from gpuhook.probe import cache
from gpuhook.probe.host import Host

SH_FRONT = os.path.join(REPO, "gpuhook", "runtime", "gpuhook-runtime")
TEXT = open(SH_FRONT).read()


def function(name: str) -> str:
    m = re.search(rf"^{name}\(\) \{{\n(.*?)^\}}", TEXT, re.S | re.M)
    assert m, f"the sh front has no function {name}"
    return m.group(1)


def case_words(body: str) -> set[str]:
    """The dash flags named in the case patterns of `body`, without their dashes."""
    return {w.lstrip("-") for w in re.findall(r"(?<![\w$])--?[a-z][a-z-]*(?==\*| \||\))", body)}


def test_the_front_is_small_named_functions():
    for name in ("read_config", "global_value_flag", "find_subcommand", "operands", "record",
                 "find_runtime", "gpu_present", "log_no_gpu", "run_python"):
        function(name)


def test_global_value_flags_are_runtimes():
    body = function("global_value_flag")
    assert case_words(body) == set(runtime.GLOBAL_VALUE_FLAGS)
    # each with one dash and with two, as Go's flag package reads them
    for flag in runtime.GLOBAL_VALUE_FLAGS:
        assert f" -{flag} " in body.replace("\n", " ") or f"(-{flag} " in body or f"        -{flag} " in body
        assert f"--{flag} " in body or f"--{flag})" in body
    # the subcommand finder and operands use it, and list no global flag of their own
    for name in ("find_subcommand", "operands"):
        assert "global_value_flag" in function(name)
    assert case_words(function("find_subcommand")) == {"root"}  # the one whose value it keeps


def test_create_and_exec_value_flags_are_runtimes():
    words = case_words(function("operands"))
    assert words == set(runtime.CREATE_VALUE_FLAGS | runtime.EXEC_VALUE_FLAGS)


def test_gpu_signs_are_the_probes():
    body = function("gpu_present")
    signs = re.findall(r'"\$r"(/[^\s;]+)', body)
    assert len(signs) == len(set(signs))
    assert set(signs) == {s for ss in probe.SIGNS.values() for s in ss}
    # the probe cache watches the directory of each: a GPU appearing invalidates it
    assert probe.sign_dirs() <= set(cache.WATCHED)


def test_bundle_loader_is_builds():
    body = function("run_python")
    assert f'"$here/../{build.LOADER}"' in body and f'"$here/../{build.INTERPRETER}"' in body
    assert build.LOADER in build.PYTHON_SH and build.INTERPRETER in build.PYTHON_SH


def test_the_front_runs_the_entry_of_defaults():
    """Every Python the front starts on a site-packages dir runs defaults.RUNTIME_MAIN (the
    module store's entry, gpuhook/startup.py), as the C front will."""
    body = function("run_python")
    assert f"main='{defaults.RUNTIME_MAIN}'" in body
    assert body.count('-c "$main"') == 2


def fake_python(tmp_path) -> str:
    """A stand-in interpreter that records that the front started Python, and its argv."""
    p = tmp_path / "fake-python"
    p.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$GPUHOOK_TEST_MARK"\n')
    p.chmod(0o755)
    return str(p)


def front(tmp_path, host_root: str, *args: str, shell: str = "/bin/sh", python: str | None = None,
          log_file: str | None = None, path: str = "/usr/bin:/bin") -> tuple[subprocess.CompletedProcess, str]:
    cfg = tmp_path / "config.toml"
    log = log_file if log_file is not None else str(tmp_path / "gpuhook.log")
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{host_root}"\nlog_file = "{log}"\n')
    mark = str(tmp_path / "python-ran")
    if os.path.exists(mark):
        os.unlink(mark)
    env = {"PATH": path, "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(tmp_path / "cache"),
           "GPUHOOK_TEST_MARK": mark, "GPUHOOK_PYTHON": python or fake_python(tmp_path)}
    r = subprocess.run([shell, SH_FRONT, *args], env=env, capture_output=True, text=True, timeout=20)
    return r, mark


@pytest.mark.parametrize("scenario", sorted(fakehost.SCENARIOS))
def test_sh_front_and_probe_agree_on_every_host_kind(scenario, tmp_path):
    """Python starts exactly on the hosts where the probe finds a GPU: never skipped where it
    would inject, never started where there is nothing."""
    root = str(tmp_path / "host")
    fakehost.build(root, scenario, mknod=is_root())
    found = bool(probe.probe(root).vendors)
    assert bool(probe.present(Host(root))) == found
    r, mark = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c1")
    assert r.returncode == 0, r.stderr
    assert os.path.exists(mark) == found, (scenario, found)
    if not found:
        assert [rec["decision"] for rec in log_records(str(tmp_path / "gpuhook.log"))] == ["no-gpu"]


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_posix_shells_and_a_date_without_nanoseconds(shell, tmp_path):
    """dash and busybox sh run it; a `date` that does not know %N gives whole seconds."""
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"no {shell}")
    cmd = [exe, "sh"] if shell == "busybox" else [exe]
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "date").write_text('#!/bin/sh\ncase $2 in *%3N*) echo "2026-01-02T03:04:05.%3NZ" ;; '
                                  '*) echo 2026-01-02T03:04:05 ;; esac\n')
    (fakebin / "date").chmod(0o755)
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    for path, want in ((f"{fakebin}:/usr/bin:/bin", "2026-01-02T03:04:05.000Z"), ("/usr/bin:/bin", None)):
        log = tmp_path / "gpuhook.log"
        if log.exists():
            log.unlink()
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{root}"\nlog_file = "{log}"\n')
        r = subprocess.run([*cmd, SH_FRONT, "--root", str(tmp_path / "st"), "create", "-b", str(tmp_path), "c2"],
                           env={"PATH": path, "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(tmp_path / "c")},
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        recs = log_records(str(log))
        assert len(recs) == 1 and recs[0]["container_id"] == "c2" and recs[0]["bundle"] == str(tmp_path)
        if want and shell == "busybox":  # its own date applet: no %N, the fallback's whole seconds
            assert recs[0]["time"].endswith(".000Z"), recs[0]
        elif want:
            assert recs[0]["time"] == want
        else:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", recs[0]["time"]), recs[0]
        assert oct(log.stat().st_mode & 0o777) == oct(0o640)  # a new log: as Python creates it


def test_no_gpu_log_never_follows_a_link(tmp_path):
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "gpuhook.log"
    link.symlink_to(target)
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c3", log_file=str(link))
    assert r.returncode == 0, r.stderr
    time.sleep(0.3)  # the background writer has had its chance
    assert target.read_text() == "" and link.is_symlink()
    # Python's append_line refuses it the same way
    runtime.append_line(str(link), "x")
    assert target.read_text() == ""


def test_the_bundle_front_runs_its_loader_directly(tmp_path):
    """In the host bundle layout the front execs libexec/ld.so with the interpreter: no
    bin/python3 sh script in between."""
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    shutil.copy(SH_FRONT, b / "bin" / "gpuhook-runtime")
    site = b / "lib" / "python3.11" / "site-packages" / "gpuhook"
    site.mkdir(parents=True)
    mark = tmp_path / "loader-argv"
    for rel in (build.LOADER, build.INTERPRETER):
        (b / rel).parent.mkdir(parents=True, exist_ok=True)
    (b / build.LOADER).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {mark}\n')
    (b / build.LOADER).chmod(0o755)
    (b / build.INTERPRETER).write_text("#!/bin/sh\nexit 99\n")
    (b / build.INTERPRETER).chmod(0o755)
    (b / "bin" / "python3").write_text("#!/bin/sh\nexit 98\n")  # must not be the one run
    (b / "bin" / "python3").chmod(0o755)
    root = str(tmp_path / "gpu")
    fakehost.build(root, "nvidia", mknod=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{root}"\nlog_file = ""\n')
    r = subprocess.run([str(b / "bin" / "gpuhook-runtime"), "create", "--bundle", str(tmp_path), "c4"],
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg)}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    argv = mark.read_text().splitlines()
    here = str(b / "bin")
    assert argv[:5] == ["--library-path", f"{here}/../lib", f"{here}/../{build.INTERPRETER}", "-I", "-S"]
    assert argv[5:7] == ["-c", defaults.RUNTIME_MAIN]
    assert argv[7:] == [f"{here}/../lib/python3.11/site-packages", "create", "--bundle", str(tmp_path), "c4"]
