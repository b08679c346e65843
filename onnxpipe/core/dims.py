"""Dims and shapes as onnxpipe writes them everywhere: a size, a symbolic name, or unknown.

Kept apart from the model view so that the manifest (which records shapes) does not need onnx.
"""

from __future__ import annotations

Dim = int | str | None
"""One dimension: a fixed size, a symbolic name (``"batch"``), or ``None`` when nothing is known."""

Shape = tuple[Dim, ...] | None
"""Dims as ints, symbolic names or ``None`` (unknown); ``None`` for a tensor of unknown rank."""
