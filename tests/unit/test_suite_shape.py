"""The suite's own shape (issue 23): a test module never imports another (what tests share
lives in tests/conftest.py, the harness modules beside it and tests/fakes), and every test
checks something: an assert (or a raised AssertionError), pytest.raises/fail/warns, or a call
of a helper that does."""

from __future__ import annotations

import ast
import os

from conftest import REPO, TESTS

TESTING = os.path.join(TESTS, "fakes")


def _sources(root: str) -> dict[str, str]:
    """{module name as the tests import it: path} for the .py files under root."""
    out = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("cri", "fixtures", "__pycache__") and os.path.join(d, x) != TESTING]
        for n in names:
            if n.endswith(".py"):
                path = os.path.join(d, n)
                if root == TESTING:
                    out["fakes" + ("" if n == "__init__.py" else "." + n[:-3])] = path
                elif n == "conftest.py" and d != root:  # a package's (tests/cluster): imported by its dotted name
                    out[os.path.relpath(d, root).replace(os.sep, ".") + ".conftest"] = path
                else:
                    out[n[:-3]] = path
    return out


MODULES = {**_sources(TESTS), **_sources(TESTING)}
TREES = {name: ast.parse(open(path).read(), path) for name, path in MODULES.items()}
TEST_MODULES = sorted(name for name in MODULES if name.startswith("test_"))


def _imported_modules(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):  # function-local imports too
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_test_module_imports_another():
    imports = {name: sorted(m for m in _imported_modules(TREES[name]) if m.split(".")[-1].startswith("test_"))
               for name in TEST_MODULES}
    assert {name: found for name, found in imports.items() if found} == {}


def _raises_assertion(node: ast.AST) -> bool:
    if not isinstance(node, ast.Raise):
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"


def _checks_itself(fn: ast.AST) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Assert) or _raises_assertion(node):
            return True
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "pytest" and node.func.attr in ("raises", "fail", "warns")):
            return True
    return False


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _from_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """{local name: (module, name)} for what the module takes from the suite's own modules."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in MODULES:
            out.update({a.asname or a.name: (node.module, a.name) for a in node.names})
    return out


def _checks(module: str, name: str, seen: frozenset = frozenset()) -> bool:
    """Whether the function `name` of `module` asserts, itself or through a function of the
    suite it calls by name (its module's own, or one it imports from conftest, a harness or
    fakes)."""
    fn = _functions(TREES[module]).get(name)
    if fn is None or (module, name) in seen:
        return False
    if _checks_itself(fn):
        return True
    seen |= {(module, name)}
    own, taken = _functions(TREES[module]), _from_imports(TREES[module])
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            callee = call.func.id
            if callee in own and _checks(module, callee, seen):
                return True
            if callee in taken and _checks(*taken[callee], seen):
                return True
    return False


def test_every_test_checks_something():
    unchecked = [f"{os.path.relpath(MODULES[m], REPO)}::{name}" for m in TEST_MODULES
                 for name in _functions(TREES[m]) if name.startswith("test") and not _checks(m, name)]
    assert unchecked == []


def test_the_checks_above_can_fail():
    """The two scans find what they look for (they read parsed source, so a test of their own)."""
    TREES["test_x_probe"] = ast.parse("from test_labels import FakeAPI\n"
                                      "def helper(r):\n    assert r\n"
                                      "def test_nothing():\n    print(1)\n"
                                      "def test_through_a_helper():\n    helper(1)\n"
                                      "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
                                      "def test_else():\n    for _ in ():\n        break\n"
                                      "    else:\n        raise AssertionError('never')\n"
                                      "def test_other_error():\n    raise ValueError('x')\n")
    MODULES["test_x_probe"] = "x.py"
    try:
        assert _imported_modules(TREES["test_x_probe"]) == {"test_labels"}
        assert [n for n in ("test_nothing", "test_through_a_helper", "test_raises", "test_else", "test_other_error")
                if not _checks("test_x_probe", n)] == ["test_nothing", "test_other_error"]
    finally:
        del TREES["test_x_probe"], MODULES["test_x_probe"]


def test_no_two_directories_on_the_path_hold_a_module_of_one_name():
    """tests/ and tests/cluster/ are both on sys.path (the cluster's conftest puts its own
    directory there): a module of one bare name in both is whichever was imported first for
    every test (tests/demo.py and the cluster's demo once made a collection error)."""
    on_path = [TESTS, os.path.join(TESTS, "cluster")]
    names = [{n[:-3] for n in os.listdir(d) if n.endswith(".py")} - {"conftest", "__init__"} for d in on_path]
    assert names[0] & names[1] == set()
