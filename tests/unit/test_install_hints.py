"""Install hints work for both kinds of install: from an index and from a source checkout."""

from __future__ import annotations

import ast
from pathlib import Path

from paths import REPO_ROOT

from onnxpipe.core.extras import install_hint

PACKAGE = REPO_ROOT / "onnxpipe"


def test_the_hint_names_both_installs() -> None:
    assert install_hint("text") == "pip install 'onnxpipe[text]' (or '.[text]' in a source checkout)"


def message_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of ``path`` that are not docstrings (f-strings' literal parts included)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_message_gives_the_hint_for_both_installs() -> None:
    """Regression: messages said ``pip install 'onnxpipe[text]'``, which a source install (the README's
    ``pip install .``) cannot use; every message now words it through :func:`install_hint`."""
    written_out = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "extras.py"
        for line, text in message_strings(path)
        if "pip install 'onnxpipe[" in text or "install onnxpipe[" in text
    ]
    assert written_out == []
