"""What a gpuhook Python run leaves for the C front: the node config's front file
(config.front_text). The tests that run the front alone call prime() first, as any earlier
Python run on a node would have."""

from __future__ import annotations

import os


def prime(config_file: str, cache_dir: str) -> None:
    """Load `config_file` as the runtime would with GPUHOOK_CACHE_DIR=cache_dir."""
    from gpuhook import config

    old = os.environ.get("GPUHOOK_CACHE_DIR")
    os.environ["GPUHOOK_CACHE_DIR"] = cache_dir
    try:
        config.load(str(config_file))
    finally:
        if old is None:
            del os.environ["GPUHOOK_CACHE_DIR"]
        else:
            os.environ["GPUHOOK_CACHE_DIR"] = old


def parse_cache_file(name: str, data: bytes) -> object:
    """A file of the cache dir, whole: JSON, or a front file (config.front_text: the magic
    and NUL-ended NAME=VALUE fields). Raises ValueError when it is not."""
    import json

    from gpuhook.config import FRONT_MAGIC

    if not name.endswith(".front"):
        return json.loads(data)
    fields = data.split(b"\0")
    if fields[0] != FRONT_MAGIC.encode() or fields[-1] != b"" or not all(b"=" in f for f in fields[1:-1]):
        raise ValueError(f"not a whole front file: {data[:120]!r}")
    return dict(f.decode().split("=", 1) for f in fields[1:-1])
