"""The exec path: the env gpuhook added at create, for the processes started later by `exec`.

containerd (CRI ExecSync, `ctr task exec`) and dockerd build an exec'd process from their own
copy of the spec, made before gpuhook edited config.json: the process would see the GPU
nodes but not GPUHOOK_ACCELERATOR / GPUHOOK_DEVICES. So:

- at create/run, when gpuhook injected, the env it added is recorded in
  <cache dir>/exec/<runc root>/<container id> (cache dir: /run/gpuhook, GPUHOOK_CACHE_DIR;
  the root with "/" written "%2F"), written atomically; a create that injects nothing removes
  a record left by an earlier container of the same id;
- at `exec`, the record's variables are set in the --process file (replacing the same keys,
  as at create), which is rewritten atomically; an exec without --process gets them as
  --env flags;
- `delete` is the runtime's alone (the front passes it through): a record whose container
  is gone is swept by a later create that writes a record under the same runtime root
  (sweep(): the runtime has no state of that id, and the record is older than SWEEP_AFTER_S,
  so a create whose runtime has not made its state yet keeps its own), so records never
  outnumber the root's containers by more than the creates of the last SWEEP_AFTER_S.

Each level (the cache dir, exec/, the root's) is made 0700 whatever the umask and, before any
use, opened without following a link and checked: a directory of gpuhook's user, not writable
by group or others (_open_level; the C front's open_checked). A level that is not: no record
is written, read or removed through it.

The C front (runtime/gpuhook-runtime.c) computes the same path and starts Python for exec
only when the record exists: a container gpuhook did not inject pays one file check. The key
holds the runtime's --root (a containerd namespace has its own), so the same id under another
root is another container; without --root it is the runtime's default, /run/<runtime name>.
A root that is not a normal absolute path (".", "..", "//", a trailing "/", a "%") or an id
outside runc's characters gets no record: the exec then goes on without the env.

A process file that is a link, not a regular file, someone else's, over MAX_PROCESS_BYTES, not
JSON, or of a shape runc would refuse is left alone: the exec goes on unchanged, and one log
line says why. Stdlib only (the per-container path).
"""

import os
import time

from ..config import is_clean_abspath

RECORD_DIR = "exec"
MAX_PROCESS_BYTES = 4 << 20
MAX_RECORD_BYTES = 64 << 10
# a record this young is never swept: its create has written it, and the runtime it execs next
# may not have made the container's state yet
SWEEP_AFTER_S = 60.0
DEFAULT_ROOT_DIR = "/run"  # a runtime's state root without --root: DEFAULT_ROOT_DIR/<its name>
# a record's level or file with any of these mode bits is not gpuhook's own
WRITABLE_BY_OTHERS = 0o022
# runc's: its id pattern is ^[\w+-\.]+$, where "+-\." is the range + , - . (so a comma too),
# and neither "." nor ".." (tests/unit/test_exec_env.py asks the real runc)
ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+,.-")


def runtime_root(root: str | None, runtime: str, pwd: str | None = None) -> str:
    """The state root the real runtime uses: --root, relative to the caller's directory as
    the front reads it (pwd/ROOT, pwd: caller_pwd; None: left relative, which no record is
    keyed by), or /run/<runtime name>."""
    if not root:
        return DEFAULT_ROOT_DIR + "/" + os.path.basename(runtime)
    if not root.startswith("/") and pwd is not None:
        return pwd + "/" + root
    return root


def caller_pwd(env, cwd: str) -> str:
    """The caller's directory as sh's $PWD names it: its $PWD when that is its cwd."""
    pwd = env.get("PWD")
    try:
        if pwd and pwd.startswith("/") and os.path.samestat(os.stat(pwd), os.stat(cwd)):
            return pwd
    except OSError:
        pass
    return cwd


def pwd_for(inv, call) -> str | None:
    """What a relative --root of this call is read against (caller_pwd), None for another root."""
    return caller_pwd(call.env, call.cwd) if inv.root and not inv.root.startswith("/") else None


def record_path(
    cache_dir: str, root: str | None, container_id: str | None, runtime: str, pwd: str | None = None
) -> str | None:
    """Where the exec record of this container is; None when the key is not a clean one."""
    r = runtime_root(root, runtime, pwd)
    if not is_clean_abspath(r) or "%" in r:
        return None
    if not container_id or container_id in (".", "..") or not ID_CHARS.issuperset(container_id):
        return None
    return os.path.join(cache_dir, RECORD_DIR, r.replace("/", "%2F"), container_id)


def state_exists(root: str | None, container_id: str, runtime: str, pwd: str | None = None) -> bool:
    """The runtime has state for this container (runc and crun: <root>/<id>)."""
    return os.path.lexists(os.path.join(runtime_root(root, runtime, pwd), container_id))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_level(name: str, parent: int | None, create: bool) -> int:
    """One level of the record's directories: made 0700 whatever the umask (create), opened
    without following a link, and used only when it is gpuhook's own (a directory of this
    user, not writable by group or others). The C front's open_checked."""
    made = False
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            made = True
        except FileExistsError:
            pass
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        if made:
            os.fchmod(fd, 0o700)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & WRITABLE_BY_OTHERS:
            raise PermissionError(f"{name}: not gpuhook's own (uid {st.st_uid}, mode {st.st_mode & 0o7777:o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _record_dir(path: str, create: bool) -> int:
    """The checked directory of the record at `path` (<cache>/exec/<root key>/<id>), walked
    level by level from the cache dir (whose parents are the node's)."""
    key_dir = os.path.dirname(path)
    exec_dir = os.path.dirname(key_dir)
    cache = os.path.dirname(exec_dir)
    if create:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
    fd = _open_level(cache, None, create)
    try:
        for name in (os.path.basename(exec_dir), os.path.basename(key_dir)):
            parent, fd = fd, -1
            try:
                fd = _open_level(name, parent, create)
            finally:
                os.close(parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def config_identity(bundle: str) -> str | None:
    """<bundle>/config.json as gpuhook left it: device, inode, size, mtime, ctime (None: none)."""
    try:
        st = os.stat(os.path.join(bundle, "config.json"), follow_symlinks=False)
    except (OSError, ValueError):
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def write_record(
    path: str, env: list[str], bundle: str | None, config: str | None = None, created: str | None = None
) -> None:
    """Atomically, through the checked directories (raises OSError where one is not gpuhook's).
    bundle and config (config_identity) name the container instance the record is for;
    created, once known, the runtime's own creation time of it (instance_of)."""
    from .. import fastjson

    record = {"env": list(env), "bundle": bundle, "config": config}
    if created is not None:
        record["created"] = created
    data = fastjson.dumps(record).encode()
    d = _record_dir(path, create=True)
    try:
        import fcntl

        from ..fsutil import write_named

        fcntl.flock(d, fcntl.LOCK_SH)  # no sweep() meanwhile: it never removes a record it did not judge
        write_named(d, os.path.basename(path), data, 0o600, sync=False)
    finally:
        os.close(d)


def sweep(path: str, root: str | None, runtime: str, pwd: str | None = None, now: float | None = None) -> int:
    """Remove the records in the directory of the record at `path` (one runtime root's) whose
    container the runtime has no state for (runc, crun: <root>/<id>, a relative root read against
    pwd as record_path reads it), left SWEEP_AFTER_S ago
    or more (a write's leftover temporary file too); how many. A record of a container the
    runtime knows is never removed. Best effort: whatever cannot be read is left, and a sweep
    another process is doing (or a record being written: flock) is not waited for."""
    import fcntl

    try:
        d = _record_dir(path, create=False)
    except OSError:
        return 0
    removed = 0
    try:
        fcntl.flock(d, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            live = set(os.listdir(runtime_root(root, runtime, pwd)))
        except FileNotFoundError:
            live = set()  # no state root at all: no container of it
        cutoff = (time.time() if now is None else now) - SWEEP_AFTER_S
        for name in os.listdir(d):
            if name in live:
                continue
            try:
                if os.stat(name, dir_fd=d, follow_symlinks=False).st_mtime <= cutoff:
                    os.unlink(name, dir_fd=d)
                    removed += 1
            except OSError:
                continue
    except OSError:  # locked (BlockingIOError), or the state root not to be read: left for later
        pass
    finally:
        os.close(d)
    return removed


def remove_record(path: str) -> None:
    """Never through a link, nor in a directory that is not gpuhook's own."""
    try:
        d = _record_dir(path, create=False)
    except OSError:
        return
    try:
        os.unlink(os.path.basename(path), dir_fd=d)
    except FileNotFoundError:
        pass
    finally:
        os.close(d)


def record_exists(path: str) -> bool:
    try:
        d = _record_dir(path, create=False)
    except OSError:
        return False
    try:
        os.stat(os.path.basename(path), dir_fd=d, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        os.close(d)


def read_record(path: str) -> list[str] | None:
    """The recorded env; None when there is none, or when it is not gpuhook's own (another
    owner, writable by others, a link, in a directory that is not gpuhook's: never trusted,
    as the caches)."""
    record = read_record_data(path)
    return record["env"] if record else None


def read_record_data(path: str) -> dict | None:
    """The whole record (env, bundle, config, created), on read_record's terms."""
    from .. import fastjson

    try:
        d = _record_dir(path, create=False)
    except OSError:
        return None
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=d)
    except OSError:
        return None
    finally:
        os.close(d)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or st.st_uid != os.geteuid() or st.st_mode & WRITABLE_BY_OTHERS:
            return None
        data = fastjson.loads(os.read(fd, MAX_RECORD_BYTES))
        env = data["env"]
        if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
            return None
        return data
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        os.close(fd)


def set_env(env: list, added: list[str]) -> bool:
    """Set each KEY=VALUE of `added` in `env`, in place: the same key replaced where it is,
    else appended (spec.apply's rule at create). True when `env` changed."""
    index = {e.partition("=")[0]: i for i, e in enumerate(env)}
    changed = False
    for item in added:
        key = item.partition("=")[0]
        if key in index:
            if env[index[key]] != item:
                env[index[key]] = item
                changed = True
        else:
            index[key] = len(env)
            env.append(item)
            changed = True
    return changed


def edit_process_file(path: str, added: list[str]) -> str | None:
    """Add the env to runc's --process file, atomically. None when done (or nothing to do);
    else why the file was left alone."""
    from .. import fastjson
    from ..fsutil import write_atomic

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        return f"process file {path}: {e.strerror or e}" + (" (a symbolic link?)" if e.errno == 40 else "")
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000:
            return f"process file {path} is not a regular file"
        if st.st_nlink != 1:
            return f"process file {path} has {st.st_nlink} hard links"
        if st.st_uid != os.geteuid():
            return f"process file {path} belongs to uid {st.st_uid}, not to this runtime"
        if st.st_size > MAX_PROCESS_BYTES:
            return f"process file {path} is {st.st_size} bytes, over the {MAX_PROCESS_BYTES} limit"
        chunks, total = [], 0
        while total <= MAX_PROCESS_BYTES:
            chunk = os.read(fd, MAX_PROCESS_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_PROCESS_BYTES:
            return f"process file {path} grew over the {MAX_PROCESS_BYTES} limit"
    except OSError as e:
        return f"process file {path}: {e.strerror or e}"
    finally:
        os.close(fd)
    try:
        process = fastjson.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:
        return f"process file {path} is not valid JSON ({str(e)[:200]})"
    if not isinstance(process, dict):
        return f"process file {path} is not a JSON object"
    env = process.get("env")
    if env is None:
        env = process["env"] = []
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        return f"process file {path}: env is not a list of strings"
    if not set_env(env, added):
        return None
    try:
        write_atomic(path, fastjson.dumps(process).encode(), st.st_mode & 0o7777, sync_dir=False, sync=False)
    except OSError as e:
        return f"process file {path}: cannot rewrite it: {e.strerror or e}"
    return None


def env_flags(argv: list[str], exec_at: int, added: list[str]) -> list[str]:
    """An exec without --process: the env as --env flags right after `exec`."""
    flags = []
    for item in added:
        flags += ["--env", item]
    return argv[: exec_at + 1] + flags + argv[exec_at + 1 :]


def instance_of(root: str | None, container_id: str, runtime: str, pwd: str | None = None) -> dict | None:
    """What the runtime itself wrote of the container now under this id: its bundle and its
    creation time (runc: <root>/<id>/state.json, the label bundle=..., created; crun:
    <root>/<id>/status, bundle, created). None: no state at all (no such container). Raises
    ValueError or OSError where the state is there but not to be read."""
    from .. import fastjson

    state = os.path.join(runtime_root(root, runtime, pwd), container_id)
    if not os.path.lexists(state):
        return None
    for name in ("state.json", "status"):
        try:
            fd = os.open(os.path.join(state, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        try:
            data = fastjson.loads(os.read(fd, MAX_PROCESS_BYTES))
        finally:
            os.close(fd)
        if not isinstance(data, dict):
            raise ValueError(f"{name} is not a JSON object")
        bundle = data.get("bundle")
        labels = (data.get("config") or {}).get("labels") if isinstance(data.get("config"), dict) else None
        for label in labels if isinstance(labels, list) else ():
            if isinstance(label, str) and label.startswith("bundle="):
                bundle = label[len("bundle=") :]
        created = data.get("created")
        if not isinstance(bundle, str) or not isinstance(created, str):
            raise ValueError(f"{name} names no bundle or creation time")
        return {"bundle": bundle, "created": created}
    raise ValueError("no state.json or status")


def _same_dir(a: str, b: object) -> bool:
    """One directory (runc names the bundle with its links resolved)."""
    try:
        return isinstance(b, str) and os.path.samestat(os.stat(a), os.stat(b))
    except (OSError, ValueError):
        return False


def _for_this_instance(path: str, record: dict, inv, runtime: str, pwd: str | None) -> str | None:
    """None when the record was made for the container now under this id and root (its
    bundle, the config.json gpuhook wrote there, and, once bound, the runtime's creation
    time are the record's); else why not. An unbound record is bound at its first use."""
    try:
        now = instance_of(inv.root, inv.container_id, runtime, pwd)
    except (OSError, ValueError) as e:
        return f"the runtime's state of {inv.container_id} cannot be read ({e}): exec record not used"
    if (
        now is None
        or not _same_dir(now["bundle"], record.get("bundle"))
        or record.get("config") is None
        or config_identity(record["bundle"]) != record["config"]
        or record.get("created", now["created"]) != now["created"]
    ):
        remove_record(path)
        return f"exec record of an earlier container {inv.container_id} removed, not used"
    if "created" not in record:
        write_record(path, record["env"], record["bundle"], record["config"], now["created"])
    return None


def on_exec(inv, argv: list[str], runtime: str, cache_dir: str, call) -> tuple[list[str], str | None]:
    """(the argv to exec the runtime with, why nothing was added or None), for the caller of
    call (args.Call: its $PWD for a relative --root, its cwd for a relative --process)."""
    pwd = pwd_for(inv, call)
    path = record_path(cache_dir, inv.root, inv.container_id, runtime, pwd)
    record = read_record_data(path) if path else None
    if path is None or not record or not record["env"]:
        return argv, None
    why = _for_this_instance(path, record, inv, runtime, pwd)
    if why:
        return argv, why
    added = record["env"]
    if inv.process is None:
        return env_flags(argv, inv.exec_at, added), None
    return argv, edit_process_file(call.path(inv.process), added)


# -- the call: exec, from __init__.prepare ---------------------------------------------------


def exec_call(inv, argv: list[str], real: str, config, call):
    """Before an exec: the recorded env into its process; anything odd leaves it unchanged,
    and the exec's log line says why. An args.Answer."""
    from ..config import cache_dir
    from .args import Answer

    try:
        argv, why = on_exec(inv, argv, real, cache_dir(), call)
    except Exception as e:  # the exec goes on, whatever happened here
        why = f"{type(e).__name__}: {e}"
    if not why or not config.log_file:
        return Answer([real] + argv)
    from .. import fastjson
    from ..logline import MAX_ERROR, line_bytes, utc_now

    record = {"time": utc_now(), "event": "exec", "container_id": inv.container_id, "decision": "unchanged"}
    record["error"] = why[:MAX_ERROR]
    return Answer([real] + argv, log=(config.log_file, line_bytes(fastjson.dumps(record))))
