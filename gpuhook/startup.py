"""The runtime's entry in the host bundle: the module store first, then runtime.main().

The bundle's front (bin/gpuhook-runtime) runs its interpreter with defaults.RUNTIME_MAIN:

    python -I -S -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); import gpuhook.startup' \\
        <site-packages> ARGS...

Importing this module is running the runtime (it execs the real one, or exits). Where the
bundle's module store is (modstore.FILE, next to gpuhook/__init__.py: install/build.py writes
it), gpuhook's modules come from it; anywhere else (a pip install, a store of another
interpreter, a bad one) they are imported as usual. `python -m gpuhook.runtime` is the same
runtime without the store (and with the cyclic garbage collector on).
"""

import gc

from . import modstore

# A create lives a few milliseconds, then execs the real runtime (or exits): the cyclic
# collector's passes over the objects of the modules being imported are pure cost there, and
# the few cycles it would free go with the process. (Reference counting frees all the rest.)
gc.disable()

_package = __file__.rpartition("/")[0]  # .../lib/python3.X/site-packages/gpuhook
modstore.install(_package + "/" + modstore.FILE, _package.rpartition("/")[0].rpartition("/")[0])

from .runtime import main  # noqa: E402  (after the store: served from it)

main()
