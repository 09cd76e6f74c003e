#!/bin/sh
# Build gpuhook's small static programs: gpuhook-hook (the default SOURCE) and the runtime's
# front (gpuhook/runtime/gpuhook-runtime.c). Static: they run on any node, whatever its libc.
# Used by setup.py (pip install, the bundle, the .deb) and by `make`: one compile line.
# usage: build.sh OUTPUT [SOURCE]
set -eu
src=${2:-$(dirname "$0")/gpuhook-hook.c}
out=$1
cc=${CC:-cc}
tmp=$out.tmp.$$
if ! "$cc" -static -O2 -Wall -Wextra -Werror -o "$tmp" "$src"; then
    rm -f "$tmp"
    echo "gpuhook: building $(basename "$src" .c) needs a C compiler and a static libc (apt-get install gcc libc6-dev)" >&2
    exit 1
fi
strip "$tmp" 2>/dev/null || true
chmod 755 "$tmp"
mv -f "$tmp" "$out"
