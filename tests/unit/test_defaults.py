"""One truth for gpuhook's node paths and defaults (gpuhook/defaults.py): no other module
spells one of them (the runtime's C front takes them from its generated header:
tests/unit/test_front.py)."""

from __future__ import annotations

import ast
import os

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


def test_the_config_defaults_are_the_tables():
    d = config.Config()
    assert (d.log_file, d.mps_pipe_dir) == (defaults.LOG_FILE, config.MPS_PIPE_DIR) == (defaults.LOG_FILE, "")
    assert config.DEFAULT_PATH == defaults.CONFIG_FILE
