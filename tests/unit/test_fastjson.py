"""fastjson: the C accelerator when it is what gpuhook expects, the stdlib `json` otherwise,
with the same results and the same refusals either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from conftest import REPO
from gpuhook import fastjson

REFUSED = ['{"a":1,"a":2}', "[NaN]", "[1] x", "", "{", '"\\ud800', "[Infinity]", "[1,]"]
ACCEPTED = ['{"a":[1,2.5,"\\u00e9",true,false,null]}', " [1] ", '{"x":{"y":[]}}', '"s"', "3"]


def test_the_accelerator_is_used_here():
    assert fastjson.ACCELERATED and fastjson.loads is fastjson._fast_loads


@pytest.mark.parametrize("text", REFUSED)
def test_both_refuse_the_same(text):
    for loads in (fastjson._fast_loads, fastjson._std_loads):
        with pytest.raises(ValueError):
            loads(text)


@pytest.mark.parametrize("text", ACCEPTED)
def test_both_accept_the_same(text):
    assert fastjson._fast_loads(text) == fastjson._std_loads(text) == json.loads(text)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_both_give_the_same_text_and_values(value):
    assert fastjson._fast_dumps(value) == fastjson._std_dumps(value)
    text = fastjson._std_dumps(value)
    assert fastjson._fast_loads(text) == fastjson._std_loads(text) == value


# _json as another CPython might have it, as fastjson sees it (the stdlib json keeps its own):
# a different signature, different results, or no accelerator at all
POISONS = {
    "signature": "def make_scanner(*a):\n    raise TypeError('make_scanner() takes 2 arguments')\n",
    "wrong-result": "def make_scanner(ctx):\n    return lambda s, i: ({'changed': True}, len(s))\n",
    "missing": None,
}


def _poisoned(poison: str) -> str:
    if POISONS[poison] is None:
        return "import sys\nsys.modules['_json'] = None\nfrom gpuhook import fastjson\n"
    return ("import sys, types, _json as real\nfake = types.ModuleType('_json')\nfake.__dict__.update(real.__dict__)\n"
            f"exec({POISONS[poison]!r}, fake.__dict__)\nsys.modules['_json'] = fake\n"
            "from gpuhook import fastjson\nsys.modules['_json'] = real\n")


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_an_unexpected_accelerator_falls_back_to_json(poison):
    """In a bare interpreter (as the wrapper runs), with _json not as expected: the stdlib
    json is used, with the same results and refusals, and a create still reads its spec."""
    code = _poisoned(poison) + (
        "assert not fastjson.ACCELERATED, 'the poisoned accelerator was used'\n"
        "assert fastjson.loads('{\"a\":[1,2]}') == {'a': [1, 2]}\n"
        "assert fastjson.dumps({'a': [1, None]}) == '{\"a\":[1,null]}'\n"
        f"for bad in {REFUSED!r}:\n"
        "    try:\n"
        "        fastjson.loads(bad)\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "print('fallback ok')\n")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {REPO!r})\n" + code],
                       capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
    assert r.returncode == 0 and "fallback ok" in r.stdout, r.stderr
