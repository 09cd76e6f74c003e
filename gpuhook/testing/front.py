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
