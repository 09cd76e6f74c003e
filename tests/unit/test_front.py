"""The runtime's front (gpuhook/runtime/gpuhook-runtime.c), a gate before Python, and Python
say each fact once, and agree.

The front's tables are generated from Python (gpuhook-runtime.h, runtime/gen_header.py): the
header must be what the generator writes now. The rest is the built front's behaviour against
Python's: its command-line parse with args.parse_args on generated argvs of every flag
Python knows (create/run's bundle and id, exec's id and so its exec record), its GPU-present
check with the probe on every fake host kind and on each sign alone, the node defaults it
uses with no GPUHOOK_* env, the interpreter's entry it runs, the no-GPU log line, never
through a link, and the node config: the front parses no TOML; what it decides of it (through
Python's front file) is what Python decides, on generated files with tomllib as the judge."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from conftest import FRONT, REPO, TESTS, is_root, log_records
from fakes import fakehost
from fakes.front import prime
from gpuhook import config, defaults, inject, probe
from gpuhook import logline as nodelog
from gpuhook.install import build
from gpuhook.probe import cache
from gpuhook.probe.host import Host
from gpuhook.runtime import args as runtime_args, create, exec as execenv, gen_header, logline


def test_the_front_is_built_from_its_source():
    assert os.access(FRONT, os.X_OK), "make builds it (gpuhook/hook/build.sh)"
    with open(FRONT, "rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_the_header_is_what_python_says_now():
    """One truth: the header is generated from Python (make front-header), never edited."""
    with open(gen_header.HEADER) as f:
        assert f.read() == gen_header.render(), "gpuhook-runtime.h is stale: run `make front-header`"
    with open(gen_header.HOOK_HEADER) as f:
        assert f.read() == gen_header.render_hook(), "gpuhook-hook.h is stale: run `make front-header`"
    r = subprocess.run([sys.executable, "-m", "gpuhook.runtime.gen_header", "--check"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("deadline", [0, 30, 31])
def test_the_hooks_ldconfig_deadline_must_end_before_its_timeout(monkeypatch, deadline):
    """runc fails the create when a hook outlives its timeout: the helper's own deadline for
    ldconfig (which lets the container start) must come first."""
    from gpuhook import hook

    monkeypatch.setattr(hook, "LDCONFIG_DEADLINE", deadline)
    with pytest.raises(ValueError, match="before the ld-cache hook's TIMEOUT"):
        gen_header.render_hook()


def test_a_sign_the_front_cannot_match_is_refused(monkeypatch):
    """probe.SIGNS may hold only what the front matches as the probe does: a name, a name's
    prefix ("*"), or a prefix and a digit ("[0-9]*")."""
    monkeypatch.setitem(probe.SIGNS, "x", ("/dev/x?y",))
    with pytest.raises(ValueError, match="not a pattern the front can match"):
        gen_header.render()


def test_gpu_signs_are_watched_by_the_probe_cache():
    # the probe cache watches the directory of each: a GPU appearing invalidates it
    assert probe.sign_dirs() <= set(cache.WATCHED)


def _one_sign_hosts() -> list[tuple[str, str, bool]]:
    """(sign, a name made for it, whether it matches): each sign's own name, and near misses."""
    cases = []
    for sign in dict.fromkeys(s for signs in probe.SIGNS.values() for s in signs):
        parent, _, name = sign.rpartition("/")
        if name.endswith("[0-9]*"):
            cases += [(sign, f"{parent}/{name[:-6]}3", True), (sign, f"{parent}/{name[:-6]}x", False)]
        elif name.endswith("*"):
            cases += [(sign, f"{parent}/{name[:-1]}128", True)]
            if name[:-1]:
                cases += [(sign, f"{parent}/x{name[:-1]}", False)]
        else:
            cases += [(sign, sign, True), (sign, sign + "x", False)]
    return cases


@pytest.mark.parametrize("sign, path, found", _one_sign_hosts())
def test_each_sign_alone_starts_python_as_the_probe_sees_it(sign, path, found, tmp_path):
    """A host with nothing but one file where a GPU may show up (or a near miss): the front
    goes on to Python exactly where the probe's sign check says so."""
    root = tmp_path / "host"
    (root / path.lstrip("/")).parent.mkdir(parents=True)
    (root / path.lstrip("/")).write_text("")
    assert bool(probe.present(Host(str(root)))) == found, (sign, path)
    r, mark = front(tmp_path, str(root), "create", "--bundle", str(tmp_path), "c1")
    assert r.returncode == 0, r.stderr
    assert os.path.exists(mark) == found, (sign, path)


def test_the_entry_runs_the_runtime(tmp_path):
    """defaults.RUNTIME_MAIN, as the front runs it (-I -S, a site-packages dir first on
    sys.path): the runtime runs, then execs the real one."""
    cfg = tmp_path / "config.toml"
    cfg.write_text('runtime = "/bin/echo"\nlog_file = ""\n')
    r = subprocess.run([sys.executable, "-I", "-S", "-c", defaults.RUNTIME_MAIN, REPO, "state", "x1"],
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg),
                            "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")},
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "state x1\n"), r.stderr


@pytest.mark.skipif(not is_root() or not shutil.which("unshare"), reason="needs root and unshare (a mount namespace)")
def test_with_no_gpuhook_env_the_front_uses_the_node_defaults(tmp_path):
    """No GPUHOOK_CONFIG, no GPUHOOK_CACHE_DIR: the front reads defaults.CONFIG_FILE's front
    file in defaults.CACHE_DIR, and a config without log_file logs in defaults.LOG_FILE (in a
    mount namespace of its own, /etc, /run and /var/log are empty tmpfs)."""
    cpu = tmp_path / "cpu"
    fakehost.build(str(cpu), "cpu", mknod=False)
    out = tmp_path / "out"
    script = f"""set -e
mount --make-rprivate /
for d in /etc /run /var/log; do mount -t tmpfs gpuhook-test "$d"; done
mkdir -p "$(dirname {defaults.CONFIG_FILE})"
printf 'runtime = "/bin/echo"\nhost_root = "{cpu}"\n' > {defaults.CONFIG_FILE}
{sys.executable} -c 'import sys; sys.path[:0] = ["{REPO}", "{TESTS}"]; from fakes.front import prime; \
prime("{defaults.CONFIG_FILE}", "{defaults.CACHE_DIR}")'
env -i PATH=/usr/bin:/bin GPUHOOK_PYTHON=/nonexistent {FRONT} create --bundle {tmp_path} c9 > {out}
cat {defaults.LOG_FILE} >> {out}
"""
    r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ran, line = out.read_text().split("\n", 1)
    assert ran == f"create --bundle {tmp_path} c9"  # the configured runtime, not Python
    assert json.loads(line)["decision"] == "no-gpu"


def test_bundle_loader_is_builds():
    assert build.LOADER in build.PYTHON_SH and build.INTERPRETER in build.PYTHON_SH


def fake_python(tmp_path) -> str:
    """A stand-in interpreter that records that the front started Python, and its argv."""
    p = tmp_path / "fake-python"
    p.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$GPUHOOK_TEST_MARK"\n')
    p.chmod(0o755)
    return str(p)


def front(tmp_path, host_root: str, *args: str, python: str | None = None,
          log_file: str | None = None, path: str = "/usr/bin:/bin") -> tuple[subprocess.CompletedProcess, str]:
    cfg = tmp_path / "config.toml"
    log = log_file if log_file is not None else str(tmp_path / "gpuhook.log")
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{host_root}"\nlog_file = "{log}"\n')
    prime(str(cfg), str(tmp_path / "cache"))
    mark = str(tmp_path / "python-ran")
    if os.path.exists(mark):
        os.unlink(mark)
    env = {"PATH": path, "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(tmp_path / "cache"),
           "GPUHOOK_TEST_MARK": mark, "GPUHOOK_PYTHON": python or fake_python(tmp_path)}
    r = subprocess.run([FRONT, *args], env=env, capture_output=True, text=True, timeout=20)
    return r, mark


@pytest.mark.parametrize("scenario", sorted(fakehost.SCENARIOS))
def test_the_front_and_probe_agree_on_every_host_kind(scenario, tmp_path):
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


def test_the_no_gpu_line(tmp_path):
    """A CPU-only node's create: one line, as Python's log has it, in a new 0640 file."""
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    r, mark = front(tmp_path, root, "--root", str(tmp_path / "st"), "create", "-b", str(tmp_path), "c2")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(mark)
    (rec,) = log_records(str(tmp_path / "gpuhook.log"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec.pop("time"))
    assert 0 <= rec.pop("duration_ms") < 1000
    # what Python's create path logs for the same create finding no GPU (no pod: the front reads
    # no config.json), time and duration aside
    out = inject.Decision(inject.NO_GPU)
    inv = runtime_args.parse_args(["--root", str(tmp_path / "st"), "create", "-b", str(tmp_path), "c2"])
    _, line = create.log_line(config.Config(log_file="/log"), inv, out, runtime_args.Call({}, "/"))
    python = json.loads(line)
    del python["time"], python["duration_ms"]
    assert rec == python == {"event": "create", "front": "wrapper", "container_id": "c2", "bundle": str(tmp_path), "decision": "no-gpu",
                             "vendors": [], "nodes": [], "mounts": [], "hooks": 0}
    assert oct((tmp_path / "gpuhook.log").stat().st_mode & 0o777) == oct(0o640)  # as Python creates it
    # a name the line cannot hold as it is: "?" for both; no id at all: null
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path), 'c"3')
    assert [log_records(str(tmp_path / "gpuhook.log"))[-1][k] for k in ("container_id", "bundle")] == ["?", "?"]
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path))
    assert log_records(str(tmp_path / "gpuhook.log"))[-1]["container_id"] is None


def test_a_key_twice_is_left_to_python(tmp_path):
    """TOML refuses a key twice: Python takes the defaults (the front file says so), and a
    create goes to Python, whose log line says why, even on a CPU-only node."""
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    r, mark = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c5")
    assert not os.path.exists(mark)
    cfg = tmp_path / "config.toml"
    cfg.write_text(cfg.read_text() + 'runtime = "/bin/false"\n')
    cache = str(tmp_path / "cache")
    env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_TEST_MARK": mark,
           "GPUHOOK_PYTHON": fake_python(tmp_path), "GPUHOOK_CACHE_DIR": cache}
    subprocess.run([FRONT, "create", "--bundle", str(tmp_path), "c5"], env=env, capture_output=True, timeout=20)
    assert os.path.exists(mark)  # no front file for this file yet: Python decides
    os.unlink(mark)
    prime(str(cfg), cache)
    subprocess.run([FRONT, "create", "--bundle", str(tmp_path), "c5"], env=env, capture_output=True, timeout=20)
    assert os.path.exists(mark)  # a config with errors: creates go to Python
    os.unlink(mark)
    r = subprocess.run([FRONT, "--root", str(tmp_path / "st"), "state", "c5"], env=env, capture_output=True,
                       timeout=20)
    assert not os.path.exists(mark) and b"does not exist" in r.stderr, r  # runc, the default: neither line's


# argvs from the words a runtime's caller uses: every flag Python knows takes a value (in
# each form: --f, -f, --f=v), flags that take none, values, ids, subcommands
FLAGS = sorted(runtime_args.GLOBAL_VALUE_FLAGS | runtime_args.CREATE_VALUE_FLAGS | runtime_args.EXEC_VALUE_FLAGS)
WORDS = st.one_of(
    st.sampled_from(["--", "-", "create", "run", "exec", "delete", "state", "--debug", "--systemd-cgroup",
                     "--no-pivot", "-d", "--tty", "/p", "rel/b", "/bundle", "id1", "id2", "x", "ctr_1", "a,b"]),
    st.builds(lambda dash, f, eq: f"{dash}{f}{eq}", st.sampled_from(["--", "-"]), st.sampled_from(FLAGS),
              st.sampled_from(["", "", "=/v", "=rel"])),
)
@settings(max_examples=150, deadline=None)
@given(st.lists(WORDS, max_size=8))
def test_the_front_parses_as_python_does(tmp_path_factory, argv):
    """The container id and the bundle the front's no-GPU line names are parse_args's, on
    any argv of a runtime's words (create and run; the other subcommands run the runtime)."""
    tmp = tmp_path_factory.mktemp("argv")
    root = tmp / "cpu"
    root.mkdir()
    log = tmp / "gpuhook.log"
    cfg = tmp / "config.toml"
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{root}"\nlog_file = "{log}"\n')
    prime(str(cfg), str(tmp / "cache"))
    r = subprocess.run([FRONT, *argv], env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg),
                                             "GPUHOOK_CACHE_DIR": str(tmp / "cache")},
                       cwd=tmp, capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    here = os.getcwd()
    os.chdir(tmp)  # a relative bundle is the caller's current directory's
    try:
        inv = runtime_args.parse_args(list(argv))
    finally:
        os.chdir(here)
    recs = log_records(str(log))
    if inv.command not in runtime_args.EDITING_COMMANDS:
        assert recs == []
        return
    (rec,) = recs
    assert (rec["container_id"], rec["bundle"]) == (inv.container_id, inv.bundle)


@settings(max_examples=120, deadline=None)
@given(st.lists(WORDS, max_size=6), st.sampled_from(["id1", "a,b", "x", "..", "a/b", "c d"]))
def test_the_front_finds_the_exec_record_python_would(tmp_path_factory, argv, cid):
    """An exec goes to Python exactly when there is a record for the container and root that
    parse_args and execenv.record_path name (a record under every id of the argv, ones Python
    would never key included): the front's exec parse and record key are Python's."""
    tmp = tmp_path_factory.mktemp("exec")
    cfg = tmp / "config.toml"
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{tmp}"\nlog_file = ""\n')
    cache = str(tmp / "cache")
    prime(str(cfg), cache)
    argv = ["--root", str(tmp / "st"), *argv[:2], "exec", *argv[2:], cid]
    inv = runtime_args.parse_args(argv, str(tmp))
    for word in set(argv):  # records of every id the front might take, where Python could key one
        path = execenv.record_path(cache, str(tmp / "st"), word, "/bin/true")
        if path and inv.root == str(tmp / "st"):
            execenv.write_record(path, ["GPUHOOK_ACCELERATOR=nvidia"], str(tmp))
    want = inv.command == "exec" and execenv.record_path(cache, inv.root, inv.container_id, "/bin/true") is not None
    want = want and execenv.record_exists(execenv.record_path(cache, inv.root, inv.container_id, "/bin/true"))
    mark = tmp / "python-ran"
    r = subprocess.run([FRONT, *argv], env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": cache,
                                             "GPUHOOK_TEST_MARK": str(mark), "GPUHOOK_PYTHON": fake_python(tmp)},
                       cwd=tmp, capture_output=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert mark.exists() == want, (argv, inv.command, inv.container_id)
    event(f"exec to Python: {want}")


def test_no_gpu_log_never_follows_a_link(tmp_path):
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "gpuhook.log"
    link.symlink_to(target)
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c3", log_file=str(link))
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "" and link.is_symlink()
    # Python's append_line refuses it the same way
    logline.append_line(str(link), "x")
    assert target.read_text() == ""


def test_a_no_gpu_line_that_does_not_fit_leaves_nothing_for_the_next_to_join(tmp_path, full_disk):
    """The front's own line on a full disk (logline.h, as append_line in Python): the bytes
    that fit are undone (a blank line), the create goes on, stderr says so in one line; the
    next create's line, once there is room, is whole, and `gpuhook log` has both whole ones."""
    root = str(tmp_path / "cpu")
    fakehost.build(root, "cpu", mknod=False)
    log = os.path.join(full_disk.path, "gpuhook.log")
    full_disk.pad(log, slack=30)
    full_disk.fill()
    before = os.path.getsize(log)
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c1", log_file=log)
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(log) == before + 30
    with open(log, "rb") as f:
        assert f.read()[before:] == b" " * 29 + b"\n"
    (said,) = r.stderr.splitlines()
    said_as = re.escape(logline.PREFIX + nodelog.CANNOT_WRITE_LOG % (log, nodelog.SHORT_WRITE % (30, 999)))
    assert re.fullmatch(said_as.replace("999", r"\d+"), said), said  # (the line's length: its timing's digits)
    full_disk.free()
    r, _ = front(tmp_path, root, "create", "--bundle", str(tmp_path), "c2", log_file=log)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert [(x["event"], x.get("container_id")) for x in log_records(log)] == [("pad", None), ("create", "c2")]


def test_the_bundle_front_runs_its_loader_directly(tmp_path):
    """In the host bundle layout the front execs libexec/ld.so with the interpreter: no
    bin/python3 sh script in between."""
    b = tmp_path / "bundle"
    (b / "bin").mkdir(parents=True)
    shutil.copy(FRONT, b / "bin" / "gpuhook-runtime")
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


def test_the_installed_node_config_is_read_by_the_front_alone(tmp_path):
    """The config `gpuhook install` writes (all defaults, commented) and one with every key
    set plainly: once Python has loaded it, the front acts on it alone (no Python for a
    pass-through)."""
    from gpuhook.install.core import NODE_CONFIG_TEXT

    cfg = tmp_path / "config.toml"
    mark = tmp_path / "python-ran"
    for text in (NODE_CONFIG_TEXT, 'runtime = "/bin/true"\nhost_root = "/"\nlog_file = ""\nfail_mode = "open"\n'
                 'probe_cache_ttl = 10\nshare = "all"\nnvidia_driver_root = "auto"\nldconfig = "/sbin/ldconfig"\n'):
        cfg.write_text(text)
        prime(str(cfg), str(tmp_path / "cache"))
        env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_TEST_MARK": str(mark),
               "GPUHOOK_PYTHON": fake_python(tmp_path), "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")}
        r = subprocess.run([FRONT, "--root", str(tmp_path / "st"), "state", "x"], env=env, capture_output=True,
                           timeout=20)
        assert not mark.exists(), (text, r.stderr)


# -- the node config: whatever the front decides of it, Python decides the same -------------

# lines of a node config: tomllib (config.parse) judges each file. Plain settings (each key
# at most once: a valid file), and lines that may make it invalid, or a key count twice, or not
# at the top level
SETTINGS = {
    "runtime": ['runtime = "@RT_A@"', "runtime = '@RT_B@'", 'runtime = "@DIR@/missing"', 'runtime = ""',
                'runtime = "rt-b"', 'runtime = "@RT_\\u0041@"'],
    "log_file": ['log_file = "@LOG_A@"', 'log_file = "@LOG_B@"'],
    "host_root": ['host_root = "@CPU@"', 'host_root = "@GPU@"'],
    "fail_mode": ['fail_mode = "closed"', 'fail_mode = "open"'],
    "others": ["x = 1", "zz = true", 'share = "all"', "probe_cache_ttl = 2.5", "x = 1 # c"],
    "comments": ['# runtime = "@RT_B@"', ""],
}
ODD_LINES = [
    "runtime = 5", '"runtime" = "@RT_B@"', 'runtime.x = "@RT_B@"', 'runtime = """@RT_B@"""', 'log_file = ""',
    'host_root = "relative"', "host_root = 1", 'fail_mode = "maybe"', "[table]", "[nvidia]", "[[x]]",
    "x = 1979-05-27", "x = 07:32:00", "x = 0x_1", "x = 1__0", "x = +inf", "x = nan", "y = [1,", 'y = """',
    "bad key = 1", "x.y = 1", "zz = True", "probe_cache_ttl = -1", "   ", "\t", "=", "x = 'a' 'b'",
]


@st.composite
def node_configs(draw) -> list[str]:
    """Plain settings in any order (a log_file one always: a valid file never logs in the
    node's own log), and now and then odd lines among them."""
    lines = [draw(st.sampled_from(SETTINGS["log_file"]))]
    for key, choices in SETTINGS.items():
        if key != "log_file" and draw(st.booleans()):
            lines.append(draw(st.sampled_from(choices)))
    lines = list(draw(st.permutations(lines)))
    for odd in draw(st.lists(st.sampled_from(ODD_LINES + SETTINGS["log_file"] + SETTINGS["runtime"]), max_size=2)):
        lines.insert(draw(st.integers(0, len(lines))), odd)
    return lines


def _config_text(lines: list[str], tmp) -> str:
    subst = {"@RT_A@": f"{tmp}/rt-a", "@RT_B@": f"{tmp}/bin/rt-b", "@RT_\\u0041@": f"{tmp}/rt-\\u0041",
             "@DIR@": str(tmp), "@LOG_A@": f"{tmp}/log-a", "@LOG_B@": f"{tmp}/log-b", "@CPU@": f"{tmp}/cpu",
             "@GPU@": f"{tmp}/gpu"}
    text = "\n".join(lines) + "\n"
    for k, v in subst.items():
        text = text.replace(k, v)
    return text


@pytest.fixture(scope="module")
def config_world(tmp_path_factory):
    """Runtimes that say which one ran, a CPU-only and a GPU host, a bundle."""
    tmp = tmp_path_factory.mktemp("world")
    (tmp / "bin").mkdir()
    for rt in ("rt-a", "rt-A", "bin/rt-b", "bin/runc"):
        p = tmp / rt
        p.write_text('#!/bin/sh\necho "$0" >> "$GPUHOOK_TEST_RAN"\n')
        p.chmod(0o755)
    fakehost.build(str(tmp / "cpu"), "cpu", mknod=False)
    fakehost.build(str(tmp / "gpu"), "nvidia", mknod=False)
    (tmp / "bundle").mkdir()
    (tmp / "bundle" / "config.json").write_text("{}")
    return tmp


@settings(max_examples=200, deadline=None)
@given(node_configs())
def test_the_front_decides_of_the_node_config_what_python_decides(config_world, tmp_path_factory, lines):
    """On generated node configs (valid or not), with tomllib as the judge: the front either
    leaves the call to Python or does what Python would, the runtime it runs, where the
    no-GPU line goes, whether a create may skip Python, the fail mode, before and after
    Python has left its front file."""
    tmp, here = config_world, tmp_path_factory.mktemp("cfg")
    cfg, cache, ran = here / "config.toml", here / "cache", here / "ran"
    text = _config_text(lines, tmp)
    cfg.write_text(text)
    judge, errors = config.parse(text)  # tomllib
    path = f"{tmp}/bin:/usr/bin:/bin"
    old_path = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        want_rt = config.find_runtime(judge.runtime)
    finally:
        os.environ["PATH"] = old_path

    def run(*args: str, python: str | None = None) -> tuple[subprocess.CompletedProcess, list[str], bool]:
        for f in (ran, here / "python-ran"):
            if f.exists():
                f.unlink()
        env = {"PATH": path, "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(cache), "GPUHOOK_TEST_RAN": str(ran),
               "GPUHOOK_TEST_MARK": str(here / "python-ran"), "GPUHOOK_PYTHON": python or fake_python(here)}
        r = subprocess.run([FRONT, "--root", str(here / "st"), *args], env=env, capture_output=True, timeout=20)
        return r, (ran.read_text().splitlines() if ran.exists() else []), (here / "python-ran").exists()

    def check_pass_through(must_decide: bool) -> None:
        r, rts, to_python = run("state", "c1")
        if want_rt is None:  # Python says why, in runc's --log too (test_faults.py)
            assert to_python and not rts and r.stderr == b"", (text, r)
            return
        if to_python:
            assert not must_decide, (text, "a current front file, and still Python")
            return
        assert rts == [want_rt], (text, rts, want_rt)

    check_pass_through(must_decide=False)  # no front file yet: Python's, or the defaults with no file
    prime(str(cfg), str(cache))
    check_pass_through(must_decide=True)
    gpu = judge.host_root == f"{tmp}/gpu"
    if judge.log_file == defaults.LOG_FILE and not errors and not gpu:
        return  # the front's no-GPU line would go to the node's own log (a valid file names one)
    for log_file in (tmp / "log-a", tmp / "log-b"):
        log_file.unlink(missing_ok=True)
    r, rts, to_python = run("create", "--bundle", str(tmp / "bundle"), "c1")
    if want_rt is None:
        assert to_python and not rts and r.stderr == b"", (text, r)
        return
    # a create may skip Python only where Python would find no GPU and has no error to log
    assert to_python == (gpu or bool(errors)), (text, to_python, errors)
    event(f"create: {'Python' if to_python else 'the front'}; config {'with' if errors else 'without'} errors; "
          f"fail_mode {judge.fail_mode}; runtime {os.path.basename(want_rt)}")
    if not to_python:
        assert rts == [want_rt]
        for log_file in (tmp / "log-a", tmp / "log-b"):
            assert log_file.exists() == (judge.log_file == str(log_file)), (text, judge.log_file)
    else:  # no Python at all: the runtime, unless the node says fail closed
        r, rts, _ = run("create", "--bundle", str(tmp / "bundle"), "c1", python=str(here / "no-python"))
        if judge.fail_mode == "closed":
            assert r.returncode == 1 and rts == [], (text, r)
        else:
            assert rts == [want_rt], (text, r)


@pytest.mark.parametrize("kind", ["another-owner", "group-writable", "link", "dir-of-another-owner",
                                  "dir-group-writable", "control"])
def test_a_front_file_not_gpuhooks_own_is_never_used(tmp_path, kind):
    """A front file naming another runtime, planted by a user who could write the cache dir:
    another owner's, writable by others, a link to one of root's, or in a directory that is
    not root's own: the front leaves the call to Python. Control: gpuhook's own is used."""
    cfg, cache, mark = tmp_path / "config.toml", tmp_path / "cache", tmp_path / "python-ran"
    evil, ran = tmp_path / "evil", tmp_path / "evil-ran"
    evil.write_text(f"#!/bin/sh\necho ran > {ran}\n")
    evil.chmod(0o755)
    cfg.write_text('log_file = ""\n')
    prime(str(cfg), str(cache))
    front_file = tmp_path / "cache" / f"config-{str(cfg).replace('/', '%2F')}.front"
    planted = front_file.read_bytes().replace(b"runtime=\0", f"runtime={evil}\0".encode())
    assert planted != front_file.read_bytes()
    target = front_file
    if kind == "link":
        target = tmp_path / "elsewhere.front"
        front_file.unlink()
        front_file.symlink_to(target)
    target.write_bytes(planted)
    target.chmod(0o600)
    if kind == "another-owner":
        os.chown(target, 65534, 65534)
    elif kind == "group-writable":
        target.chmod(0o620)
    elif kind == "dir-of-another-owner":
        os.chown(cache, 65534, 65534)
    elif kind == "dir-group-writable":
        cache.chmod(0o770)
    env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(cache),
           "GPUHOOK_TEST_MARK": str(mark), "GPUHOOK_PYTHON": fake_python(tmp_path)}
    subprocess.run([FRONT, "state", "x"], env=env, capture_output=True, timeout=20)
    assert ran.exists() == (kind == "control") and mark.exists() == (kind != "control"), kind


def test_a_changed_config_is_pythons_until_python_has_read_it(tmp_path):
    """The front file names the config file as it was (dev, inode, size, mtime, ctime): an
    edit in place, of the same size, or a new file renamed over it, and the front leaves
    every call to Python until a Python run has decided again."""
    cfg, cache, mark = tmp_path / "config.toml", tmp_path / "cache", tmp_path / "python-ran"
    env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_CACHE_DIR": str(cache),
           "GPUHOOK_TEST_MARK": str(mark), "GPUHOOK_PYTHON": fake_python(tmp_path)}
    cfg.write_text('runtime = "/bin/true"\n')
    prime(str(cfg), str(cache))
    for change in ("in-place", "renamed"):
        r = subprocess.run([FRONT, "state", "x"], env=env, capture_output=True, timeout=20)
        assert r.returncode == 0 and not mark.exists(), r
        if change == "in-place":
            with open(cfg, "r+") as f:
                f.write('runtime = "/bin/echo"\n')  # the same size
        else:
            (tmp_path / "new.toml").write_text('runtime = "/bin/true"\n')
            os.rename(tmp_path / "new.toml", cfg)
        subprocess.run([FRONT, "state", "x"], env=env, capture_output=True, timeout=20)
        assert mark.exists(), change
        mark.unlink()
        prime(str(cfg), str(cache))
        if change == "in-place":
            r = subprocess.run([FRONT, "state", "x"], env=env, capture_output=True, timeout=20)
            assert r.returncode == 0 and r.stdout == b"state x\n" and not mark.exists(), r  # the edited file's runtime
            cfg.write_text('runtime = "/bin/true"\n')
            prime(str(cfg), str(cache))
