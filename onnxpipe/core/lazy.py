"""A package facade whose names are imported on first use (PEP 562): the one helper both facades share.

``import onnxpipe`` and ``import onnxpipe.api`` stay cheap: every pipeline worker process imports the
package, most need only the runtime, and the CLI's parsers read the options without loading onnx or
onnxruntime.  A public name must never equal a submodule's name: importing a submodule sets the package
attribute of its name, which would hide a function so named.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
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
