"""A copy of the model with its input shapes frozen, for runtimes and NPUs that need fixed shapes.

Why: tract, NPU compilers and OpenVINO's static mode type every tensor before they run anything; a
stage of a dynamic model hands them symbolic dims and ``Shape -> Gather -> Concat`` arithmetic feeding
its ``Reshape`` targets, which some cannot type at all.  ``split --static`` splits this copy instead:

1. the given input shapes replace the declared ones;
2. the source's ``value_info`` and declared output shapes are dropped: they describe the dynamic model
   (and some exporters' are simply wrong), and would contradict the frozen shapes;
3. ONNX shape inference (with data propagation) and, when installed, onnxruntime's symbolic inference
   settle the shapes, and :func:`onnxpipe.ir.fold.fold_constants` folds the shape arithmetic they
   make constant, and replaces an ``If`` whose condition folds by the branch it takes; repeated until
   nothing more folds.

The result computes bit for bit what the source computes at those shapes (only exact ops are folded),
so a static split verifies against the source at its profiled shapes.  What stays open is what no
freezing fixes: a size that follows data (a ``NonZero``'s count, an ``If`` on a value), which
:func:`unsettled` finds for the plan's notes to name.  The sizes frozen are the ones the model runs at:
``split`` chooses them as a measured profile does (:mod:`onnxpipe.cost.runnable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.fold import fold_constants
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import ModelView, set_input_shapes, value_dims
from onnxpipe.ir.symbolic import symbolic_dims

MAX_ROUNDS = 8
"""Rounds of inference and folding: each settles shapes that the previous fold made constant."""


def freeze_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], base_dir: Path | None = None
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with ``shapes`` frozen and its shape arithmetic folded; and the number of
    nodes folded (``base_dir``: the model's folder, where its external tensors are read from).  ``model``
    itself is not changed."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    graph = frozen.graph
    set_input_shapes(graph, shapes)
    del graph.value_info[:]
    for vi in graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    folded = 0
    for _ in range(MAX_ROUNDS):
        done = fold_constants(frozen, _static_shapes(frozen, symbolic=False), base_dir)
        if not done:  # the dearer second opinion only where ONNX's own inference is stuck
            done = fold_constants(frozen, _static_shapes(frozen, symbolic=True), base_dir)
        folded += done
        if not done:
            break
    return frozen, folded


def _static_shapes(model: onnx.ModelProto, *, symbolic: bool) -> dict[str, tuple[int, ...]]:
    """Tensors whose every dim is a number, by ONNX's inference (and onnxruntime's symbolic one)."""
    found: dict[str, tuple[int, ...]] = {}
    try:
        g = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
        for vi in [*g.input, *g.value_info, *g.output]:
            _keep_static(found, vi.name, value_dims(vi))
    except Exception:  # noqa: BLE001 - best effort: the symbolic inference may still settle them
        pass
    if symbolic:
        for name, dims in (symbolic_dims(model) or {}).items():
            if name not in found:
                _keep_static(found, name, dims)
    return found


def _keep_static(found: dict[str, tuple[int, ...]], name: str, dims: tuple[Dim, ...] | None) -> None:
    if dims is not None and all(isinstance(d, int) and d >= 0 for d in dims):
        found[name] = tuple(int(d) for d in dims if isinstance(d, int))


def static_view(view: ModelView, shapes: Mapping[str, Sequence[int]]) -> tuple[ModelView, int]:
    """``view``'s model with ``shapes`` frozen (:func:`freeze_shapes`), as a view that keeps the source's
    path, folder and hash: the stages of a static split are checked against the source file."""
    frozen, folded = freeze_shapes(view.proto, shapes, view.base_dir)
    return view_from_proto(frozen, path=view.path, sha256=view.sha256, base_dir=view.base_dir), folded


def unsettled(
    view: ModelView, groups: Sequence[tuple[int, Sequence[str]]]
) -> list[tuple[int, str, tuple[Dim, ...] | None]]:
    """``(group, tensor, dims)`` for each tensor of ``groups`` (a stage's index and its outputs) whose
    dims in ``view`` (a frozen model) are not all numbers; ``dims`` None for an unknown rank."""
    found: list[tuple[int, str, tuple[Dim, ...] | None]] = []
    for index, names in groups:
        for name in names:
            info = view.tensors.get(name)
            if info is None or not info.is_static:
                found.append((index, name, None if info is None else info.shape))
    return found


__all__ = ["MAX_ROUNDS", "freeze_shapes", "static_view", "unsettled"]
