"""A strict reader of the YAML gpuhook writes (cdi.to_yaml), for the tests, which have no YAML
library to lean on: block mappings and sequences, every string a double-quoted JSON string,
plain ints, booleans, null, [] and {}: exactly what cdi.to_yaml emits, and a strict subset of
YAML. Anything else (a duplicate key, a trailing line, a line that is not a mapping) fails."""

from __future__ import annotations

import json
import re

_KEY = re.compile(r'^("(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z0-9_.-]*):(?: (.*))?$')


def load_yaml(text: str):
    lines = [
        [len(raw) - len(raw.lstrip(" ")), raw.strip()]
        for raw in text.splitlines()
        if raw.strip() and not raw.lstrip().startswith("#")
    ]
    value, i = _block(lines, 0, lines[0][0])
    assert i == len(lines), f"trailing lines from {lines[i]}"
    return value


def _block(lines, i, indent):
    if lines[i][1].startswith("- "):
        return _seq(lines, i, indent)
    return _map(lines, i, indent)


def _seq(lines, i, indent):
    out = []
    while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
        rest = lines[i][1][2:]
        if _KEY.match(rest) or rest.startswith("- "):
            lines[i] = [indent + 2, rest]  # "- key: v" opens a block two columns in
            value, i = _block(lines, i, indent + 2)
        else:
            value, i = json.loads(rest), i + 1
        out.append(value)
    return out, i


def _map(lines, i, indent):
    out = {}
    while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
        m = _KEY.match(lines[i][1])
        assert m, f"not a mapping line: {lines[i]}"
        key = json.loads(m.group(1)) if m.group(1).startswith('"') else m.group(1)
        assert key not in out, f"duplicate key {key}"
        i += 1
        if m.group(2) is not None:
            out[key] = json.loads(m.group(2))
            continue
        nxt_indent, nxt = lines[i]
        if nxt_indent == indent and nxt.startswith("- "):
            out[key], i = _seq(lines, i, indent)
        else:
            assert nxt_indent > indent, f"empty value for {key}"
            out[key], i = _block(lines, i, nxt_indent)
    return out, i
