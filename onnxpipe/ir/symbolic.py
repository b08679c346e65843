"""onnxruntime's symbolic shape inference, as a second opinion where ONNX's own leaves dims unsettled.

Why: ONNX shape inference (even with ``data_prop``) cannot follow the shape arithmetic torch exporters
write (``Shape -> Gather -> Unsqueeze -> Concat -> Expand``, ``Range`` over a computed length, a
``Reshape`` to a computed shape).  With the inputs fixed to concrete sizes it leaves such tensors with
made-up symbols (``unk__12``), and a static cost path then has to guess their size.  On the torch
exports of the project's corpus it left 9-108 tensors per model at a wrong size (a BERT's 4x128
attention masks counted 4 bytes instead of 256 KiB, a GPT-2's position ids and causal mask as one
element); onnxruntime's ``SymbolicShapeInference``, which evaluates those shape subgraphs symbolically,
settled every one of them to the size the model really computes.

It needs ``sympy`` (``pip install 'onnxpipe[shapes]'``), which onnxruntime itself only lists as an
extra; without it :func:`symbolic_dims` returns None and callers keep ONNX's answer, saying so.

The tool's public ``infer_shapes`` writes ``sym_shape_infer_temp.onnx`` into the current directory when
some shape stays unknown (an op it does not know) and then raises; a library must not write into its
user's folder, and a partial answer is still worth having.  So this runs the same loop that function
runs, without the save, at most :data:`MAX_RUNS` times (the cap onnxruntime's own transformer helper
puts on it), and takes whatever it settled, also when the tool raises halfway (an assertion on a 1-D
``Concat`` along ``-1``, a helper that newer onnx releases dropped): every dim it had written by then
was inferred from settled inputs.  An op it does not know (a custom domain's) stops it at that op, so
the tensors after it keep ONNX's answer.  A version of the tool without that loop gives None: the second
opinion is best effort by design.

Symbols are not merged (``auto_merge=False``): merging takes two dims that broadcast together to be
equal, and one of them may be 1 when the model runs (a ``NonZero`` count added to a row of 7 is not 7),
which would settle a wrong size that beats ONNX's honest unknown.  Unmerged, such a dim stays a symbol,
the caller sizes it as before and says so.  On the corpus's torch exports merging bought nothing.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.model import ModelView, default_opset, value_dims

INT_MAX = 2**31 - 1
"""What the tool takes for an unbounded end (``Slice`` to the end), as its own default."""
MAX_RUNS = 200
"""Passes of the tool's loop at most (it repeats while a pass settled something new)."""
_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


def available() -> bool:
    """Whether symbolic inference can run here (sympy installed; onnxruntime ships the tool itself)."""
    return importlib.util.find_spec("sympy") is not None


def symbolic_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]] | None:
    """The dims symbolic inference found for every tensor it typed (value infos and graph outputs of
    the main graph), an ``int`` where settled and the symbol's name where not; None when it is not
    installed or got nowhere on ``model``.  ``model`` itself is not changed (the tool works on a copy)."""
    if not available():
        return None
    try:
        inferred: onnx.ModelProto | None = getattr(run_tool(model, auto_merge=False), "out_mp_", None)
    except Exception:  # noqa: BLE001 - best effort: the caller keeps ONNX's shapes
        return None
    if inferred is None:
        return None
    found: dict[str, tuple[Dim, ...]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = value_dims(vi)
        if dims is not None:
            found[vi.name] = dims
    return found


def run_tool(model: onnx.ModelProto, *, auto_merge: bool) -> Any:
    """The tool once :func:`_infer` ran it on ``model`` (its ``out_mp_``: the model as far as it got;
    its ``suggested_merge_``: the symbols it merged, with ``auto_merge``); None when onnxruntime lacks
    it or the model's opset is below its floor."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return None
    with _quiet():
        return _infer(SymbolicShapeInference, model, auto_merge)


def _infer(tool: Any, model: onnx.ModelProto, auto_merge: bool = False) -> Any:
    """``SymbolicShapeInference.infer_shapes`` without its save of an unfinished model into the current
    directory and its raise: the loop it runs, kept as far as it got also when the tool raised on some
    node (None: the opset is below the tool's floor)."""
    if default_opset(model) < 7:  # the tool's own floor
        return None
    inference = tool(INT_MAX, auto_merge, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    try:
        inference._preprocess(model)
        for _ in range(MAX_RUNS):
            if not inference.run_:
                break
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - what it settled before the failure stands
        pass
    return inference


class _Silenced(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextmanager
def _quiet() -> Iterator[None]:
    """The tool logs a warning for every op it does not know; what it did not settle, the caller says.

    A filter of its own per call, added and removed, so that calls in several threads at once cannot
    leave the tool's logger silenced (saving and restoring ``disabled`` would: enter A, enter B, exit A,
    exit B)."""
    logger = logging.getLogger(_LOGGER)
    silenced = _Silenced()
    logger.addFilter(silenced)
    try:
        yield
    finally:
        logger.removeFilter(silenced)


# --------------------------------------------------------------------------------------------------
# Unnamed input dims that must be equal, linked so that they get one size.
#
# Why: a model whose inputs have unnamed dims (``input: [?, ?]``, ``state: [2, ?, 128]``) says nothing
# of which dims agree, and sizing each on its own gave a voice-activity detector's ``state`` a batch of
# 16 next to its ``input``'s batch of 1, which the model refuses.  Named symbols already get one size
# everywhere (:mod:`onnxpipe.ir.shapes`); this finds the links the names do not spell out.
#
# How: every unnamed input dim gets a symbol of its own (``?0``, ``?1``...), and onnxruntime's symbolic
# shape inference runs with merging on (``auto_merge``): where an op needs two dims equal (an ``Add``
# of the state's rows and the input's, a ``MatMul``'s inner dims) it merges their symbols.  The input
# dims it ends with are the links: a dim merged into another unnamed one shares its symbol, one merged
# into a named symbol (``batch``) takes that name, one shown fixed takes that size.  ONNX's own
# inference cannot do this (it never equates two unknown dims); onnxruntime's tool needs ``sympy`` (the
# ``shapes`` extra), and without it, or when the tool fails, the dims stay unlinked, as before.
#
# Merging may equate a dim with one that broadcasts against it (one of them 1 when the model runs);
# for choosing sizes that is harmless: both get the same default.  The answer is kept per model (by its
# sha256), since every step resolves shapes and the inference is not free on a large graph.

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
    """The tool's loop with merging on (:func:`run_tool`), its merges applied to the
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
