"""Static costs: FLOPs and bytes per node from concrete shapes, without running the model.

Used for ``--cost static`` (:func:`static_profile`) and, by the profiler, to split the measured time of a
fused group of nodes over its members (:func:`node_cost`).

Shapes come from ONNX shape inference on a weight-less copy of the model with the inputs fixed to
concrete sizes, so models over 2 GB work without reading their weights; where it leaves dims unsettled
(the shape arithmetic of torch exports), from onnxruntime's symbolic shape inference on the same copy.

A node's time is ``max(flops / PEAK_FLOPS, bytes / MEMORY_BANDWIDTH) + NODE_OVERHEAD_SECONDS``, a
roofline with nominal constants for one CPU core.  The constants are deliberately round: real peaks depend
on the machine, the kernel and the data type, so the absolute seconds mean little.  What the partitioner
needs is the *ratio* between nodes, and that is roughly right as long as big Conv/MatMul/Gemm/attention
nodes are compute bound and everything else is memory bound, which these constants encode.

FLOPs count a multiply-add as two.  Conv, ConvTranspose, MatMul, Gemm, Einsum, recurrent and attention
ops are counted precisely; elementwise ops cost one FLOP per output element, normalisations and reductions
one per input element, pooling one per window element; data movement (Reshape, Transpose, Concat, Gather,
Slice...) costs bytes only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import onnx
from onnx import shape_inference

from onnxpipe.core.dims import Dim
from onnxpipe.core.errors import ModelLoadError
from onnxpipe.model import ModelView, NodeInfo, initializer_nbytes, itemsize, value_dims
from onnxpipe.symbolic import available as symbolic_available
from onnxpipe.symbolic import symbolic_dims
from onnxpipe.weightfile import external_info, is_external, source_file

if TYPE_CHECKING:
    from onnxpipe.profile import Profile

PEAK_FLOPS = 50e9
"""Nominal FLOP/s of one core running a well-vectorised kernel (AVX2 fp32 reaches 50-100)."""
MEMORY_BANDWIDTH = 10e9
"""Nominal bytes/s one core streams from memory."""
NODE_OVERHEAD_SECONDS = 2e-6
"""Dispatch cost of one kernel, which dominates tiny shape-manipulation nodes."""

Shapes = Mapping[str, Sequence[int]]

_ALIASING = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Shape", "Size", "Dropout"})
"""Ops onnxruntime runs without touching the data (views or metadata)."""

_REDUCTION_LIKE = frozenset(
    {
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "RMSNormalization",
        "LpNormalization",
        "MeanVarianceNormalization",
        "Softmax",
        "LogSoftmax",
        "Hardmax",
        "ArgMax",
        "ArgMin",
        "CumSum",
        "TopK",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "GlobalLpPool",
    }
)

_ELEMENTWISE = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BiasGelu", "BitShift",
        "Cast", "CastLike", "Ceil", "Celu", "Clip", "Cos", "Cosh", "DequantizeLinear", "Div", "Elu", "Equal",
        "Erf", "Exp", "FastGelu", "Floor", "Gelu", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish",
        "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log", "Max", "Mean", "Min", "Mish", "Mod",
        "Mul", "Neg", "Not", "Or", "PRelu", "Pow", "QuantizeLinear", "QuickGelu", "Reciprocal", "Relu",
        "Resize", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign",
        "Sqrt", "Sub", "Sum", "Swish", "Tan", "Tanh", "ThresholdedRelu", "Upsample", "Where", "Xor",
        "BiasAdd", "BiasSplitGelu", "DynamicQuantizeLinear",
    }
)  # fmt: skip

_MATMUL_LIKE = frozenset({"MatMul", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat"})
_CONV_LIKE = frozenset({"Conv", "FusedConv", "QLinearConv", "ConvInteger", "NhwcConv"})
_ATTENTION_LIKE = frozenset(
    {"MultiHeadAttention", "GroupQueryAttention", "PackedMultiHeadAttention", "SparseAttention"}
)
_RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
_POOL = frozenset({"MaxPool", "AveragePool", "LpPool"})


@dataclass(frozen=True)
class NodeCost:
    """Static cost of one node: FLOPs, bytes read and written, and the roofline time they imply."""

    flops: float
    bytes: int
    known: bool
    """False when a shape the formula needs was unknown (the cost is then a lower bound)."""

    @property
    def seconds(self) -> float:
        return static_seconds(self.flops, self.bytes)


def static_seconds(flops: float, nbytes: float) -> float:
    """Roofline time of one node with the module's nominal constants."""
    return max(flops / PEAK_FLOPS, nbytes / MEMORY_BANDWIDTH) + NODE_OVERHEAD_SECONDS


# --------------------------------------------------------------------------------------------------
# per node


def node_flops(view: ModelView, node: NodeInfo, shapes: Shapes) -> float:
    """FLOPs of ``node`` with tensor shapes taken from ``shapes`` (0.0 when a needed shape is unknown)."""
    flops = _flops(view, node, shapes)
    return 0.0 if flops is None else flops


def node_bytes(view: ModelView, node: NodeInfo, shapes: Shapes) -> int:
    """Bytes the node reads (weights included) and writes; 0 for ops that only alias their input."""
    if node.op_type in _ALIASING:
        return 0
    total = 0
    for t in dict.fromkeys(node.reads + node.outputs):
        total += _nbytes(view, t, shapes) or 0
    return total


def node_cost(view: ModelView, node: NodeInfo, shapes: Shapes) -> NodeCost:
    flops = _flops(view, node, shapes)
    known = flops is not None and all(t in shapes for t in node.outputs)
    return NodeCost(flops=flops or 0.0, bytes=node_bytes(view, node, shapes), known=known)


def _numel(shape: Sequence[int] | None) -> int | None:
    return None if shape is None else math.prod(int(d) for d in shape)


def _nbytes(view: ModelView, tensor: str, shapes: Shapes) -> int | None:
    n = _numel(shapes.get(tensor))
    if n is None:
        return None
    size = itemsize(view.tensor(tensor).elem_type)
    return n * (size if size else 4)


def _attrs(view: ModelView, node: NodeInfo) -> dict[str, onnx.AttributeProto]:
    return {a.name: a for a in view.proto.graph.node[node.index].attribute}


def _flops(view: ModelView, node: NodeInfo, shapes: Shapes) -> float | None:
    """FLOPs by op type; ``None`` when a needed shape is unknown."""
    op = node.op_type
    proto_inputs = list(view.proto.graph.node[node.index].input)

    def shape(i: int) -> Sequence[int] | None:
        if i >= len(proto_inputs) or not proto_inputs[i]:
            return None
        return shapes.get(proto_inputs[i])

    def has_input(i: int) -> bool:
        return i < len(proto_inputs) and bool(proto_inputs[i])

    out = shapes.get(node.outputs[0]) if node.outputs else None
    out_el = _numel(out)

    if op in _ALIASING or node.has_subgraph:
        return 0.0
    if op in _CONV_LIKE:
        w_idx = 3 if op == "QLinearConv" else 1
        w = shape(w_idx)
        if w is None or out_el is None:
            return None
        bias = out_el if has_input(8 if op == "QLinearConv" else 2) else 0
        return 2.0 * out_el * math.prod(w[1:]) + bias
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        if x is None or w is None:
            return None
        bias = (out_el or 0) if has_input(2) else 0
        return 2.0 * _numel(x) * math.prod(w[1:]) + bias  # type: ignore[operator]
    if op in _MATMUL_LIKE:
        a = shape(0)
        if a is None or out_el is None or not a:
            return None
        k = a[-1]
        if op == "FusedMatMul" and len(a) >= 2 and _int_attr(_attrs(view, node), "transA", 0):
            k = a[-2]
        return 2.0 * out_el * k
    if op == "Gemm":
        a = shape(0)
        if a is None or out_el is None or len(a) != 2:
            return None
        k = a[0] if _int_attr(_attrs(view, node), "transA", 0) else a[1]
        return 2.0 * out_el * k + (out_el if has_input(2) else 0)
    if op == "Attention" and node.domain == "com.microsoft":
        x, w = shape(0), shape(1)
        if x is None or w is None or out_el is None or len(x) != 3:
            return None
        seq = x[1]
        return 2.0 * x[0] * x[1] * x[2] * w[-1] + 4.0 * out_el * seq
    if op in _ATTENTION_LIKE or op == "Attention":
        q, k_shape = shape(0), shape(1)
        if q is None or out_el is None:
            return None
        if k_shape is None or len(k_shape) < 3:
            kv_len = q[-2] if len(q) == 4 else q[1] if len(q) >= 2 else 1
        else:
            kv_len = k_shape[-2] if len(k_shape) == 4 else k_shape[1]
        return 4.0 * out_el * kv_len
    if op == "Einsum":
        return _einsum_flops(_attrs(view, node), [shape(i) for i in range(len(proto_inputs))], out_el)
    if op in _RECURRENT:
        x, w, r = shape(0), shape(1), shape(2)
        if x is None or w is None or r is None or len(x) != 3 or len(w) != 3:
            return None
        steps_batch = _numel(x) // max(1, w[2])  # type: ignore[operator]
        return 2.0 * steps_batch * (math.prod(w) + math.prod(r))
    if op in _POOL:
        kernel = _ints_attr(_attrs(view, node), "kernel_shape")
        if out_el is None:
            return None
        return float(out_el * max(1, math.prod(kernel)))
    if op in _REDUCTION_LIKE or op.startswith("Reduce"):
        n = _numel(shape(0))
        return None if n is None else float(n)
    if op in _ELEMENTWISE:
        if out_el is None:
            return None
        arity = sum(1 for i in node.inputs)
        return float(out_el * max(1, arity - 1)) if op in ("Sum", "Mean", "Max", "Min") else float(out_el)
    return 0.0


def _int_attr(attrs: Mapping[str, onnx.AttributeProto], name: str, default: int) -> int:
    a = attrs.get(name)
    return int(a.i) if a is not None else default


def _ints_attr(attrs: Mapping[str, onnx.AttributeProto], name: str) -> list[int]:
    a = attrs.get(name)
    return [int(v) for v in a.ints] if a is not None else []


def _einsum_flops(
    attrs: Mapping[str, onnx.AttributeProto], ins: Sequence[Sequence[int] | None], out_el: int | None
) -> float | None:
    a = attrs.get("equation")
    if a is None or out_el is None:
        return None
    eq = a.s.decode().replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if "..." in eq or len(terms) != len(ins):
        return float(out_el)
    sizes: dict[str, int] = {}
    for term, shp in zip(terms, ins, strict=True):
        if shp is None or len(shp) != len(term):
            return None
        for letter, size in zip(term, shp, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    out_letters = set(rhs) if "->" in eq else {c for c in sizes if lhs.count(c) == 1}
    contracted = [c for c in sizes if c not in out_letters]
    if not contracted:
        return float(out_el)
    return 2.0 * out_el * math.prod(sizes[c] for c in contracted)


_RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def constant_tensors(view: ModelView) -> set[str]:
    """Initializers and the outputs of constant nodes and of nodes computed from constants only (which
    onnxruntime folds when it loads the model: they cost nothing per run)."""
    const = set(view.initializers)
    for node in view.nodes:
        foldable = node.is_constant or (
            node.reads
            and all(t in const for t in node.reads)
            and node.domain in ("", "ai.onnx")
            and node.op_type not in _RANDOM_OPS
            and not node.has_subgraph
        )
        if foldable:
            const.update(node.outputs)
    return const


# --------------------------------------------------------------------------------------------------
# concrete shapes


def concrete_shapes(
    view: ModelView,
    input_shapes: Mapping[str, Sequence[int]],
    notes: list[str] | None = None,
    *,
    symbolic: bool = True,
) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor of the main graph with the inputs fixed to ``input_shapes``.

    ONNX shape inference runs on a weight-less copy whose input dims are replaced.  Where it leaves a
    node's output unsettled, onnxruntime's symbolic shape inference (:mod:`onnxpipe.symbolic`) is asked
    too, and the answer with fewer unknown dims wins.  Dims still unsettled take the size the inputs
    gave their symbolic name, else 1.  Tensors of unknown rank are left out.  ``notes`` gets a line
    naming the tensors whose dims stayed unsettled.  ``symbolic=False`` asks ONNX's inference alone
    (what the benchmarks compare against).
    """
    from onnxpipe.feeds import symbol_sizes

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
                else "pip install 'onnxpipe[shapes]' (sympy) lets onnxruntime's symbolic shape inference "
                "settle them"
            )
            notes.append(
                f"{len(left)} tensor(s) have dims shape inference left unsettled, sized from the inputs' "
                f"symbols or as 1 (e.g. {_names(left, 3)}): {why}"
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


# --------------------------------------------------------------------------------------------------
# static profile


def tensor_bytes_for(
    view: ModelView, shapes: Mapping[str, Sequence[int]], names: Iterable[str]
) -> dict[str, int]:
    result: dict[str, int] = {}
    for t in names:
        n = _nbytes(view, t, shapes)
        if n is not None:
            result[t] = n
    return result


def static_profile(
    view: ModelView, *, shapes: Mapping[str, Sequence[int]] | None = None, symbolic: bool = True
) -> Profile:
    """A :class:`~onnxpipe.profile.Profile` from static costs (``source="static"``); never runs the model.

    ``shapes`` overrides input shapes as in :func:`onnxpipe.feeds.resolve_input_shapes`; ``symbolic``
    as in :func:`concrete_shapes`.
    """
    from onnxpipe.feeds import resolve_input_shapes
    from onnxpipe.profile import SCHEMA_VERSION, Profile

    inputs = resolve_input_shapes(view, shapes)
    notes: list[str] = []
    tshapes = concrete_shapes(view, inputs, notes, symbolic=symbolic)
    seconds: dict[str, float] = {}
    guessed: list[str] = []
    bodies: list[str] = []
    folded = constant_tensors(view)
    for node in view.compute_nodes:
        if node.outputs and all(t in folded for t in node.outputs):
            seconds[node.name] = 0.0  # computed from constants: folded once at load time
            continue
        cost = node_cost(view, node, tshapes)
        seconds[node.name] = cost.seconds
        if not cost.known:
            guessed.append(node.name)
        if node.has_subgraph:
            bodies.append(node.name)
    if guessed:
        notes.append(
            f"{len(guessed)} node(s) with shapes shape inference could not settle, costed as a lower bound: "
            + _names(guessed)
        )
    if bodies:
        notes.append(
            f"{len(bodies)} node(s) with subgraphs costed by their inputs and outputs only: " + _names(bodies)
        )
    names = list(view.inputs) + [t for n in view.nodes for t in n.outputs] + list(view.initializers)
    return Profile(
        schema_version=SCHEMA_VERSION,
        model_sha256=view.sha256,
        model_name=view.path.name if view.path is not None else "",
        source="static",
        threads=1,
        runs=0,
        input_shapes=MappingProxyType(inputs),
        node_seconds=MappingProxyType(seconds),
        tensor_bytes=MappingProxyType(tensor_bytes_for(view, tshapes, dict.fromkeys(names))),
        total_seconds=sum(seconds.values()),
        regions=(),
        unattributed=tuple(notes),
        exact_fraction=1.0,
    )


def _names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
