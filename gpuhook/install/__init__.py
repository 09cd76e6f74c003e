"""`gpuhook install` / `gpuhook uninstall`: put gpuhook on a node and register the
`gpu-optional` runtime handler with the node's container runtime.

    core.py        the two commands: what is written where, in which order; the state file
    runtimes.py    the registry: one Adapter per container runtime, each in its own file:
      containerd.py  containerd's config.toml (version 2 and 3), edited in place with tomlkit
      crio.py        CRI-O's drop-in, /etc/crio/crio.conf.d/99-gpuhook.toml
      docker.py      dockerd's /etc/docker/daemon.json: runtimes["gpu-optional"]
    journal.py     what the adapters share: the journalled edit of a config, its byte-for-byte undo
    files.py       atomic writes, the host bundle's versions (/opt/gpuhook), the state file
    restart.py     making a runtime load its new config (its adapter's Daemon says how):
                   SIGTERM + supervisor, SIGHUP, systemctl
    build.py       builds the host bundle (packaging/build-bundle.sh runs it; install runs it
                   when it has no bundle to copy: a pip install)
    devlinks.py    /dev/char/MAJ:MIN links of the nodes gpuhook injects (install and the agent)
    (the commands' argparse wiring is gpuhook/cli/install.py)

Every path the installer writes is under --host-root; every path it writes *into* a config
file (the handler's binary) is the host's own view of it, without the host root.
"""


class InstallError(Exception):
    """Something about the node that stops the install: one clear line for the operator."""
