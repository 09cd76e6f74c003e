"""exec sees the env gpuhook added at create (gpuhook/runtime/exec.py, the front's exec path).

Against a fake runtime that shows what it was given (argv, the --process file as it read it),
then real runc: a process exec'd the way containerd's shim does it sees GPUHOOK_*.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import needs_runc, wrapper_path
from gpuhook.runtime import exec as execenv
from fakes.front import prime
from gpuhook.runtime.args import EXEC_VALUE_FLAGS, parse_args

FRONT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gpuhook", "runtime", "gpuhook-runtime")
ENV = ["GPUHOOK_ACCELERATOR=nvidia", "GPUHOOK_DEVICES=nvidia:GPU-1,nvidia:GPU-2"]
PROCESS = {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["sh", "-c", "env"],
           "env": ["PATH=/bin", "GPUHOOK_ACCELERATOR=cpu"], "cwd": "/"}

FAKE_RUNTIME = r"""#!/bin/sh
out=@OUT@
printf '%s\n' "$@" > "$out/argv"
root= p= prev= last=
for a; do
    case $prev in --root | -root) root=$a ;; --process | -p) p=$a ;; esac
    case $a in --root=*) root=${a#*=} ;; --process=* | -p=*) p=${a#*=} ;; esac
    prev=$a last=$a
done
[ -f "$p" ] && cat "$p" > "$out/process" 2>/dev/null
case " $* " in
    *" delete "*) [ -e "$out/fail" ] && exit 3; rm -rf "${root:-/run/runc}/$last" ;;
esac
exit 0
"""


@pytest.mark.parametrize("argv, cid, process, root", [
    # containerd's runc shim (go-runc): globals, then exec's flags, then the id
    (["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format", "json",
      "exec", "--process", "/tmp/runc-process1", "--detach", "--pid-file", "/b/x.pid", "abc"],
     "abc", "/tmp/runc-process1", "/run/containerd/runc/k8s.io"),
    (["--root=/r", "--systemd-cgroup", "exec", "--console-socket", "/s", "-p", "/p", "-d", "abc"], "abc", "/p", "/r"),
    (["exec", "--process=/p", "--tty", "abc"], "abc", "/p", None),
    (["--root", "/r", "exec", "-e", "A=B", "--cwd", "/x", "-u", "1:1", "--cap", "CAP_X", "abc", "sh", "-p", "/no"],
     "abc", None, "/r"),
    (["--root", "/r", "delete", "--force", "abc"], "abc", None, "/r"),
])
def test_parse_exec_and_delete(argv, cid, process, root):
    inv = parse_args(argv)
    assert (inv.container_id, inv.process, inv.root) == (cid, process, root)
    if inv.command == "exec":
        assert argv[inv.exec_at] == "exec"


def test_record_keys_by_runtime_root():
    a = execenv.record_path("/c", "/run/containerd/runc/k8s.io", "x", "/usr/sbin/runc")
    b = execenv.record_path("/c", "/run/containerd/runc/moby", "x", "/usr/sbin/runc")
    assert a == "/c/exec/%2Frun%2Fcontainerd%2Frunc%2Fk8s.io/x" and a != b
    assert execenv.record_path("/c", None, "x", "/usr/sbin/runc") == "/c/exec/%2Frun%2Frunc/x"
    assert execenv.record_path("/c", None, "x", "/usr/bin/crun") == "/c/exec/%2Frun%2Fcrun/x"
    for root in ("/r/../s", "/r/./s", "/r//s", "/r/", "/", "/r%2Fs"):
        assert execenv.record_path("/c", root, "x", "runc") is None, root
    for cid in ("", ".", "..", "a/b", "a b", "a\nb"):
        assert execenv.record_path("/c", "/r", cid, "runc") is None, cid


@needs_runc
def test_the_record_key_takes_the_ids_runc_takes(tmp_path):
    """Every printable ASCII character in an id, and ".", "..", "-": an exec record is keyed by
    exactly the ids the real runc accepts (`runc state` of a missing container says "does not
    exist" for an id it accepts, "invalid container ID format" for one it refuses)."""
    ids = [f"a{chr(c)}b" for c in range(0x20, 0x7F)] + [".", "..", "-", "a", "a\u00e9b"]
    for cid in ids:
        r = subprocess.run(["runc", "--root", str(tmp_path / "state"), "state", cid], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode != 0 and ("does not exist" in r.stderr or "invalid container ID" in r.stderr), r.stderr
        runc_takes = "does not exist" in r.stderr
        keyed = execenv.record_path(str(tmp_path / "cache"), "/run/r", cid, "runc") is not None
        assert keyed == runc_takes, (cid, r.stderr)


@pytest.mark.parametrize("argv, detach", [
    (["run", "--bundle", "/b", "c1"], False),
    (["run", "-d", "--bundle", "/b", "c1"], True),
    (["run", "--detach", "c1"], True),
    (["run", "-detach=true", "c1"], True),
    (["run", "--detach=false", "c1"], False),
    (["run", "--detach=1", "c1"], True),
    (["--root", "/r", "run", "c1", "-d"], True),
    (["create", "-d", "c1"], False),  # only run's: create always detaches
])
def test_parse_run_detach(argv, detach):
    assert parse_args(argv).detach is detach


@pytest.mark.parametrize("change", ["no-state", "another-bundle", "config-rewritten", "recreated"])
def test_a_record_is_used_only_for_the_instance_it_was_made_for(front, tmp_path, change):
    """The same id and root, but not the container gpuhook injected: gone (no state), made
    from another bundle, from a config.json rewritten since (another create, without gpuhook),
    or created again after the record was first used (runc's `created`). The exec gets no
    env, the record goes, one log line says why."""
    root = front.root("r")
    rec = front.record(root, "c1")
    bundle = json.loads(open(os.path.join(root, "c1", "state.json")).read())["config"]["labels"][0][len("bundle="):]
    p = front.process_file()
    assert front.run("--root", root, "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == ["PATH=/bin", "GPUHOOK_ACCELERATOR=nvidia", ENV[1]]  # the instance it was made for
    state = os.path.join(root, "c1", "state.json")
    if change == "no-state":
        shutil.rmtree(os.path.join(root, "c1"))
    elif change == "another-bundle":
        other = tmp_path / "other-bundle"
        other.mkdir()
        (other / "config.json").write_text("{}")
        with open(state, "w") as f:
            json.dump({"created": "2026-12-01T19:00:00Z", "config": {"labels": [f"bundle={other}"]}}, f)
    elif change == "config-rewritten":
        tmp = os.path.join(bundle, "config.json.new")
        with open(tmp, "w") as f:
            f.write("{}")
        os.rename(tmp, os.path.join(bundle, "config.json"))
    else:
        with open(state, "w") as f:
            json.dump({"created": "2026-12-01T19:00:00Z", "config": {"labels": [f"bundle={bundle}"]}}, f)
    p = front.process_file()
    assert front.run("--root", root, "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == PROCESS["env"]
    assert not os.path.exists(rec)
    (line,) = front.log_lines()
    assert line["event"] == "exec" and "earlier container c1" in line["error"], line


def test_the_instance_is_what_runc_or_crun_wrote(tmp_path):
    """runc's state.json (its bundle label, created) and crun's status (bundle, created, as
    crun 1.x writes it); none at all: no such container; a state gpuhook cannot read: an error."""
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "state.json").write_text(json.dumps({"id": "a", "created": "2026-12-01T18:28:07.710911314Z",
                                                       "config": {"labels": ["x=y", "bundle=/b/a"]}}))
    (root / "b").mkdir()
    (root / "b" / "status").write_text(json.dumps({"pid": 7, "process-start-time": 263473330, "bundle": "/b/b",
                                                   "created": "2021-08-29T14:34:52.000293421Z", "owner": "root"}))
    (root / "c").mkdir()
    (root / "c" / "state.json").write_text("{not json")
    (root / "d").mkdir()
    assert execenv.instance_of(str(root), "a", "runc") == {"bundle": "/b/a", "created": "2026-12-01T18:28:07.710911314Z"}
    assert execenv.instance_of(str(root), "b", "crun") == {"bundle": "/b/b", "created": "2021-08-29T14:34:52.000293421Z"}
    assert execenv.instance_of(str(root), "none", "runc") is None
    for cid in ("c", "d"):
        with pytest.raises(ValueError):
            execenv.instance_of(str(root), cid, "runc")


def test_set_env_replaces_and_appends():
    env = ["PATH=/bin", "GPUHOOK_ACCELERATOR=cpu"]
    assert execenv.set_env(env, ENV)
    assert env == ["PATH=/bin", "GPUHOOK_ACCELERATOR=nvidia", ENV[1]]
    assert not execenv.set_env(env, ENV)


# -- the front and Python, with a fake runtime ------------------------------------------

class Front:
    """gpuhook-runtime's front (this checkout's), a fake runtime, a cache dir, a log."""

    def __init__(self, tmp_path, config_extra: str = "", primed: bool = True):
        self.tmp = tmp_path
        self.out = tmp_path / "out"
        self.out.mkdir()
        bindir = tmp_path / "bin"
        bindir.mkdir()
        # its default root is /run/<its name>: a name of this run's own
        self.runtime = str(bindir / f"runc-gpuhook-test-{os.getpid()}")
        with open(self.runtime, "w") as f:
            f.write(FAKE_RUNTIME.replace("@OUT@", str(self.out)))
        os.chmod(self.runtime, 0o755)
        self.cache = str(tmp_path / "cache")
        self.log = tmp_path / "gpuhook.log"
        self.config = tmp_path / "config.toml"
        host = tmp_path / "cpu-host"
        host.mkdir()
        self.config.write_text(config_extra + f'runtime = "{self.runtime}"\nhost_root = "{host}"\n'
                               f'log_file = "{self.log}"\n')
        if primed:  # as an earlier Python run leaves it: the front decides alone
            prime(str(self.config), self.cache)
        # the Python the front starts leaves a mark: a container gpuhook did not inject never starts it
        self.python = str(bindir / "python-marked")
        with open(self.python, "w") as f:
            f.write(f'#!/bin/sh\necho started >> {tmp_path / "python-started"}\nexec {sys.executable} "$@"\n')
        os.chmod(self.python, 0o755)

    def python_started(self) -> int:
        p = self.tmp / "python-started"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def root(self, name: str) -> str:
        """A runtime root of this test's own."""
        return str(self.tmp / "roots" / name)

    def record(self, root, cid, env=ENV, instance: bool = True) -> str:
        """The record of a container gpuhook injected: its bundle, and (instance) the state the
        runtime wrote of it, as runc does (state.json: the bundle label, its creation time)."""
        path = execenv.record_path(self.cache, root, cid, self.runtime)
        bundle = self.tmp / "bundles" / path.replace("/", "_")
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text("{}")
        if instance:
            state = os.path.join(execenv.runtime_root(root, self.runtime), cid)
            os.makedirs(state, exist_ok=True)
            with open(os.path.join(state, "state.json"), "w") as f:
                json.dump({"id": cid, "created": "2026-12-01T18:28:07.710911314Z",
                           "config": {"labels": [f"bundle={bundle}"]}}, f)
        execenv.write_record(path, env, str(bundle), execenv.config_identity(str(bundle)))
        return path

    def close(self) -> None:
        shutil.rmtree(execenv.runtime_root(None, self.runtime), ignore_errors=True)  # /run/<its name>

    def process_file(self, name="runc-process1", process=PROCESS) -> str:
        p = self.tmp / name
        p.write_text(json.dumps(process))
        p.chmod(0o600)
        return str(p)

    def run(self, *argv, cwd=None) -> subprocess.CompletedProcess:
        for f in ("argv", "process"):
            if (self.out / f).exists():
                (self.out / f).unlink()
        return subprocess.run([FRONT, *argv], capture_output=True, text=True, cwd=cwd, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(self.config),
                                   "GPUHOOK_CACHE_DIR": self.cache, "GPUHOOK_PYTHON": self.python})

    def seen_argv(self) -> list[str]:
        return (self.out / "argv").read_text().splitlines()

    def seen_env(self) -> list[str]:
        return json.loads((self.out / "process").read_text())["env"]

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def front(tmp_path):
    f = Front(tmp_path)
    yield f
    f.close()


@pytest.mark.parametrize("form", ["shim", "equals", "relative-root", "no-root"])
def test_exec_of_an_injected_container_gets_the_recorded_env(front, form, tmp_path):
    p = front.process_file()
    cwd = None
    if form == "shim":
        front.record(front.root("run/containerd/runc/k8s.io"), "c1")
        argv = ["--root", front.root("run/containerd/runc/k8s.io"), "--log", str(tmp_path / "l.json"), "--log-format", "json",
                "exec", "--process", p, "--detach", "--pid-file", str(tmp_path / "x.pid"), "c1"]
    elif form == "equals":
        front.record(front.root("r/ns"), "c1")
        argv = ["--systemd-cgroup", f"--root={front.root('r/ns')}", "exec", "--console-socket", "/s", f"--process={p}", "c1"]
    elif form == "relative-root":
        (tmp_path / "state").mkdir()
        cwd = str(tmp_path)
        front.record(str(tmp_path / "state"), "c1")
        argv = ["--root", "state", "exec", "-p", p, "c1"]
    else:
        front.record(None, "c1")  # the runtime's default root, /run/<its name>
        argv = ["exec", "-p", p, "-d", "c1"]
    r = front.run(*argv, cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert front.seen_argv() == argv
    assert front.seen_env() == ["PATH=/bin", "GPUHOOK_ACCELERATOR=nvidia", ENV[1]]
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert front.python_started() == 1 and front.log_lines() == []


@pytest.mark.parametrize("flag", sorted(EXEC_VALUE_FLAGS))
def test_sh_front_and_python_agree_on_the_container_id(front, flag):
    """Every exec flag that takes a value, with a value that looks like a container id: the
    front finds the record of the real id (it starts Python), as parse_args does."""
    front.record(front.root("r"), "c1")
    dash = "-" if len(flag) == 1 else "--"
    r = front.root("r")
    for argv in (["--root", r, "exec", f"{dash}{flag}", "decoy", "c1", "true"],
                 ["--root", r, "exec", f"-{flag}", "decoy", "c1", "true"],
                 ["--root", r, "exec", f"--{flag}=decoy", "c1", "true"]):
        assert parse_args(argv).container_id == "c1"
        started = front.python_started()
        assert front.run(*argv).returncode == 0
        assert front.python_started() == started + 1, argv


def test_exec_when_only_python_can_read_the_node_config(tmp_path):
    front = Front(tmp_path, primed=False)  # no front file yet: the front hands everything to Python
    front.record(front.root("r"), "c1")
    p = front.process_file()
    assert front.run("--root", front.root("r"), "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == ["PATH=/bin", "GPUHOOK_ACCELERATOR=nvidia", ENV[1]]
    p = front.process_file()
    assert front.run("--root", front.root("r"), "exec", "-p", p, "c2").returncode == 0
    assert front.seen_env() == PROCESS["env"]


def test_exec_without_process_file_gets_env_flags(front):
    front.record(front.root("r"), "c1")
    r = front.run("--root", front.root("r"), "exec", "-t", "c1", "sh", "-c", "env")
    assert r.returncode == 0, r.stderr
    assert front.seen_argv() == ["--root", front.root("r"), "exec", "--env", ENV[0], "--env", ENV[1], "-t", "c1", "sh", "-c", "env"]


@pytest.mark.parametrize("root, cid", [("r/other-namespace", "c1"), ("r/ns", "c2"), (None, "c1")])
def test_exec_of_a_container_gpuhook_did_not_inject_is_a_file_check(front, root, cid):
    """The same id under another runtime root (another containerd namespace) is another
    container: no env, and no Python started at all."""
    front.record(front.root("r/ns"), "c1")
    p = front.process_file()
    argv = (["--root", front.root(root)] if root else []) + ["exec", "--process", p, cid]
    r = front.run(*argv)
    assert r.returncode == 0, r.stderr
    assert front.seen_argv() == argv and front.seen_env() == PROCESS["env"]
    assert front.python_started() == 0


def _bad(kind: str, tmp_path) -> tuple[str, bytes | None]:
    """A --process path that must be left alone, and the bytes it must keep."""
    p = tmp_path / "runc-process-bad"
    good = json.dumps(PROCESS).encode()
    if kind == "symlink":
        (tmp_path / "target.json").write_bytes(good)
        p.symlink_to(tmp_path / "target.json")
        return str(p), good
    if kind == "hardlink":
        p.write_bytes(good)
        os.link(p, tmp_path / "other-name")
        return str(p), good
    if kind == "fifo":
        os.mkfifo(p)
        return str(p), None
    if kind == "directory":
        p.mkdir()
        return str(p), None
    if kind == "missing":
        return str(p), None
    data = {"huge": b'{"env": ["A=' + b"x" * (5 << 20) + b'"]}',
            "not-json": b'{"env": [',
            "not-an-object": b'["env"]',
            "duplicate-keys": b'{"env": [], "env": ["A=b"]}',
            "env-not-a-list": b'{"env": "A=b"}',
            "env-not-strings": b'{"env": ["A=b", 7]}',
            "deep": b"[" * 100000 + b"]" * 100000}[kind]
    p.write_bytes(data)
    p.chmod(0o600)
    return str(p), data


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "directory", "missing", "huge", "not-json",
                                  "not-an-object", "duplicate-keys", "env-not-a-list", "env-not-strings", "deep"])
def test_an_odd_process_file_is_left_alone_and_the_exec_goes_on(front, kind, tmp_path):
    front.record(front.root("r"), "c1")
    path, before = _bad(kind, tmp_path)
    argv = ["--root", front.root("r"), "exec", "--process", path, "-d", "c1"]
    r = front.run(*argv)
    assert r.returncode == 0, r.stderr
    assert front.seen_argv() == argv and "Traceback" not in r.stderr
    if before is not None:
        assert open(path, "rb").read() == before
    if kind == "symlink":
        assert os.path.islink(path)
    (line,) = front.log_lines()
    assert line["event"] == "exec" and line["container_id"] == "c1" and line["decision"] == "unchanged"
    assert path in line["error"], line


def test_a_record_not_written_by_gpuhook_is_not_trusted(front):
    path = front.record(front.root("r"), "c1")
    os.chmod(path, 0o666)
    p = front.process_file()
    assert front.run("--root", front.root("r"), "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == PROCESS["env"]


def test_every_record_level_is_made_0700_whatever_the_umask(tmp_path):
    """A cache dir that was there already (0755) and a umask of 000: exec/ and the root's
    directory are 0700 all the same, the record 0600."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    rec = execenv.record_path(str(cache), "/r/ns", "c1", "runc")
    old = os.umask(0)
    try:
        execenv.write_record(rec, ENV, "/bundle")
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (cache / "exec", os.path.dirname(rec), rec)}
    assert list(modes.values()) == [0o700, 0o700, 0o600], modes
    assert execenv.read_record(rec) == ENV


@pytest.mark.parametrize("level", ["exec", "root"])
@pytest.mark.parametrize("kind", ["link", "group-writable", "another-owner"])
def test_a_record_level_that_is_not_gpuhooks_is_never_used(front, tmp_path, level, kind):
    """A level of the record's directories planted as a link to another root's (a user who
    could write the level above), writable by others, or another user's: nothing is read,
    written or removed through it, by Python or by the front; the other root's record stays."""
    victim = front.record(front.root("r/victim"), "c1")
    rec = execenv.record_path(front.cache, front.root("r/ns"), "c1", front.runtime)
    planted = os.path.dirname(rec) if level == "root" else os.path.dirname(os.path.dirname(rec))
    if level == "exec":  # the whole exec/ is another directory, holding a record for /r/ns
        other = tmp_path / "elsewhere"
        os.rename(os.path.dirname(os.path.dirname(victim)), other)
        os.rename(other / os.path.basename(os.path.dirname(victim)), other / os.path.basename(os.path.dirname(rec)))
        victim = str(other / os.path.basename(os.path.dirname(rec)) / "c1")
        target = str(other)
    else:
        target = os.path.dirname(victim)
    if kind == "link":
        os.symlink(target, planted)
    else:
        os.rename(target, planted)
        victim = rec
        if kind == "group-writable":
            os.chmod(planted, 0o770)
        else:
            os.chown(planted, 65534, 65534)
    before = open(victim, "rb").read()
    p = front.process_file()
    assert front.run("--root", front.root("r/ns"), "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == PROCESS["env"] and front.python_started() == 0
    assert execenv.read_record(rec) is None and not execenv.record_exists(rec)
    execenv.remove_record(rec)
    assert front.run("--root", front.root("r/ns"), "delete", "c1").returncode == 0
    with pytest.raises(OSError):
        execenv.write_record(rec, ["GPUHOOK_ACCELERATOR=other"], "/b")
    assert open(victim, "rb").read() == before, "written or removed through a level that is not gpuhook's"


@pytest.mark.parametrize("slow", [False, True], ids=["front", "python"])
def test_delete_is_the_runtimes_alone(tmp_path, slow):
    """`delete` of an injected container: the runtime, with its argv and its status, and no
    Python from the front; the record is left to a later create's sweep (test_record_sweep.py).
    With no front file yet the front hands the call to Python, which does the same."""
    front = Front(tmp_path, primed=not slow)
    state = tmp_path / "state"
    (state / "c1").mkdir(parents=True)
    rec = front.record(str(state), "c1", instance=False)
    (front.out / "fail").write_text("")
    r = front.run("--root", str(state), "delete", "c1")
    assert r.returncode == 3 and os.path.exists(rec)  # the runtime refused: its status
    (front.out / "fail").unlink()
    r = front.run("--root", str(state), "delete", "--force", "c1")
    assert r.returncode == 0, r.stderr
    assert not (state / "c1").exists() and os.path.exists(rec)
    assert front.seen_argv() == ["--root", str(state), "delete", "--force", "c1"]
    assert front.python_started() == (1 if slow else 0)  # that Python left the front file: the second is the front's


def test_a_stale_record_of_the_same_id_is_never_used_by_a_cpu_only_create(front, tmp_path):
    """A create on a CPU-only node is the front's alone (no Python): an old record of the same
    id stays, and the new container's first exec does not get its env (another instance) and
    removes it."""
    state = tmp_path / "state"
    state.mkdir()
    rec = front.record(str(state), "c1", instance=False)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2"}')
    assert front.run("--root", str(state), "create", "--bundle", str(bundle), "c1").returncode == 0
    assert os.path.exists(rec) and front.python_started() == 0
    (state / "c1").mkdir()
    (state / "c1" / "state.json").write_text(json.dumps({"created": "2026-12-01T19:00:00Z",
                                                         "config": {"labels": [f"bundle={bundle}"]}}))
    p = front.process_file()
    assert front.run("--root", str(state), "exec", "-p", p, "c1").returncode == 0
    assert front.seen_env() == PROCESS["env"] and not os.path.exists(rec) and front.python_started() == 1


def test_create_that_injects_writes_the_record(tmp_path, make_host):
    host = make_host("nvidia", mknod=False, gpus=2, libs=False)
    front = Front(tmp_path)
    front.config.write_text(f'runtime = "{front.runtime}"\nhost_root = "{host}"\nlog_file = "{front.log}"\n')
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, '
                                        '"process": {"env": ["PATH=/bin"]}}')
    state = tmp_path / "state"
    r = front.run("--root", str(state), "create", "--bundle", str(bundle), "c1")
    assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    added = [e for e in spec["process"]["env"] if e.startswith("GPUHOOK_")]
    assert added and added[0] == "GPUHOOK_ACCELERATOR=nvidia"
    rec = execenv.record_path(front.cache, str(state), "c1", front.runtime)
    assert execenv.read_record(rec) == added
    assert stat.S_IMODE(os.stat(rec).st_mode) == 0o600
    # an opt-out container of the same id later: the record goes
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, '
                                        '"annotations": {"gpuhook.dev/inject": "false"}}')
    assert front.run("--root", str(state), "create", "--bundle", str(bundle), "c1").returncode == 0
    assert not os.path.exists(rec)
    assert [line["decision"] for line in front.log_lines()] == ["injected", "declined"]


@pytest.mark.parametrize("argv, recorded", [(["run", "-d"], True), (["run"], False), (["create"], True)])
def test_run_in_the_foreground_leaves_no_record(tmp_path, make_host, argv, recorded):
    """`run` without --detach: the runtime removes the container itself and no `delete`
    comes, so no record is written (it would outlive the container); an old one goes."""
    host = make_host("nvidia", mknod=False, gpus=1, libs=False)
    front = Front(tmp_path)
    front.config.write_text(f'runtime = "{front.runtime}"\nhost_root = "{host}"\nlog_file = "{front.log}"\n')
    state = tmp_path / "state"
    old = front.record(str(state), "c1", instance=False)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, '
                                        '"process": {"env": ["PATH=/bin"]}}')
    r = front.run("--root", str(state), *argv, "--bundle", str(bundle), "c1")
    assert r.returncode == 0, r.stderr
    assert [line["decision"] for line in front.log_lines()] == ["injected"]
    assert os.path.exists(old) == recorded
    if recorded:
        assert execenv.read_record_data(old)["bundle"] == str(bundle)


# -- real runc: exec as containerd's shim does it --------------------------------------------

def start(wrapper: str, rt, bundle_dir: str, cid: str, tmp_path) -> None:
    """create + start through the wrapper; the container's stdio is not a pipe of ours (runc
    create would keep it open until the container exits)."""
    with open(tmp_path / f"{cid}.err", "w+") as err:
        for step in (["create", "--bundle", bundle_dir, cid], ["start", cid]):
            r = subprocess.run([wrapper, "--root", rt.state, *step], env=rt.env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=err, timeout=30)
            err.seek(0)
            assert r.returncode == 0, err.read()


def _exec(binary: str, state: str, env: dict, cid: str, tmp_path, script: str) -> subprocess.CompletedProcess:
    process = dict(PROCESS, args=["sh", "-c", script], env=["PATH=/bin"])
    p = tmp_path / f"runc-process-{cid}"
    p.write_text(json.dumps(process))
    return subprocess.run([binary, "--root", state, "--log", str(tmp_path / f"{cid}.exec.log"), "--log-format", "json",
                           "exec", "--process", str(p), cid],
                          env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


@needs_runc
def test_runc_exec_into_an_injected_container_sees_gpuhook_env(make_host, runtime, tmp_path):
    rt = runtime(make_host("nvidia", mknod=True))
    wrapper = wrapper_path()
    b = rt.bundle("b", ["sleep", "600"])
    cache = rt.env["GPUHOOK_CACHE_DIR"]
    rt.ids.append("gpu-exec")
    start(wrapper, rt, b, "gpu-exec", tmp_path)
    rec = execenv.record_path(cache, rt.state, "gpu-exec", "/usr/sbin/runc")
    assert rec and os.path.exists(rec)
    r = _exec(wrapper, rt.state, rt.env, "gpu-exec", tmp_path,
              "echo accel=$GPUHOOK_ACCELERATOR; echo devices=$GPUHOOK_DEVICES; stat -c '%t:%T' /dev/nvidia3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[0] == "accel=nvidia" and lines[1].count("nvidia:GPU-") == 8 and lines[2] == "c3:3", r.stdout
    # the same as the container's first process
    with open(os.path.join(b, "config.json")) as f:
        init_env = [e for e in json.load(f)["process"]["env"] if e.startswith("GPUHOOK_")]
    assert lines[:2] == ["accel=nvidia", init_env[1].replace("GPUHOOK_DEVICES=", "devices=")]
    # plain runc, for the control: the same exec without the wrapper sees none of it
    r = _exec("runc", rt.state, rt.env, "gpu-exec", tmp_path, "echo accel=${GPUHOOK_ACCELERATOR:-none}")
    assert r.stdout.split() == ["accel=none"], r.stderr
    r = subprocess.run([wrapper, "--root", rt.state, "delete", "--force", "gpu-exec"], env=rt.env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    # runc's delete alone; the next injecting create under this root sweeps the record once it
    # is older than a create may take to make its state, and keeps its own
    assert os.path.exists(rec)
    old = os.stat(rec).st_mtime - execenv.SWEEP_AFTER_S - 1
    os.utime(rec, (old, old))
    rt.ids.append("gpu-exec-2")
    start(wrapper, rt, rt.bundle("b2", ["sleep", "600"]), "gpu-exec-2", tmp_path)
    assert not os.path.exists(rec)
    assert os.path.exists(execenv.record_path(cache, rt.state, "gpu-exec-2", "/usr/sbin/runc"))


@needs_runc
def test_a_later_container_of_the_same_id_made_without_gpuhook_gets_no_env(make_host, runtime, tmp_path):
    """`run` in the foreground through gpuhook (runc removes the container itself), then a
    container of the same id and root made with plain runc from another bundle: an exec
    through gpuhook adds nothing of the first one's env. And a record made for an instance
    that plain runc then replaced (same id, same bundle, a config.json written anew) is not
    used either."""
    rt = runtime(make_host("nvidia", mknod=True))
    wrapper = wrapper_path()
    cache = rt.env["GPUHOOK_CACHE_DIR"]
    b = rt.bundle("b", ["true"])
    r = rt.run(b, "again")
    assert r.returncode == 0, r.stderr
    assert rt.log_records()[-1]["decision"] == "injected"
    rec = execenv.record_path(cache, rt.state, "again", "/usr/sbin/runc")
    assert not os.path.exists(rec), "a foreground run left its exec record"
    plain = rt.bundle("plain", ["sleep", "600"])
    for step in (["create", "--bundle", plain, "again"], ["start", "again"]):
        subprocess.run(["runc", "--root", rt.state, *step], check=True, timeout=30, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = _exec(wrapper, rt.state, rt.env, "again", tmp_path, "echo accel=${GPUHOOK_ACCELERATOR:-none}")
    assert r.returncode == 0 and r.stdout.split() == ["accel=none"], (r.stdout, r.stderr)
    subprocess.run(["runc", "--root", rt.state, "delete", "--force", "again"], check=True, timeout=30)
    # injected by gpuhook, deleted by plain runc (no record removed), made again by plain runc
    rt.ids.append("again")
    b2 = rt.bundle("b2", ["sleep", "600"])
    start(wrapper, rt, b2, "again", tmp_path)
    assert os.path.exists(rec)
    subprocess.run(["runc", "--root", rt.state, "delete", "--force", "again"], check=True, timeout=30)
    with open(os.path.join(b2, "config.json")) as f:
        spec = json.load(f)
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.startswith("GPUHOOK_")]
    with open(os.path.join(b2, "config.json.new"), "w") as f:
        json.dump(spec, f)
    os.rename(os.path.join(b2, "config.json.new"), os.path.join(b2, "config.json"))
    for step in (["create", "--bundle", b2, "again"], ["start", "again"]):
        subprocess.run(["runc", "--root", rt.state, *step], check=True, timeout=30, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = _exec(wrapper, rt.state, rt.env, "again", tmp_path, "echo accel=${GPUHOOK_ACCELERATOR:-none}")
    assert r.returncode == 0 and r.stdout.split() == ["accel=none"], (r.stdout, r.stderr)
    assert not os.path.exists(rec)


@needs_runc
def test_runc_exec_into_a_cpu_only_container_is_untouched(make_host, runtime, tmp_path):
    rt = runtime(make_host("cpu"))
    wrapper = wrapper_path()
    b = rt.bundle("b", ["sleep", "600"])
    rt.ids.append("cpu-exec")
    start(wrapper, rt, b, "cpu-exec", tmp_path)
    r = _exec(wrapper, rt.state, rt.env, "cpu-exec", tmp_path, "echo accel=${GPUHOOK_ACCELERATOR:-none}")
    assert r.returncode == 0 and r.stdout.split() == ["accel=none"], r.stderr
    assert not os.path.exists(os.path.join(rt.env["GPUHOOK_CACHE_DIR"], "exec"))


def test_delete_says_the_runtimes_failure_even_with_sigchld_ignored(tmp_path):
    """A caller that ignores SIGCHLD (inherited across exec, so waitpid has no status to
    give): the front's delete still exits with the runtime's failure, and keeps the record."""
    import signal

    front = Front(tmp_path)
    state = tmp_path / "state"
    (state / "c1").mkdir(parents=True)
    rec = front.record(str(state), "c1", instance=False)
    (front.out / "fail").write_text("")
    r = subprocess.run([FRONT, "--root", str(state), "delete", "c1"], capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(front.config),
                            "GPUHOOK_CACHE_DIR": front.cache, "GPUHOOK_PYTHON": front.python},
                       preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    assert r.returncode == 3 and os.path.exists(rec), r.stderr
