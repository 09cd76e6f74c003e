"""CRI-O: the `gpu-optional` handler as a drop-in, /etc/crio/crio.conf.d/99-gpuhook.toml.

CRI-O merges every file of crio.conf.d key by key (unlike containerd 1.x's imports), so a
drop-in of our own is the clean way: the operator's crio.conf is never touched and uninstall
is one unlink.

  runtime_type = "oci": gpuhook-runtime has runc's command line.
  runtime_root: the state directory CRI-O passes as `--root` to every call of the handler;
      runc keeps its containers there. Its own directory keeps gpu-optional containers apart
      from the default handler's (/run/runc).
  No allowed_annotations: that list only lets a handler act on CRI-O's own experimental
      `io.kubernetes.cri-o.*` annotations (and is deprecated in favour of workloads); pod
      annotations such as gpuhook.dev/* reach the OCI spec without it.
"""

from __future__ import annotations

from ..defaults import RUNTIME_HANDLER

HANDLER = RUNTIME_HANDLER
DROPIN = "/etc/crio/crio.conf.d/99-gpuhook.toml"
RUNTIME_ROOT = "/run/gpuhook-runc"
MARK = "# Written by `gpuhook install`"


def render(binary: str) -> bytes:
    return (
        f"{MARK}; `gpuhook uninstall` removes it. Edits here are overwritten by the next install.\n"
        "# The gpu-optional runtime handler: runc behind gpuhook-runtime, which adds this node's\n"
        "# GPUs to a container's config.json at create (node settings: /etc/gpuhook/config.toml).\n"
        f"[crio.runtime.runtimes.{HANDLER}]\n"
        f'runtime_path = "{binary}"\n'
        'runtime_type = "oci"\n'
        f'runtime_root = "{RUNTIME_ROOT}"\n'
    ).encode()
