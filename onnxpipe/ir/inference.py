"""The shape of every tensor of the main graph at concrete input sizes, without running the model.

ONNX shape inference runs on a weight-less copy of the model with the inputs fixed to concrete sizes, so
models over 2 GB work without reading their weights; where it leaves dims unsettled (the shape
arithmetic of torch exports), onnxruntime's symbolic shape inference (:mod:`onnxpipe.ir.symbolic`) is
asked too.  Static costs and the profiler's value matching both size tensors with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from onnx import shape_inference

from onnxpipe.core.dims import Dim
from onnxpipe.core.errors import ModelLoadError
from onnxpipe.core.extras import install_hint
from onnxpipe.ir.external import external_info, is_external, source_file
from onnxpipe.ir.model import ModelView, initializer_nbytes, value_dims
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
    light = _weightless_copy(view.proto, view.base_dir)
    del light.graph.value_info[:]
    for vi in light.graph.input:
        if vi.name in input_shapes and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            shape.Clear()
            for d in input_shapes[vi.name]:
                shape.dim.add().dim_value = int(d)
    try:
        inferred = shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True)
        graph = inferred.graph
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
    tensors = [t for t in _node_outputs(view) if not _not_a_tensor(view, t)]

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
    result: dict[str, tuple[int, ...]] = {}
    for name, found_dims in found.items():
        result[name] = tuple(
            d if isinstance(d, int) else symbols.get(d, 1) if isinstance(d, str) else 1 for d in found_dims
        )
    for name, given in input_shapes.items():
        result[name] = tuple(int(d) for d in given)
    for t in view.proto.graph.initializer:
        result[t.name] = tuple(int(d) for d in t.dims)
    return result


def _node_outputs(view: ModelView) -> list[str]:
    """The main graph's node outputs, in graph order (those a cost or a cut may need the size of)."""
    return [t for n in view.nodes for t in n.outputs if t]


def _not_a_tensor(view: ModelView, name: str) -> bool:
    """Whether shape inference typed ``name`` as a sequence, map or optional: it has no shape to settle."""
    info = view.tensors.get(name)
    return info is not None and info.elem_type == onnx.TensorProto.UNDEFINED


def _unknowns(dims: Sequence[Dim]) -> int:
    return sum(1 for d in dims if not isinstance(d, int))


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")


SMALL_ELEMENTS = 1 << 16
"""Initializers up to this many elements keep their data in the shape-inference copy: symbolic shape
inference reads the values of those that shape arithmetic or a constant-folded chain touches (a BERT's
512 position ids, sliced to the sequence length; a bias folded with a constant).  The peak is the full
copy made first either way."""


def _weightless_copy(proto: onnx.ModelProto, base_dir: Path | None = None) -> onnx.ModelProto:
    """A copy whose big initializers keep dims and type but no data (enough for shape inference); the
    small ones keep theirs, read from their external file when the model keeps them there (``base_dir``:
    the model's folder; unknown, they are left without data as well)."""
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    for t in light.graph.initializer:
        small = math.prod(t.dims) <= SMALL_ELEMENTS
        if is_external(t):
            data = _small_external(t, base_dir) if small else None
            for f in _DATA_FIELDS:
                t.ClearField(f)
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            if data is not None:
                t.raw_data = data
        elif not small:
            for f in _DATA_FIELDS:
                t.ClearField(f)
    return light


def _small_external(t: onnx.TensorProto, base_dir: Path | None) -> bytes | None:
    """The bytes of external tensor ``t`` (None: folder unknown, file outside it, too short, or a length
    that is not the tensor's size)."""
    if base_dir is None:
        return None
    size = initializer_nbytes(t)
    try:
        path = source_file(t, base_dir)
        _, offset, length = external_info(t)
        if length is not None and length != size:  # a tensor of other dims than its entry says
            return None
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(size)
    except (OSError, ModelLoadError):
        return None
    return data if len(data) == size else None


def names_text(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
