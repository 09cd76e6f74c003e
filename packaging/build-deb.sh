#!/bin/sh
# Build gpuhook_<version>_<arch>.deb with dpkg-deb: the host bundle in /opt/gpuhook (with the
# package's mark, defaults.PACKAGE_MARK) and the boot-time unit gpuhook-install.service. No Depends: the bundle brings its own Python, libraries
# and libc; runc is recommended (gpuhook-runtime execs it).
#
# usage: packaging/build-deb.sh OUT_DIR [BUNDLE_DIR]
#   BUNDLE_DIR  a bundle from packaging/build-bundle.sh (default: build one now)
#
# Maintainer scripts, on purpose unsurprising:
#   postinst  enables gpuhook-install.service (it runs at the next boot, before the runtime);
#             changes no runtime config and restarts nothing now, it says how to.
#   prerm     on remove: `gpuhook uninstall --restart none --keep-bundle` (the runtime config gets
#             its original bytes back when untouched since), disables the unit. dpkg removes the files.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: $0 OUT_DIR [BUNDLE_DIR]}
bundle=${2:-}
command -v dpkg-deb >/dev/null 2>&1 || { echo "build-deb: dpkg-deb not found" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
if [ -z "$bundle" ]; then
    "$repo/packaging/build-bundle.sh" "$work/bundle" >&2
    bundle=$work/bundle
fi
[ -f "$bundle/gpuhook-bundle.json" ] || { echo "build-deb: $bundle is not a gpuhook bundle" >&2; exit 1; }

version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gpuhook/__init__.py")
arch=$(dpkg --print-architecture)
root=$work/root
mkdir -p "$root/opt" "$root/lib/systemd/system" "$root/DEBIAN"
cp -a "$bundle" "$root/opt/gpuhook"
# The mark that tells `gpuhook uninstall` this bundle is the package's (dpkg removes it), not
# one that `gpuhook install` copied; its path is gpuhook.defaults.PACKAGE_MARK.
mark=$(PYTHONPATH="$repo" "${PYTHON:-python3}" -c 'from gpuhook.defaults import PACKAGE_MARK; print(PACKAGE_MARK)')
echo "gpuhook $(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gpuhook/__init__.py") (.deb): dpkg removes this bundle" \
    > "$root$mark"
install -m 0644 "$repo/systemd/gpuhook-install.service" "$root/lib/systemd/system/gpuhook-install.service"

cat > "$root/DEBIAN/control" <<CONTROL
Package: gpuhook
Version: $version
Architecture: $arch
Maintainer: gpuhook maintainers <maintainers@gpuhook.dev>
Installed-Size: $(du -sk "$root/opt" "$root/lib" | awk '{s += $1} END {print s}')
Section: admin
Priority: optional
Recommends: runc
Description: GPU-optional containers: the node part (runtime wrapper and installer)
 gpuhook-runtime wraps runc: a container started with the gpu-optional runtime
 handler gets the node's GPUs (devices, driver libraries, environment) when the
 node has any, and runs unchanged on CPU when it has none.
 .
 This package installs gpuhook with its own Python in /opt/gpuhook and a boot-time
 unit that adds the gpu-optional handler to containerd or CRI-O.
CONTROL

cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if command -v deb-systemd-helper >/dev/null 2>&1; then
        deb-systemd-helper enable gpuhook-install.service >/dev/null || true
    elif command -v systemctl >/dev/null 2>&1; then
        systemctl enable gpuhook-install.service >/dev/null 2>&1 || true
    fi
    [ -d /run/systemd/system ] && systemctl daemon-reload >/dev/null 2>&1 || true
    echo "gpuhook: the gpu-optional handler is added at the next boot; to add it now:"
    echo "  /opt/gpuhook/bin/gpuhook install --restart systemd"
fi
exit 0
POSTINST

cat > "$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = remove ]; then
    /opt/gpuhook/bin/gpuhook uninstall --restart none --keep-bundle || true
    if command -v deb-systemd-helper >/dev/null 2>&1; then
        deb-systemd-helper disable gpuhook-install.service >/dev/null || true
    elif command -v systemctl >/dev/null 2>&1; then
        systemctl disable gpuhook-install.service >/dev/null 2>&1 || true
    fi
fi
exit 0
PRERM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"

mkdir -p "$out"
deb=$out/gpuhook_${version}_${arch}.deb
# GPUHOOK_DEB_COMPRESSION: xz (default), gzip, zstd or none (the tests use none: faster)
dpkg-deb --root-owner-group -Z"${GPUHOOK_DEB_COMPRESSION:-xz}" --build "$root" "$deb" >/dev/null
echo "$deb"
