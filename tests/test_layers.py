"""The shape of the package, read from the code with ``ast`` (docs/ARCHITECTURE.md, "Layers").

Imports go down the layers, never up; no two packages import each other (directly or around a
loop); the strategy families do not import each other; a function-level import of a cadence module
is allowed only for a module that needs a heavy optional dependency (Ray, matplotlib); no private
name crosses a module; and only the strategies and the API read which strategy a config names.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cadence"

# Bottom to top. A module may import any module of its own layer or of a layer below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("cadence.errors", "cadence.registry", "cadence.seeding", "cadence.resources", "cadence.settings", "cadence.task_config", "cadence.config",
                    "cadence.device", "cadence.compiled", "cadence.kernels", "cadence.kge_step", "cadence.optim")),
    ("shared types", ("cadence.core",)),
    ("where rows live", ("cadence.store", "cadence.pm")),
    ("what is learned", ("cadence.data", "cadence.models")),
    ("how it is judged and asked", ("cadence.evaluation", "cadence.prediction")),
    ("tasks", ("cadence.tasks",)),
    ("where code runs", ("cadence.engines", "cadence.pipeline", "cadence.ps")),
    ("how batches flow", ("cadence.strategies",)),
    ("the trainer", ("cadence.training",)),
    ("the edge", ("cadence.api", "cadence.auto", "cadence.comparison", "cadence.cli", "cadence.report", "cadence")),
]
HEAVY = ("ray", "matplotlib")  # optional dependencies a module may import lazily (STYLE.md, 10)
STRATEGY_READERS = ("cadence.strategies", "cadence.api", "cadence.auto", "cadence.cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(SRC.rglob("*.py"))}


def imports(tree: ast.Module, name: str):
    """(imported module, line, at the top level?, the names it takes) for each cadence import."""
    top = {id(node) for node in tree.body}
    # (names for annotations only, ``if TYPE_CHECKING:`` at the top level: an import as any other here)
    top |= {id(inner) for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
            for inner in node.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cadence":
                    yield alias.name, node.lineno, id(node) in top, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "cadence":
            yield node.module, node.lineno, id(node) in top, tuple(alias.name for alias in node.names)


def resolve(target: str, names: tuple[str, ...], known: set[str]) -> list[str]:
    """``from cadence.x import y`` imports the module cadence.x.y when y is a module."""
    found = [f"{target}.{item}" for item in names if f"{target}.{item}" in known]
    return found or [target]


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") and prefix != "cadence":
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    if best is None:
        return len(LAYERS) - 1 if module == "cadence" else -1
    return best[0]


def package_of(module: str) -> str:
    """The unit of the cycle check: a strategy family (a package under ``cadence.strategies``; a
    module beside them, such as the registry ``catalog``, is ``cadence.strategies``'s), or a
    top-level package or module."""
    parts = module.split(".")
    if parts[:2] == ["cadence", "strategies"] and len(parts) > 2 and (SRC / "strategies" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def edges(trees: dict[str, ast.Module]):
    known = set(trees)
    for name, tree in trees.items():
        for target, line, top, names in imports(tree, name):
            for module in resolve(target, names, known):
                yield name, module, line, top, names


TREES = modules()
EDGES = list(edges(TREES))


def test_every_module_has_a_layer():
    assert [name for name in TREES if layer_of(name) < 0] == []


def test_imports_go_down_the_layers():
    upward = [f"{source}:{line} imports {target} ({LAYERS[layer_of(source)][0]} -> {LAYERS[layer_of(target)][0]})"
              for source, target, line, _, _ in EDGES if layer_of(target) > layer_of(source)]
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_package_cycle():
    graph: dict[str, set[str]] = {}
    for source, target, _, _, _ in EDGES:
        a, b = package_of(source), package_of(target)
        if a != b:
            graph.setdefault(a, set()).add(b)
    assert find_cycle(graph) is None


def test_no_module_cycle():
    graph: dict[str, set[str]] = {}
    for source, target, _, _, _ in EDGES:
        if source != target and not target.startswith(source + "."):  # (a package's own modules)
            graph.setdefault(source, set()).add(target)
    assert find_cycle(graph) is None


def test_strategy_families_do_not_import_each_other():
    """A family (``cadence.strategies.<family>``) builds on the layers below, never on a sibling; only
    the strategy registry (``cadence.strategies.catalog``) composes them."""
    crossing = [f"{source}:{line} imports {target}" for source, target, line, _, _ in EDGES
                if package_of(source).startswith("cadence.strategies.") and target.startswith("cadence.strategies")
                and package_of(target) != package_of(source)]
    assert crossing == []


def import_stack(package: str, edges_of: dict[str, set[str]], names=TREES) -> tuple[str, ...]:
    """The longest chain of imports among ``package``'s own modules (of ``names``)."""
    @functools.cache
    def longest(module: str) -> tuple[str, ...]:
        below = [longest(target) for target in edges_of.get(module, ())
                 if target.startswith(package + ".") and target != module]
        return (module, *max(below, key=len, default=()))

    return max((longest(name) for name in names if name.startswith(package + ".")), key=len)


FAMILIES = sorted(f"cadence.strategies.{path.name}" for path in (SRC / "strategies").iterdir()
                  if path.is_dir() and (path / "__init__.py").exists())
MAX_FAMILY_DEPTH = 5
TOP_LEVEL_EDGES: dict[str, set[str]] = {}
for _source, _target, _, _top, _ in EDGES:
    if _top:
        TOP_LEVEL_EDGES.setdefault(_source, set()).add(_target)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_strategy_family_is_at_most_five_imports_deep(family: str):
    """A family reads from the top (``strategy``) down in at most five modules (the parameter
    server's family was eleven deep, AdaPM's eight); the roles it builds on are a layer below it
    (``cadence.ps``: the parameter server's; ``cadence.pm``: AdaPM's node).
    Counted over the imports a plain ``import`` runs (a function-level import of Ray's side is not one)."""
    stack = import_stack(family, TOP_LEVEL_EDGES)
    assert len(stack) <= MAX_FAMILY_DEPTH, " -> ".join(stack)


def test_the_depth_rule_catches_a_deep_stack():
    names = [f"cadence.strategies.deep.m{index}" for index in range(MAX_FAMILY_DEPTH + 1)]
    chain = {names[index]: {names[index + 1]} for index in range(len(names) - 1)}
    assert len(import_stack("cadence.strategies.deep", chain, names)) == MAX_FAMILY_DEPTH + 1
    assert len(import_stack("cadence.strategies.deep", {}, names)) == 1


TOP_LEVEL = {name: {target for source, target, _, top, _ in EDGES if source == name and top} for name in TREES}


@functools.cache
def imports_heavy(name: str) -> bool:
    """Whether importing module ``name`` imports a heavy optional dependency (itself, or through the
    cadence modules it imports at its top level; there is no cycle, ``test_no_module_cycle``)."""
    for node in TREES[name].body:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import) and any(a.name.split(".")[0] in HEAVY for a in inner.names):
                return True
            if isinstance(inner, ast.ImportFrom) and (inner.module or "").split(".")[0] in HEAVY:
                return True
    return any(imports_heavy(target) for target in TOP_LEVEL[name] - {name} if not target.startswith(name + "."))


def test_a_lazy_import_is_for_a_heavy_optional_dependency_only():
    # (the CLI imports the library inside its commands, so that ``cadence --help`` and a mistyped flag
    # answer at once, before torch loads)
    lazy = [f"{source}:{line} imports {target} inside a function" for source, target, line, top, _ in EDGES
            if not top and not imports_heavy(target) and source != "cadence.cli"]
    assert lazy == []


def test_no_private_name_crosses_a_module():
    crossing = [f"{source}:{line} imports {', '.join(n for n in names if n.startswith('_'))} from {target}"
                for source, target, line, _, names in EDGES
                if any(n.startswith("_") and n != "__version__" for n in names)]
    assert crossing == []


def reads_strategy(tree: ast.Module) -> list[int]:
    """Lines that read ``<something>.config.strategy`` or ``config.strategy``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "strategy" and isinstance(node.ctx, ast.Load):
            value = node.value
            if isinstance(value, ast.Name) and value.id == "config" or \
                    isinstance(value, ast.Attribute) and value.attr == "config":
                lines.append(node.lineno)
    return lines


def test_only_the_strategies_and_the_api_read_the_strategy_name():
    readers = [f"{name}:{line}" for name, tree in TREES.items() for line in reads_strategy(tree)
               if not name.startswith(STRATEGY_READERS)]
    assert readers == []


@pytest.mark.parametrize("source, broken", [
    ("cadence.store.embedding_store", "from cadence.tasks.base import Task\n"),
    ("cadence.core.batch", "from cadence.training.trainer import Trainer\n"),
])
def test_the_rule_catches_an_upward_import(source, broken):
    """The check itself can fail: an import against the rule, added to a copy of the tree, is found."""
    trees = dict(TREES)
    trees[source] = ast.parse(ast.unparse(TREES[source]) + "\n" + broken)
    found = [(s, t) for s, t, _, _, _ in edges(trees) if s == source and layer_of(t) > layer_of(s)]
    assert found


# test directories that are not a package of src/cadence, and why
TEST_DIRS_OF_THEIR_OWN = {
    "benchmarks": "the scripts in benchmarks/ (their results' checks and helpers)",
    "reliability": "properties of the whole library under generated inputs (tests/reliability/harness.py)",
}


def test_the_tests_mirror_the_packages():
    """``tests/<path>/`` tests ``src/cadence/<path>/``: a directory of tests for a package that does
    not exist (a package renamed or split, its tests left behind) is an error."""
    tests = SRC.parents[1] / "tests"
    stray = [str(path.relative_to(tests)) for path in sorted(tests.rglob("*")) if path.is_dir()
             and path.name != "__pycache__" and any(path.glob("test_*.py"))
             and not (SRC / path.relative_to(tests)).is_dir()
             and path.relative_to(tests).parts[0] not in TEST_DIRS_OF_THEIR_OWN]
    assert stray == []


def test_only_the_engines_call_ray_actors_directly():
    """Outside ``cadence.engines`` a role is called by its method (``Hosted.call``/``start``,
    ``placement.Handle``), never as ``actor.verb.remote(...)``: a renamed verb fails where it is
    written, and how a call crosses a process is the engines' alone."""
    raw = [f"{name}:{node.lineno}" for name, tree in TREES.items() if not name.startswith("cadence.engines")
           for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr == "remote"]
    assert raw == []


def test_only_the_engines_turn_a_verbs_name_back_into_a_call():
    """Outside ``cadence.engines`` a role's verb is called by its method, never looked up by a name
    made at run time (``getattr(role, name)(...)``): a request that names a verb is dispatched by the
    engines' transport alone (``engines.remote``, ``engines.ray``, ``engines.placement``)."""
    by_name = [f"{name}:{node.lineno}" for name, tree in TREES.items() if not name.startswith("cadence.engines")
               for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
               and getattr(node.func.func, "id", "") == "getattr" and not isinstance(node.func.args[1], ast.Constant)]
    assert by_name == []


def test_ps_engine_is_resolved_by_one_registry():
    """``ps.engine`` names where roles run for every strategy: one registry (``engines.PLACEMENTS``),
    the parameter server's engine built on the placement it gives (a key that picks per task, such
    as ``model.name``, has a registry per task instead)."""
    where = [f"{name}:{node.lineno}" for name, tree in TREES.items() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Registry" and len(node.args) > 1
             and isinstance(node.args[1], ast.Constant) and node.args[1].value == "ps.engine"]
    assert where == ["cadence.engines:12"]
