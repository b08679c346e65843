"""Every function of the package stays small enough to read at once: at most 80 lines and 8 parameters;
every module at most 600 lines.

A function that grows past these is split into named steps, and a long parameter list becomes an options
object (the way the planners take a :class:`~onnxpipe.planning.request.PlanRequest`); a module that grows
past its limit is split along a responsibility.  Read with ``ast``, so nothing is imported.
"""

from __future__ import annotations

import ast

from paths import REPO_ROOT

MAX_LINES = 80
MAX_PARAMS = 8
MAX_MODULE_LINES = 600


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted((REPO_ROOT / "onnxpipe").rglob("*.py")):
        where = str(path.relative_to(REPO_ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((f"{where}:{node.lineno} {node.name}", node))
    return found


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x.arg not in ("self", "cls")]
    return names + (["*" + a.vararg.arg] if a.vararg else []) + (["**" + a.kwarg.arg] if a.kwarg else [])


def test_the_package_has_functions_to_check() -> None:
    assert len(_functions()) > 500


def test_no_function_is_longer_than_80_lines() -> None:
    long = [
        f"{where}: {(fn.end_lineno or fn.lineno) - fn.lineno + 1} lines"
        for where, fn in _functions()
        if (fn.end_lineno or fn.lineno) - fn.lineno + 1 > MAX_LINES
    ]
    assert long == [], "split these into named steps"


def test_no_function_takes_more_than_8_parameters() -> None:
    many = [
        f"{where}: {len(_params(fn))} parameters"
        for where, fn in _functions()
        if len(_params(fn)) > MAX_PARAMS
    ]
    assert many == [], "give these an options object"


def test_no_module_is_longer_than_600_lines() -> None:
    modules = sorted((REPO_ROOT / "onnxpipe").rglob("*.py"))
    assert len(modules) > 100
    long = [
        f"{path.relative_to(REPO_ROOT)}: {lines} lines"
        for path in modules
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert long == [], "split these along a responsibility"


def test_the_checks_see_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (fn,) = [
        n
        for n in ast.walk(ast.parse(f"def f(a, b, *c, d, **e):\n{body}\n"))
        if isinstance(n, ast.FunctionDef)
    ]
    assert (fn.end_lineno or 0) - fn.lineno + 1 == MAX_LINES + 1
    assert _params(fn) == ["a", "b", "d", "*c", "**e"]
