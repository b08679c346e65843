"""Dims and shapes as onnxpipe writes them everywhere: a size, a symbolic name, or unknown.

Kept apart from the model view so that the manifest (which records shapes) does not need onnx.
"""

from __future__ import annotations

from collections.abc import Sequence

Dim = int | str | None
"""One dimension: a fixed size, a symbolic name (``"batch"``), or ``None`` when nothing is known."""

Shape = tuple[Dim, ...] | None
"""Dims as ints, symbolic names or ``None`` (unknown); ``None`` for a tensor of unknown rank."""


def dims_text(dims: Sequence[Dim] | None, unknown_rank: str, *, symbols: bool = True, cut: int = 0) -> str:
    """``[batch, 3, ?]`` (``unknown_rank`` for dims of unknown rank): a size, a symbol by name (``?`` unless
    ``symbols``; one longer than ``cut`` characters cut short), or ``?`` for an unknown dim."""
    if dims is None:
        return unknown_rank

    def one(d: Dim) -> str:
        if isinstance(d, str) and symbols:
            return d if not cut or len(d) <= cut else d[: cut - 3] + "..."
        return str(d) if isinstance(d, int) and d >= 0 else "?"

    return "[" + ", ".join(one(d) for d in dims) + "]"
