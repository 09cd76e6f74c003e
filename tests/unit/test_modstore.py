"""The host bundle's module store (gpuhook/modstore.py, written by install/build.py, read by
gpuhook/startup.py): a real create on an 8-GPU host imports every gpuhook module it runs from
the store, a store that is not right (another interpreter's, cut short, garbage, one bad
module) costs only plain imports, and the store is the same bytes for the same modules."""

from __future__ import annotations

import ast
import compileall
import json
import os
import py_compile
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, is_root
from gpuhook import defaults, modstore
from gpuhook.install import build
from gpuhook.testing import bundle, fakehost

# the front's entry, with os.execv first made to say which modules came from where (the
# real runtime then runs as usual)
PROBE = """
import os, sys
_execv = os.execv
def execv(path, args):  # (repr, not json: json would import what the test looks for)
    with open(os.environ["GPUHOOK_TEST_MODULES"], "w") as f:
        f.write(repr({n: type(getattr(m, "__loader__", None)).__name__ for n, m in sys.modules.items()}))
    with open(os.environ["GPUHOOK_TEST_MODULES"] + ".json-file", "w") as f:
        f.write(getattr(sys.modules.get("_json"), "__file__", ""))
    with open(os.environ["GPUHOOK_TEST_MODULES"] + ".gc", "w") as f:
        f.write(str(__import__("gc").isenabled()))
    _execv(path, args)
os.execv = execv
"""
# the modules the entry imports before the store is there
BEFORE_STORE = {"gpuhook", "gpuhook.startup", "gpuhook.modstore"}


# this interpreter's _json, when it is an extension module (the store says where it is)
JSON_EXT = getattr(__import__("_json"), "__file__", None)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """gpuhook as the bundle has it: lib/python3.X/site-packages, its unchecked-hash .pyc
    files, _json in lib-dynload beside it, the store (build.write_store, as build() writes it)."""
    site = str(tmp_path_factory.mktemp("bundle") / "lib" / "python3" / "site-packages")
    if JSON_EXT:
        os.makedirs(os.path.join(site, "..", "lib-dynload"))
        shutil.copy(JSON_EXT, os.path.join(site, "..", "lib-dynload", os.path.basename(JSON_EXT)))
    shutil.copytree(os.path.join(REPO, "gpuhook"), os.path.join(site, "gpuhook"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    assert compileall.compile_dir(site, quiet=2, workers=0,
                                  invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    build.write_store(site)
    return site


@pytest.fixture(scope="module")
def host(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("host"))
    fakehost.nvidia(fakehost.FakeHost(root, mknod=is_root()), gpus=8)
    return root


def create(tmp_path, site: str, host: str, cid: str = "c1", cache: str | None = None) -> tuple[dict, dict]:
    """One create through the front's entry: ({module: its loader's class}, the log record)."""
    b = tmp_path / f"bundle-{cid}"
    bundle.make_bundle(str(b), ["true"])
    cfg = tmp_path / "config.toml"
    log = tmp_path / "gpuhook.log"
    text = f'runtime = "/bin/true"\nhost_root = "{host}"\nlog_file = "{log}"\n'
    if not cfg.exists() or cfg.read_text() != text:  # the same file: the config cache holds
        cfg.write_text(text)
    mods = tmp_path / f"modules-{cid}.json"
    env = {"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg), "GPUHOOK_TEST_MODULES": str(mods),
           "GPUHOOK_CACHE_DIR": cache or str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE + defaults.RUNTIME_MAIN, site, "create",
                        "--bundle", str(b), cid], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stderr, r.stderr
    record = [json.loads(line) for line in log.read_text().splitlines()][-1]
    assert record["container_id"] == cid
    loaders = ast.literal_eval(mods.read_text())
    loaders["_json file"] = open(str(mods) + ".json-file").read()
    assert open(str(mods) + ".gc").read() == "False"  # startup.py: no collector passes in a create
    return loaders, record


def test_a_create_imports_only_modules_the_store_serves(tmp_path, site, host):
    # cold (no config or probe cache yet: tomllib and the vendor modules run too), then warm
    for cid in ("cold", "warm"):
        loaders, record = create(tmp_path, site, host, cid, cache=str(tmp_path / "cache"))
        assert record["decision"] == "injected" and len(record["devices"]) == 8, record
        if cid == "cold":
            assert {"gpuhook.probe.nvidia", "tomllib"} <= set(loaders)
        else:  # and none of the stdlib modules that cost time at import
            dear = {"__future__", "re", "typing", "json", "enum", "tomllib", "datetime"} & set(loaders)
            assert not dear, f"a warm create imported {sorted(dear)}"
            assert "gpuhook.log" not in loaders  # (structlog's side: the runtime has utc_now)
        if JSON_EXT:  # found where the store says, loaded as a plain import loads it
            assert loaders["_json"] == "ExtensionFileLoader"
            assert loaders["_json file"] == os.path.join(os.path.dirname(site), "lib-dynload",
                                                         os.path.basename(JSON_EXT))
        loaders = {n: kind for n, kind in loaders.items() if n.startswith("gpuhook")}
        plain = {n: kind for n, kind in loaders.items() if kind != "Store" and n not in BEFORE_STORE}
        assert not plain, f"imported by a create, not served by the store: {plain}"
        assert {n for n, kind in loaders.items() if kind == "Store"} <= set(build.store_modules(site))


def test_the_store_holds_no_front_end(site):
    names = set(build.store_modules(site))
    assert {"gpuhook.runtime", "gpuhook.plan", "gpuhook.probe.nvidia"} <= names
    assert not [n for n in names if n.split(".")[1:2] and n.split(".")[1] in modstore.FRONT_ENDS]
    assert not [n for n in names if n.endswith("__main__")]


def _served(loaders: dict) -> set[str]:
    return {n for n, kind in loaders.items() if kind == "Store" and n.startswith("gpuhook")}


@pytest.mark.parametrize("damage", ["magic", "cut", "garbage", "empty", "missing", "one module", "no _json"])
def test_a_store_that_is_not_right_means_plain_imports(damage, tmp_path, site, host):
    shutil.copytree(os.path.dirname(site), str(tmp_path / "lib"), symlinks=True)
    other = str(tmp_path / "lib" / os.path.basename(site))
    store = os.path.join(other, "gpuhook", modstore.FILE)
    data = open(store, "rb").read()
    if damage == "magic":  # another interpreter's
        data = bytes([data[0] ^ 0xFF]) + data[1:]
    elif damage == "cut":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = data[:8] + b"\xff" * (len(data) - 8)
    elif damage == "empty":
        data = b""
    elif damage == "one module":  # gpuhook.plan's code is no code any more
        name, kind, rel, pyc, offset, length = next(line.split(" ") for line in data[8:].decode("ascii", "replace")
                                              .splitlines() if line.startswith("gpuhook.plan "))
        start = 8 + int.from_bytes(data[4:8], "little") + int(offset)
        data = data[:start] + b"\x00" * int(length) + data[start + int(length):]
    if damage == "no _json":  # where the store says it is: plain imports find another
        if not JSON_EXT:
            pytest.skip("this interpreter's _json is built in")
        os.unlink(os.path.join(tmp_path, "lib", "lib-dynload", os.path.basename(JSON_EXT)))
    elif damage == "missing":
        os.unlink(store)
    else:
        with open(store, "wb") as f:
            f.write(data)
    loaders, record = create(tmp_path, other, host, "c-" + damage.replace(" ", "-"))
    assert record["decision"] == "injected", record
    if damage == "one module":
        assert loaders["gpuhook.plan"] == "SourceFileLoader" and "gpuhook.plan.policy" in _served(loaders)
    elif damage == "no _json":
        assert loaders["_json file"] == JSON_EXT and "gpuhook.plan" in _served(loaders)
    else:
        assert not _served(loaders)
        assert loaders["gpuhook.runtime"] == "SourceFileLoader"


def test_served_modules_are_the_ones_a_plain_import_loads(site):
    """The same __file__, __path__ and __cached__, and the .pyc's very code."""
    code = (f"import sys; sys.path.insert(0, {site!r}); from gpuhook import modstore; "
            f"s = modstore.read({site!r} + '/gpuhook/' + modstore.FILE, {os.path.dirname(site)!r}) "
            "if sys.argv[1] == 'store' else None; "
            "s and sys.meta_path.insert(0, s); import json, gpuhook.plan, gpuhook.probe.cache; "
            "print(json.dumps([[m.__file__, getattr(m, '__path__', None), m.__cached__, m.__spec__.origin, "
            "m.__spec__.parent, type(m.__loader__).__name__, m.plan.__code__.co_filename if hasattr(m, 'plan') "
            "else None] for m in (gpuhook.plan, gpuhook.probe.cache)]))")
    runs = {how: json.loads(subprocess.run([sys.executable, "-I", "-S", "-c", code, how], capture_output=True,
                                           text=True, check=True).stdout) for how in ("store", "plain")}
    assert [m[-2] for m in runs["store"]] == ["Store", "Store"]
    assert [m[-2] for m in runs["plain"]] == ["SourceFileLoader", "SourceFileLoader"]
    assert [m[:-2] + m[-1:] for m in runs["store"]] == [m[:-2] + m[-1:] for m in runs["plain"]]


def test_the_store_is_the_same_bytes_for_the_same_modules(tmp_path, site):
    store = os.path.join(site, "gpuhook", modstore.FILE)
    first = open(store, "rb").read()
    build.write_store(site)
    assert open(store, "rb").read() == first
    # its code is the .pyc files' own
    import importlib.util

    path = os.path.join(site, "gpuhook", "plan", "__init__.py")
    pyc = open(importlib.util.cache_from_source(path), "rb").read()
    assert pyc[16:] in first


def test_python_m_gpuhook_runtime_needs_no_store(tmp_path, host):
    b = tmp_path / "b"
    bundle.make_bundle(str(b), ["true"])
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'runtime = "/bin/true"\nhost_root = "{host}"\nlog_file = "{tmp_path}/log"\n')
    r = subprocess.run([sys.executable, "-m", "gpuhook.runtime", "create", "--bundle", str(b), "m1"], cwd=REPO,
                       env={"PATH": "/usr/bin:/bin", "GPUHOOK_CONFIG": str(cfg),
                            "GPUHOOK_CACHE_DIR": str(tmp_path / "cache")}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(open(f"{tmp_path}/log").read().splitlines()[-1])["decision"] == "injected"
