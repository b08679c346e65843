"""A package facade whose names are imported on first use (PEP 562): the helpers the facades share.

``import onnxpipe`` and ``import onnxpipe.api`` stay cheap: every pipeline worker process imports the
package, most need only the runtime, and the CLI's parsers read the options without loading onnx or
onnxruntime.  A public name must never equal a submodule's name: importing a submodule sets the package
attribute of its name, which would hide a function so named.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Mapping
from importlib.abc import InspectLoader
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` is ``exports[n]``'s attribute
    ``n``, imported when first asked for and kept as a module global from then on."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return public

    return getattr_, dir_


def typed_exports(package: str) -> dict[str, str]:
    """Each name the ``if TYPE_CHECKING:`` block of ``package``'s source imports, and the module it comes
    from: a facade writes a name and its module once, as the import a type checker reads, and resolves
    it at run time from the same line (as scientific Python's lazy_loader reads a stub file)."""
    spec = sys.modules[package].__spec__
    loader = spec.loader if spec is not None else None
    source = loader.get_source(package) if isinstance(loader, InspectLoader) else None
    if source is None:
        raise ImportError(f"{package}: its source, whose imports name its exports, cannot be read")
    (block,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }
