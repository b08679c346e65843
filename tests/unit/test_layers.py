"""The package's import graph: rooms in layers, each importing only those below it, and no cycle.

Read from the source with ``ast``, so that nothing is imported and the test runs in milliseconds.  Every
``import`` counts, at module level or inside a function, so that an import moved into a function cannot
hide a cycle or an upward dependency.  Imports under ``if TYPE_CHECKING:`` are annotations only: they
count for the layers (a low room must not even name a higher room's types), and for cycles too: a cycle
that only annotations close is still two modules that cannot be read one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
from paths import REPO_ROOT

PACKAGE = REPO_ROOT / "onnxpipe"

RANKS = {
    "core": 0,
    "ir": 1,
    "partition": 1,
    "schedule": 1,
    "cluster": 1,
    "cost": 2,
    "planning": 3,
    "manifest": 4,
    "export": 5,
    "verification": 6,
    "runtime": 7,
    "calibrate": 8,
    "api": 9,
    "": 10,  # the facade, onnxpipe/__init__.py
    "cli": 11,
}
"""Each room's floor: a module imports its own room and rooms of lower floors only (rooms on one floor
know nothing of each other).  The order is the pipeline's: load, cost, plan, write (the manifest holds
the plan's records), export, check, run."""

FUNCTION_LEVEL: dict[tuple[str, str], str] = {
    # (module, imported module): why it is imported inside a function
}
"""Imports of onnxpipe modules inside functions, each with its reason (none today)."""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool
    type_checking: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _resolve(module: str, name: str | None) -> str | None:
    """The onnxpipe module a ``from module import name`` needs: the submodule ``name`` if there is one."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module if module in MODULES else None


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(module: str) -> Iterator[Import]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    target = _resolve(alias.name, None)
                    if target is not None:
                        yield Import(module, target, child.lineno, in_function, type_checking)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for alias in child.names:
                    target = _resolve(child.module, alias.name)
                    if target is not None:
                        yield Import(module, target, child.lineno, in_function, type_checking)
                    if target not in (None, child.module) and child.module in MODULES and "." in child.module:
                        # ``from package import submodule`` runs the package's ``__init__`` first: an
                        # edge to the package too, or a cycle through its re-exports hides (the top
                        # package is left out: every import runs it, and it only re-exports the door).
                        yield Import(module, child.module, child.lineno, in_function, type_checking)
            else:
                yield from visit(
                    child,
                    in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef),
                    type_checking or (isinstance(child, ast.If) and _is_type_checking(child)),
                )

    yield from visit(tree, False, False)


IMPORTS = [imp for m in MODULES for imp in imports_of(m) if imp.imported != imp.importer]


def third_party(module: str) -> set[str]:
    """Top-level names of the packages outside onnxpipe that ``module`` imports when it is imported
    (imports inside functions wait for a call: the devices file's reader asks onnxruntime for its
    provider names only when it reads one)."""
    found: set[str] = set()
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found - {"onnxpipe"}


def test_every_module_is_in_a_room_with_a_floor() -> None:
    unknown = sorted({room(m) for m in MODULES} - set(RANKS))
    assert not unknown, f"rooms without a floor in RANKS: {unknown}"


def test_no_room_imports_a_room_above_it_or_beside_it() -> None:
    wrong = [
        f"{imp.importer} (floor {RANKS[room(imp.importer)]}) imports {imp.imported} "
        f"(floor {RANKS[room(imp.imported)]}) at line {imp.line}"
        for imp in IMPORTS
        if room(imp.importer) != room(imp.imported) and RANKS[room(imp.imported)] >= RANKS[room(imp.importer)]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    """No cycle, imports under ``if TYPE_CHECKING:`` included (the manifest's check/manifest/write
    triangle was one: two modules annotating with the class of a third that imports them)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    graph.add_edges_from((imp.importer, imp.imported) for imp in IMPORTS)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:5])


def test_planning_does_not_import_the_manifest() -> None:
    """The plan is made of planning's own records; the manifest holds them as they are (not the other
    way round, where the planner built its plan of the file format's records)."""
    wrong = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in IMPORTS
        if room(imp.importer) == "planning" and room(imp.imported) == "manifest"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_onnxpipe_import_hides_inside_a_function() -> None:
    hidden = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in IMPORTS
        if imp.in_function and (imp.importer, imp.imported) not in FUNCTION_LEVEL
    ]
    assert not hidden, "\n".join(hidden)


def test_type_checking_imports_stay_inside_their_room() -> None:
    """Annotation-only imports, to name a type of the same room; the facades list every public name, and
    an options module (light, so that the CLI reads its defaults without loading onnx or numpy) names the
    heavy types a field may hold (a profile, samples in memory, a cluster)."""
    crossing = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in IMPORTS
        if imp.type_checking
        and room(imp.importer) != room(imp.imported)
        and imp.importer not in ("onnxpipe", "onnxpipe.api")
        and not imp.importer.endswith(".options")
    ]
    assert not crossing, "\n".join(crossing)


def test_the_manifest_needs_neither_onnx_nor_onnxruntime() -> None:
    """A runtime that only reads split folders loads the manifest without the splitting machinery: no
    module that importing :mod:`onnxpipe.manifest` runs imports onnx or onnxruntime at its top level."""
    graph = nx.DiGraph(
        (imp.importer, imp.imported) for imp in IMPORTS if not (imp.type_checking or imp.in_function)
    )
    closure = {"onnxpipe.manifest"} | nx.descendants(graph, "onnxpipe.manifest")
    # a package's __init__ runs before its submodules: the rooms' own files count too
    closure |= {".".join(m.split(".")[:i]) for m in list(closure) for i in range(2, m.count(".") + 1)}
    heavy = {m: third_party(m) & {"onnx", "onnxruntime"} for m in sorted(closure)}
    assert not {m: h for m, h in heavy.items() if h}, heavy


WORKER_STARTS = (
    "onnxpipe.runtime.backends.process_worker",  # a worker process's target
    "onnxpipe.runtime.backends.processes",  # the class of the process object the child unpickles
    "onnxpipe.runtime.backends.ray_actor",  # a Ray actor's body
)
"""The modules a worker imports as it starts."""


def test_a_worker_starts_without_onnx_ray_or_networkx() -> None:
    """A worker needs onnxruntime and its stage, not the splitting machinery: no module that importing a
    worker's start module runs imports onnx, ray or networkx at its top level (ray_ship's merge into
    stage_cache had every Ray actor import onnx for the driver's hashing of a model's files)."""
    graph = nx.DiGraph(
        (imp.importer, imp.imported) for imp in IMPORTS if not (imp.type_checking or imp.in_function)
    )
    heavy: dict[str, set[str]] = {}
    for start in WORKER_STARTS:
        closure = {start} | nx.descendants(graph, start)
        closure |= {".".join(m.split(".")[:i]) for m in list(closure) for i in range(2, m.count(".") + 1)}
        heavy |= {m: found for m in closure if (found := third_party(m) & {"onnx", "ray", "networkx"})}
    assert not heavy, heavy


def test_the_cli_imports_only_the_door_and_core() -> None:
    """The CLI parses, maps flags to options, calls :mod:`onnxpipe.api` and prints: nothing else."""
    wrong = [
        f"{imp.importer}:{imp.line} imports {imp.imported}"
        for imp in IMPORTS
        if room(imp.importer) == "cli" and room(imp.imported) not in ("cli", "api", "core")
    ]
    assert not wrong, "\n".join(wrong)
