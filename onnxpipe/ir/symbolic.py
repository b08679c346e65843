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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.model import default_opset, value_dims

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
