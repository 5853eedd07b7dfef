"""The package map of ``docs/index.md`` holds: each subpackage imports only the layers below its
own and only what its row's "may import" column names, and no modules import each other in a
circle.

Every ``import slate...`` and ``from slate... import`` in ``src/slate`` is read with :mod:`ast`,
including the imports inside functions and under ``TYPE_CHECKING`` (a circle that only a lazy
import hides is still a circle of the design).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "slate"

#: Bottom to top. A unit (a subpackage, or a module at the top of ``src/slate``) may import
#: units of its own layer or of the layers below. Within a layer the order below is the order
#: of the allowed imports too (``optim`` uses ``engines``, ``algorithms`` does not).
LAYERS: list[list[str]] = [
    ["errors", "version", "config", "permissions"],
    ["metrics", "objectives", "models", "topology", "security", "faults"],
    ["communication"],
    ["algorithms"],
    ["data", "engines"],
    ["optim"],
    ["inference"],
    ["training"],
    ["estimator", "studies"],
    ["cli"],
    ["__init__", "__main__"],
]
RANK = {
    unit: (layer, position)
    for layer, units in enumerate(LAYERS)
    for position, unit in enumerate(units)
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    """``slate.training.run`` -> ``training``; ``slate.errors`` -> ``errors``; ``slate`` ->
    ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per test process (the tests below read every file of
    the package; parsing them is most of their time). No test changes a tree."""
    return ast.parse(path.read_text(), str(path))


def slate_imports(path: Path, known: set[str]) -> set[str]:
    """The slate modules that ``path`` imports (a ``from slate.pkg import name`` counts as the
    module ``slate.pkg.name`` where that is a module, else as ``slate.pkg``)."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "slate")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "slate":
                continue
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports (made once per test
    process; the tests only read it)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {name: slate_imports(path, known) & known for name, path in files.items()}


def test_every_unit_of_the_package_has_a_layer():
    units = {unit_of(m) for m in import_graph()}
    assert units == set(RANK), f"not in LAYERS: {units - set(RANK)}; gone: {set(RANK) - units}"


def test_no_import_runs_up_a_layer():
    upward = []
    for module, imported in import_graph().items():
        here = RANK[unit_of(module)]
        for target in imported:
            there = RANK[unit_of(target)]
            if unit_of(target) != unit_of(module) and there > here:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that run up the package map:\n" + "\n".join(sorted(upward))


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return circles


def test_tarjan_finds_a_planted_circle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
    assert strongly_connected(import_graph()) == []


@pytest.mark.parametrize("unit", [u for layer in LAYERS for u in layer if not u.startswith("__")])
def test_the_package_map_names_every_unit(unit):
    doc = (ROOT / "docs" / "index.md").read_text()
    name = f"`{unit}.py`" if (PACKAGE / f"{unit}.py").is_file() else f"`{unit}/`"
    assert name in doc.split("## Package map")[1].split("Module by module")[0]


GROUND = LAYERS[0]


def package_map() -> dict[str, set[str]]:
    """The package map's "may import" column (``docs/index.md``): each unit of a row (its first
    column) and the units it may import. ``ground`` is :data:`GROUND`; ``everything below`` the
    units of the layers below; ```X``, and what it imports`` X and X's own column; ``nothing of
    slate`` none."""
    doc = (ROOT / "docs" / "index.md").read_text()
    table = doc.split("## Package map")[1].split("Module by module")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `") or
            line.startswith("| ground")]  # fmt: skip
    allowed: dict[str, set[str]] = {}
    for row in reversed(rows):  # bottom up: "what it imports" names a row below
        package, _, may = (cell.strip() for cell in row.strip("|").split("|"))
        units = [re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", package)]
        named = {re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", may)}
        if "everything below" in may:
            named = {u for u in RANK if RANK[u][0] < min(RANK[unit][0] for unit in units)}
        if "and what it imports" in may:
            named |= set().union(*(allowed[u] for u in list(named)))
        if re.search(r"\bground\b", may):
            named |= set(GROUND)
        for unit in units:
            allowed[unit] = named
    return allowed


def test_the_package_map_reader_reads_every_kind_of_row():
    allowed = package_map()
    assert allowed["errors"] == set()  # nothing of slate
    assert allowed["cli"] == set(RANK) - {"cli", "__init__", "__main__"}  # everything below
    assert "algorithms" in allowed["studies"] and "engines" in allowed["studies"]  # and what ...
    assert set(GROUND) <= allowed["algorithms"] and "engines" not in allowed["algorithms"]


def test_every_import_is_allowed_by_the_package_map_s_may_import_column():
    allowed = package_map()
    assert set(allowed) == set(RANK) - {"__init__", "__main__"}  # (they sit on top)
    outside = sorted(
        f"{module} -> {target}"
        for module, imported in import_graph().items()
        if unit_of(module) in allowed
        for target in imported
        if unit_of(target) != unit_of(module) and unit_of(target) not in allowed[unit_of(module)]
    )
    assert not outside, "imports the package map's may-import column does not allow:\n" + (
        "\n".join(outside)
    )


def test_the_package_map_allows_no_import_up_a_layer():
    upward = sorted(
        f"{unit} may import {other}"
        for unit, others in package_map().items()
        for other in others
        if RANK[other] > RANK[unit]
    )
    assert not upward


def test_no_file_is_longer_than_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long


def engine_name_branches(path: Path) -> list[str]:
    """Comparisons of ``<...>engine.name`` with anything, and ``getattr(<...>, "recovers")``."""
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if (
                    isinstance(side, ast.Attribute)
                    and side.attr == "name"
                    and "engine" in ast.unparse(side.value)
                ):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value == "recovers" for a in node.args)
        ):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_branch_finder_sees_both_kinds(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'if run.engine.name == "distributed":\n    pass\nx = getattr(engine, "recovers", 0)\n'
    )
    assert len(engine_name_branches(sample)) == 2


def test_nothing_outside_engines_branches_on_an_engine_s_name():
    outside = [p for p in PACKAGE.rglob("*.py") if "engines" not in p.relative_to(PACKAGE).parts]
    assert [hit for p in outside for hit in engine_name_branches(p)] == []


#: Names that stand in more than one place for one thing: each package's base classes, and SLATE
#: as an algorithm of the simulator and engines and as a ``torch.optim`` optimizer.
SAME_THING = {"__init__", "__main__", "base", "slate", "SLATE"}


def test_no_module_or_class_name_means_two_things():
    modules: dict[str, list[str]] = {}
    classes: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        modules.setdefault(path.stem, []).append(where)
        for node in parsed(path).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(where)
    twice = {
        name: places
        for table in (modules, classes)
        for name, places in table.items()
        if len(places) > 1 and name not in SAME_THING
    }
    assert twice == {}
