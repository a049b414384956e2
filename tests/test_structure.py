"""The shape of the package, read from its source with `ast` (nothing is imported): no import circle between its
modules, no module over 600 lines, no function over 100 lines, and no comment or docstring that cites a results file
or names a GPU model.

Every import of a package module counts as an edge, wherever it sits: at module level, inside a function, or under
``if TYPE_CHECKING``. A module-level circle fails at import time, depending on which module is imported first. An
import inside a function only puts the same circle off until the first call; the two modules still cannot be read,
tested or moved apart, and the layering (errors <- config <- patterns <- router <- backends <- integration <-
training, evaluation <- cli) is what keeps them so. An import under ``TYPE_CHECKING`` is a dependency that the type
checker follows. Lazy imports remain the way to put off heavy or optional packages (transformers, lm_eval, triton),
which are not package modules and make no edge here.

Importing ``a.b.c`` also runs ``a`` and ``a.b``: those make edges too, except a package that holds the importer
(Python has it in `sys.modules` already, initialized or under way).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "elastic_attention"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    modules = {}
    for path in sorted((SOURCE / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, (path, _) in MODULES.items()}


def _nearest_module(name: str) -> str | None:
    """The module that ``name`` (a module, or a name inside one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str) -> set[str]:
    """The package modules that ``module`` imports, anywhere in its source, and the packages that hold them."""
    _, is_package = MODULES[module]
    found = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found.update(_nearest_module(alias.name) for alias in node.names if alias.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package, one level up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:  # `from pkg import sub` imports the submodule `pkg.sub`
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else _nearest_module(source))
    edges = set()
    for target in found - {None, module}:
        edges.add(target)
        parts = target.split(".")
        for end in range(1, len(parts)):
            parent = ".".join(parts[:end])
            if parent in MODULES and not module.startswith(parent + "."):
                edges.add(parent)
    edges.discard(module)
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one circle through them."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_through(sorted(component), graph) for component in components]


def _circle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One circle from the first module of ``component`` back to itself (breadth-first, inside the component)."""
    start, members = component[0], set(component)
    previous = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for successor in sorted(graph[node] & members):
            if successor == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return [*reversed(path), start]
            if successor not in previous:
                previous[successor] = node
                queue.append(successor)
    return component


def test_the_circle_finder_finds_a_circle_and_passes_a_tree():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_every_import_form_makes_an_edge():
    """The reader of imports sees every form the package uses (a guard against a test that passes by seeing none)."""
    graph = {module: _imported(module) for module in MODULES}
    assert "elastic_attention.errors" in graph["elastic_attention.cli"]  # module level, `from a.b import name`
    assert "elastic_attention.evaluation.showcase" in graph["elastic_attention.cli"]  # inside a function
    assert "elastic_attention.evaluation" in graph["elastic_attention.cli"]  # the package that holds it
    assert "elastic_attention.cache" not in graph["elastic_attention.cache.layer"]  # its own package: no edge


def test_no_import_circle():
    graph = {module: _imported(module) for module in MODULES}
    circles = _circles(graph)
    assert not circles, "import circles (every import counts, see the module docstring):\n" + "\n".join(
        " -> ".join(circle) for circle in circles)


def test_no_module_over_600_lines():
    long = {str(path.relative_to(SOURCE)): lines for path, _ in MODULES.values()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_no_function_over_100_lines():
    """A function's lines run from its ``def`` to its last line: docstring and nested functions included."""
    long = {}
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{module}.{node.name} (line {node.lineno})"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


#: A results file cited, or a GPU model named: measurements belong in docs/ and the results files, the source says
#: what the code does. (No GPU name is functional in the source today: the code matches on compute capability.)
CITATION = re.compile(r"benchmarks/results|studies/[\w.-]+/results|"
                      r"\b(?:H100|H200|H20|A100|A10G|L4|L40S?|V100|T4|B200|GH200|RTX ?\d{4})\b")


@pytest.mark.parametrize("path", [path for path, _ in MODULES.values()], ids=lambda path: str(path.relative_to(SOURCE)))
def test_no_results_file_or_gpu_named_in_the_source(path):
    name = str(path.relative_to(SOURCE))
    found = [f"{number}: {line.strip()}" for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if CITATION.search(line)]
    assert not found, f"{name} cites results files or GPUs (move the facts to docs/):\n" + "\n".join(found)
