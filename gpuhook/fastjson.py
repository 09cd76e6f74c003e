"""JSON for the per-container path, on the C accelerator alone.

The stdlib `json` package compiles regular expressions at import, which pulls in `re` and
`enum`: on a slow node that is ~15 ms before any work, on every container start. `_json`
(the C half of the same package) parses and serialises without them. Same results as
json.loads / json.dumps(separators=(",", ":")) for the JSON that OCI specs hold.
"""


import _json


def _no_constant(name: str):
    raise ValueError(f"invalid JSON constant {name}")


def _object(pairs: list) -> dict:
    """A JSON object; duplicate keys are refused: Go's encoding/json (runc) merges or keeps
    what Python would drop, so a spec with them cannot be read the way runc reads it."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup[:64]!r}")
    return obj


class _Context:
    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(_object)
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)
    memo: dict = {}


_scan = _json.make_scanner(_Context())
_WS = " \t\n\r"


def loads(s: str | bytes):
    """Parse one JSON document; ValueError on anything else (trailing data, NaN, bad UTF-8,
    duplicate keys)."""
    if isinstance(s, (bytes, bytearray)):
        s = bytes(s).decode("utf-8")  # UnicodeDecodeError is a ValueError
    i = 0
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    try:
        obj, end = _scan(s, i)
    except StopIteration as e:
        raise ValueError(f"invalid JSON at offset {e.value}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except SystemError:
        raise ValueError(_why(s, i)) from None
    finally:
        _Context.memo.clear()
    while end < n and s[end] in _WS:
        end += 1
    if end != n:
        raise ValueError(f"extra data at offset {end}")
    return obj


def _why(s: str, i: int) -> str:
    """The message of a syntax error that _json could not raise: it raises
    json.decoder.JSONDecodeError, a class it finds only once json.decoder is imported, which
    the fast path never does; without it the scanner fails with SystemError instead."""
    import json.decoder  # noqa: F401  (on malformed input only)

    try:
        _scan(s, i)
    except (ValueError, RecursionError) as e:
        return str(e)
    except StopIteration as e:
        return f"invalid JSON at offset {e.value}"
    return "invalid JSON"


def _default(o):
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


_encode = _json.make_encoder(None, _default, _json.encode_basestring_ascii, None, ":", ",",
                             False, False, False)


def dumps(obj) -> str:
    """Compact JSON (no NaN/Infinity: they are not JSON)."""
    return "".join(_encode(obj, 0))
