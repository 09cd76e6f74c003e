"""Node config keys of the policy work (share, mps_pipe_dir) and `gpuhook config check`: the
runtime's reader (config.py) is the one source of the keys' rules, and the check prints them."""

from __future__ import annotations

import os

import pytest

from conftest import NO_CONFIG, gpuhook
from gpuhook import config as cfg


CASES = [
    ("", True),
    ('share = "unallocated"\nmps_pipe_dir = "/run/nvidia-mps"\n', True),
    ('share = "all"\nfail_mode = "closed"\nprobe_cache_ttl = 0\n', True),
    ('runtime = "/usr/bin/crun"\nhost_root = "/host"\nlog_file = ""\nldconfig = "/sbin/ldconfig"\nprobe_cache_ttl = 2.5\n', True),
    ('share = "some"\n', False),
    ('share = 1\n', False),
    ('mps_pipe_dir = "tmp/mps"\n', False),
    ('mps_pipe_dir = "/tmp/../etc"\n', False),
    ('mps_pipe_dir = "/"\n', False),
    ('mps_pipe_dir = "/tmp/mps/"\n', False),
    ('mps_pipe_dir = ""\n', True),  # no MPS: the default
    ('fail_mode = "shut"\n', False),
    ('probe_cache_ttl = -1\n', False),
    ('probe_cache_ttl = true\n', False),
    ('probe_cache_ttl = "10"\n', False),
    ('host_root = "relative"\n', False),
    ('runtime = 3\n', False),
    ('bogus = 1\n', False),
    ('[table]\nx = 1\n', False),
    ('share = \n', False),
    ('vendor_label = "gpu.type"\n', True),
    ('vendor_label = ""\n', True),
    ('vendor_label = "example.com/gpu-vendor"\n', True),
    ('vendor_label = "accelerator"\n', True),
    ('vendor_label = "kubernetes.io/gpu"\n', False),
    ('vendor_label = "node-role.kubernetes.io/gpu"\n', False),
    ('vendor_label = "x.k8s.io/gpu"\n', False),
    ('vendor_label = "gpuhook.dev/gpu.type"\n', False),
    ('vendor_label = "Example.com/gpu"\n', False),
    ('vendor_label = "gpu type"\n', False),
    ('vendor_label = "-gpu"\n', False),
    ('vendor_label = "a/b/c"\n', False),
    ('vendor_label = "/gpu"\n', False),
    ('vendor_label = "gpu/"\n', False),
    (f'vendor_label = "{"x" * 64}"\n', False),
    (f'vendor_label = "{"a." * 127}b/x"\n', False),  # a prefix over 253 characters
    ('vendor_label = true\n', False),
]


@pytest.mark.parametrize("text, valid", CASES)
def test_the_reader_tells_valid_files(text, valid):
    _, errors = cfg.parse(text)
    assert (errors == []) is valid, errors
    assert all(": " in e for e in errors)  # "key: what is wrong" (or "invalid TOML: ...")


def test_fast_reader_defaults_and_new_keys():
    c, errors = cfg.parse('share = "unallocated"\nmps_pipe_dir = "/run/mps"\n')
    assert errors == [] and (c.share, c.mps_pipe_dir) == ("unallocated", "/run/mps")
    c, errors = cfg.parse('share = "all"\n')
    assert errors == [] and c.share == "all"
    c, errors = cfg.parse('share = "everyone"\n')
    assert c.share == "unallocated" and any("share" in e and "'unallocated' used" in e for e in errors)
    assert cfg.Config().share == "unallocated" and cfg.Config().mps_pipe_dir == ""  # MPS is opt-in


def test_vendor_label_default_and_fallback():
    assert cfg.Config().vendor_label == "gpu.type"
    c, errors = cfg.parse('vendor_label = "example.com/gpu-vendor"\n')
    assert errors == [] and c.vendor_label == "example.com/gpu-vendor"
    assert cfg.parse('vendor_label = ""\n') == (cfg.Config(vendor_label=""), [])
    c, errors = cfg.parse('vendor_label = "node-role.kubernetes.io/gpu"\n')
    assert c.vendor_label == "gpu.type"
    assert errors == ["vendor_label: 'node-role.kubernetes.io/gpu' is not a label key ([prefix/]name) outside "
                      "gpuhook.dev/, kubernetes.io and k8s.io, nor \"\"; 'gpu.type' used"]


def test_cached_config_from_before_the_new_keys_still_loads(tmp_path, monkeypatch):
    """A cache record written before share/mps_pipe_dir existed: the defaults fill them in."""
    monkeypatch.setenv("GPUHOOK_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "c.toml"
    path.write_text('share = "unallocated"\n')
    c, _ = cfg.load(str(path))
    assert c.share == "unallocated"
    c2, _ = cfg.load(str(path))  # from the cache
    assert c2 == c


def test_config_check_ok(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('share = "unallocated"\nfail_mode = "closed"\n')
    r = gpuhook("config", "check", "--config", str(path), config=NO_CONFIG)
    assert r.returncode == 0 and r.stdout.strip().endswith(": OK") and r.stderr == ""


def test_config_check_prints_every_error_with_its_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('share = "some"\nfail_mode = "shut"\nprobe_cache_ttl = -1\nbogus = 1\nmps_pipe_dir = "x"\n')
    r = gpuhook("config", "check", "--config", str(path), config=NO_CONFIG)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5
    keys = sorted(line.split(": ")[1] for line in lines)
    assert keys == ["bogus", "fail_mode", "mps_pipe_dir", "probe_cache_ttl", "share"]
    assert all(line.startswith(str(path) + ": ") for line in lines)
    # the runtime's own errors, word for word: what it would log, and what it uses instead
    assert [line.removeprefix(f"{path}: ") for line in lines] == cfg.parse(path.read_text())[1]


@pytest.mark.parametrize("content, words", [
    (b"share = \n", "invalid TOML"),
    (b"\xff\xfe", "not UTF-8"),
    (None, "no such file"),
])
def test_config_check_bad_files(tmp_path, content, words):
    path = tmp_path / "c.toml"
    if content is not None:
        path.write_bytes(content)
    r = gpuhook("config", "check", "--config", str(path), config=NO_CONFIG)
    assert r.returncode == 1 and words in r.stdout and "Traceback" not in r.stderr
    assert len(r.stdout.strip().splitlines()) == 1


def test_config_check_default_path(tmp_path):
    r = gpuhook("config", "check", config=NO_CONFIG)
    assert r.returncode == 0 and "defaults apply" in r.stdout
    path = tmp_path / "c.toml"
    path.write_text('share = "nope"\n')
    r = gpuhook("config", "check", config=str(path))
    assert r.returncode == 1 and "share:" in r.stdout


def test_config_without_subcommand_is_usage():
    r = gpuhook("config", config=NO_CONFIG)
    assert r.returncode == 2 and "check" in r.stderr


# -- the property: a file the reader finds valid is read as it is --------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

_PATHS = st.sampled_from(["/", "/host", "/run/mps", "/tmp/nvidia-mps", "relative", "/a/../b", "/a/", "//a",
                          "/run/nvidia/driver", "auto", "", "/x\0y"])
_VALUES = {
    "runtime": st.one_of(st.sampled_from(["runc", "/usr/bin/crun", ""]), st.integers()),
    "host_root": _PATHS,
    "log_file": st.one_of(_PATHS, st.booleans()),
    "fail_mode": st.sampled_from(["open", "closed", "shut", ""]),
    "ldconfig": st.one_of(_PATHS, st.integers()),
    "probe_cache_ttl": st.one_of(st.integers(-5, 100), st.floats(allow_nan=True, allow_infinity=True),
                                 st.booleans(), st.just("10")),
    "share": st.sampled_from(["all", "unallocated", "some", ""]),
    "mps_pipe_dir": _PATHS,
    "nvidia_driver_root": _PATHS,
    "bogus": st.integers(),
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=_VALUES))
def test_a_valid_file_is_read_as_it_is_and_an_invalid_key_falls_back_to_its_default(data):
    import tomlkit

    text = tomlkit.dumps(data)
    conf, errors = cfg.parse(text)
    bad = {e.partition(":")[0] for e in errors}
    assert bad <= set(data), (text, errors)  # every error names a key of the file
    for key, value in data.items():
        if key in bad:
            assert key == "bogus" or getattr(conf, key) == cfg.Config._defaults[key], (text, errors)
        else:
            assert getattr(conf, key) == value, text


# -- where the node config and the real runtime are ------------------------------------------

def test_the_config_path_is_the_environments_or_the_default(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUHOOK_CONFIG", raising=False)
    assert cfg.config_path() == cfg.DEFAULT_PATH
    assert cfg.node_config_path("/") == cfg.DEFAULT_PATH
    # the DaemonSet: the node's / under /host, its config file there (links resolved inside it)
    host = tmp_path / "host"
    (host / cfg.DEFAULT_PATH.lstrip("/")).parent.mkdir(parents=True)
    assert cfg.node_config_path(str(host)) == str(host) + cfg.DEFAULT_PATH
    monkeypatch.setenv("GPUHOOK_CONFIG", str(tmp_path / "mine.toml"))
    assert cfg.config_path() == str(tmp_path / "mine.toml")
    assert cfg.node_config_path(str(host)) == str(tmp_path / "mine.toml")
    monkeypatch.setenv("GPUHOOK_CONFIG", "")
    assert cfg.config_path() == cfg.DEFAULT_PATH


def _exe(path, body="#!/bin/sh\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def test_find_runtime_takes_the_named_one_then_runc_then_crun(monkeypatch, tmp_path):
    """runtime = a path (used when it is an executable file) or a name looked up on PATH;
    unset: runc, else crun. A directory or a file that cannot be run is skipped."""
    a, b = tmp_path / "a", tmp_path / "b"
    crun = _exe(b / "crun")
    (a / "runc").mkdir(parents=True)  # a directory named runc: not a runtime
    (b / "runc").write_text("not executable")
    monkeypatch.setenv("PATH", f"{a}:{b}")
    assert cfg.find_runtime(None) == crun
    runc = _exe(tmp_path / "c" / "runc")
    monkeypatch.setenv("PATH", f"{a}:{b}:{tmp_path / 'c'}")
    assert cfg.find_runtime(None) == runc  # runc before crun, wherever on PATH
    assert cfg.find_runtime("crun") == crun
    assert cfg.find_runtime(str(tmp_path / "c" / "runc")) == runc
    assert cfg.find_runtime(str(a / "runc")) is None  # the directory
    assert cfg.find_runtime(str(b / "runc")) is None  # not executable
    assert cfg.find_runtime(str(tmp_path / "none")) is None
    assert cfg.find_runtime("youki") is None


def test_find_runtime_empty_path_entries_are_the_working_directory(monkeypatch, tmp_path):
    runc = _exe(tmp_path / "runc")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", ":/nonexistent")
    assert cfg.find_runtime(None) == os.path.join(".", "runc") and os.path.samefile(cfg.find_runtime(None), runc)
    monkeypatch.delenv("PATH")
    found = cfg.find_runtime(None)
    assert found is None or (os.path.dirname(found) in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"))
