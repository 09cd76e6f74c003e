"""The package's import graph has no cycle (module-level and function-level imports alike):
a step imports only the steps before it, front ends import steps, and command groups share
cli/args.py instead of importing each other."""

from __future__ import annotations

import ast
import os

from conftest import REPO

PKG = os.path.join(REPO, "gpuhook")


def _module(path: str) -> str:
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[:-9] if rel.endswith(".__init__") else rel


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for d, _, names in os.walk(PKG):
        for name in names:
            if not name.endswith(".py"):
                continue
            path = os.path.join(d, name)
            mod = _module(path)
            package = mod if name == "__init__.py" else mod.rpartition(".")[0]
            deps = graph.setdefault(mod, set())
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = package.split(".")
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                    deps.add(target)
                    deps.update(f"{target}.{a.name}" for a in node.names)
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuhook"):
                    deps.add(node.module)
                    deps.update(f"{node.module}.{a.name}" for a in node.names)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names if a.name.startswith("gpuhook"))
    modules = set(graph)
    # a package's __init__ importing its own submodules is not a cycle through the package
    return {m: {x for x in deps if x in modules and x != m and not m.startswith(x + ".")}
            for m, deps in graph.items()}


def test_no_import_cycle():
    graph = _graph()
    assert "gpuhook.cli" in graph and "gpuhook.cli.args" in graph["gpuhook.cli"]
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
