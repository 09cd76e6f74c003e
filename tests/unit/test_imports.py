"""The package's import graph: no cycle (module-level and function-level imports alike), and
every import goes down the layers (LAYERS below: base, types, pipeline, core, the fronts,
the command line), never up, never sideways between two fronts; command groups share
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


# The layers, lowest first: a module imports its own package's modules and those of the layers
# below its own, never one above (functions' imports included). In an open layer the units
# may import each other (the cycle test above keeps them in order); in a closed one, never: a
# front does not import another front. A unit is a top-level module or package of gpuhook.
OPEN, CLOSED = "open", "closed"
LAYERS = (
    # the base every module may import: file primitives, the small record type, JSON, the node's
    # paths and defaults, the node log's format, bounds and create record, the hook's names
    ("base", OPEN, {"gpuhook", "gpuhook.fsutil", "gpuhook.record", "gpuhook.fastjson", "gpuhook.defaults",
                    "gpuhook.layout", "gpuhook.logline", "gpuhook.nvidia_tools", "gpuhook.hook"}),
    ("types", OPEN, {"gpuhook.vendors", "gpuhook.edits", "gpuhook.inventory"}),
    # the pipeline: probe (Host: every host read) -> config -> plan -> spec / CDI
    ("pipeline", OPEN, {"gpuhook.probe", "gpuhook.config", "gpuhook.plan", "gpuhook.spec", "gpuhook.cdi"}),
    # the one create core, the node log's reader, the schemas of the CLI's output
    ("core", OPEN, {"gpuhook.inject", "gpuhook.log", "gpuhook.models"}),
    # the fronts a create goes through (the DRA driver: its prepare), adapters around the core, each on its own
    ("create fronts", CLOSED, {"gpuhook.runtime", "gpuhook.nri", "gpuhook.dra"}),
    # the installer sets those fronts up on a node; the agent runs the installer and the plugin
    ("installer", CLOSED, {"gpuhook.install"}),
    ("agent", CLOSED, {"gpuhook.agent"}),
    # the command line and what stands on it all
    ("top", OPEN, {"gpuhook.cli", "gpuhook.__main__"}),
)


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _layer_of() -> dict[str, int]:
    return {unit: i for i, (_, _, units) in enumerate(LAYERS) for unit in units}


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes up a layer, or sideways in a closed one: "importer -> imported (why)"."""
    layer = _layer_of()
    out = []
    for m, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = _unit(m), _unit(dep)
            if a == b or b == "gpuhook":
                continue
            la, lb = layer[a], layer[b]
            if lb > la:
                out.append(f"{m} -> {dep} (up: {LAYERS[la][0]} imports {LAYERS[lb][0]})")
            elif lb == la and LAYERS[la][1] == CLOSED:
                out.append(f"{m} -> {dep} (sideways in {LAYERS[la][0]})")
    return out


def test_every_module_has_a_layer():
    layer = _layer_of()
    assert sorted({_unit(m) for m in _graph()} - set(layer)) == []


def test_imports_go_down_the_layers_never_up_or_sideways():
    assert wrong_way(_graph()) == []


def test_the_direction_check_finds_an_import_up_and_one_sideways():
    """The check itself: an import up (the base importing a front), one sideways between two
    fronts (inside a function, as the plugin once imported the wrapper), one down (fine)."""
    graph = {"gpuhook.fsutil": {"gpuhook.runtime.create"}, "gpuhook.nri.plugin": {"gpuhook.runtime.logline"},
             "gpuhook.runtime.create": {"gpuhook.inject", "gpuhook.runtime.args"}, "gpuhook.cli": {"gpuhook.nri"}}
    assert wrong_way(graph) == ["gpuhook.fsutil -> gpuhook.runtime.create (up: base imports create fronts)",
                                "gpuhook.nri.plugin -> gpuhook.runtime.logline (sideways in create fronts)"]
