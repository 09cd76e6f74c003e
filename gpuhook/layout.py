"""The host bundle's layout under defaults.INSTALL_PREFIX, written once: install/build.py makes
it; the C front (its generated header), `gpuhook nri --root` and the benchmark run what is in
it. The base layer: it imports only record.py."""

from .record import Record

# the bundle's loader and interpreter, as the C front (gpuhook/runtime/gpuhook-runtime.c: exec_python)
# and bin/python3 run them
LOADER = "libexec/ld.so"
INTERPRETER = "libexec/python3"
LIBRARY_PATH_FLAG = "--library-path"  # the loader's option: where the bundle's libraries are
LIB = "lib"  # those libraries, and lib/<PYTHON_DIRS...>/<SITE_PACKAGES> (beside bin/ and libexec/)
PYTHON_DIRS = "python3"  # lib/python3.X: how its name starts
SITE_PACKAGES = "site-packages"  # where gpuhook is, under lib/python3.X
DIST_PACKAGES = "dist-packages"  # Debian's python3-gpuhook's place, when the front is beside it


class LaunchWord(Record):
    """A word of LAUNCH: its kind (PROGRAM or PATH: under the bundle's root, a PROGRAM one
    that must be executable; WORD: as it is) and its text."""

    kind: str
    text: str

    __slots__ = ()


PROGRAM, PATH, WORD = "program", "path", "word"
# The bundled interpreter's launch, before its own arguments: the bundle's loader runs it on the
# bundle's libraries. bin/python3 (PYTHON_SH), `gpuhook nri --root` and the C front
# (gpuhook-runtime.h's LAUNCH, generated from this) all start it so.
LAUNCH = (
    LaunchWord(PROGRAM, LOADER),
    LaunchWord(WORD, LIBRARY_PATH_FLAG),
    LaunchWord(PATH, LIB),
    LaunchWord(PROGRAM, INTERPRETER),
)


def launch(root: str) -> list[str]:
    """LAUNCH for the bundle whose root is `root`."""
    return [w.text if w.kind == WORD else f"{root}/{w.text}" for w in LAUNCH]
