"""containerd's config.toml: add or remove the `gpu-optional` runtime handler, in place.

Version 2 (containerd 1.x) keeps the CRI runtime handlers under
`plugins."io.containerd.grpc.v1.cri".containerd.runtimes`, versions 3 (containerd 2.0 to 2.3)
and 4 (2.4 and later: the servers' sections moved under [plugins], the CRI plugin's stayed) under
`plugins."io.containerd.cri.v1.runtime".containerd.runtimes`. A file with no `version` is
version 1 (containerd before 1.5's layout), which is refused rather than guessed at.

The file is edited in place with tomlkit, which keeps every comment, key order and layout of
the rest. Not a conf.d drop-in: containerd reads conf.d only through an `imports` line of
config.toml (so config.toml is edited anyway), and in containerd 1.x an imported file's
plugin section *replaces* config.toml's whole section for that plugin instead of merging
into it: a drop-in would have to carry a copy of the node's entire CRI config, and would go
stale as soon as the operator changes config.toml. For the same reason an existing import
that defines the CRI plugin's section would silently undo an edit of config.toml: that case
is refused with the file's name (see `shadowing_imports`).

A second trap, checked with containerd 1.6: a file that defines any runtime handler replaces
the built-in handler map, so the built-in `runc` handler is gone. On a file that defines
none, the stock `runc` handler is written next to ours so the node keeps its default.
"""

from __future__ import annotations

from ..defaults import BIN_DIRS, RUNTIME_BINARY as BINARY, RUNTIME_HANDLER

import copy
import dataclasses
import glob
import os

import tomlkit
from tomlkit.exceptions import TOMLKitError

from . import InstallError, files, journal, restart
from .runtimes import Adapter

HANDLER = RUNTIME_HANDLER
ANNOTATIONS = ["gpuhook.dev/*"]
RUNC_V2 = "io.containerd.runc.v2"
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
DEFAULT_CONFIG = "/etc/containerd/config.toml"


def parse(text: str, where: str) -> tuple[tomlkit.TOMLDocument, int]:
    """(document, version); InstallError for invalid TOML or a version gpuhook does not edit."""
    try:
        doc = tomlkit.parse(text)
    except (TOMLKitError, ValueError) as e:
        raise InstallError(f"{where}: not valid TOML ({str(e).splitlines()[0]})") from None
    version = doc.get("version")
    if version is None:
        raise InstallError(
            f"{where}: no `version` line, so containerd reads it as config version 1, "
            "which gpuhook does not edit; convert it to version 2 (containerd 1.x) "
            "or 3 (containerd 2.x) first"
        )
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise InstallError(f"{where}: config version {version!r} is not supported (2, 3 or 4)")
    return doc, int(version)


def dumps(doc) -> str:
    return tomlkit.dumps(doc)


def _runtimes(doc, version: int, create: bool):
    """The `runtimes` table of the CRI plugin; None when absent and not `create`d."""
    node = doc
    path = ["plugins", CRI_PLUGIN[version], "containerd", "runtimes"]
    for i, key in enumerate(path):
        child = node.get(key)
        if child is None:
            if not create:
                return None
            node[key] = tomlkit.table(
                is_super_table=True
            )  # item assignment: proxies of out-of-order tables have no .add()
            child = node[key]
        elif not isinstance(child, dict):
            raise InstallError(f"{'.'.join(path[: i + 1])} is a {type(child).__name__}, not a table")
        node = child
    return node


def _default_name(doc, version: int) -> str:
    try:
        name = doc["plugins"][CRI_PLUGIN[version]]["containerd"]["default_runtime_name"]
    except (KeyError, TypeError):
        return "runc"
    return str(name) if name else "runc"


def _plain(value):
    """A tomlkit value as plain Python (dicts, lists, scalars)."""
    return copy.deepcopy(value.unwrap() if hasattr(value, "unwrap") else value)


def _is_runc(handler) -> bool:
    return isinstance(handler, dict) and handler.get("runtime_type") == RUNC_V2


def desired_handler(doc, version: int, binary: str | None) -> dict:
    """Our handler: a copy of the default runc handler (SystemdCgroup and the rest), with
    runc.v2, our pod annotations and `options.BinaryName` = the host's gpuhook-runtime; with
    no `binary` (the NRI front), no BinaryName at all: plain runc."""
    runtimes = _runtimes(doc, version, create=False) or {}
    source = runtimes.get(_default_name(doc, version))
    if not _is_runc(source):
        source = runtimes.get("runc")
    handler = _plain(source) if _is_runc(source) else {}
    handler["runtime_type"] = RUNC_V2
    pods = [a for a in handler.get("pod_annotations") or [] if a not in ANNOTATIONS]
    handler["pod_annotations"] = pods + ANNOTATIONS
    options = handler.pop("options", None)
    options = dict(options) if isinstance(options, dict) else {}
    options.pop("BinaryName", None)
    if binary is not None:
        options["BinaryName"] = binary
    if options:
        handler["options"] = options  # last: a sub-table renders after the handler's keys
    return handler


def has_handler(doc, version: int, binary: str | None) -> bool:
    runtimes = _runtimes(doc, version, create=False)
    current = runtimes.get(HANDLER) if runtimes is not None else None
    return current is not None and _plain(current) == desired_handler(doc, version, binary)


def _style(runtimes) -> tuple[str, str]:
    """(header indent, one indent step) of the existing handlers, so ours looks like them."""
    for value in runtimes.values():
        if isinstance(value, tomlkit.items.Table):
            head = value.trivia.indent
            for _, item in value.value.body:
                if isinstance(item, tomlkit.items.Item) and not isinstance(
                    item, (tomlkit.items.Table, tomlkit.items.Whitespace)
                ):
                    key = item.trivia.indent
                    return head, key[len(head) :] if key.startswith(head) else ""
            return head, ""
    return "", ""


def _table(data: dict, indent: str, step: str) -> tomlkit.items.Table:
    """A table laid out like containerd's own: keys one step in, sub-tables after, a blank line."""
    table = tomlkit.table()
    table.trivia.indent = indent
    subs = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    for key, value in data.items():
        if not isinstance(value, dict):
            table.add(key, value)
            table.item(key).trivia.indent = indent + step  # type: ignore[union-attr]
    table.add(tomlkit.nl())
    for key, value in subs:
        table.add(key, _table(value, indent + step, step))
    return table


def _indent_headers(table, indent: str, step: str) -> None:
    """tomlkit indents a table's header by its parent's when it is added: set it back."""
    table.trivia.indent = indent
    for value in table.values():
        if isinstance(value, tomlkit.items.Table):
            _indent_headers(value, indent + step, step)


def add_handler(doc, version: int, binary: str | None) -> bool:
    """Add (or bring up to date) our handler; False when it is already exactly right."""
    if has_handler(doc, version, binary):
        return False
    handler = desired_handler(doc, version, binary)
    runtimes = _runtimes(doc, version, create=True)
    if not any(isinstance(v, dict) for v in runtimes.values()):
        # The file sets no handler: containerd's built-in runc is in force, and would vanish
        # as soon as the file sets ours. Write it down too.
        runtimes["runc"] = _table({"runtime_type": RUNC_V2}, "", "")  # item assignment: works on
        # tomlkit's proxy of out-of-order tables too, where .add() does not exist
    head, step = _style(runtimes)
    runtimes[HANDLER] = _table(handler, head, step)
    _indent_headers(runtimes[HANDLER], head, step)
    return True


def remove_handler(doc, version: int) -> bool:
    """Remove our handler; False when there is none. A runc handler that install wrote
    (file with no handler of its own) stays: it equals containerd's built-in one."""
    runtimes = _runtimes(doc, version, create=False)
    if runtimes is None or HANDLER not in runtimes:
        return False
    del runtimes[HANDLER]
    return True


# -- NRI (the `nri` front): containerd 1.7 has it, off by default; 2.x on; 1.6 none ----------

NRI_PLUGIN = "io.containerd.nri.v1.nri"  # the plugin's section under [plugins]
# What a containerd binary holds when it has NRI (the plugin type's name, 1.7 and later), and
# when it is 2.x (its module path: NRI on by default). Checked against Debian's 1.6.20
# (neither), 1.7.24 (the first) and 2.1.9 (both).
NRI_MARK = b"io.containerd.nri.v1"
V2_MARK = b"github.com/containerd/containerd/v2/"


def binary_nri(path: str) -> bool | None:
    """Whether the containerd binary at `path` has NRI on by default (2.x: True; 1.7: False);
    None when it has no NRI at all (1.6 and before). Read, never run: it may be another
    distribution's binary (a DaemonSet's host root)."""
    found = set()
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            window = tail + chunk
            found |= {m for m in (NRI_MARK, V2_MARK) if m in window}
            tail = window[-len(V2_MARK) :]
    if NRI_MARK not in found:
        return None
    return V2_MARK in found


def find_binary(host_root: str) -> str | None:
    """The node's containerd (the first of BIN_DIRS, resolved inside the host root), as a path from here."""
    from ..probe.host import Host

    h = Host(host_root)
    return next((p for d in BIN_DIRS if os.path.isfile(p := h.resolve(f"{d}/containerd"))), None)


def _nri(doc):
    plugins = doc.get("plugins")
    section = plugins.get(NRI_PLUGIN) if isinstance(plugins, dict) else None
    return section if isinstance(section, dict) else None


def nri_on(doc, default_on: bool) -> bool:
    section = _nri(doc)
    if section is None:
        return default_on
    return section.get("disable", not default_on) is False


def check_nri(doc, default_on: bool | None, where: str) -> None:
    """InstallError when gpuhook's NRI plugin cannot reach this containerd: no NRI in it (1.6),
    or external plugins' connections turned off."""
    if default_on is None:
        raise InstallError(
            "--front nri: this containerd has no NRI (containerd 1.6 and before; 1.7 has it): "
            "upgrade containerd, or install with --front wrapper"
        )
    section = _nri(doc)
    if section is not None and section.get("disable_connections") is True:
        raise InstallError(
            f'--front nri: {where} sets [plugins."{NRI_PLUGIN}"] disable_connections = true, which keeps '
            "out every plugin containerd does not start itself (gpuhook's connects to its socket): set it to false"
        )


def enable_nri(doc, default_on: bool) -> dict | None:
    """Turn NRI on where it is off; what was there before (for undo_nri), None when it was on."""
    if nri_on(doc, default_on):
        return None
    section = _nri(doc)
    if section is None:
        doc.setdefault("plugins", tomlkit.table(is_super_table=True))
        table = tomlkit.table()
        table.add("disable", False)
        doc["plugins"][NRI_PLUGIN] = table
        return {"section": False}
    before = {"section": True, "disable": section["disable"] if "disable" in section else None}
    section["disable"] = False
    return before


def undo_nri(doc, before: dict | None) -> bool:
    """Put back what enable_nri changed (`before`, its answer); False when there is nothing to undo."""
    section = _nri(doc)
    if not before or section is None or section.get("disable") is not False:
        return False
    if not before.get("section"):
        del doc["plugins"][NRI_PLUGIN]
    elif before.get("disable") is None:
        del section["disable"]
    else:
        section["disable"] = before["disable"]
    return True


def nri_socket(doc) -> str:
    from ..nri.plugin import DEFAULT_SOCKET

    section = _nri(doc) or {}
    return str(section.get("socket_path") or DEFAULT_SOCKET)


def shadowing_imports(doc, version: int, host_root: str, config_path: str) -> list[str]:
    """Files `imports`ed by config.toml that define the CRI plugin's section: containerd
    loads them after config.toml and their section replaces the one we edit."""
    import tomllib

    found = []
    imports = doc.get("imports") or []
    here = os.path.realpath(_host(host_root, config_path))
    for pattern in imports if isinstance(imports, list) else []:
        if not isinstance(pattern, str):
            continue
        path = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(config_path), pattern)
        for f in sorted(glob.glob(_host(host_root, path))):
            if os.path.realpath(f) == here:
                continue
            try:
                with open(f, "rb") as fh:
                    data = tomllib.load(fh)
            except (OSError, ValueError) as e:
                raise InstallError(
                    f"{_unhost(host_root, f)} (imported by {config_path}): cannot read it ({e})"
                ) from None
            if CRI_PLUGIN[version] in (data.get("plugins") or {}):
                found.append(_unhost(host_root, f))
    return found


def _host(host_root: str, path: str) -> str:
    return os.path.join(host_root, path.lstrip("/"))


def _unhost(host_root: str, path: str) -> str:
    rel = os.path.relpath(path, host_root)
    return "/" + rel if not rel.startswith("..") else path


# -- the adapter (runtimes.py): what install and uninstall do with containerd -------------------

BACKUP = files.STATE_DIR + "/containerd-config.toml"
SOCKET = "/run/containerd/containerd.sock"
# containerd's global flags that take a value (urfave/cli: "--flag value" or "--flag=value")
_VALUE_FLAGS = {"--config", "-c", "--log-level", "-l", "--address", "-a", "--root", "--state"}


@dataclasses.dataclass
class Read:
    """containerd's config as install found it, checked before anything is written."""

    raw: bytes | None  # the file now (None: there is none)
    doc: object  # what install edits: the file now, or its original when the file is as install wrote it
    version: int
    front: str
    nri_default: bool | None  # --front nri: NRI on when the file does not say (2.x); None: no NRI (1.6)
    fresh: bool  # doc is the original's (then nothing of an earlier front is left to undo)


def _read(root: str, front: str, mine: dict | None) -> Read:
    """No config.toml: containerd runs on its built-in defaults; a version 2 file with only the
    handlers keeps them (containerd 2.x reads version 2 too)."""
    name = DEFAULT_CONFIG
    raw = files.read(_host(root, name), name)
    base = journal.as_before(root, mine, raw, BACKUP)
    doc, version = parse(journal.text(base, name) if base is not None else "version = 2\n", name)
    shadows = shadowing_imports(doc, version, root, name)
    if shadows:
        raise InstallError(
            f"{shadows[0]} (imported by {name}) sets the {CRI_PLUGIN[version]} plugin's "
            f"section, which replaces {name}'s when containerd loads it: add the gpu-optional "
            "handler there by hand, or fold that file into config.toml, then run install again"
        )
    default = None
    if front == "nri":
        default = _nri_default(root, doc, version)
        check_nri(doc, default, name)
    return Read(raw, doc, version, front, default, base is not raw)


def _nri_default(root: str, doc, version: int) -> bool | None:
    """Whether NRI is on by default in this node's containerd (None: it has none). Versions 3
    and 4 are read by containerd 2.x alone; a version 2 file by 1.6, 1.7 and 2.x: the binary says."""
    if version >= 3:
        return True
    binary = find_binary(root)
    if binary is not None:
        return binary_nri(binary)
    if _nri(doc) is not None and "disable" in _nri(doc):
        return False  # (a file that sets it says for itself; only 1.7 and later have the section)
    raise InstallError(
        f"--front nri: no containerd under {root} ({', '.join(BIN_DIRS)}) to tell whether it has NRI "
        f'(containerd 1.7 and later): set [plugins."{NRI_PLUGIN}"] disable = false in {DEFAULT_CONFIG} by hand '
        "(containerd 1.7 or later), or install with --front wrapper"
    )


def _install(root: str, state: dict, dry_run: bool, say: journal.Say, read: Read) -> bool:
    name, doc, version = DEFAULT_CONFIG, read.doc, read.version
    mine = state.get("containerd") or {}
    nri = None if read.fresh else mine.get("nri")  # what NRI was before gpuhook turned it on
    add_handler(doc, version, BINARY if read.front == "wrapper" else None)
    if read.front == "nri":
        assert read.nri_default is not None  # (check_nri refused it)
        nri = enable_nri(doc, read.nri_default) or nri
    elif undo_nri(doc, nri):
        nri = None
    new = dumps(doc).encode()
    what = "handler gpu-optional" + (" (plain runc, for gpuhook's NRI plugin)" if read.front == "nri" else "")
    if new == read.raw:
        say(f"containerd: {name}: {what} already in place (config version {version})")
        return False
    if dry_run:
        say(f"containerd: {name}: {what} would be added (config version {version})")
        return True
    journal.write_config(root, state, "containerd", name, BACKUP, read.raw, new, every={"nri": nri})
    existed = read.raw is not None
    say(
        f"containerd: {name}: {what} {'added' if existed else 'written to a new file'} (config version {version}, "
        + (f"BinaryName {BINARY})" if read.front == "wrapper" else "no BinaryName)")
        + (f'; NRI turned on ([plugins."{NRI_PLUGIN}"] disable = false)' if nri else "")
        + (f"; original kept in {BACKUP}" if existed and state["containerd"].get("backup") else "")
    )
    return True


def _uninstall(root: str, mine: dict | None, dry_run: bool, say: journal.Say) -> bool:
    name = DEFAULT_CONFIG

    def edit(raw: bytes) -> bytes | None:
        doc, version = parse(journal.text(raw, name), name)
        undone = undo_nri(doc, (mine or {}).get("nri"))  # (only what gpuhook turned on)
        return dumps(doc).encode() if remove_handler(doc, version) or undone else None

    return journal.uninstall_edited(
        root, mine, "containerd", name, BACKUP, dry_run, say, edit, "no gpu-optional handler: left as it is"
    )


def _plugin_args(read: Read) -> tuple[str, ...]:
    """What `gpuhook nri` needs to serve this containerd beyond its defaults: the socket the
    config names (the hook finds each container's rootfs in its bundle, wherever `state` is)."""
    from ..nri.plugin import DEFAULT_SOCKET

    doc = read.doc
    assert isinstance(doc, dict)
    return ("--socket", nri_socket(doc)) if nri_socket(doc) != DEFAULT_SOCKET else ()


def _has_ours(raw: bytes) -> bool:
    doc, version = parse(journal.text(raw, DEFAULT_CONFIG), DEFAULT_CONFIG)
    return remove_handler(doc, version)


def _daemon_config(proc: str, pid: int, argv: list[str]) -> str | None:
    """The config file a containerd daemon reads, as a path from here; None for a
    `containerd <subcommand>` run (config dump, publish...), which is not the daemon."""
    config = DEFAULT_CONFIG
    i = 1
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in _VALUE_FLAGS:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            if flag in ("--config", "-c"):
                config = value
        elif not arg.startswith("-"):
            return None
        i += 1
    return restart.config_path(proc, pid, config)


ADAPTER = Adapter(
    name="containerd",
    label="containerd",
    config=DEFAULT_CONFIG,
    marks=(DEFAULT_CONFIG, SOCKET),
    pods=True,
    # no config reload (1.6, checked): SIGHUP kills it on the spot, so SIGTERM and its
    # supervisor (containerd.service: Restart=always) starts it again
    daemon=restart.Daemon(
        comm="containerd",
        unit="containerd.service",
        systemctl="restart",
        how="restart containerd (systemctl restart containerd.service)",
        config_of=_daemon_config,
    ),
    read=_read,
    install=_install,
    uninstall=_uninstall,
    ours=journal.ours(_has_ours, DEFAULT_CONFIG),
    fronts=("wrapper", "nri"),
    plugin_args=_plugin_args,
)
