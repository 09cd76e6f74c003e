"""The node config reader (gpuhook/config.py) as a node sees it: the file an admin writes, the
cache beside it in /run/gpuhook, the front file the C front reads, and what a hostile or
broken file, cache or front file there does (never more than the defaults and a line)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import REPO
from gpuhook import config as cfg


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's cache dir and a config file path on it (not written yet)."""
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUHOOK_CONFIG", raising=False)
    monkeypatch.setattr(cfg, "_LOADED", {})
    return tmp_path / "config.toml"


def new_process() -> None:
    """What the next load sees as a process of its own would: nothing parsed in memory, so
    the cache dir is what it may use (the wrapper's fresh interpreter)."""
    cfg._LOADED.clear()


def front_fields(path: str) -> dict:
    """The front file of the config at `path`, as the C front reads it: magic, then NAME=VALUE."""
    with open(cfg.front_file(os.path.abspath(path)), "rb") as f:
        magic, *fields, last = f.read().decode().split("\0")
    assert magic == cfg.FRONT_MAGIC and last == ""
    return dict(field.split("=", 1) for field in fields)


def identity(path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def cache_file(path) -> str:
    return os.path.join(cfg.cache_dir(), "config-" + str(path).replace("/", "%2F") + ".json")


# -- the file -------------------------------------------------------------------------------


def test_a_node_without_a_config_file_gets_the_defaults(node):
    assert cfg.load(str(node)) == (cfg.Config(), [])
    assert not os.path.exists(cfg.cache_dir())  # nothing to remember


def test_the_file_is_read_and_its_errors_name_it(node):
    node.write_text('runtime = "/usr/bin/crun"\nhost_root = "/host"\nfail_mode = "closed"\nshare = "some"\n')
    conf, errors = cfg.load(str(node))
    assert (conf.runtime, conf.host_root, conf.fail_mode, conf.share) == ("/usr/bin/crun", "/host", "closed",
                                                                         "unallocated")
    assert errors == [f"{node}: share: 'some' is not one of all, unallocated; 'unallocated' used"]


def test_gpuhook_config_names_the_file_read_when_none_is_given(node, monkeypatch):
    node.write_text('log_file = ""\n')
    monkeypatch.setenv("GPUHOOK_CONFIG", str(node))
    assert cfg.load() == (cfg.Config(log_file=""), [])


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_config_that_is_no_regular_file_is_the_defaults_with_a_line(node, kind):
    os.mkdir(node) if kind == "directory" else os.mkfifo(node)  # a FIFO must not hang the create
    assert cfg.load(str(node)) == (cfg.Config(), [f"{node} is not a regular file; defaults used"])


def test_a_config_that_cannot_be_opened_is_the_defaults_with_a_line(node):
    node.write_text("")
    path = str(node) + "/config.toml"  # under a regular file: ENOTDIR
    conf, errors = cfg.load(path)
    assert conf == cfg.Config() and errors == [f"cannot read {path}: Not a directory; defaults used"]


def test_a_config_that_is_not_utf8_is_the_defaults_and_the_front_leaves_it_to_python(node):
    node.write_bytes(b'runtime = "/usr/bin/\xff"\n')
    assert cfg.load(str(node)) == (cfg.Config(), [f"{node} is not UTF-8; defaults used"])
    assert stat.S_IMODE(os.stat(cfg.cache_dir()).st_mode) == 0o700  # made private by the front file's write
    assert front_fields(str(node))["errors"] == "1"
    assert front_fields(str(node))["runtime"] == ""


def test_invalid_toml_is_the_defaults_with_the_parsers_reason(node):
    import tomllib

    node.write_text("share = \n")
    with pytest.raises(tomllib.TOMLDecodeError) as reason:
        tomllib.loads(node.read_text())
    assert cfg.load(str(node)) == (cfg.Config(), [f"{node}: invalid TOML: {reason.value}"])


def test_a_config_over_the_limit_is_refused_whole_not_read_cut(node):
    line = b'fail_mode = "closed"\n'
    pad = b"#" * (cfg.MAX_CONFIG_BYTES - len(line) - 1) + b"\n"
    node.write_bytes(pad + line)  # exactly the limit: read
    assert cfg.load(str(node)) == (cfg.Config(fail_mode="closed"), [])
    node.write_bytes(pad + line + b"\n")  # one byte more: the defaults and a line, the front told so
    assert cfg.load(str(node)) == (cfg.Config(), [f"{node} is larger than 1 MiB; defaults used"])
    assert front_fields(str(node))["errors"] == "1"
    node.write_bytes(pad + b"x" * (2 << 20))
    assert cfg.load(str(node)) == (cfg.Config(), [f"{node} is larger than 1 MiB; defaults used"])


def test_an_executable_config_file_is_still_a_regular_file(node):
    node.write_text('fail_mode = "closed"\n')
    node.chmod(0o755)
    assert cfg.load(str(node)) == (cfg.Config(fail_mode="closed"), [])


def test_an_overlong_toml_error_is_cut():
    conf, errors = cfg.parse('x = "' + "a" * 500)  # unterminated: the reason quotes nothing of it
    assert conf == cfg.Config() and errors[0].startswith("invalid TOML: ") and len(errors[0]) <= 214
    conf, errors = cfg.parse("[" * 100000)  # deeper than the parser recurses
    assert conf == cfg.Config() and errors[0].startswith("invalid TOML: ")


# -- each key's checks ------------------------------------------------------------------------


@pytest.mark.parametrize("text, key, error", [
    ("bogus = 1", "bogus", "bogus: unknown key, ignored"),
    ('runtime = 3', "runtime", "runtime: expected a string, got int; default used"),
    ('probe_cache_ttl = "10"', "probe_cache_ttl", "probe_cache_ttl: expected a number, got str; default used"),
    ("probe_cache_ttl = true", "probe_cache_ttl", "probe_cache_ttl: expected a number, got bool; default used"),
    ("probe_cache_ttl = inf", "probe_cache_ttl", "probe_cache_ttl: inf is not a finite number; default used"),
    ("probe_cache_ttl = -inf", "probe_cache_ttl", "probe_cache_ttl: -inf is not a finite number; default used"),
    ("probe_cache_ttl = nan", "probe_cache_ttl", "probe_cache_ttl: nan is not a finite number; default used"),
    ("probe_cache_ttl = -1", "probe_cache_ttl", "probe_cache_ttl: -1 is negative; default used"),
    ("probe_cache_ttl = -0.5", "probe_cache_ttl", "probe_cache_ttl: -0.5 is negative; default used"),
    ('fail_mode = "shut"', "fail_mode", "fail_mode: 'shut' is not one of open, closed; 'open' used"),
    ('host_root = "host"', "host_root", "host_root: 'host' is not an absolute path; '/' used"),
    ('host_root = "/h\\u0000"', "host_root", "host_root: contains a NUL character; default used"),
    ('share = "none"', "share", "share: 'none' is not one of all, unallocated; 'unallocated' used"),
    ('mps_pipe_dir = "/tmp/../mps"', "mps_pipe_dir",
     "mps_pipe_dir: '/tmp/../mps' is not a normal absolute path; MPS not mounted"),
    ('nvidia_driver_root = "driver"', "nvidia_driver_root",
     "nvidia_driver_root: 'driver' is not 'auto' or a normal absolute path; 'auto' used"),
    ('vendor_label = "k8s.io/gpu"', "vendor_label",
     "vendor_label: 'k8s.io/gpu' is not a label key ([prefix/]name) outside gpuhook.dev/, kubernetes.io and "
     "k8s.io, nor \"\"; 'gpu.type' used"),
    ('nri_runtime_handler = ""', "nri_runtime_handler", "nri_runtime_handler: is empty; 'gpu-optional' used"),
])
def test_a_bad_value_is_the_keys_default_and_one_line(text, key, error):
    conf, errors = cfg.parse(text + "\n")
    assert conf == cfg.Config() and errors == [error]
    assert key == "bogus" or getattr(conf, key) == getattr(cfg.Config(), key)


@pytest.mark.parametrize("text, key, value", [
    ("probe_cache_ttl = 0", "probe_cache_ttl", 0),  # 0 disables the probe cache: not negative
    ("probe_cache_ttl = 0.5", "probe_cache_ttl", 0.5),
    ("probe_cache_ttl = 1e300", "probe_cache_ttl", 1e300),
    ('fail_mode = "closed"', "fail_mode", "closed"),
    ('fail_mode = "open"', "fail_mode", "open"),
    ('host_root = "/"', "host_root", "/"),
    ('host_root = "/host"', "host_root", "/host"),
    ('share = "all"', "share", "all"),
    ('mps_pipe_dir = "/run/nvidia/mps/nvidia.com/gpu/pipe"', "mps_pipe_dir", "/run/nvidia/mps/nvidia.com/gpu/pipe"),
    ('mps_pipe_dir = ""', "mps_pipe_dir", ""),
    ('nvidia_driver_root = "auto"', "nvidia_driver_root", "auto"),
    ('nvidia_driver_root = "/"', "nvidia_driver_root", "/"),
    ('nvidia_driver_root = "/run/nvidia/driver"', "nvidia_driver_root", "/run/nvidia/driver"),
    ('vendor_label = ""', "vendor_label", ""),
    ('nri_runtime_handler = "nvidia"', "nri_runtime_handler", "nvidia"),
    ('ldconfig = "/sbin/ldconfig.real"', "ldconfig", "/sbin/ldconfig.real"),
])
def test_a_good_value_is_taken(text, key, value):
    conf, errors = cfg.parse(text + "\n")
    assert errors == [] and getattr(conf, key) == value
    assert conf._replace(**{key: getattr(cfg.Config(), key)}) == cfg.Config()


def test_every_bad_key_is_reported_and_the_good_ones_kept():
    conf, errors = cfg.parse('fail_mode = "closed"\nshare = "x"\nhost_root = "rel"\nruntime = "crun"\nbogus = 2\n')
    assert (conf.fail_mode, conf.share, conf.host_root, conf.runtime) == ("closed", "unallocated", "/", "crun")
    assert len(errors) == 3 and errors[0] == "bogus: unknown key, ignored"
    assert sorted(e.split(":")[0] for e in errors[1:]) == ["host_root", "share"]


@pytest.mark.parametrize("path, clean", [
    ("/run/mps", True), ("/a", True), ("/a/b/c", True), ("/a.b/..c/c..", True),
    ("/", False), ("", False), ("run/mps", False), ("/run//mps", False), ("/run/./mps", False),
    ("/run/../mps", False), ("/run/mps/", False), ("//run", False), ("/..", False), ("/.", False),
    ("/run/mp\0s", False),
])
def test_a_normal_absolute_path(path, clean):
    assert cfg.is_clean_abspath(path) is clean
    # mps_pipe_dir and nvidia_driver_root take exactly those ("" and auto and / aside)
    assert (cfg.from_dict({"mps_pipe_dir": path})[1] == []) is (clean or path == "")
    assert (cfg.from_dict({"nvidia_driver_root": path})[1] == []) is (clean or path == "/")


@pytest.mark.parametrize("key, valid", [
    ("gpu.type", True), ("a", True), ("A9", True), ("x" * 63, True), ("a-b_c.d", True),
    ("example.com/gpu", True), ("a/b", True), ("a-0123456789bcdefghijklmnopqrstuvwxyz.io/x", True), ("a-b.c-d/x", True), (("a" * 63 + ".") * 3 + "a" * 61 + "/x", True),
    ("", True),  # off
    ("x" * 64, False), ("-a", False), ("a-", False), ("_a", False), ("a.", False), ("a b", False), ("é", False),
    ("/x", False), ("a/", False), ("a/b/c", False), ("Example.com/x", False), ("-a.com/x", False),
    ("a-.com/x", False), ("a..com/x", False), (".a/x", False), ("a_b/x", False), (("a" * 63 + ".") * 3 + "a" * 62 + "/x", False),
    ("kubernetes.io/x", False), ("node.kubernetes.io/x", False), ("k8s.io/x", False), ("x.k8s.io/x", False),
    ("gpuhook.dev/x", False), ("a.gpuhook.dev/x", False),
    ("mykubernetes.io/x", True), ("k8s.io.example/x", True), ("gpuhook.devx/x", True),
])
def test_vendor_label_is_a_label_key_outside_the_reserved_domains(key, valid):
    assert cfg.valid_vendor_label(key) is valid
    conf, errors = cfg.from_dict({"vendor_label": key})
    assert (errors == [] and conf.vendor_label == key) is valid


def test_a_cached_record_is_checked_like_the_file(node):
    """A record in the cache dir is only gpuhook's own; still, what it holds is checked again."""
    node.write_text('share = "all"\n')
    cfg.load(str(node))
    st = os.stat(node)
    key = [str(node), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    from gpuhook import fastjson

    with open(cache_file(node), "wb") as f:
        f.write(fastjson.dumps({"key": key, "config": {"share": "all", "fail_mode": "shut"}, "errors": ["e1"]}).encode())
    new_process()
    conf, errors = cfg.load(str(node))
    assert conf == cfg.Config(share="all")
    assert errors == ["e1", "fail_mode: 'shut' is not one of open, closed; 'open' used"]


# -- the cache ------------------------------------------------------------------------------


def test_the_parse_is_cached_privately_and_used_while_the_file_is_the_same(node):
    node.write_text('runtime = "/usr/bin/crun"\n')
    first = cfg.load(str(node))
    path = cache_file(node)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cfg.cache_dir()).st_mode) == 0o700
    # what the cache says is what load returns while the file is unchanged: plant a value in it
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace("/usr/bin/crun", "/usr/bin/runc"))
    new_process()
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/runc"), [])
    # the file changed (same size, new mtime and ctime): parsed again
    node.write_text('runtime = "/usr/bin/youk"\n')
    os.utime(node, ns=(1, 1))
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/youk"), [])
    assert first == (cfg.Config(runtime="/usr/bin/crun"), [])


def test_a_resident_process_parses_a_file_once_while_it_is_the_same(node):
    """The runtime server and the NRI plugin load the config for every create: the file they
    parsed is used from memory while its identity holds (not even the cache dir is read), a
    changed file is parsed again, and what a caller does to the errors it got stays its own."""
    node.write_text('runtime = "/usr/bin/crun"\nbogus = 1\n')
    first = cfg.load(str(node))
    path = cache_file(node)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("/usr/bin/crun", "/usr/bin/runc"))
    conf, errors = cfg.load(str(node))
    assert (conf, errors) == first and conf is first[0]  # from memory: the planted cache unread
    errors.append("the caller's own")
    assert cfg.load(str(node)) == first
    node.write_text('runtime = "/usr/bin/youk"\nbogus = 2\n')
    os.utime(node, ns=(1, 1))
    assert cfg.load(str(node))[0].runtime == "/usr/bin/youk"
    new_process()
    assert cfg.load(str(node))[0].runtime == "/usr/bin/youk"  # the cache dir follows the file too


def test_a_config_read_from_the_cache_dir_is_kept_in_memory_too(node, monkeypatch):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    new_process()
    assert cfg.load(str(node))[0].runtime == "/usr/bin/crun"  # from the cache dir

    def unread(key):
        raise AssertionError("the cache dir read again")

    monkeypatch.setattr(cfg, "_cache_get", unread)
    conf, errors = cfg.load(str(node))
    assert conf.runtime == "/usr/bin/crun" and errors == []
    errors.append("the caller's own")
    assert cfg.load(str(node))[1] == []


def test_the_cache_keeps_the_errors_and_leaves_out_unset_values(node):
    node.write_text('bogus = 1\nlog_file = "/l"\n')
    first = cfg.load(str(node))
    assert first == (cfg.Config(log_file="/l"), [f"{node}: bogus: unknown key, ignored"])
    assert cfg.load(str(node)) == first
    from gpuhook import fastjson

    with open(cache_file(node), "rb") as f:
        record = fastjson.loads(f.read())
    assert "runtime" not in record["config"] and "ldconfig" not in record["config"]  # None: the default


def test_the_cache_files_of_two_configs_do_not_collide(node, tmp_path):
    a, b = tmp_path / "a%2Fb.toml", tmp_path / "a" / "b.toml"
    b.parent.mkdir()
    a.write_text('runtime = "/a"\n')
    b.write_text('runtime = "/b"\n')
    assert cfg.load(str(a))[0].runtime == "/a" and cfg.load(str(b))[0].runtime == "/b"
    assert cfg.load(str(a))[0].runtime == "/a" and cfg.load(str(b))[0].runtime == "/b"
    assert len(os.listdir(cfg.cache_dir())) == 4  # a cache and a front file each


@pytest.mark.parametrize("how", ["other owner", "group-writable", "world-writable", "wrong key", "not json",
                                 "not a record"])
def test_a_cache_not_gpuhooks_own_or_not_current_is_never_used(node, how):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    path = cache_file(node)
    text = open(path).read().replace("/usr/bin/crun", "/tmp/evil")
    if how == "wrong key":
        text = text.replace(str(node), str(node) + "x", 1)
    elif how == "not json":
        text = text[:-1]
    elif how == "not a record":
        text = "[1]"
    with open(path, "w") as f:
        f.write(text)
    if how == "other owner":
        os.chown(path, 1000, 1000)
    elif how == "group-writable":
        os.chmod(path, 0o620)
    elif how == "world-writable":
        os.chmod(path, 0o602)
    new_process()
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/crun"), [])


@pytest.mark.parametrize("mode", [0o644, 0o755, 0o711])
def test_a_cache_others_may_read_but_not_write_is_gpuhooks_own_and_used(node, mode):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    path = cache_file(node)
    text = open(path).read().replace("/usr/bin/crun", "/usr/bin/runc")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    new_process()
    assert cfg.load(str(node))[0].runtime == "/usr/bin/runc"


def test_a_cache_dir_that_cannot_be_made_only_costs_the_parse(node, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "file" / "cache"))
    node.write_text('runtime = "/usr/bin/crun"\n')
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/crun"), [])
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/crun"), [])


def test_the_cache_dir_is_the_environments_or_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUHOOK_CACHE_DIR", raising=False)
    assert cfg.cache_dir() == "/run/gpuhook"
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", "")
    assert cfg.cache_dir() == "/run/gpuhook"
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path))
    assert cfg.cache_dir() == str(tmp_path)
    assert cfg.front_file("/etc/gpuhook/config.toml") == str(tmp_path / "config-%2Fetc%2Fgpuhook%2Fconfig.toml.front")
    assert cfg.front_file("/a%b") == str(tmp_path / "config-%2Fa%25b.front")


# -- the front file -----------------------------------------------------------------------------


def test_the_front_file_says_what_python_decided_for_this_very_file(node):
    node.write_text('runtime = "/usr/bin/crun"\nhost_root = "/host"\nlog_file = ""\n')
    cfg.load(str(node))
    assert front_fields(str(node)) == {"config": identity(node), "runtime": "/usr/bin/crun", "host_root": "/host",
                                       "log_file": "", "fail_mode": "open", "errors": "0"}
    st = os.lstat(cfg.front_file(str(node)))
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    # from the cache too, and for a file with errors
    node.write_text('fail_mode = "closed"\nbogus = 1\n')
    for _ in range(2):
        cfg.load(str(node))
        assert front_fields(str(node)) == {"config": identity(node), "runtime": "", "host_root": "/",
                                           "log_file": "/var/log/gpuhook.log", "fail_mode": "closed", "errors": "1"}


def test_the_front_file_is_not_rewritten_while_it_says_the_same(node):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    before = os.stat(cfg.front_file(str(node)))
    cfg.load(str(node))
    after = os.stat(cfg.front_file(str(node)))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "other owner", "link", "different", "fifo"])
def test_a_front_file_not_gpuhooks_own_is_replaced(node, tmp_path, how):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    front = cfg.front_file(str(node))
    good = open(front, "rb").read()
    if how == "link":
        target = tmp_path / "target"
        target.write_bytes(good)
        os.unlink(front)
        os.symlink(target, front)
    elif how == "different":
        with open(front, "wb") as f:
            f.write(good.replace(b"runtime=/usr/bin/crun", b"runtime=/tmp/evil"))
    elif how == "fifo":  # must not hang the create
        os.unlink(front)
        os.mkfifo(front, 0o600)
    else:
        os.chmod(front, {"world-writable": 0o602, "group-writable": 0o620, "other owner": 0o600}[how])
        if how == "other owner":
            os.chown(front, 1000, 1000)
    cfg.load(str(node))
    st = os.lstat(front)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert open(front, "rb").read() == good


@pytest.mark.parametrize("mode", [0o644, 0o755, 0o711])
def test_a_front_file_others_may_read_but_not_write_is_kept(node, mode):
    node.write_text('runtime = "/usr/bin/crun"\n')
    cfg.load(str(node))
    front = cfg.front_file(str(node))
    os.chmod(front, mode)
    ino = os.stat(front).st_ino
    cfg.load(str(node))
    assert os.stat(front).st_ino == ino


def test_no_front_file_for_a_config_the_front_could_not_read_whole(node):
    """Over MAX_FRONT_BYTES the front would read it cut: none is written, Python decides."""
    node.write_text(f'runtime = "/{"r" * cfg.MAX_FRONT_BYTES}"\n')
    conf, errors = cfg.load(str(node))
    assert errors == [] and len(conf.runtime) == cfg.MAX_FRONT_BYTES + 1
    assert not os.path.exists(cfg.front_file(str(node)))
    # just under the limit: written whole
    node.write_text(f'runtime = "/{"r" * (cfg.MAX_FRONT_BYTES - 200)}"\n')
    cfg.load(str(node))
    assert front_fields(str(node))["runtime"] == "/" + "r" * (cfg.MAX_FRONT_BYTES - 200)


def test_a_front_file_of_exactly_the_limit_is_still_written(node):
    # the config file's identity (device, inode, size, times) is in the front file, its digits
    # this machine's: the runtime's length that fills the file is found from the file itself,
    # up or down (a few rounds: a new size can change the size's own digits)
    length = cfg.MAX_FRONT_BYTES // 2
    for _round in range(8):
        node.write_text(f'runtime = "/{"r" * length}"\n')
        short = cfg.MAX_FRONT_BYTES - len(cfg.front_text(os.stat(node), cfg.parse(node.read_text())[0], []))
        if short == 0:
            break
        length += short
    assert len(cfg.front_text(os.stat(node), cfg.parse(node.read_text())[0], [])) == cfg.MAX_FRONT_BYTES
    cfg.load(str(node))
    assert os.path.getsize(cfg.front_file(str(node))) == cfg.MAX_FRONT_BYTES
    ino = os.stat(cfg.front_file(str(node))).st_ino
    cfg.load(str(node))  # read whole and found the same: kept
    assert os.stat(cfg.front_file(str(node))).st_ino == ino


def test_a_front_file_that_cannot_be_written_costs_nothing(node, tmp_path, monkeypatch):
    node.write_text('runtime = "/usr/bin/crun"\n')
    os.makedirs(cfg.cache_dir())
    os.mkdir(cfg.front_file(str(node)))  # a directory in its place
    assert cfg.load(str(node)) == (cfg.Config(runtime="/usr/bin/crun"), [])


# -- the front itself as the runtime --------------------------------------------------------------


def test_the_front_is_known_by_its_name_its_file_or_a_copy(tmp_path, monkeypatch):
    front = tmp_path / "front"
    data = os.urandom(3 << 16) + b"tail"  # more than one read's worth
    front.write_bytes(data)
    monkeypatch.setattr(cfg, "FRONT_BINARY", str(front))
    assert cfg.is_front(str(front))
    assert cfg.is_front("/usr/local/bin/gpuhook-runtime")  # the name alone, even if absent
    os.link(front, tmp_path / "hardlink")
    assert cfg.is_front(str(tmp_path / "hardlink"))
    copy = tmp_path / "copy"
    copy.write_bytes(data)
    assert cfg.is_front(str(copy))
    copy.chmod(0o755)  # an executable copy, as installed
    assert cfg.is_front(str(copy))
    for i in (0, len(data) - 1, 1 << 16, (1 << 16) - 1):
        copy.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])  # same size, one byte differs
        assert not cfg.is_front(str(copy)), i
    copy.write_bytes(data + b"!")
    assert not cfg.is_front(str(copy))
    assert not cfg.is_front(str(tmp_path / "absent"))
    runc = tmp_path / "runc"
    runc.write_bytes(b"#!/bin/sh\n")
    assert not cfg.is_front(str(runc))


def test_a_fifo_or_device_the_size_of_the_front_is_no_front(tmp_path, monkeypatch):
    front = tmp_path / "front"
    front.write_bytes(b"")  # size 0, as a FIFO's
    monkeypatch.setattr(cfg, "FRONT_BINARY", str(front))
    os.mkfifo(tmp_path / "fifo")
    assert not cfg.is_front(str(tmp_path / "fifo"))  # and does not block opening it
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert cfg.is_front(str(empty))  # an empty regular copy of an empty front is a copy


def test_the_shipped_front_is_the_front(tmp_path):
    if not os.path.exists(cfg.FRONT_BINARY):
        pytest.skip("the C front is not built")
    assert cfg.is_front(cfg.FRONT_BINARY)
    copy = tmp_path / "runtime"
    copy.write_bytes(open(cfg.FRONT_BINARY, "rb").read())
    assert cfg.is_front(str(copy))


# -- the real runtime -------------------------------------------------------------------------


def test_a_relative_runtime_path_is_taken_from_the_working_directory_not_path(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "bin" / "sub").mkdir(parents=True)
    for d in ("sub", "bin/sub"):
        (tmp_path / d / "runc").write_text("#!/bin/sh\n")
        (tmp_path / d / "runc").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert cfg.find_runtime("sub/runc") == "sub/runc"
    os.unlink(tmp_path / "sub" / "runc")
    assert cfg.find_runtime("sub/runc") is None  # never looked up on PATH (bin/sub/runc)


STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def test_without_path_the_runtime_is_looked_up_in_the_standard_directories(monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    want = next((os.path.join(d, n) for n in ("runc", "crun") for d in STANDARD_PATH
                 if os.access(os.path.join(d, n), os.X_OK)), None)
    if want is None:
        pytest.skip("neither runc nor crun installed")
    assert cfg.find_runtime(None) == want


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
@pytest.mark.parametrize("layout, want", [
    ({"/usr/local/sbin": ["runc"]}, "/usr/local/sbin/runc"),
    ({"/usr/local/sbin": ["crun"], "/usr/local/bin": ["runc"]}, "/usr/local/bin/runc"),
])
def test_a_node_without_path_looks_in_usr_local_first(tmp_path, layout, want):
    """A node whose runtime starts gpuhook without PATH and whose runc is a local build: found
    in /usr/local (sbin, then bin) before the distribution's. The two directories are the
    test's own, mounted over the host's in a mount namespace of a child."""
    assert cfg.find_runtime(str(tmp_path / "runc")) is None  # (here too: a path that is not there)
    binds = []
    for d in ("/usr/local/sbin", "/usr/local/bin"):
        mine = tmp_path / d.strip("/").replace("/", "_")
        mine.mkdir()
        for name in layout.get(d, []):
            (mine / name).write_text("#!/bin/sh\n")
            (mine / name).chmod(0o755)
        binds.append(f"mount --bind {mine} {d}")
    probe = "import sys; from gpuhook import config; sys.stdout.write(repr(config.find_runtime(None)))"
    script = " && ".join(["mount --make-rprivate /", *binds, f"exec env -u PATH {sys.executable} -c '{probe}'"])
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0 and "mount" in r.stderr:
        pytest.skip("cannot mount here: " + r.stderr.strip())
    assert r.returncode == 0 and r.stdout == repr(want), r.stderr


def test_a_relative_runtime_is_the_callers_found_in_its_cwd(tmp_path):
    """A runtime named by a relative path, or found on a relative PATH entry, is the caller's:
    in the caller's directory (cwd), never in gpuhook's own."""
    exe = tmp_path / "bin" / "myrunc"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert cfg.find_runtime("bin/myrunc", cwd=str(tmp_path)) == str(exe)
    assert cfg.find_runtime("myrunc", path="bin", cwd=str(tmp_path)) == str(exe)
    assert cfg.find_runtime("bin/myrunc", cwd=str(tmp_path / "bin")) is None
    assert cfg.find_runtime(str(exe), cwd="/nonexistent") == str(exe)


def test_check_is_the_readers_own_errors_one_line_each():
    """config.check (`gpuhook config check`'s) says exactly what the reader says of the same
    text: nothing for a valid file, one line per problem of one that is not."""
    assert cfg.check('fail_mode = "closed"\nprobe_cache_ttl = 5\n') == []
    bad = 'fail_mode = "sometimes"\nbogus = 1\n'
    assert cfg.check(bad) == cfg.parse(bad)[1] == [
        "bogus: unknown key, ignored",
        "fail_mode: 'sometimes' is not one of open, closed; 'open' used",
    ]
