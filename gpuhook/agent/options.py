"""The node agent's options (`gpuhook agent`'s command line, cli/agent.py), and the install
they make."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .. import cdi, defaults
from ..nri.plugin import DEFAULT_SOCKET as NRI_SOCKET, ROOTFS_TEMPLATE
from . import nri as nri_mod

READY_FILE = defaults.READY_FILE


@dataclasses.dataclass
class Options:
    root: str = "/"  # where the node's / is (/host in the DaemonSet)
    spec_root: str = "/"  # the node's / as the container runtime sees it (in CDI paths)
    interval: float = 30.0  # periodic re-probe, seconds
    debounce: float = 1.0  # quiet time after a udev event before re-probing
    cdi_dir: str | None = None  # default <root>/var/run/cdi (resolved inside root); "" = off
    nfd_dir: str | None = None  # default <root>/etc/kubernetes/node-feature-discovery/features.d; "" = off
    cdi_format: str = "yaml"
    cdi_max_version: str | None = None  # the newest cdiVersion the node's runtimes read (None: any)
    install: bool = True
    once: bool = False
    ready_file: str = READY_FILE  # "" = none
    ldconfig: str | None = None  # the node's ldconfig for the CDI ld-cache hook (found when None)
    install_restart: str = "none"  # passed to gpuhook install: signal | systemd | none
    api_resync: float = 300.0  # re-check the Node's labels at least this often
    udev: bool = True
    nvidia_driver_root: str | None = None  # the node config's nvidia_driver_root (None: auto)
    runtime_log: str | None = None  # the runtime's log to follow (None: the node config's log_file in root; "" = off)
    log_position: str | None = None  # where it stopped reading that log (None: LOG_POSITION in root; "" = none)
    pod_events: bool = True  # Events and the gpuhook.dev/accelerator label on gpu-optional pods
    metrics_address: str | None = None  # host:port for Prometheus metrics (None: off)
    kubeconfig: str | None = None  # the API from a kubeconfig file (None: in-cluster, when in a pod)
    kube_context: str | None = None  # its context (None: current-context)
    node_name: str | None = None  # this node's name in the API (None: NODE_NAME, else the host name)
    vendor_label: str | None = None  # the label set to the primary vendor (None: the node config's, read at each probe)
    front: str = nri_mod.DEFAULT_FRONT  # wrapper | nri | auto: whether the NRI plugin runs (nri.py)
    nri_socket: str = NRI_SOCKET  # the runtime's NRI socket, as the node sees it
    nri_rootfs_template: str = ROOTFS_TEMPLATE  # the plugin's --rootfs-template

    def resolved_vendor_label(self) -> str:
        """vendor_label, else the node config's (gpu.type by default; "" = none): read again
        at each probe, so a renamed or removed key takes effect without a restart."""
        if self.vendor_label is not None:
            return self.vendor_label
        from ..config import load, node_config_path

        return load(node_config_path(self.root))[0].vendor_label

    def resolved_runtime_log(self) -> str:
        if self.runtime_log is not None:
            return self.runtime_log
        from ..config import load, node_config_path

        config, _ = load(node_config_path(self.root))
        if not config.log_file:
            return ""
        return self._under_root(None, config.log_file) if self.root != "/" else config.log_file

    def resolved_log_position(self) -> str:
        return self._under_root(self.log_position, defaults.LOG_POSITION)

    def resolved_cdi_dir(self) -> str:
        return self._under_root(self.cdi_dir, cdi.DEFAULT_DIR)

    def resolved_nfd_dir(self) -> str:
        return self._under_root(self.nfd_dir, defaults.NFD_DIR)

    def _under_root(self, given: str | None, default: str) -> str:
        if given is not None:
            return given
        from ..probe.host import Host

        # inside the root as if chrooted: /var/run -> /run on the node must not lead to the
        # agent container's own /run
        return Host(self.root).resolve(default)


def default_installer(opts: Options, log, front: str) -> Callable[[], None]:
    """`gpuhook install` for this node (gpuhook.install.core.install) with the agent's front:
    for `nri` the plain runc handler and NRI turned on, with no gpuhook-nri.service (the agent
    runs the plugin itself: a unit beside it would be a second plugin)."""

    def install() -> None:
        from ..install.core import Options as InstallOptions, install as run_install

        run_install(
            InstallOptions(host_root=opts.root, restart=opts.install_restart, front=front, nri_unit=front != "nri"),
            lambda line: log.info("install.step", message=line),
        )

    return install
