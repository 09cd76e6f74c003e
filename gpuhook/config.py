"""Node config, /etc/gpuhook/config.toml (GPUHOOK_CONFIG overrides the path).

Read with the stdlib tomllib, into a plain record. A missing file means the defaults; an
invalid one means the defaults plus the errors (which the caller logs): never a node where
no container can start.

tomllib pulls in re, typing, datetime and string: ~20 ms on a slow node, on every container
start. So the parsed result is cached as JSON in /run/gpuhook (GPUHOOK_CACHE_DIR), keyed by
the file's path, inode, size, mtime and ctime: the file is parsed again as soon as it
changes, and a cache that cannot be written or read only costs the parse. The rules of the keys
are written once, here (from_dict): the runtime falls back on the default of each key that
breaks one, and `gpuhook config check` (check) prints the same errors for people.

The C front (runtime/gpuhook-runtime.c) parses no TOML: beside the cache, each load leaves it
the front file (front_text), what Python decided of the keys the front acts on, and the
config file's identity (dev, inode, size, mtime, ctime) it was decided from. The front uses it
only when it is current and gpuhook's own; otherwise it leaves every decision to Python.
"""

import os
from .probe.driverroot import AUTO as NVIDIA_DRIVER_ROOT_AUTO
from . import defaults
from .record import Record

DEFAULT_PATH = defaults.CONFIG_FILE
CONFIG_ENV = "GPUHOOK_CONFIG"  # the node config's path, when set
CACHE_DIR_ENV = "GPUHOOK_CACHE_DIR"  # the cache dir, when set
FAIL_MODES = ("open", "closed")
# the front file: its first field, then NAME=VALUE fields, each ended by a NUL (no value holds
# one: from_dict refuses them); FRONT_KEYS are the config's keys the front acts on
FRONT_MAGIC = "gpuhook-front 1"
FRONT_KEYS = ("runtime", "host_root", "log_file", "fail_mode")
FRONT_IDENTITY = "config"  # the field of the config file's identity
FRONT_ERRORS = "errors"  # the field that says whether the file had errors ("1") or not ("0")
# the real runtime when the node config names none: the first of these found on PATH
DEFAULT_RUNTIMES = ("runc", "crun")
MAX_FRONT_BYTES = 16 << 10
MAX_CONFIG_BYTES = 1 << 20  # a node config is a few hundred bytes; a larger one is refused whole, never read cut


SHARE_MODES = ("all", "unallocated")
# GPUs the kubelet's device manager allocated to other pods (its checkpoint) are held back
# unless the node says share = "all"; a node without device plugins has no checkpoint and
# gives every GPU either way.
DEFAULT_SHARE = "unallocated"
# MPS is opt-in: the pipe directory is mounted read-write into every container that gets
# compute, so only one the node names (NVIDIA's device plugin with MPS sharing, as the GPU
# Operator runs it: <MPS_ROOT>/<resource>/pipe, /run/nvidia/mps/nvidia.com/gpu/pipe; or the
# daemon's own CUDA_MPS_PIPE_DIRECTORY), and only while no non-root user can write or swap it
# (plan/trusted.py). NVIDIA's default, /tmp/nvidia-mps, is under a world-writable /tmp.
MPS_PIPE_DIR = ""


class Config(Record):
    """runtime: the real OCI runtime, a name on PATH or a path (None: first of runc, crun).
    host_root: where the node's / is (tests and dry runs point it at a fake host).
    log_file: one JSON line per create ("" disables). fail_mode: open | closed.
    ldconfig: the node's ldconfig for the ld-cache hook (None: found on the node).
    probe_cache_ttl: seconds a probe result may be reused (probe/cache.py); 0 disables.
    share: unallocated (the default: GPUs the kubelet allocated to other pods are never given)
    | all (every GPU, allocated or not).
    mps_pipe_dir: the node's NVIDIA MPS control daemon pipe directory, mounted into containers
    that get compute while it is root's and nobody else can write it ("": no MPS, the default).
    nvidia_driver_root: where the NVIDIA driver's userspace is: "auto" (the host, the GPU
    Operator's /run/nvidia/driver, GKE's /home/kubernetes/bin/nvidia) or one node path.
    vendor_label: the node label the agent sets to the primary vendor, as
    gpuhook.dev/accelerator (default gpu.type; "" turns it off): a label key, not under
    gpuhook.dev/, kubernetes.io or k8s.io (valid_vendor_label).
    nri_runtime_handler: the runtime handler whose pods `gpuhook nri` adjusts (default gpu-optional)."""

    runtime: "str | None" = None
    host_root: str = "/"
    log_file: str = defaults.LOG_FILE
    fail_mode: str = "open"
    ldconfig: "str | None" = None
    probe_cache_ttl: float = 10.0
    share: str = DEFAULT_SHARE
    mps_pipe_dir: str = MPS_PIPE_DIR
    nvidia_driver_root: str = NVIDIA_DRIVER_ROOT_AUTO
    vendor_label: str = defaults.VENDOR_LABEL
    nri_runtime_handler: str = defaults.RUNTIME_HANDLER

    __slots__ = ()


_TYPES: "dict[str, type | tuple[type, ...]]" = {
    "runtime": str,
    "host_root": str,
    "log_file": str,
    "fail_mode": str,
    "ldconfig": str,
    "probe_cache_ttl": (int, float),
    "share": str,
    "mps_pipe_dir": str,
    "nvidia_driver_root": str,
    "vendor_label": str,
    "nri_runtime_handler": str,
}


def config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_PATH


def parse(text: str) -> "tuple[Config, list[str]]":
    import tomllib

    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as e:
        return Config(), [f"invalid TOML: {str(e)[:200] or type(e).__name__}"]
    return from_dict(data)


def check(text: str) -> "list[str]":
    """Every problem of a config file's text, one line each ("key: what is wrong, and what
    the runtime uses instead"); [] when valid: `gpuhook config check`."""
    return parse(text)[1]


def from_dict(data: dict) -> "tuple[Config, list[str]]":
    errors: list[str] = []
    values: dict = {}
    for key, value in data.items():
        want = _TYPES.get(key)
        if want is None:
            errors.append(f"{key}: unknown key, ignored")
        elif not isinstance(value, want) or isinstance(value, bool):
            kind = "a string" if want is str else "a number"
            errors.append(f"{key}: expected {kind}, got {type(value).__name__}; default used")
        elif isinstance(value, str) and "\0" in value:  # no path or name holds one; os.* raise on it
            errors.append(f"{key}: contains a NUL character; default used")
        elif isinstance(value, float) and not abs(value) < float("inf"):  # TOML has nan and inf
            errors.append(f"{key}: {value} is not a finite number; default used")
        else:
            values[key] = value
    if values.get("fail_mode", "open") not in FAIL_MODES:
        errors.append(f"fail_mode: {values.pop('fail_mode')!r} is not one of open, closed; 'open' used")
    if values.get("probe_cache_ttl", 0) < 0:
        errors.append(f"probe_cache_ttl: {values.pop('probe_cache_ttl')} is negative; default used")
    if "host_root" in values and not values["host_root"].startswith("/"):
        errors.append(f"host_root: {values.pop('host_root')!r} is not an absolute path; '/' used")
    if values.get("share", DEFAULT_SHARE) not in SHARE_MODES:
        errors.append(f"share: {values.pop('share')!r} is not one of {', '.join(SHARE_MODES)}; {DEFAULT_SHARE!r} used")
    if values.get("mps_pipe_dir") and not is_clean_abspath(values["mps_pipe_dir"]):
        errors.append(f"mps_pipe_dir: {values.pop('mps_pipe_dir')!r} is not a normal absolute path; MPS not mounted")
    if "nvidia_driver_root" in values and not valid_driver_root(values["nvidia_driver_root"]):
        errors.append(
            f"nvidia_driver_root: {values.pop('nvidia_driver_root')!r} is not "
            f"{NVIDIA_DRIVER_ROOT_AUTO!r} or a normal absolute path; {NVIDIA_DRIVER_ROOT_AUTO!r} used"
        )
    if "vendor_label" in values and not valid_vendor_label(values["vendor_label"]):
        errors.append(
            f"vendor_label: {values.pop('vendor_label')!r} is not a label key ([prefix/]name) outside "
            f'gpuhook.dev/, kubernetes.io and k8s.io, nor ""; {defaults.VENDOR_LABEL!r} used'
        )
    if values.get("nri_runtime_handler") == "":
        values.pop("nri_runtime_handler")
        errors.append(f"nri_runtime_handler: is empty; {defaults.RUNTIME_HANDLER!r} used")
    return Config(**values), errors


# Kubernetes' label key grammar, with string operations (no `re` on the per-container path)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_DNS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
# label prefixes the agent never sets: its own (gpuhook.dev/ labels are the table it writes anyway)
# and those Kubernetes reserves for itself (node-role.kubernetes.io, node.kubernetes.io...)
RESERVED_LABEL_DOMAINS = ("gpuhook.dev", "kubernetes.io", "k8s.io")


def valid_label_name(name: str) -> bool:
    """A label key's name part: 1 to 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    return 0 < len(name) <= 63 and set(name) <= _NAME_CHARS and name[0].isalnum() and name[-1].isalnum()


def valid_label_prefix(prefix: str) -> bool:
    """A label key's prefix: a DNS subdomain (<= 253 characters, lower-case labels of
    [a-z0-9-], alphanumeric at both ends, joined by dots)."""
    return 0 < len(prefix) <= 253 and all(
        part and set(part) <= _DNS_CHARS and part[0] != "-" and part[-1] != "-" for part in prefix.split(".")
    )


def valid_vendor_label(key: str) -> bool:
    """vendor_label: "" (off), or a Kubernetes label key ([prefix/]name) whose prefix is none
    of RESERVED_LABEL_DOMAINS nor a subdomain of one."""
    if key == "":
        return True
    prefix, slash, name = key.rpartition("/")
    if not valid_label_name(name) or (slash and not valid_label_prefix(prefix)):
        return False
    return not any(prefix == d or prefix.endswith("." + d) for d in RESERVED_LABEL_DOMAINS)


def valid_driver_root(value: str) -> bool:
    """nvidia_driver_root: "auto", "/" (the host only), or a normal absolute path."""
    return value in (NVIDIA_DRIVER_ROOT_AUTO, "/") or is_clean_abspath(value)


def node_config_path(root: str) -> str:
    """The node config of the node whose / is `root` (/host in the DaemonSet), as seen from
    here: GPUHOOK_CONFIG when set, else DEFAULT_PATH inside root."""
    if os.environ.get(CONFIG_ENV) or root == "/":
        return config_path()
    from .probe.host import Host

    return Host(root).resolve(DEFAULT_PATH)


def is_clean_abspath(path: str) -> bool:
    """Absolute, normal (no '.', '..', '//' or trailing '/'), not '/' itself."""
    return (
        path.startswith("/")
        and path != "/"
        and "\0" not in path
        and all(p not in ("", ".", "..") for p in path[1:].split("/"))
    )


def cache_dir() -> str:
    return os.environ.get(CACHE_DIR_ENV) or defaults.CACHE_DIR


# The last config this process parsed, per file: (its key, config, errors). A resident process
# (the runtime server, the NRI plugin) loads the config for every create: while the file is
# the one parsed (the same key as the cache file's), neither file is read or parsed again.
_LOADED: "dict[str, tuple[list, Config, list[str]]]" = {}


def load(path: "str | None" = None) -> "tuple[Config, list[str]]":
    """(config, errors). Never raises."""
    path = path or config_path()
    try:
        # O_NONBLOCK: a FIFO in its place must not hang every container start
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return Config(), []
    except OSError as e:
        return Config(), [f"cannot read {path}: {e.strerror or e}; defaults used"]
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            return Config(), [f"{path} is not a regular file; defaults used"]
        name = os.path.abspath(path)
        key = [name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        known = _LOADED.get(name)
        if known is not None and known[0] == key:
            _front_put(key, st, known[1], known[2])
            return known[1], list(known[2])
        cached = _cache_get(key)
        if cached is not None:
            _LOADED[name] = (key, *cached)
            _front_put(key, st, *cached)
            return cached[0], list(cached[1])
        raw = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError as e:
        return Config(), [f"cannot read {path}: {e.strerror or e}; defaults used"]
    finally:
        os.close(fd)
    why = f"larger than {MAX_CONFIG_BYTES >> 20} MiB" if len(raw) > MAX_CONFIG_BYTES else None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        why = why or "not UTF-8"
    if why:
        errors = [f"{path} is {why}; defaults used"]
        _front_put(key, st, Config(), errors)
        return Config(), errors
    config, errors = parse(text)
    errors = [f"{path}: {e}" for e in errors]
    _LOADED[name] = (key, config, list(errors))
    _cache_put(key, config, errors)
    _front_put(key, st, config, errors)
    return config, errors


def _cache_file(key: list) -> str:
    name = key[0].replace("%", "%25").replace("/", "%2F")
    return os.path.join(cache_dir(), f"config-{name}.json")


def _cache_get(key: list) -> "tuple[Config, list[str]] | None":
    from . import fastjson

    try:
        with open(_cache_file(key), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None  # not written by gpuhook: never trusted (SECURITY.md)
            record = fastjson.loads(f.read(1 << 20))
        if record["key"] != key:
            return None
        config, errors = from_dict(record["config"])
        return config, list(record["errors"]) + errors
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _cache_put(key: list, config: "Config", errors: "list[str]") -> None:
    from . import fastjson
    from .fsutil import write_atomic

    values = {k: v for k, v in config._asdict().items() if v is not None}
    try:
        os.makedirs(cache_dir(), mode=0o700, exist_ok=True)
        write_atomic(_cache_file(key), fastjson.dumps({"key": key, "config": values, "errors": errors}).encode(), 0o600)
    except (OSError, ValueError, TypeError):
        pass


def front_file(config_file: str) -> str:
    """The front file of the config at this absolute path (the C front names it the same way)."""
    name = config_file.replace("%", "%25").replace("/", "%2F")
    return os.path.join(cache_dir(), f"config-{name}.front")


def front_text(st: os.stat_result, config: "Config", errors: "list[str]") -> bytes:
    """What the front may act on: the config file's identity as the front stats it, Python's
    value of each FRONT_KEYS key ("" for none), and whether the file had errors (then the
    front sends creates to Python, whose log line says why)."""
    fields = {FRONT_IDENTITY: f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"}
    for k in FRONT_KEYS:
        fields[k] = getattr(config, k) or ""
    fields[FRONT_ERRORS] = "1" if errors else "0"
    return (FRONT_MAGIC + "\0" + "".join(f"{k}={v}\0" for k, v in fields.items())).encode()


def _front_put(key: list, st: os.stat_result, config: "Config", errors: "list[str]") -> None:
    """Leave the front file, unless it already says exactly this (one small read per load)."""
    from .fsutil import write_atomic

    path = front_file(key[0])
    try:
        data = front_text(st, config, errors)
        if len(data) > MAX_FRONT_BYTES:
            return  # the front finds none: Python decides
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            pass
        else:
            try:
                st_front = os.fstat(fd)
                ours = st_front.st_uid == os.geteuid() and not st_front.st_mode & 0o022
                if ours and os.read(fd, MAX_FRONT_BYTES + 1) == data:
                    return
            finally:
                os.close(fd)
        os.makedirs(cache_dir(), mode=0o700, exist_ok=True)
        write_atomic(path, data, 0o600, sync_dir=False)
    except (OSError, ValueError, UnicodeError):
        pass


def find_runtime(name: "str | None", path: "str | None" = None, cwd: "str | None" = None) -> "str | None":
    """The real runtime's path: `name` (a path, or a name on `path`, the caller's PATH; None:
    this process's), else runc, else crun. A relative one is the caller's: in cwd when given."""
    candidates = [name] if name else DEFAULT_RUNTIMES
    if path is None:
        path = os.environ.get("PATH")
    dirs = (path or defaults.SEARCH_PATH).split(":")
    for c in candidates:
        for p in [c] if "/" in c else [os.path.join(d or ".", c) for d in dirs]:
            if cwd is not None and not p.startswith("/"):
                p = os.path.join(cwd, p)
            if os.access(p, os.X_OK) and not os.path.isdir(p):
                return p
    return None


# the C front as this package ships it (setup.py builds it here; the host bundle's bin/ holds a copy)
FRONT_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime", "gpuhook-runtime")


def is_front(path: str) -> bool:
    """The runtime is gpuhook-runtime itself (its name, the front's file, or a copy of it):
    run as the real runtime, it would run itself for ever. The C front's is_front too."""
    if os.path.basename(path) == "gpuhook-runtime":
        return True
    try:
        sa, sb = os.stat(path), os.stat(FRONT_BINARY)  # opened only for a copy of the same size
        if os.path.samestat(sa, sb):
            return True
        if sa.st_size != sb.st_size or sa.st_mode & 0o170000 != 0o100000:
            return False
        with open(path, "rb") as a, open(FRONT_BINARY, "rb") as b:
            while True:
                x, y = a.read(1 << 16), b.read(1 << 16)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False
