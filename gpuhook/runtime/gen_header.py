"""The C front's tables (gpuhook-runtime.h), generated from the Python that defines each one;
and gpuhook-hook's (gpuhook/hook/gpuhook-hook.h) the same way.

The front (gpuhook-runtime.c) cannot import Python, so every fact it shares with Python (the
flags that take a value, the GPU signs, the node paths, the front file's format, the exec
record's key, the server's wire, the interpreter's entry) is written here into a header from
the one Python place that says it. The header is checked in, so a build needs no Python;
`make front-header` (python -m gpuhook.runtime.gen_header) writes it again, and
tests/unit/test_front.py fails when it is not current.
"""

import os
import sys

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpuhook-runtime.h")
# gpuhook-hook's (gpuhook/hook/gpuhook-hook.c): what it shares with gpuhook/hook/__init__.py
HOOK_HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hook", "gpuhook-hook.h")


def _c(value: str) -> str:
    """A C string literal of `value` (plain ASCII, a newline at most: every table here is)."""
    if not value.isascii() or any(ord(c) < 0x20 and c != "\n" for c in value):
        raise ValueError(f"not a plain ASCII string for the front: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _no_gpu_line() -> str:
    """The printf format of the front's no-GPU create line: the line create.log_line writes for
    a create that found no GPU (no pod: the front reads no config.json), its time, id, bundle
    and duration as positional arguments 1 to 4 (a string, a JSON token, a string, a double)."""
    import re

    from ..config import Config
    from ..inject import NO_GPU, Decision
    from .args import Call, Invocation
    from .create import log_line

    no_gpu = Decision(NO_GPU)
    logged = log_line(
        Config(log_file="/log"), Invocation("create", "@BUNDLE@", "@ID@", None, None), no_gpu, Call({}, "/")
    )
    assert logged is not None
    line = logged[1].decode().replace("%", "%%")
    line, times = re.subn(r'"time":"[^"]*"', '"time":"%1$s"', line)
    line, durations = re.subn(r'"duration_ms":[0-9.]+', '"duration_ms":%4$.2f', line)
    if (times, durations, line.count('"@ID@"'), line.count("@BUNDLE@")) != (1, 1, 1, 1):
        raise ValueError(f"create.log_line's no-GPU line is not one the front can write: {line!r}")
    return line.replace('"@ID@"', "%2$s").replace("@BUNDLE@", "%3$s")


def _printf(format: str, strings: int, conversion: str = "s") -> str:
    """A message format the front prints as it is: `strings` "%s" (or of another conversion:
    "d", ints) and no other conversion."""
    if format.count("%") != strings or format.count("%" + conversion) != strings:
        raise ValueError(f"not a format of {strings} %{conversion} for the front: {format!r}")
    return format


def _strings(name: str, values, why: str) -> str:
    items = ", ".join(_c(v) for v in values)
    return f"/* {why} */\nstatic const char *const {name}[] = {{{items + ', ' if items else ''}NULL}};\n"


def _words(name: str, values, why: str) -> str:
    """A macro of comma-separated strings, for a NULL-ended argument list."""
    return f"#define {name} {', '.join(_c(v) for v in values)} /* {why} */\n"


def _define(name: str, value: "str | int", why: str, octal: bool = False) -> str:
    text = _c(value) if isinstance(value, str) else f"0{value:o}" if octal else str(value)
    return f"#define {name} {text} /* {why} */\n"


def _launch() -> str:
    """layout.LAUNCH: the bundled interpreter's command line, each word with its kind."""
    from .. import layout

    kinds = {layout.WORD: "LAUNCH_WORD", layout.PATH: "LAUNCH_PATH", layout.PROGRAM: "LAUNCH_PROGRAM"}
    items = ", ".join(f"{{{kinds[w.kind]}, {_c(w.text)}}}" for w in layout.LAUNCH)
    return (
        "/* layout.LAUNCH: the bundled interpreter's command line before its own arguments; a PATH or\n"
        " * PROGRAM word is under the bundle's root (the front's dir/..), a PROGRAM must be executable */\n"
        "enum launch_kind { LAUNCH_WORD, LAUNCH_PATH, LAUNCH_PROGRAM };\n"
        f"static const struct launch_word {{ enum launch_kind kind; const char *text; }} LAUNCH[] = {{{items}}};\n"
        "#define LAUNCH_WORDS (sizeof LAUNCH / sizeof *LAUNCH)\n"
    )


def _wire() -> str:
    """server.REQUEST_FIELDS and REPLIES by name: the request's fields as an enum in the wire's
    order (REQUEST_IS_LIST: a counted list), and for each reply the front acts on, its kind and
    its fields' places (REPLY_<KIND>_<FIELD>; REPLY_REST, the rest, last)."""
    from . import server

    fields = "".join(f"    REQUEST_{f.upper()},\n" for f in server.REQUEST_FIELDS)
    lists = ", ".join(f"[REQUEST_{f.upper()}] = 1" for f in server.REQUEST_LISTS)
    out = [
        "/* server.REQUEST_FIELDS: the request's fields, in the wire's order */\n",
        f"enum request_field {{\n{fields}    REQUEST_NFIELDS\n}};\n",
        f"static const int REQUEST_IS_LIST[REQUEST_NFIELDS] = {{{lists}}}; /* server.REQUEST_LISTS */\n",
    ]
    for kind in ("exec", "exit"):
        names = server.REPLIES[kind]
        if server.REPLY_REST in names[:-1]:
            raise ValueError(f"server.REPLIES[{kind!r}]: {server.REPLY_REST} is the rest: it goes last")
        tail = "" if names[-1:] == (server.REPLY_REST,) else f"REPLY_{kind.upper()}_NFIELDS"
        enum = ", ".join(
            [f"REPLY_{kind.upper()}_{n.upper()}" + (" = 1" if not i else "") for i, n in enumerate(names)]
            + ([tail] if tail else [])
        )
        out.append(_define(f"REPLY_{kind.upper()}", kind, f"server.REPLIES: then {', '.join(names)}"))
        out.append(f"enum reply_{kind} {{ {enum} }};\n")
    return "".join(out)


def _signs() -> str:
    """probe.SIGNS, each once, split for the front: the directory, the name or its prefix,
    and how the rest of a name may go (SIGN_EXACT, SIGN_ANY: "*", SIGN_DIGIT: "[0-9]*")."""
    from .. import probe

    rows, seen = [], set()
    for sign in (s for signs in probe.SIGNS.values() for s in signs):
        if sign in seen:
            continue
        seen.add(sign)
        parent, _, name = sign.rpartition("/")
        kind = "SIGN_DIGIT" if name.endswith("[0-9]*") else "SIGN_ANY" if name.endswith("*") else "SIGN_EXACT"
        name = name[:-6] if kind == "SIGN_DIGIT" else name[:-1] if kind == "SIGN_ANY" else name
        if not parent.startswith("/") or any(c in name for c in "*?[]"):
            raise ValueError(f"probe.SIGNS: {sign} is not a pattern the front can match")
        rows.append(f"    {{{_c(parent)}, {_c(name)}, {kind}}},\n")
    return (
        "/* where a GPU can show up (probe.SIGNS), each once: a directory, and a name in it */\n"
        "enum sign_kind { SIGN_EXACT, SIGN_ANY, SIGN_DIGIT };\n"
        "static const struct sign {\n    const char *dir, *name;\n    enum sign_kind kind;\n} SIGNS[] = {\n"
        + "".join(rows)
        + "    {NULL, NULL, SIGN_EXACT},\n};\n"
    )


def _front_file() -> str:
    """config.front_text's fields, by name: an enum the front's struct config is indexed by."""
    from .. import config

    keys = (config.FRONT_IDENTITY, *config.FRONT_KEYS, config.FRONT_ERRORS)
    enum = "".join(f"    FRONT_{k.upper()},\n" for k in keys)
    names = "".join(f"    [FRONT_{k.upper()}] = {_c(k)},\n" for k in keys)
    # with no config file: what front_text says of the defaults (the identity aside)
    fields = dict(f.split("=", 1) for f in _fields(config.front_text(os.stat("/"), config.Config(), [])))
    defaults = "".join(f"    [FRONT_{k.upper()}] = {_c(fields[k])},\n" for k in keys[1:])
    prefix, _, suffix = os.path.basename(config.front_file("/@")).partition("%2F@")
    return (
        _define("FRONT_MAGIC", config.FRONT_MAGIC, "config.FRONT_MAGIC: the front file's first field")
        + _define("MAX_FRONT", config.MAX_FRONT_BYTES, "config.MAX_FRONT_BYTES")
        + _define("FRONT_FILE_PREFIX", prefix, "config.front_file: <cache dir>/PREFIX<config path escaped>SUFFIX")
        + _define("FRONT_FILE_SUFFIX", suffix, "config.front_file")
        + _define("FAIL_CLOSED", _one_of("closed", config.FAIL_MODES), "config.FAIL_MODES")
        + _define("FRONT_NO_ERRORS", fields[config.FRONT_ERRORS], "config.front_text: a file with no errors")
        + _escapes(prefix, suffix)
        + "/* the front file's NAME=VALUE fields (config.front_text: FRONT_IDENTITY, FRONT_KEYS, FRONT_ERRORS) */\n"
        + f"enum front_key {{\n{enum}    FRONT_NKEYS\n}};\n"
        + f"static const char *const FRONT_KEY_NAMES[FRONT_NKEYS] = {{\n{names}}};\n"
        + "/* the values with no config file: the defaults (config.Config()), as front_text writes them */\n"
        + f"static const char *const FRONT_DEFAULTS[FRONT_NKEYS] = {{\n{defaults}}};\n"
    )


def _escapes(prefix: str, suffix: str) -> str:
    """How config.front_file writes "/" and "%" in the one file name a path becomes."""
    from .. import config

    def escaped(c: str) -> str:
        name = os.path.basename(config.front_file(c))
        if not (name.startswith(prefix) and name.endswith(suffix)):
            raise ValueError(f"config.front_file({c!r}) is not {prefix}<escaped>{suffix}: {name}")
        return name[len(prefix) : len(name) - len(suffix)]

    return _define("ESCAPED_SLASH", escaped("/"), 'config.front_file: "/" in a path as a name') + _define(
        "ESCAPED_PERCENT", escaped("%"), 'config.front_file: "%" in a path as a name'
    )


def _fields(text: bytes) -> "list[str]":
    """The NAME=VALUE fields of a front file (after its magic)."""
    return text.decode().split("\0")[1:-1]


def _one_of(value: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{value!r} is not one of {choices}")
    return value


def _log_write() -> list[str]:
    """What logline.h needs (both headers have it), and the line that says a line was lost."""
    from .. import logline

    return [
        _define("CANNOT_WRITE_LOG", _printf(logline.CANNOT_WRITE_LOG, 2), "logline.CANNOT_WRITE_LOG: file, why"),
        _define("SHORT_WRITE", _printf(logline.SHORT_WRITE, 2, "d"), "logline.SHORT_WRITE: written, the line's"),
    ]


def render() -> str:
    from .. import config, defaults, layout, runtime
    from .. import logline as nodelog
    from . import args, logline, server
    from . import exec as execenv

    parts = [
        "/* gpuhook-runtime.h: the C front's tables, generated by `python -m gpuhook.runtime.gen_header`\n"
        " * (make front-header) from the Python that defines each. Do not edit: tests/unit/test_front.py\n"
        " * fails when this is not what the generator writes. */\n",
        _strings("GLOBAL_VALUE_FLAGS", sorted(args.GLOBAL_VALUE_FLAGS), "args.GLOBAL_VALUE_FLAGS"),
        _strings("CREATE_VALUE_FLAGS", sorted(args.CREATE_VALUE_FLAGS), "args.CREATE_VALUE_FLAGS"),
        _strings("EXEC_VALUE_FLAGS", sorted(args.EXEC_VALUE_FLAGS), "args.EXEC_VALUE_FLAGS"),
        _strings("EDITING_COMMANDS", sorted(args.EDITING_COMMANDS), "args.EDITING_COMMANDS: create, run"),
        _strings("SERVED_COMMANDS", sorted(server.SERVED), "server.SERVED: what the resident server runs"),
        _define("EXEC_COMMAND", args.EXEC_COMMAND, "args.EXEC_COMMAND"),
        _define("ROOT_FLAG", args.ROOT_FLAG, "args.ROOT_FLAG: the runtime's state root"),
        _strings("BUNDLE_FLAGS", args.BUNDLE_FLAGS, "args.BUNDLE_FLAGS: create/run's bundle"),
        _signs(),
        _define("CONFIG_FILE", defaults.CONFIG_FILE, "defaults.CONFIG_FILE"),
        _define("CACHE_DIR", defaults.CACHE_DIR, "defaults.CACHE_DIR"),
        _define("CONFIG_ENV", config.CONFIG_ENV, "config.CONFIG_ENV: the node config's path, when set"),
        _define("CACHE_DIR_ENV", config.CACHE_DIR_ENV, "config.CACHE_DIR_ENV: the cache dir, when set"),
        _define("PYTHON_ENV", defaults.PYTHON_ENV, "defaults.PYTHON_ENV: the interpreter to start, when set"),
        _define("SEARCH_PATH", defaults.SEARCH_PATH, "defaults.SEARCH_PATH: where runtimes are without $PATH"),
        _strings("DEFAULT_RUNTIMES", config.DEFAULT_RUNTIMES, "config.DEFAULT_RUNTIMES, in order"),
        _define("DEFAULT_RUNTIMES_TEXT", " or ".join(config.DEFAULT_RUNTIMES), "for the messages"),
        _define("FRONT_NAME", os.path.basename(config.FRONT_BINARY), "config.is_front: the wrapper's own name"),
        _front_file(),
        _define("NO_GPU_LINE", _no_gpu_line(), "create.log_line's, for a create with no GPU"),
        _define("TIME_FORMAT", nodelog.TIME_FORMAT, "logline.TIME_FORMAT: year, month, day, hour, minute, second, ms"),
        _define("LOG_MODE", nodelog.LOG_MODE, "logline.LOG_MODE: a log file's, when a line creates it", octal=True),
        _define("PREFIX", logline.PREFIX, "logline.PREFIX: the runtime's error lines"),
        _define("NO_RUNTIME", _printf(logline.NO_RUNTIME, 2), "logline.NO_RUNTIME: the runtime, the config file"),
        _define("RUNTIME_IS_FRONT", _printf(logline.RUNTIME_IS_FRONT, 2), "logline.RUNTIME_IS_FRONT"),
        _define("CANNOT_RUN", _printf(logline.CANNOT_RUN, 2), "logline.CANNOT_RUN: the runtime, the error"),
        _define("NO_RUNTIME_STATUS", logline.NO_RUNTIME_STATUS, "logline.NO_RUNTIME_STATUS"),
        *_log_write(),
        _define("RECORD_DIR", execenv.RECORD_DIR, "exec.RECORD_DIR: <cache dir>/RECORD_DIR/<root key>/<id>"),
        _define("DEFAULT_ROOT_DIR", execenv.DEFAULT_ROOT_DIR, "exec.DEFAULT_ROOT_DIR: /run/<runtime> without --root"),
        _define("WRITABLE_BY_OTHERS", execenv.WRITABLE_BY_OTHERS, "exec.WRITABLE_BY_OTHERS: not gpuhook's", octal=True),
        _define("ID_CHARS", "".join(sorted(execenv.ID_CHARS)), "exec.ID_CHARS: runc's id characters"),
        _define("SOCKET_NAME", server.SOCKET_NAME, "server.SOCKET_NAME, in the cache dir"),
        _define("SERVER_MAGIC", server.MAGIC, "server.MAGIC: the wire's version"),
        _define("SERVER_TIMEOUT_S", server.FRONT_TIMEOUT_S, "server.FRONT_TIMEOUT_S: then Python starts here"),
        _wire(),
        _define("MAX_REPLY", server.MAX_REPLY_BYTES, "server.MAX_REPLY_BYTES"),
        _define("MAX_REPLY_FIELDS", server.MAX_REPLY_FIELDS, "server.MAX_REPLY_FIELDS"),
        _define("MAX_REPLY_TEXT", server.MAX_REPLY_TEXT, "server.MAX_REPLY_TEXT: an answer's stderr text"),
        _define("MAX_REPLY_LOG_LINE", server.MAX_REPLY_LOG_LINE, "server.MAX_REPLY_LOG_LINE"),
        _launch(),
        _define("LIB", layout.LIB, "layout.LIB: the bundle's libraries, its python3.X dirs"),
        _define("PYTHON_DIRS", layout.PYTHON_DIRS, "layout.PYTHON_DIRS: how lib/python3.X starts"),
        _define("SITE_PACKAGES", layout.SITE_PACKAGES, "layout.SITE_PACKAGES"),
        _define("DIST_PACKAGES", layout.DIST_PACKAGES, "layout.DIST_PACKAGES: Debian's"),
        _words("RUNTIME_FLAGS", defaults.RUNTIME_FLAGS, "defaults.RUNTIME_FLAGS: then RUNTIME_MAIN"),
        _words("MODULE_FLAGS", defaults.MODULE_FLAGS, "defaults.MODULE_FLAGS: then RUNTIME_MODULE"),
        _strings("PYTHONS", defaults.FRONT_PYTHONS, "defaults.FRONT_PYTHONS: a name is beside the front"),
        _define("RUNTIME_MAIN", defaults.RUNTIME_MAIN, "defaults.RUNTIME_MAIN: -c, <site-packages>, argv"),
        _define("RUNTIME_MODULE", runtime.__name__, "python -m RUNTIME_MODULE, with no site-packages dir"),
    ]
    return "\n".join(parts)


def render_hook() -> str:
    """gpuhook-hook.h: the helper's subcommands, its @state root, its log's variable and event,
    its ldconfig deadline, from gpuhook/hook/__init__.py."""
    from .. import hook, logline

    if not 0 < hook.LDCONFIG_DEADLINE < hook.TIMEOUT[hook.LDCACHE]:
        raise ValueError("hook.LDCONFIG_DEADLINE must end before the ld-cache hook's TIMEOUT")
    return "\n".join(
        [
            "/* gpuhook-hook.h: what gpuhook-hook.c shares with gpuhook/hook/__init__.py, generated by\n"
            " * `python -m gpuhook.runtime.gen_header` (make front-header). Do not edit: tests/unit/test_front.py\n"
            " * fails when this is not what the generator writes. */\n",
            _define("KIND_LDCACHE", hook.LDCACHE, "hook.LDCACHE: the ld-cache subcommand"),
            _define("KIND_BYPATH", hook.BYPATH, "hook.BYPATH: the /dev/dri/by-path subcommand"),
            _define(
                "ROOTFS_FROM_STATE", hook.ROOTFS_FROM_STATE, "hook.ROOTFS_FROM_STATE: ROOTFS read from the OCI state"
            ),
            _define("LOG_ENV", hook.LOG_ENV, "hook.LOG_ENV: the node log the helper writes its outcome to"),
            _define("LOG_EVENT", hook.EVENT, "hook.EVENT: that line's event"),
            _define("LOG_MAX_ERROR", logline.MAX_ERROR, "logline.MAX_ERROR: of an error, in that line"),
            *_log_write(),
            _define("LDCONFIG_DEADLINE", hook.LDCONFIG_DEADLINE, "hook.LDCONFIG_DEADLINE: seconds, under hook.TIMEOUT"),
        ]
    )


def main(argv: "list[str] | None" = None) -> int:
    """Write the headers (--check: only say whether they are current)."""
    args = sys.argv[1:] if argv is None else argv
    stale = []
    for path, text in ((HEADER, render()), (HOOK_HEADER, render_hook())):
        try:
            with open(path) as f:
                current = f.read() == text
        except FileNotFoundError:
            current = False
        if current:
            continue
        stale.append(path)
        if "--check" not in args:
            from ..fsutil import write_atomic

            write_atomic(path, text.encode(), 0o644)
    if "--check" in args:
        for path in stale:
            sys.stderr.write(f"gen_header: {path} is not current (make front-header)\n")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
