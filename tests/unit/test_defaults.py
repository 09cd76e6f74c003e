"""One truth for gpuhook's node paths and defaults (gpuhook/defaults.py): no other module
spells one of them, and the runtime's C front, which cannot import Python, holds the same values."""

from __future__ import annotations

import ast
import os
import re

import pytest

from conftest import REPO
from gpuhook import config, defaults

PKG = os.path.join(REPO, "gpuhook")
VALUES = {k: v for k, v in vars(defaults).items() if k.isupper() and isinstance(v, str)}


def _literals(path: str) -> list[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_no_module_spells_a_default_again():
    again = []
    for d, _, names in os.walk(PKG):
        for name in names:
            path = os.path.join(d, name)
            if not name.endswith(".py") or path == defaults.__file__:
                continue
            again += [f"{os.path.relpath(path, REPO)}:{line}: {value!r} (defaults.{k})"
                      for line, value in _literals(path) for k, v in VALUES.items() if value == v]
    assert not again, "written again instead of taken from gpuhook/defaults.py:\n" + "\n".join(again)


def _front() -> str:
    with open(os.path.join(PKG, "runtime", "gpuhook-runtime.c")) as f:
        return f.read()


@pytest.mark.parametrize("name, value", [
    ("LOG_FILE", defaults.LOG_FILE),
    ("CONFIG_FILE", defaults.CONFIG_FILE),
    ("CACHE_DIR", defaults.CACHE_DIR),
])
def test_the_front_has_the_same_defaults(name, value):
    found = set(re.findall(rf'^#define {name} "([^"]*)"', _front(), re.M))
    assert found == {value}, f"the front says {found}, gpuhook/defaults.py {value!r}"


def test_the_config_defaults_are_the_tables():
    d = config.Config()
    assert (d.log_file, d.mps_pipe_dir) == (defaults.LOG_FILE, config.MPS_PIPE_DIR) == (defaults.LOG_FILE, "")
    assert config.DEFAULT_PATH == defaults.CONFIG_FILE
