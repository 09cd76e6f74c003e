"""Where gpuhook keeps things on a node, and the defaults that several parts share: each
written once, here. The C front (runtime/gpuhook-runtime.c) cannot import this: its header
(gpuhook-runtime.h) is generated from these values (runtime/gen_header.py).

This module imports nothing: it is on the per-container path.
"""

CONFIG_FILE = "/etc/gpuhook/config.toml"  # the node config (GPUHOOK_CONFIG overrides)
LOG_FILE = "/var/log/gpuhook.log"  # one JSON line per create (the node config's log_file)
CACHE_DIR = "/run/gpuhook"  # parsed config, probe result, exec records (GPUHOOK_CACHE_DIR)
READY_FILE = CACHE_DIR + "/ready"  # the agent's readiness file
# where the agent stopped reading LOG_FILE: the next agent (a new pod of the DaemonSet) starts
# there, so the creates made while none ran get their Events too (agent/follow.py)
LOG_POSITION = "/var/lib/gpuhook/agent-log-position.json"
INSTALL_PREFIX = "/opt/gpuhook"  # the host bundle
BUNDLE_VERSIONS = ".versions"  # its versions' directory, under INSTALL_PREFIX (install/files.py)
PACKAGE_MARK = INSTALL_PREFIX + "/.installed-by-package"  # the .deb's bundle: uninstall leaves it to dpkg
BACKUP_DIR = "/etc/gpuhook/backup"  # what install replaced, for uninstall
RUNTIME_BINARY = INSTALL_PREFIX + "/bin/gpuhook-runtime"  # the handler's binary
CDI_DIR = "/var/run/cdi"  # where the agent writes CDI specs
# the agent's NFD feature file (its labels, for node-feature-discovery), which uninstall removes
NFD_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
NFD_FEATURES = NFD_DIR + "/gpuhook"
MPS_PIPE_DIR = "/tmp/nvidia-mps"  # CUDA's default MPS pipe directory: where a container's CUDA looks
# (the host side is the node config's mps_pipe_dir, unset by default: config.py)
# the scheduling label users already write (nodeAffinity on gpu.type In [nvidia, amd, intel]): the
# agent sets it to gpuhook.dev/accelerator's vendor (the node config's vendor_label; "" turns it off)
VENDOR_LABEL = "gpu.type"
# the agent's name in the API: its field manager (the API server records under it which fields the
# agent's patches set, metadata.managedFields: the agent changes or removes only those) and its Events' source
AGENT_NAME = "gpuhook-agent"
# the runtime handler (a pod's runtimeClassName's handler) of gpu-optional pods: the one the NRI
# plugin adjusts (the node config's nri_runtime_handler)
RUNTIME_HANDLER = "gpu-optional"
# the runtime's entry, as the front runs it: `python -I -S -c RUNTIME_MAIN <site-packages> ARGS...`.
# A create lives a few milliseconds, then execs the real runtime (or exits): the cyclic collector's
# passes over the objects of the modules being imported are pure cost there (reference counting
# frees the rest, and the few cycles go with the process).
RUNTIME_FLAGS = ("-I", "-S", "-c")  # then RUNTIME_MAIN (or CLI_MAIN), <site-packages>, ARGS...
MODULE_FLAGS = ("-I", "-m")  # then the module: with no site-packages dir, as sys.path has it
RUNTIME_MAIN = (
    "import gc, sys; gc.disable(); sys.path.insert(0, sys.argv.pop(1)); from gpuhook.runtime import main; main()"
)
# gpuhook's CLI the same way (the bundle's bin/gpuhook, `gpuhook nri --root`)
CLI_MAIN = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuhook.cli import main; sys.exit(main())"
# where the front looks for an interpreter when GPUHOOK_PYTHON names none and its bundle has none of
# its own: the first of these, a name beside the front itself, a path as it is
FRONT_PYTHONS = ("python3", "python", "/usr/local/bin/python3", "/usr/bin/python3")
PYTHON_ENV = "GPUHOOK_PYTHON"  # the interpreter the front starts, before all of these (tests, odd nodes)
# Where a node keeps its tools, in execvp's order: where a runtime named without a path is looked
# for when there is no $PATH (SEARCH_PATH, the C front's too), where the installer looks for
# runc and containerd, the NVIDIA probe for the driver's tools, and what the probe cache watches
# under a driver root.
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
SEARCH_PATH = ":".join(BIN_DIRS)
# Where a node keeps shared libraries: where the NVIDIA probe looks for the driver's, and what
# the probe cache watches (on the node and under a driver root) for a driver installed or changed.
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/powerpc64le-linux-gnu",
    "/usr/lib",
)
WSL_LIB_DIR = "/usr/lib/wsl/lib"  # WSL2's GPU userspace (libdxcore.so, libcuda.so...)
