"""Fuzzing of everything that parses input gpuhook does not control: the spec editor and the
whole config.json read (hostile spec shapes), the argument parser, the ld.so.cache parser,
every probe file parser, the JSON layer, the node config. No exception escapes but the ones
each documents (SpecError, LdCacheError, ValueError), and the input is never modified.

hypothesis runs in every `make test`; atheris (coverage-guided, the `test` extra on Linux
x86_64) runs each target for a few seconds in a subprocess: `python tests/hardening/test_fuzz.py TARGET
-max_total_time=N` runs one by hand for longer.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fakes import bundle, fakehost
from gpuhook import config as gconfig, fastjson  # noqa: E402
from gpuhook.runtime import args as runtime_args, create  # noqa: E402
from gpuhook.edits import DeviceNode, Edits, Hook, Mount  # noqa: E402
from gpuhook.inventory import VendorInventory  # noqa: E402
from gpuhook.probe import amd, common, drm, ldcache, nvidia  # noqa: E402
from gpuhook.probe.host import Host  # noqa: E402
from gpuhook.spec import SpecError, apply, check  # noqa: E402

FIXTURE_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "nvidia-ctk-rootfs-1",
                             "etc", "ld.so.cache")

EDITS = Edits(
    env=("GPUHOOK_ACCELERATOR=nvidia", "GPUHOOK_DEVICES=nvidia:GPU-1"),
    device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0, "rwm", 0o666, 0, 0), DeviceNode("/dev/nvidiactl", "c", 195, 255)),
    mounts=(Mount("/host/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1"),),
    hooks=(Hook("createContainer", "/bin/sh", ("sh", "-c", "true"), ("PATH=/bin",), 30),),
    additional_gids=(44,),
)

any_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)  # surrogates too
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                      any_text)
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(any_text, c, max_size=3),
                          max_leaves=10)
# every place of a spec that gpuhook reads or edits, and a few of their items
SPEC_PATHS = [("process",), ("process", "env"), ("process", "env", 0), ("process", "user"),
              ("process", "user", "additionalGids"), ("root",), ("root", "path"), ("annotations",),
              ("annotations", "gpuhook.dev/inject"), ("annotations", "gpuhook.dev/vendors"),
              ("annotations", "gpuhook.dev/max-gpus"), ("annotations", "io.kubernetes.cri.container-type"),
              ("linux",), ("linux", "devices"), ("linux", "devices", 0), ("linux", "resources"),
              ("linux", "resources", "devices"), ("linux", "resources", "devices", 0), ("mounts",),
              ("mounts", 0), ("hooks",), ("hooks", "createContainer"), ("hooks", "prestart")]
mutations = st.lists(st.tuples(st.sampled_from(SPEC_PATHS), json_value), max_size=4)


def hostile_spec(muts) -> dict:
    """A runc spec with values of any type put at places gpuhook reads or edits."""
    spec = bundle.spec(["sh"], annotations={"a": "b"})
    spec["linux"]["devices"] = [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]
    spec["hooks"] = {"prestart": [{"path": "/bin/true"}]}
    for path, value in muts:
        node = spec
        for key in path[:-1]:
            if isinstance(node, dict) and isinstance(node.get(key), (dict, list)):
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                node = None
                break
        if isinstance(node, dict):
            node[path[-1]] = value
        elif isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node):
            node[path[-1]] = value
    return spec


# -- the spec editor ------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(mutations)
def test_apply_on_hostile_specs(muts):
    """apply() returns a spec or raises SpecError, never modifies its input, and what it
    returns passes check(), is idempotent and serialises."""
    spec = hostile_spec(muts)
    before = copy.deepcopy(spec)
    try:
        out = apply(spec, EDITS)
    except SpecError:
        assert spec == before
        return
    assert spec == before
    check(out)
    assert apply(out, EDITS) == out
    assert json.loads(fastjson.dumps(out)) == out


@settings(max_examples=300, deadline=None)
@given(json_value)
def test_check_raises_only_spec_error(value):
    """Any JSON: check passes it or raises SpecError, whose message is one line saying what."""
    try:
        check(value if isinstance(value, dict) else {"process": value})
    except SpecError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))


@pytest.fixture(scope="module")
def fake_node():
    with tempfile.TemporaryDirectory() as d:
        fakehost.build(os.path.join(d, "host"), "nvidia", mknod=False)
        yield d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(muts=mutations)
def test_whole_config_json_read_on_hostile_specs(fake_node, muts, monkeypatch):
    """The create path's own reading (runtime/create.py edit_bundle: JSON, checks, planner, editor,
    write) on hostile specs on an 8-GPU node: it either writes a spec that passes check()
    or fails on a ValueError/OSError (fail open) with config.json untouched; no other exception
    (a TypeError in some reader) is what it failed on."""
    from gpuhook import inject

    raised: list[BaseException] = []
    real_text = inject.error_text

    def error_text(e):
        raised.append(e)
        return real_text(e)

    monkeypatch.setenv("GPUHOOK_CACHE_DIR", os.path.join(fake_node, "cache"))
    b = os.path.join(fake_node, "b")
    os.makedirs(os.path.join(b, "rootfs"), exist_ok=True)
    path = os.path.join(b, "config.json")
    raw = json.dumps(hostile_spec(muts)).encode()
    with open(path, "wb") as f:
        f.write(raw)
    conf = gconfig.Config(host_root=os.path.join(fake_node, "host"), log_file="")
    with pytest.MonkeyPatch.context() as m:  # each example's own: hypothesis runs many in one test
        m.setattr(inject, "error_text", error_text)
        decision = create.edit_bundle(b, conf, [], runtime_args.Call(os.environ, b))
    if decision.decision == inject.ERROR:
        assert len(raised) == 1 and isinstance(raised[0], (ValueError, OSError)), raised
        with open(path, "rb") as f:
            assert f.read() == raw
        return
    with open(path, "rb") as f:
        check(json.loads(f.read()))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fastjson_raises_only_value_error(data):
    """Any bytes: ValueError, or the value the json module reads from them."""
    try:
        value = fastjson.loads(data)
    except ValueError:
        return
    assert value == json.loads(data)


CLEAN_CHECK = r"""
import sys
sys.path.insert(0, sys.argv[1])
from gpuhook import fastjson
assert "json" not in sys.modules and "json.decoder" not in sys.modules
bad = []
for line in open(sys.argv[2], "rb").read().split(b"\n\0\n"):
    try:
        fastjson.loads(line)
    except ValueError:
        pass
    except BaseException as e:
        bad.append(f"{line[:60]!r}: {type(e).__name__}: {e}")
print("\n".join(bad[:10]))
sys.exit(1 if bad else 0)
"""


def test_fastjson_raises_only_value_error_in_a_bare_interpreter(tmp_path):
    """The wrapper's interpreter never imports `json` (its regexes cost ~15 ms). There _json
    reports most syntax errors as SystemError (it raises json.decoder.JSONDecodeError only
    once json.decoder is imported): fastjson must still raise ValueError, or a torn cache file
    crashes every create. Checked in a bare `python -S -E -s`, over mutated documents."""
    import random

    rng = random.Random(7)
    docs = [json.dumps(bundle.spec(["sh"], annotations={"a": "b"})), '{"key": [1, 2], "config": {}}', "[[[9]]]"]
    inputs = ["[[[9]", '{"a" 1}', '"abc', "[1 2]", '{"a":1,}', "", " ", "{", "nul", "-", "[1e999]", '"\\ud800"']
    for _ in range(3000):
        s = list(rng.choice(docs))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(s) + 1)
            op = rng.random()
            if op < 0.4 and i < len(s):
                del s[i]
            elif op < 0.8:
                s.insert(i, rng.choice('[]{}",: 0123456789.eE-+tfnu\\'))
            else:
                del s[i:]
        inputs.append("".join(s))
    data = tmp_path / "inputs"
    data.write_bytes(b"\n\0\n".join(x.encode("utf-8", "surrogatepass") for x in inputs))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-S", "-E", "-s", "-c", CLEAN_CHECK, repo, str(data)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# -- the argument parser --------------------------------------------------------------------

flag_words = st.sampled_from(["create", "run", "start", "state", "--root", "--log", "--log-format", "-b", "--bundle",
                              "--bundle=", "-bundle", "--pid-file", "--console-socket", "--preserve-fds", "--", "-",
                              "--systemd-cgroup", "-d", "json", "/b", "rel/b", ""])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(flag_words, any_text), max_size=12))
def test_parse_args_never_raises(argv):
    inv = runtime_args.parse_args(argv)
    if inv.command in ("create", "run"):
        assert isinstance(inv.bundle, str) and inv.bundle.startswith("/")


# -- ld.so.cache ----------------------------------------------------------------------------

def _real_cache() -> bytes:
    with open(FIXTURE_CACHE, "rb") as f:
        return f.read()


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_ldcache_parse_on_mutated_real_cache(data):
    """A real cache with bytes flipped, cut or inserted: entries or LdCacheError."""
    raw = bytearray(_real_cache())
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        i = data.draw(st.integers(0, len(raw)))
        if op == "flip" and i < len(raw):
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i:]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        entries = ldcache.parse(bytes(raw))
    except ldcache.LdCacheError:
        return
    found = ldcache.lookup(entries)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()), found


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"", b"glibc-ld.so.cache1.1", b"ld.so-1.7.0\0"]), st.binary(max_size=400))
def test_ldcache_parse_raises_only_ldcache_error(prefix, body):
    """Any bytes after a magic (or none): LdCacheError, or name -> path strings."""
    try:
        found = ldcache.lookup(ldcache.parse(prefix + body))
    except ldcache.LdCacheError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()), found


# -- probe file parsers ---------------------------------------------------------------------

class TextHost(Host):
    """A Host whose files are given as text."""

    def __init__(self, files: dict[str, str]) -> None:
        super().__init__("/nonexistent-gpuhook-fuzz-root")
        self.files = files

    def read_text(self, path, limit=1 << 20, quiet=False):
        return self.files.get(path)


probe_text = st.one_of(
    any_text,
    st.lists(st.one_of(any_text, st.sampled_from([
        "Character devices:", "Block devices:", "195 nvidia-frontend", "  1 mem", "510 nvidia-uvm", "226 drm",
        "Device Minor: \t 3", "GPU UUID: \t GPU-1", "Model: \t H100", "GPU Excluded: \t Yes",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu", "NVRM version: 1.2.3",
        "simd_count 416", "drm_render_minor 128", "location_id 17152", "domain 0", "DRIVER=amdgpu",
        "PCI_ID=1002:740F", "PCI_SLOT_NAME=0000:43:00.0", "226:128", "²:٣", "-1 x", "99999999999999999999999 big"])),
        max_size=12).map("\n".join),
)


@settings(max_examples=400, deadline=None)
@given(probe_text)
def test_probe_text_parsers_never_raise(text):
    info = nvidia.parse_information(text)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
    version = nvidia.parse_version(text)
    assert version is None or all(p.isascii() and p.isdigit() for p in version.split("."))
    props = amd.parse_properties(text)
    assert all(isinstance(v, int) for v in props.values())
    dev = common.parse_dev(text)
    assert dev is None or all(isinstance(x, int) and x >= 0 for x in dev)
    host = TextHost({"/proc/devices": text, "/sys/x/uevent": text})
    majors = common.char_majors(host)
    assert all(isinstance(m, int) and m >= 0 for ms in majors.values() for m in ms)
    assert all(isinstance(v, str) for v in common.uevent(host, "/sys/x/uevent").values())
    drm.node_number(text)
    common.is_uint(text)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.sampled_from(["/proc/devices", "/proc/driver/nvidia/version",
                                        "/proc/driver/nvidia/gpus/0000:18:00.0/information",
                                        "/sys/class/kfd/kfd/topology/nodes/1/properties", "/sys/class/kfd/kfd/dev",
                                        "/sys/class/kfd/kfd/topology/nodes/1/gpu_id"]), probe_text, max_size=6))
def test_vendor_probes_on_hostile_files(files):
    """The NVIDIA and AMD probes on a host whose /proc and /sys files are anything: an
    inventory or None, never an exception."""
    with tempfile.TemporaryDirectory() as d:
        for path, text in files.items():
            full = d + path
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
        for mod in (nvidia, amd):
            inv = mod.probe(Host(d))
            assert inv is None or isinstance(inv, VendorInventory), inv


# -- the node config ------------------------------------------------------------------------

toml_text = st.one_of(any_text, st.lists(st.one_of(any_text, st.sampled_from([
    'runtime = "runc"', "runtime = 5", 'fail_mode = "closed"', 'fail_mode = "maybe"', "probe_cache_ttl = nan",
    "probe_cache_ttl = -1", "probe_cache_ttl = inf", 'host_root = "relative"', 'log_file = "/x\\u0000y"',
    '[policy]', 'x = [', ']', 'runtime = """', '"""', "share = 1", 'mps_pipe_dir = "/../x"'])), max_size=8).map("\n".join))


@settings(max_examples=300, deadline=None)
@given(toml_text)
def test_node_config_parse_never_raises(text):
    conf, errors = gconfig.parse(text)
    assert all(isinstance(e, str) for e in errors)
    for key in ("runtime", "host_root", "log_file", "ldconfig"):
        value = getattr(conf, key)
        assert value is None or (isinstance(value, str) and "\0" not in value)
    assert conf.fail_mode in gconfig.FAIL_MODES
    assert 0 <= conf.probe_cache_ttl < float("inf")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300) | toml_text.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_node_config_load_never_raises(data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.toml")
        with open(path, "wb") as f:
            f.write(data)
        old = os.environ.get("GPUHOOK_CACHE_DIR")
        os.environ["GPUHOOK_CACHE_DIR"] = os.path.join(d, "cache")
        try:
            conf, errors = gconfig.load(path)
            again = gconfig.load(path)  # through the cache
        finally:
            if old is None:
                os.environ.pop("GPUHOOK_CACHE_DIR", None)
            else:
                os.environ["GPUHOOK_CACHE_DIR"] = old
        assert again == (conf, errors)


# -- atheris (coverage-guided) --------------------------------------------------------------

# The driver runs in its own interpreter, with only gpuhook instrumented (instrumenting pytest
# and hypothesis too would take a minute before the first input).
ATHERIS_DRIVER = r"""
import copy, sys
import atheris

with atheris.instrument_imports(include=["gpuhook"]):
    from gpuhook import config as gconfig, fastjson
    from gpuhook.runtime import args as runtime_args
    from gpuhook.edits import DeviceNode, Edits, Hook, Mount
    from gpuhook.probe import amd, common, drm, ldcache, nvidia
    from gpuhook.probe.host import Host
    from gpuhook.spec import SpecError, apply, check

EDITS = Edits(env=("GPUHOOK_ACCELERATOR=nvidia",), device_nodes=(DeviceNode("/dev/nvidia0", "c", 195, 0),),
              mounts=(Mount("/h/libcuda.so.1", "/usr/lib/libcuda.so.1"),),
              hooks=(Hook("createContainer", "/bin/sh", ("sh",), ("PATH=/bin",), 30),), additional_gids=(44,))


class TextHost(Host):
    def __init__(self, files):
        super().__init__("/nonexistent-gpuhook-fuzz-root")
        self.files = files

    def read_text(self, path, limit=1 << 20, quiet=False):
        return self.files.get(path)


def ldcache_target(data):
    try:
        ldcache.lookup(ldcache.parse(data))
    except ldcache.LdCacheError:
        pass


def json_spec_target(data):
    try:
        spec = fastjson.loads(data)
    except ValueError:
        return
    if not isinstance(spec, dict):
        return
    before = copy.deepcopy(spec)
    try:
        out = apply(spec, EDITS)
    except SpecError:
        assert spec == before
        return
    assert spec == before
    check(out)
    fastjson.dumps(out)


def args_target(data):
    runtime_args.parse_args([a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")])


def probe_text_target(data):
    text = data.decode("utf-8", "replace")
    nvidia.parse_information(text)
    nvidia.parse_version(text)
    amd.parse_properties(text)
    common.parse_dev(text)
    host = TextHost({"/proc/devices": text, "/u": text})
    common.char_majors(host)
    common.uevent(host, "/u")
    drm.node_number(text)


def config_target(data):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    conf, errors = gconfig.parse(text)
    assert conf.fail_mode in gconfig.FAIL_MODES


TARGETS = {"ldcache": ldcache_target, "json-spec": json_spec_target, "args": args_target,
           "probe-text": probe_text_target, "config": config_target}
target = TARGETS[sys.argv.pop(1)]
atheris.Setup(sys.argv, target)
atheris.Fuzz()
"""
ATHERIS_TARGETS = ("ldcache", "json-spec", "args", "probe-text", "config")
ATHERIS_SECONDS = 1

try:
    import atheris  # noqa: F401
    HAVE_ATHERIS = True
except ImportError:
    HAVE_ATHERIS = False


@pytest.mark.skipif(not HAVE_ATHERIS, reason="atheris is not installed (the test extra installs it on Linux x86_64)")
@pytest.mark.parametrize("target", ATHERIS_TARGETS)
def test_atheris(target, tmp_path):
    seeds = tmp_path / "corpus"
    seeds.mkdir()
    if target == "ldcache":
        (seeds / "real").write_bytes(_real_cache())
    elif target == "json-spec":
        (seeds / "spec").write_bytes(json.dumps(bundle.spec(["sh"], annotations={"a": "b"})).encode())
    elif target == "args":
        (seeds / "shim").write_bytes(b"\0".join([b"--root", b"/r", b"--log", b"/b/log.json", b"create",
                                                 b"--bundle", b"/b", b"--pid-file", b"/b/pid", b"id"]))
    driver = tmp_path / "driver.py"
    driver.write_text(ATHERIS_DRIVER)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    r = subprocess.run([sys.executable, str(driver), target, f"-max_total_time={ATHERIS_SECONDS}",
                        "-rss_limit_mb=2048", f"-artifact_prefix={tmp_path}/", str(seeds)],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, errors="replace", timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "Done" in r.stderr, r.stderr[-2000:]


if __name__ == "__main__":  # python tests/hardening/test_fuzz.py TARGET [libFuzzer flags]: one target, by hand
    exec(compile(ATHERIS_DRIVER, "atheris-driver", "exec"))
