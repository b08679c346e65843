"""The shape of every tensor of the main graph at concrete input sizes, without running the model.

ONNX shape inference runs on a weight-less copy of the model with the inputs fixed to concrete sizes, so
models over 2 GB work without reading their weights; where it leaves dims unsettled (the shape
arithmetic of torch exports), onnxruntime's symbolic shape inference (:mod:`onnxpipe.ir.symbolic`) is
asked too.  Static costs and the profiler's value matching both size tensors with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import shape_inference

from onnxpipe.core.dims import Dim
from onnxpipe.core.extras import install_hint
from onnxpipe.core.text import names_text
from onnxpipe.ir.external import weightless_copy
from onnxpipe.ir.model import ModelView, set_input_shapes, value_dims
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.ir.symbolic import available as symbolic_available
from onnxpipe.ir.symbolic import symbolic_dims


def concrete_shapes(
    view: ModelView,
    input_shapes: Mapping[str, Sequence[int]],
    notes: list[str] | None = None,
    *,
    symbolic: bool = True,
) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor of the main graph with the inputs fixed to ``input_shapes``.

    ONNX shape inference runs on a weight-less copy whose input dims are replaced.  Where it leaves a
    node's output unsettled, onnxruntime's symbolic shape inference (:mod:`onnxpipe.ir.symbolic`) is asked
    too, and the answer with fewer unknown dims wins.  Dims still unsettled take the size the inputs
    gave their symbolic name, else 1.  Tensors of unknown rank are left out.  ``notes`` gets a line
    naming the tensors whose dims stayed unsettled.  ``symbolic=False`` asks ONNX's inference alone
    (what the benchmarks compare against).
    """
    symbols = symbol_sizes(view, input_shapes)
    light = weightless_copy(view.proto, view.base_dir)
    del light.graph.value_info[:]
    set_input_shapes(light.graph, input_shapes)
    try:
        graph = shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True).graph
    except Exception:  # noqa: BLE001 - best effort: the view's own types remain
        graph = light.graph

    found: dict[str, tuple[Dim, ...]] = {}

    def offer(name: str, dims: tuple[Dim, ...] | None) -> None:
        if dims is not None and (name not in found or _unknowns(found[name]) > _unknowns(dims)):
            found[name] = dims

    for vi in list(graph.value_info) + list(graph.output) + list(graph.input):
        offer(vi.name, value_dims(vi))
    for name, info in view.tensors.items():
        offer(name, info.shape)

    # a dim named after an input's symbol (``batch``) is settled by the inputs' sizes; ``unk__3`` is not
    # a sequence, map or optional (typed UNDEFINED by shape inference) has no shape to settle
    tensors = [
        t
        for n in view.nodes
        for t in n.outputs
        if t and (t not in view.tensors or view.tensors[t].elem_type != onnx.TensorProto.UNDEFINED)
    ]

    def unsettled() -> list[str]:
        return [
            t
            for t in tensors
            if t not in found or any(not isinstance(d, int) and d not in symbols for d in found[t])
        ]

    if unsettled():
        for name, dims in ((symbolic_dims(light) if symbolic else None) or {}).items():
            offer(name, dims)
        left = unsettled()
        if left and notes is not None:
            why = (
                "symbolic shape inference was not asked"
                if not symbolic
                else "onnxruntime's symbolic shape inference could not settle them either"
                if symbolic_available()
                else f"{install_hint('shapes')} installs sympy, which lets onnxruntime's symbolic shape "
                "inference settle them"
            )
            notes.append(
                f"{len(left)} tensor(s) have dims shape inference left unsettled, sized from the inputs' "
                f"symbols or as 1 (e.g. {names_text(left, 3)}): {why}"
            )
    result = {
        name: tuple(d if isinstance(d, int) else symbols.get(d, 1) if isinstance(d, str) else 1 for d in dims)
        for name, dims in found.items()
    }
    result |= {name: tuple(int(d) for d in given) for name, given in input_shapes.items()}
    return result | {t.name: tuple(int(d) for d in t.dims) for t in view.proto.graph.initializer}


def _unknowns(dims: Sequence[Dim]) -> int:
    return sum(1 for d in dims if not isinstance(d, int))
