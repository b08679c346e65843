"""Unnamed input dims that must be equal, linked so that they get one size.

Why: a model whose inputs have unnamed dims (``input: [?, ?]``, ``state: [2, ?, 128]``) says nothing
of which dims agree, and sizing each on its own gave a voice-activity detector's ``state`` a batch of
16 next to its ``input``'s batch of 1, which the model refuses.  Named symbols already get one size
everywhere (:mod:`onnxpipe.ir.shapes`); this finds the links the names do not spell out.

How: every unnamed input dim gets a symbol of its own (``?0``, ``?1``...), and onnxruntime's symbolic
shape inference runs with merging on (``auto_merge``): where an op needs two dims equal (an ``Add``
of the state's rows and the input's, a ``MatMul``'s inner dims) it merges their symbols.  The input
dims it ends with are the links: a dim merged into another unnamed one shares its symbol, one merged
into a named symbol (``batch``) takes that name, one shown fixed takes that size.  ONNX's own
inference cannot do this (it never equates two unknown dims); onnxruntime's tool needs ``sympy`` (the
``shapes`` extra), and without it, or when the tool fails, the dims stay unlinked, as before.

Merging may equate a dim with one that broadcasts against it (one of them 1 when the model runs);
for choosing sizes that is harmless: both get the same default.  The answer is kept per model (by its
sha256), since every step resolves shapes and the inference is not free on a large graph.
"""

from __future__ import annotations

from collections import OrderedDict

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.model import ModelView, value_dims
from onnxpipe.ir.symbolic import available, run_tool

LINK_PREFIX = "?"
"""Link symbols start with this, which no exporter writes in a dim name of its own."""
_CACHE: OrderedDict[str, dict[str, tuple[Dim, ...]]] = OrderedDict()
_CACHE_SIZE = 8


def linked_input_shapes(view: ModelView) -> dict[str, tuple[Dim, ...]]:
    """The inputs' declared dims with every unnamed dim replaced by what it was shown to equal: a link
    symbol (``?3``) shared by the unnamed dims that must agree, a named symbol, or a size; only inputs
    that have an unnamed dim, and only when there are two or more such dims to link."""
    unnamed = [
        (name, axis)
        for name in view.inputs
        for axis, d in enumerate(view.tensor(name).shape or ())
        if d is None or (isinstance(d, int) and d < 0)
    ]
    if len(unnamed) < 2 or not available():
        return {}
    cached = _CACHE.get(view.sha256)
    if cached is None:
        cached = _infer_links(view, unnamed)
        _CACHE[view.sha256] = cached
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return dict(cached)


def _infer_links(view: ModelView, unnamed: list[tuple[str, int]]) -> dict[str, tuple[Dim, ...]]:
    model = onnx.ModelProto()
    model.CopyFrom(view.proto)
    del model.graph.value_info[:]  # only what the inputs imply
    symbol_of: dict[tuple[str, int], str] = {}
    by_name = {vi.name: vi for vi in model.graph.input}
    for i, (name, axis) in enumerate(unnamed):
        vi = by_name.get(name)
        if vi is None or not vi.type.HasField("tensor_type"):
            continue
        dim = vi.type.tensor_type.shape.dim[axis]
        symbol_of[(name, axis)] = dim.dim_param = f"{LINK_PREFIX}{i}"
    out = _run(model)
    if out is None:
        return {}
    inferred = {vi.name: value_dims(vi) for vi in out.graph.input}
    result: dict[str, tuple[Dim, ...]] = {}
    for name in dict.fromkeys(n for n, _ in unnamed):
        declared = view.tensor(name).shape
        got = inferred.get(name)
        if declared is None or got is None or len(got) != len(declared):
            continue
        result[name] = tuple(
            g if (name, axis) in symbol_of and g is not None else d
            for axis, (d, g) in enumerate(zip(declared, got, strict=True))
        )
    return result


def _run(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The tool's loop with merging on (:func:`onnxpipe.ir.symbolic.run_tool`), its merges applied to the
    inputs; None when it is missing or fails before it has a model."""
    tool = run_tool(model, auto_merge=True)
    out: onnx.ModelProto | None = getattr(tool, "out_mp_", None)
    if out is None:
        return None
    merges: dict[str, object] = dict(getattr(tool, "suggested_merge_", {}) or {})
    for vi in out.graph.input:  # the tool renames inputs' dims only at its end: apply its merges
        for dim in vi.type.tensor_type.shape.dim:
            seen: set[str] = set()
            while dim.HasField("dim_param") and dim.dim_param in merges and dim.dim_param not in seen:
                seen.add(dim.dim_param)
                target = merges[dim.dim_param]
                if isinstance(target, int) or str(target).isdigit():
                    dim.dim_value = int(str(target))
                else:
                    dim.dim_param = str(target)
    return out


__all__ = ["LINK_PREFIX", "linked_input_shapes"]
