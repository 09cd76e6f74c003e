#!/bin/sh
# Build the gpuhook image (the DaemonSet's, daemonset/) with no registry: FROM scratch, the
# host bundle at /opt/gpuhook, and the three things that make the bundle's own interpreter
# start with no distribution around it (no shell, no package manager, nothing else):
#   <loader path>     a link to the bundle's loader, where libexec/python3's PT_INTERP names it
#   /etc/ld.so.cache  from /etc/ld.so.conf = /opt/gpuhook/lib: the loader finds the bundle's libc
#   /usr/bin/gpuhook  the CLI as a Python script (`#!/opt/gpuhook/libexec/python3 -IS`)
# The agent copies that very /opt/gpuhook to the node (`gpuhook install`), so the pod and the
# node run the same files.
#
# usage: packaging/build-image.sh [BUNDLE_DIR]
#   BUNDLE_DIR  a bundle from packaging/build-bundle.sh (default: build one now, PYTHON as there)
#   IMAGE       the image name (default localhost/gpuhook:<version>: what daemonset/kustomization.yaml names)
#   PODMAN      the podman command (default podman)
#   CONTEXT     the build context (default: the repository; .containerignore sends only
#               build/image/rootfs from it)
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
bundle=${1:-}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gpuhook/__init__.py")
image=${IMAGE:-localhost/gpuhook:$version}
podman=${PODMAN:-podman}
ctx=${CONTEXT:-$repo}
rootfs=$ctx/build/image/rootfs
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
[ -x "$ldconfig" ] || { echo "build-image: ldconfig not found (apt-get install libc-bin)" >&2; exit 1; }

rm -rf "$rootfs"
mkdir -p "$rootfs/opt" "$rootfs/etc" "$rootfs/usr/bin" "$rootfs/host" "$rootfs/run" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
if [ -n "$bundle" ]; then
    [ -f "$bundle/gpuhook-bundle.json" ] || { echo "build-image: $bundle is not a gpuhook bundle" >&2; exit 1; }
    cp -a "$bundle" "$rootfs/opt/gpuhook"
else
    "$repo/packaging/build-bundle.sh" "$rootfs/opt/gpuhook"
fi
b=$rootfs/opt/gpuhook
loader=$(sed -n 's/^ "loader": "\(.*\)",*$/\1/p' "$b/gpuhook-bundle.json")
[ -n "$loader" ] && [ -f "$b/lib/${loader##*/}" ] || {
    echo "build-image: $b/gpuhook-bundle.json names no loader (a bundle from an older gpuhook: rebuild it)" >&2; exit 1; }
pylib=$(cd "$b/lib" && ls -d python3.*)
mkdir -p "$rootfs${loader%/*}"
ln -s "/opt/gpuhook/lib/${loader##*/}" "$rootfs$loader"
echo /opt/gpuhook/lib > "$rootfs/etc/ld.so.conf"
"$ldconfig" -X -r "$rootfs"
cat > "$rootfs/usr/bin/gpuhook" <<SCRIPT
#!/opt/gpuhook/libexec/python3 -IS
# gpuhook's CLI in the image: the bundle's interpreter, started by the kernel with no shell.
import sys
sys.path.insert(0, "/opt/gpuhook/lib/$pylib/site-packages")
from gpuhook.cli import main
sys.exit(main())
SCRIPT
chmod 755 "$rootfs/usr/bin/gpuhook"
# root runs the agent (it is privileged); the others are there for tools that look them up
printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:65534:65534:nobody:/:/nonexistent\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$rootfs/etc/group"

$podman build --pull=never --build-arg "VERSION=$version" -f "$repo/packaging/Containerfile" -t "$image" "$ctx" >&2
size=$($podman image inspect --format '{{.Size}}' "$image")
echo "image: $image: $((size / 1000000)) MB uncompressed (bundle: $(du -sm "$b" | cut -f1) MiB)"
