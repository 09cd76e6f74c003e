"""The container runtimes gpuhook installs for: one Adapter each, in its own file of this
package (containerd.py, crio.py, docker.py) as that module's ADAPTER. A new runtime is one
new file and its name in NAMES; core.py and restart.py only ever ask an adapter.

NAMES is plain strings so that the command line can list them without importing the
adapters (tomlkit and the rest load only when an install runs).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import TYPE_CHECKING, Any, Callable

from .files import host

if TYPE_CHECKING:
    from .restart import Daemon

NAMES = ("containerd", "crio", "docker")  # the order `--runtime auto` looks for them in
# the fronts: gpuhook-runtime as the handler's binary (`wrapper`, the default), or a plain runc
# handler and gpuhook's NRI plugin, gpuhook-nri.service (`nri`)
FRONTS = ("wrapper", "nri")

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One container runtime gpuhook installs for."""

    name: str  # as --runtime names it, and the key of its record in the install state
    label: str  # as `--runtime auto` says it found it
    config: str  # the node file install writes: the runtime's config, or a drop-in of ours
    marks: tuple[str, ...]  # node paths that say the runtime is there (`--runtime auto`)
    pods: bool  # a CRI runtime (a kubelet's); False: a daemon of its own (dockerd)
    daemon: Daemon  # how its running daemon is found and made to load the new config
    # (host root, front, its record in the install state) -> the config, checked before
    # anything is written (InstallError: refused), for install
    read: Callable[[str, str, dict | None], Any]
    install: Callable[[str, dict, bool, Say, Any], bool]  # True: its config changed
    uninstall: Callable[[str, dict | None, bool, Say], bool]  # True: its config changed
    ours: Callable[[str], bool]  # its config has gpuhook's handler (uninstall without a state)
    # which of `marks` are on the node under `root` (default: those that exist there)
    found: Callable[[str, tuple[str, ...]], list[str]] = lambda root, marks: [
        p for p in marks if os.path.exists(host(root, p))
    ]
    kubelet_shim: str = ""  # not `pods`: what serves a kubelet's pods with it (cri-dockerd)
    fronts: tuple[str, ...] = ("wrapper",)  # what can give its containers their GPUs (FRONTS)
    # what `gpuhook nri` needs beyond its defaults to serve it (--socket...), from `read`'s answer
    plugin_args: Callable[[Any], tuple[str, ...]] = lambda read: ()


def get(name: str) -> Adapter:
    adapter = importlib.import_module(f"{__package__}.{name}").ADAPTER
    assert isinstance(adapter, Adapter) and adapter.name == name
    return adapter


def every() -> dict[str, Adapter]:
    return {name: get(name) for name in NAMES}
