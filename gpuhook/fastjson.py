"""JSON for the per-container path, on the C accelerator alone.

The stdlib `json` package compiles regular expressions at import, which pulls in `re` and
`enum`: on a slow node that is ~15 ms before any work, on every container start. `_json`
(the C half of the same package) parses and serialises without them. Same results as
json.loads / json.dumps(separators=(",", ":")) for the JSON that OCI specs hold.

`_json` is private: its signatures may change in another CPython. At import both halves are
built and checked on a sample; if anything is not as expected, loads and dumps are the
stdlib `json`'s with the same rules (slower, never wrong): `ACCELERATED` says which.
"""

try:
    import _json
except ImportError:  # an interpreter without the accelerator
    _json = None  # type: ignore[assignment]


def _no_constant(name: str):
    raise ValueError(f"invalid JSON constant {name}")


def _object(pairs: list) -> dict:
    """A JSON object; duplicate keys are refused: Go's encoding/json (runc) merges or keeps
    what Python would drop, so a spec with them cannot be read the way runc reads it."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
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


_WS = " \t\n\r"
_scan = _encode = None  # made by _accelerated()


def _fast_loads(s: str | bytes):
    """Parse one JSON document; ValueError on anything else (trailing data, NaN, bad UTF-8,
    duplicate keys)."""
    if isinstance(s, (bytes, bytearray)):
        s = bytes(s).decode("utf-8")  # UnicodeDecodeError is a ValueError
    i = 0
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    try:
        obj, end = _scan(s, i)  # type: ignore[misc]
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
        _scan(s, i)  # type: ignore[misc]
    except (ValueError, RecursionError) as e:
        return str(e)
    except StopIteration as e:
        return f"invalid JSON at offset {e.value}"
    return "invalid JSON"


def _default(o):
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _fast_dumps(obj) -> str:
    """Compact JSON (no NaN/Infinity: they are not JSON)."""
    return "".join(_encode(obj, 0))  # type: ignore[misc]


def _std_loads(s: str | bytes):
    import json

    if isinstance(s, (bytes, bytearray)):
        s = bytes(s).decode("utf-8")
    try:
        return json.loads(s, object_pairs_hook=_object, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _std_dumps(obj) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default)


# what the accelerator must give for gpuhook to use it
_SAMPLE = '{"a":[1,2.5,"\\u00e9x",true,false,null],"b":{}}'
_SAMPLE_VALUE = {"a": [1, 2.5, "\u00e9x", True, False, None], "b": {}}


def _accelerated() -> bool:
    global _scan, _encode
    try:
        _scan = _json.make_scanner(_Context())  # type: ignore[arg-type]
        _encode = _json.make_encoder(None, _default, _json.encode_basestring_ascii, None, ":", ",", False, False, False)
        return (
            _fast_loads(_SAMPLE) == _SAMPLE_VALUE
            and _fast_dumps(_SAMPLE_VALUE) == _SAMPLE
            and _fast_loads(" [1] ") == [1]
        )
    except Exception:  # noqa: BLE001 (any failure of a private API means: do not use it)
        return False


ACCELERATED = _json is not None and _accelerated()
loads = _fast_loads if ACCELERATED else _std_loads
dumps = _fast_dumps if ACCELERATED else _std_dumps
