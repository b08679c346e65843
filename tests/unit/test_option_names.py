"""The library speaks of options as fields, never as flags: read from the source with ``ast``.

Outside ``onnxpipe/cli`` no string names a ``--flag`` (docstrings aside: they may say what the CLI
does); every option a message names through :func:`onnxpipe.core.options.opt` is a field of one of the
door's options objects; and the CLI has a flag for every field a message names, so that the line the
CLI prints never shows the field's mark-up.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

from paths import REPO_ROOT

from onnxpipe.api import options as api_options
from onnxpipe.cli.parsers import SUBCOMMANDS
from onnxpipe.core.options import OptionRef

PACKAGE = REPO_ROOT / "onnxpipe"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "cli")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings: a module's, class's or function's first
    statement, and the string right after an assignment (an attribute's docstring)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
        for before, after in itertools.pairwise(body):
            if (
                isinstance(before, ast.Assign | ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
            ):
                found.add(id(after.value))
    return found


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def _opt_calls(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "opt":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):  # a name passed in is
                yield node.lineno, first.value  # checked where it is written as a literal


def _fields() -> dict[str, set[str]]:
    """Each options class of the door, by name, and its fields."""
    return {
        name: {f.name for f in dataclasses.fields(value)}
        for name, value in vars(api_options).items()
        if isinstance(value, type) and dataclasses.is_dataclass(value)
    }


def test_no_string_outside_the_cli_names_a_flag() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {FLAG.search(text).group(0)}"  # type: ignore[union-attr]
        for path in SOURCES
        for line, text in _strings(path)
        if FLAG.search(text)
    ]
    assert not found, "name the option with onnxpipe.core.options.opt instead:\n" + "\n".join(found)


def test_every_option_a_message_names_is_a_field() -> None:
    fields = _fields()
    every = set().union(*fields.values())
    wrong = []
    for path in SOURCES:
        for line, name in _opt_calls(path):
            owner, _, field = name.rpartition(".")
            known = field in fields.get(owner, set()) if owner else field in every
            if not known:
                wrong.append(f"{path.relative_to(REPO_ROOT)}:{line}: {name}")
    assert not wrong, "options named that no options class has:\n" + "\n".join(wrong)


def test_the_cli_has_a_flag_for_every_option_a_message_names() -> None:
    tables = SUBCOMMANDS
    named = {name for path in SOURCES for _, name in _opt_calls(path)}
    api_only = {"inputs", "ProfileOptions.inputs", "ProfileOptions.out"}  # samples in memory; a saved profile
    missing = []
    for name in sorted(named - api_only):
        owner, _, field = name.rpartition(".")
        ref = OptionRef(field, owner or None)
        if not any(t.find(ref) for t in tables):
            missing.append(name)
    assert not missing, f"options the CLI cannot word as a flag: {missing}"
