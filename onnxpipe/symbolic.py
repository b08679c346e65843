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
runs, without the save, and takes whatever it settled.  Any failure of the tool (a version without
that loop, an assertion on an odd model) is a None: the second opinion is best effort by design.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnx

from onnxpipe.model import Dim, value_dims

INT_MAX = 2**31 - 1
"""What the tool takes for an unbounded end (``Slice`` to the end), as its own default."""
_LOGGER = "onnxruntime.tools.symbolic_shape_infer"


def available() -> bool:
    """Whether symbolic inference can run here (sympy installed; onnxruntime ships the tool itself)."""
    return importlib.util.find_spec("sympy") is not None


def symbolic_dims(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]] | None:
    """The dims symbolic inference found for every tensor it typed (value infos and graph outputs of
    the main graph), an ``int`` where settled and the symbol's name where not; None when it is not
    installed or failed on ``model``.  ``model`` itself is not changed (the tool works on a copy)."""
    if not available():
        return None
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return None
    try:
        with _quiet():
            inferred = _infer(SymbolicShapeInference, model)
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


def _infer(tool: Any, model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``SymbolicShapeInference.infer_shapes`` without its save of an unfinished model into the current
    directory and its raise: the loop it runs, and the model as far as it got."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 7:  # the tool's own floor
        return None
    inference = tool(INT_MAX, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    inference._preprocess(model)
    while inference.run_:
        inference._infer_impl()
    inference._update_output_from_vi()
    out: onnx.ModelProto = inference.out_mp_
    return out


@contextmanager
def _quiet() -> Iterator[None]:
    """The tool logs a warning for every op it does not know; what it did not settle, the caller says."""
    logger = logging.getLogger(_LOGGER)
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before
