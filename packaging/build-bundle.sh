#!/bin/sh
# Build the host bundle: gpuhook with its own Python, libraries and libc, for nodes that have
# no Python (see gpuhook/install/build.py for the layout). `gpuhook install` copies it to
# /opt/gpuhook on the node.
#
# usage: packaging/build-bundle.sh OUT_DIR
#   PYTHON  the interpreter to bundle, with gpuhook's dependencies installed
#           (default: the repository's .venv/bin/python, else python3)
# Needs ldd (libc-bin). The bundle is for this machine's architecture.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: $0 OUT_DIR}
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then py=$repo/.venv/bin/python; else py=python3; fi
fi
command -v ldd >/dev/null 2>&1 || { echo "build-bundle: ldd not found (apt-get install libc-bin)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$repo"
# gpuhook itself comes from this source tree, its dependencies from $py's environment.
PYTHONPATH=$repo exec "$py" -m gpuhook.install.build "$out"
