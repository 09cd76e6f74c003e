"""gpuhook-runtime's command line, against every form containerd's shim and CRI-O use,
the runtime the front and Python pick from the node config (tomllib's reading), and a
runtime that is the wrapper itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhook import config as cfg
from gpuhook.runtime.args import parse_args

FRONT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gpuhook", "runtime", "gpuhook-runtime")


@pytest.mark.parametrize("argv, command, bundle, cid", [
    # containerd's io.containerd.runc.v2 shim
    (["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json",
      "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "abc"], "create", "/b", "abc"),
    (["--root", "/r", "--log", "/b/log.json", "--log-format", "json", "--systemd-cgroup",
      "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "--console-socket", "/tmp/s", "abc"], "create", "/b", "abc"),
    (["create", "--bundle=/b", "abc"], "create", "/b", "abc"),
    (["create", "-b", "/b", "abc"], "create", "/b", "abc"),
    (["create", "-b=/b", "abc"], "create", "/b", "abc"),
    (["create", "abc", "--bundle", "/b"], "create", "/b", "abc"),
    (["--root=/r", "--log=/l", "create", "--no-pivot", "--bundle", "/b", "abc"], "create", "/b", "abc"),
    (["-root", "/r", "run", "-d", "--bundle", "/b", "abc"], "run", "/b", "abc"),
    # a flag value that looks like a subcommand is a value
    (["--root", "create", "create", "--bundle", "/b", "x"], "create", "/b", "x"),
    (["--log", "create", "state", "x"], "state", None, None),
    (["--root", "/r", "create", "--pid-file", "--bundle", "x"], "create", None, "x"),
    # the rest pass straight through
    (["--root", "/r", "start", "abc"], "start", None, None),
    (["--root", "/r", "state", "abc"], "state", None, None),
    (["--root", "/r", "kill", "abc", "9"], "kill", None, None),
    (["--root", "/r", "delete", "--force", "abc"], "delete", None, None),
    (["--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "abc"], "exec", None, None),
    (["--root", "/r", "update", "--resources", "-", "abc"], "update", None, None),
    (["features"], "features", None, None),
    (["--version"], None, None, None),
    ([], None, None, None),
])
def test_parse_args(argv, command, bundle, cid, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inv = parse_args(argv)
    assert inv.command == command
    if command in ("create", "run"):
        assert inv.bundle == (bundle or str(tmp_path))
        assert inv.container_id == cid
    else:
        assert inv.bundle is None


def test_relative_bundle_and_log_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inv = parse_args(["--log", "/x/log.json", "--log-format", "json", "create", "-b", "rel", "id"])
    assert inv.bundle == str(tmp_path / "rel")
    assert (inv.log, inv.log_format) == ("/x/log.json", "json")


def test_the_callers_directory_is_the_one_given(tmp_path, monkeypatch):
    """The runtime server's way: the caller's directory passed in, whatever this process's is;
    of repeated flags the last counts, whichever spelling (-b, --bundle; -d, --detach=...)."""
    monkeypatch.chdir(tmp_path)
    assert parse_args(["create", "id"], "/caller").bundle == "/caller"
    assert parse_args(["create", "--bundle", "rel", "id"], "/caller").bundle == "/caller/rel"
    assert parse_args(["create", "-b", "/abs", "id"], "/caller").bundle == "/abs"
    inv = parse_args(["create", "-b", "x", "--bundle", "y", "-b=z", "id"], "/c")
    assert (inv.bundle, inv.container_id) == ("/c/z", "id")
    assert parse_args(["run", "-d", "--detach=false", "id"], "/c").detach is False
    assert parse_args(["run", "--detach=false", "-d", "id"], "/c").detach is True
    assert parse_args(["run", "--detach=T", "id"], "/c").detach is True
    inv = parse_args(["--root", "r", "exec", "-p", "a.json", "--process", "b.json", "id", "-p", "c"], "/c")
    assert (inv.root, inv.process, inv.container_id, inv.exec_at) == ("r", "b.json", "id", 2)


@given(st.lists(st.text(min_size=0, max_size=12), max_size=10))
def test_parse_args_never_raises(argv):
    """Any argv parses; what it finds are words of argv (exec's where it stands)."""
    inv = parse_args(argv)
    assert inv.command is None or inv.command in argv, (argv, inv.command)
    assert inv.exec_at is None or argv[inv.exec_at] == inv.command == "exec", (argv, inv.exec_at)
    assert inv.container_id is None or inv.container_id in argv, (argv, inv.container_id)


# -- the front and Python agree on the node config ------------------------------------

def sh_view(config_path: str, path_env: str) -> str:
    """What the front decides: it prints the runtime it would exec (through a fake
    runtime that echoes) for a pass-through call."""
    r = subprocess.run([FRONT, "state", "x"], capture_output=True, text=True,
                       env={"PATH": path_env, "GPUHOOK_CONFIG": config_path, "GPUHOOK_PYTHON": sys.executable,
                            "GPUHOOK_CACHE_DIR": os.path.join(os.path.dirname(config_path), "cache")})
    return r.stdout.strip() if r.returncode == 0 else f"error {r.returncode}"


@pytest.fixture
def fake_runtimes(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("runc", "crun", "my runtime"):
        p = bindir / name
        p.write_text(f"#!/bin/sh\necho {name.replace(' ', '_')}\n")
        p.chmod(0o755)
    return bindir


CONFIGS = [
    "",
    'runtime = "crun"\n',
    "runtime = 'crun'\n",
    '  runtime   =   "crun"   # the fast one\n',
    '# runtime = "crun"\n',
    '[section]\nruntime = "crun"\n',
    'runtime = "runc"\nhost_root = "/"\n',
    'log_file = ""\nruntime = "crun"\n',
    'runtime = "{bin}/crun"\n',
    'runtime = "{bin}/my runtime"\n',
    '"runtime" = "crun"\n',            # quoted key: the front hands over to Python
    'runtime = "cr\\u0075n"\n',         # escape: idem
    'runtime = """crun"""\n',          # multi-line string: idem
    'runtime = ""\n',                  # empty: unset, runc
    'x = ["""\nruntime = "crun"\na=1 """]\n',  # a "key line" inside another key's multi-line string
    "x = ['''\n[fake]\na=1 ''']\nruntime = \"crun\"\n",  # a "table" inside one
    'foo = bar\nruntime = "crun"\n',    # invalid TOML elsewhere: all defaults
    'x = [1, 2]\nruntime = "crun"\n',   # an array: Python reads it
    '# café\nruntime = "crun"\n',       # non-ASCII in a comment: Python reads it
    b'# caf\xe9\nruntime = "crun"\n',  # not UTF-8: defaults
    'runtime = "crun" # \x01\n',       # a control character: invalid TOML
    'runtime = "crun"\r\n',            # CRLF
    'n = 10\nflag = true\nwhen = 1979-05-27T07:32:00Z\nruntime = "crun"\n',  # plain values the front reads past
]


@pytest.mark.parametrize("text", CONFIGS)
def test_sh_front_and_tomllib_pick_the_same_runtime(text, tmp_path, fake_runtimes):
    path = tmp_path / "config.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text.replace("{bin}", str(fake_runtimes)))
    config, _ = cfg.load(str(path))
    old = os.environ.get("PATH")
    os.environ["PATH"] = str(fake_runtimes)
    try:
        want = cfg.find_runtime(config.runtime)
    finally:
        os.environ["PATH"] = old
    got = sh_view(str(path), str(fake_runtimes))
    if got.startswith("error"):
        # the front could not read it for sure: it must then not have picked anything else
        pytest.fail(f"front failed on {text!r}: {got}")
    assert got == os.path.basename(want).replace(" ", "_"), (text, got, want)


@pytest.mark.parametrize("log_format", ["json", "text"])
@pytest.mark.parametrize("command", [["state", "x"], ["create", "--bundle", "/nonexistent/b", "x"]])
def test_sh_front_missing_runtime_is_one_clear_line_and_runcs_log_says_it(tmp_path, command, log_format):
    """The front knows the config (its front file is current) and finds no runtime: one line on
    stderr, exit 127, and the same error in the caller's --log as runc writes its own (the
    containerd shim reports what it finds there), relative to the caller's directory."""
    path = tmp_path / "config.toml"
    path.write_text('runtime = "/nonexistent/runc"\nlog_file = ""\n')
    from fakes.front import prime

    prime(str(path), str(tmp_path / "cache"))
    r = subprocess.run([FRONT, "--log", "log.json", "--log-format", log_format, *command], capture_output=True,
                       text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(path),
                                                     "GPUHOOK_CACHE_DIR": str(tmp_path / "cache"),
                                                     "GPUHOOK_PYTHON": sys.executable})
    assert r.returncode == 127
    assert r.stderr.count("\n") == 1 and "no real OCI runtime" in r.stderr, r.stderr
    (line,) = (tmp_path / "log.json").read_text().splitlines()
    said = r.stderr.rstrip("\n")
    if log_format == "json":
        rec = json.loads(line)
        assert (rec["level"], rec["msg"]) == ("error", said) and set(rec) == {"level", "msg", "time"}
    else:
        assert line == said


def test_python_missing_runtime_is_one_clear_line(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('runtime = "/nonexistent/runc"\n')
    r = subprocess.run([sys.executable, "-m", "gpuhook.runtime", "create", "--bundle", str(tmp_path), "x"],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(path),
                                                             "PYTHONPATH": os.path.dirname(os.path.dirname(FRONT))})
    assert r.returncode == 127
    assert "Traceback" not in r.stderr and "no real OCI runtime" in r.stderr


@pytest.mark.parametrize("how", ["link-first-on-path", "copy-first-on-path", "link-in-config", "copy-in-config"])
def test_a_runtime_that_is_the_front_itself_is_one_clear_line(tmp_path, how):
    """A `runc` that is the wrapper (a link to it, or a copy), first on PATH or named in the
    config: refused with one line, by the front (with and without its front file: then Python
    refuses it) and by Python itself; never a front that execs itself for ever."""
    from fakes.front import prime

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "runc"
    if how.startswith("link"):
        fake.symlink_to(FRONT)
    else:
        fake.write_bytes(open(FRONT, "rb").read())
        fake.chmod(0o755)
    path = tmp_path / "config.toml"
    path.write_text(f'runtime = "{fake}"\n' if how.endswith("in-config") else 'log_file = ""\n')
    cache = str(tmp_path / "cache")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "GPUHOOK_CONFIG": str(path), "GPUHOOK_CACHE_DIR": cache,
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(FRONT))), "GPUHOOK_PYTHON": sys.executable}
    py = [sys.executable, "-m", "gpuhook.runtime", "state", "x"]
    for primed, argv in ((False, py), (True, [FRONT, "state", "x"])):
        if primed:
            prime(str(path), cache)
        try:
            r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv[0]} ran itself for ever through {fake}")
        assert r.returncode == 127, (argv, r)
        assert r.stderr == f"gpuhook-runtime: the real OCI runtime {fake} is gpuhook-runtime itself (set `runtime` in {path})\n"


def test_a_deeply_nested_node_config_means_defaults_not_a_traceback(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("x = 1\ny = " + "[" * 3000 + "]" * 3000 + "\n")
    config, errors = cfg.load(str(path))
    assert config == cfg.Config() and errors and "invalid TOML" in errors[0]


def test_relative_host_root_goes_to_python_which_refuses_it(tmp_path, fake_runtimes):
    """The front must not look for GPUs relative to the bundle: Python says why instead."""
    path = tmp_path / "config.toml"
    path.write_text(f'host_root = "relative/dir"\nlog_file = "{tmp_path}/log"\nruntime = "{fake_runtimes}/runc"\n')
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text("{}")
    r = subprocess.run([FRONT, "create", "--bundle", str(bundle), "x"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(path), "GPUHOOK_PYTHON": sys.executable,
                            "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0 and r.stdout.strip() == "runc", r.stderr
    import json

    (line,) = (tmp_path / "log").read_text().splitlines()
    assert "host_root" in json.dumps(json.loads(line).get("warnings"))


def test_python_never_imports_from_the_bundle_directory(tmp_path, fake_runtimes, make_host):
    """gpuhook-runtime runs as root with the bundle as its current directory."""
    host = make_host("nvidia", mknod=False, gpus=1, libs=False)
    path = tmp_path / "config.toml"
    path.write_text(f'host_root = "{host}"\nlog_file = ""\nruntime = "{fake_runtimes}/runc"\n')
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": "rootfs"}}')
    for name in ("_json.py", "os.py", "gpuhook.py", "fastjson.py"):
        (bundle / name).write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('{name}')\n")
    wrapper = os.path.join(os.path.dirname(sys.executable), "gpuhook-runtime")
    if not os.path.exists(wrapper):
        pytest.skip("no installed gpuhook-runtime (make test installs it)")
    r = subprocess.run([wrapper, "create", "--bundle", str(bundle), "x"], cwd=bundle, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(path), "GPUHOOK_CACHE_DIR": str(tmp_path / "c"),
                            "PYTHONPATH": str(bundle)})
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "PWNED").exists()
    assert "/dev/nvidia0" in (bundle / "config.json").read_text()  # and it did its work
