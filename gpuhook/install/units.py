"""The runtime server's systemd units (runtime/server.py), from the node paths in defaults.py.

`gpuhook install` writes them on a node with systemd (and with --restart systemd enables the
socket); with --front nri it writes the NRI plugin's unit instead (enabled and started where
systemd runs). The .deb ships them all (packaging/build-deb.sh: `python -m gpuhook.install.units DIR`).
The server is optional: without it gpuhook-runtime starts Python per create, as before.
"""

import os
import sys

from .. import defaults
from ..runtime.server import SOCKET_NAME

UNIT_DIR = "/etc/systemd/system"
SOCKET_UNIT = "gpuhook-runtime.socket"
SERVICE_UNIT = "gpuhook-runtime.service"
MARK = "runtime-server"  # in every unit gpuhook writes: uninstall removes only those

SOCKET_TEXT = f"""# gpuhook: the socket of the runtime server ({SERVICE_UNIT}). gpuhook-runtime asks the
# server to edit a GPU container's config.json instead of starting an interpreter per
# container; systemd starts the server on the first connection. Optional: when it is not
# there (not enabled, stopped, another gpuhook version), gpuhook-runtime starts Python itself.
# Written by `gpuhook install` ({MARK}).
[Unit]
Description=gpuhook: the runtime server's socket

[Socket]
ListenStream={defaults.CACHE_DIR}/{SOCKET_NAME}
SocketMode=0600
DirectoryMode=0700

[Install]
WantedBy=sockets.target
"""

SERVICE_TEXT = f"""# gpuhook: the runtime server, started by {SOCKET_UNIT}. It edits what gpuhook-runtime
# would have edited with a fresh interpreter, one request at a time, and exits when a front
# of another installed version connects (an upgrade): the next connection starts the new one.
# Written by `gpuhook install` ({MARK}).
[Unit]
Description=gpuhook: the runtime server (GPU container creates without an interpreter's start)
Requires={SOCKET_UNIT}
After={SOCKET_UNIT}
ConditionPathExists={defaults.INSTALL_PREFIX}/bin/gpuhook

[Service]
Type=simple
ExecStart={defaults.INSTALL_PREFIX}/bin/gpuhook runtime-server
Restart=on-failure
UMask=0022

[Install]
Also={SOCKET_UNIT}
"""

TEXTS = {SOCKET_UNIT: SOCKET_TEXT, SERVICE_UNIT: SERVICE_TEXT}

NRI_UNIT = "gpuhook-nri.service"
NRI_MARK = "nri-plugin"  # in the NRI plugin's unit: uninstall removes only that
NRI_START_TIMEOUT = 30  # s the kubelet's start waits at most for the plugin's registration at boot


def nri_text(args: tuple[str, ...] = ()) -> str:
    """gpuhook's NRI plugin (`gpuhook nri ARGS`), for `gpuhook install --front nri`."""
    command = " ".join([f"{defaults.INSTALL_PREFIX}/bin/gpuhook", "nri", *args])
    return f"""# gpuhook: the NRI plugin. containerd or CRI-O asks it at each container create of a pod
# whose runtime handler is gpu-optional (a plain runc handler), and it adds this node's GPUs.
# Started after the runtime and before the kubelet, and ready (READY=1) only once the runtime
# has synchronized it: at boot the kubelet's first pods find it registered, unless it cannot
# register within TimeoutStartSec (the kubelet starts then all the same). A gpu-optional pod
# created while it is not registered starts without its GPUs and gets a "missed" line in the
# node log; it reconnects by itself when the runtime restarts.
# Written by `gpuhook install --front nri` ({NRI_MARK}).
[Unit]
Description=gpuhook: the NRI plugin (GPUs for gpu-optional pods, no runtime binary replaced)
After=containerd.service crio.service
Before=kubelet.service
ConditionPathExists={defaults.INSTALL_PREFIX}/bin/gpuhook

[Service]
Type=notify
NotifyAccess=all
TimeoutStartSec={NRI_START_TIMEOUT}
ExecStart={command}
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: python -m gpuhook.install.units DIR", file=sys.stderr)
        return 2
    for name, text in {**TEXTS, NRI_UNIT: nri_text()}.items():
        with open(os.path.join(args[0], name), "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
