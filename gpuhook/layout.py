"""The host bundle's layout under defaults.INSTALL_PREFIX, written once: install/build.py makes
it; the C front (its generated header), `gpuhook nri --root` and the benchmark run what is in
it. The base layer: it imports nothing."""

# the bundle's loader and interpreter, as the C front (gpuhook/runtime/gpuhook-runtime.c: exec_python)
# and bin/python3 run them
LOADER = "libexec/ld.so"
INTERPRETER = "libexec/python3"
LIBRARY_PATH_FLAG = "--library-path"  # the loader's option: where the bundle's libraries are
LIB = "lib"  # those libraries, and lib/<PYTHON_DIRS...>/<SITE_PACKAGES> (beside bin/ and libexec/)
PYTHON_DIRS = "python3"  # lib/python3.X: how its name starts
SITE_PACKAGES = "site-packages"  # where gpuhook is, under lib/python3.X
DIST_PACKAGES = "dist-packages"  # Debian's python3-gpuhook's place, when the front is beside it
