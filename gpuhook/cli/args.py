"""What the command groups share (cli/*.py): the
usage error and the arguments several of them take. It imports no command module, so the
command modules import it and not each other (no import cycle).
"""

from __future__ import annotations


class UsageError(Exception):
    """A problem with what the user gave us: one line, exit 2."""


def driver_root(args, root: str) -> str:
    """The NVIDIA driver root setting for a command: --nvidia-driver-root, else the node
    config's nvidia_driver_root (the config of the node whose / is `root`)."""
    from ..config import load, node_config_path, valid_driver_root

    given = getattr(args, "nvidia_driver_root", None)
    if given is not None:
        if not valid_driver_root(given):
            raise UsageError(f"--nvidia-driver-root {given}: not auto, / or a normal absolute path")
        return given
    return load(node_config_path(root))[0].nvidia_driver_root


def add_driver_root_arg(sp) -> None:
    sp.add_argument(
        "--nvidia-driver-root",
        metavar="DIR",
        help="where the NVIDIA driver's userspace is: auto "
        "(the host, /run/nvidia/driver, /home/kubernetes/bin/nvidia) or a node path "
        "(default: the node config's nvidia_driver_root, auto)",
    )


CDI_FORMATS = ("yaml", "json")


def add_max_cdi_version_arg(sp) -> None:
    sp.add_argument(
        "--max-cdi-version",
        metavar="VERSION",
        help="the newest cdiVersion the node's runtimes read (podman 4.3: 0.5.0): newer fields are left out "
        "(default: what the specs need)",
    )


def add_cdi_dir_args(sp) -> None:
    """--cdi-format and --max-cdi-version of the commands that keep the node's CDI directory:
    the agent and `gpuhook dra` write the same files, so they take them from one definition
    (their DaemonSets pass both the same: tests/unit/test_dra_manifests.py)."""
    sp.add_argument("--cdi-format", choices=CDI_FORMATS, default="yaml", help="the CDI specs' format (default yaml)")
    add_max_cdi_version_arg(sp)


def max_cdi_version(args) -> str | None:
    """--max-cdi-version, checked: one of cdi.KNOWN_VERSIONS, or None (what the specs need)."""
    from ..cdi import KNOWN_VERSIONS

    given = args.max_cdi_version
    if given is not None and given not in KNOWN_VERSIONS:
        raise UsageError(f"--max-cdi-version {given}: one of {', '.join(KNOWN_VERSIONS)}")
    return given


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, 0 <= s < 1e6 (no nan, no inf)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < 1e6 or value != value:
        raise argparse.ArgumentTypeError(f"{text}: out of range")
    return value


def usage(parser) -> int:
    parser.print_help()
    return 2


def usage_error(msg: str):
    return UsageError(msg)
