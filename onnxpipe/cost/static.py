"""Static costs: FLOPs and bytes per node from concrete shapes, without running the model.

Used for ``--cost static`` (:func:`static_profile`) and, by the profiler, to split the measured time of a
fused group of nodes over its members (:func:`node_flops`).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import onnx

from onnxpipe.core.choices import CostSource
from onnxpipe.core.text import names_text
from onnxpipe.cost.profile import SCHEMA_VERSION, Profile
from onnxpipe.ir.model import ModelView, NodeInfo, itemsize
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.ir.shapevalues import constant_only
from onnxpipe.ir.static import concrete_shapes

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
    return sum(_nbytes(view, t, shapes) or 0 for t in dict.fromkeys(node.reads + node.outputs))


def _numel(shape: Sequence[int] | None) -> int | None:
    return None if shape is None else math.prod(int(d) for d in shape)


def _nbytes(view: ModelView, tensor: str, shapes: Shapes) -> int | None:
    n = _numel(shapes.get(tensor))
    if n is None:
        return None
    size = itemsize(view.tensor(tensor).elem_type)
    return n * (size if size else 4)


def _flops(view: ModelView, node: NodeInfo, shapes: Shapes) -> float | None:
    """FLOPs by op type; ``None`` when a needed shape is unknown."""
    if node.op_type in _ALIASING or node.has_subgraph:
        return 0.0
    if node.op_type == "Attention" and node.domain == "com.microsoft":
        formula: _Formula | None = _packed_attention_flops
    elif node.op_type.startswith("Reduce"):
        formula = _reduction_flops
    else:
        formula = _FORMULAS.get(node.op_type)
    if formula is None:
        return 0.0  # data movement: bytes only
    return formula(_Op(view, node, shapes, tuple(view.proto.graph.node[node.index].input)))


@dataclass(frozen=True)
class _Op:
    """A node as the FLOP formulas see it: its inputs by position (an empty name is an omitted optional
    input), their shapes, its first output's elements and its attributes."""

    view: ModelView
    node: NodeInfo
    shapes: Shapes
    inputs: tuple[str, ...]

    def shape(self, i: int) -> Sequence[int] | None:
        if not self.has_input(i):
            return None
        return self.shapes.get(self.inputs[i])

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and bool(self.inputs[i])

    @property
    def out_el(self) -> int | None:
        return _numel(self.shapes.get(self.node.outputs[0]) if self.node.outputs else None)

    @property
    def attrs(self) -> dict[str, onnx.AttributeProto]:
        return {a.name: a for a in self.view.proto.graph.node[self.node.index].attribute}


_Formula = Callable[[_Op], float | None]


def _conv_flops(op: _Op) -> float | None:
    quantized = op.node.op_type == "QLinearConv"
    w, out_el = op.shape(3 if quantized else 1), op.out_el
    if w is None or out_el is None:
        return None
    bias = out_el if op.has_input(8 if quantized else 2) else 0
    return 2.0 * out_el * math.prod(w[1:]) + bias


def _conv_transpose_flops(op: _Op) -> float | None:
    x, w = op.shape(0), op.shape(1)
    if x is None or w is None:
        return None
    bias = (op.out_el or 0) if op.has_input(2) else 0
    return 2.0 * _numel(x) * math.prod(w[1:]) + bias  # type: ignore[operator]


def _matmul_flops(op: _Op) -> float | None:
    a, out_el = op.shape(0), op.out_el
    if a is None or out_el is None or not a:
        return None
    k = a[-1]
    if op.node.op_type == "FusedMatMul" and len(a) >= 2 and op.view.int_attributes(op.node).get("transA"):
        k = a[-2]
    return 2.0 * out_el * k


def _gemm_flops(op: _Op) -> float | None:
    a, out_el = op.shape(0), op.out_el
    if a is None or out_el is None or len(a) != 2:
        return None
    k = a[0] if op.view.int_attributes(op.node).get("transA") else a[1]
    return 2.0 * out_el * k + (out_el if op.has_input(2) else 0)


def _packed_attention_flops(op: _Op) -> float | None:
    """onnxruntime's ``Attention`` (com.microsoft): the QKV projection, then the scores and the sum."""
    x, w, out_el = op.shape(0), op.shape(1), op.out_el
    if x is None or w is None or out_el is None or len(x) != 3:
        return None
    seq = x[1]
    return 2.0 * x[0] * x[1] * x[2] * w[-1] + 4.0 * out_el * seq


def _attention_flops(op: _Op) -> float | None:
    """Scores and weighted sum over the key length (from the key's shape, else the query's)."""
    q, k_shape, out_el = op.shape(0), op.shape(1), op.out_el
    if q is None or out_el is None:
        return None
    if k_shape is None or len(k_shape) < 3:
        kv_len = q[-2] if len(q) == 4 else q[1] if len(q) >= 2 else 1
    else:
        kv_len = k_shape[-2] if len(k_shape) == 4 else k_shape[1]
    return 4.0 * out_el * kv_len


def _recurrent_flops(op: _Op) -> float | None:
    x, w, r = op.shape(0), op.shape(1), op.shape(2)
    if x is None or w is None or r is None or len(x) != 3 or len(w) != 3:
        return None
    steps_batch = _numel(x) // max(1, w[2])  # type: ignore[operator]
    return 2.0 * steps_batch * (math.prod(w) + math.prod(r))


def _pool_flops(op: _Op) -> float | None:
    kernel = op.attrs.get("kernel_shape")
    out_el = op.out_el
    if out_el is None:
        return None
    return float(out_el * max(1, math.prod(kernel.ints if kernel is not None else ())))


def _reduction_flops(op: _Op) -> float | None:
    n = _numel(op.shape(0))
    return None if n is None else float(n)


def _elementwise_flops(op: _Op) -> float | None:
    out_el = op.out_el
    if out_el is None:
        return None
    arity = len(op.node.inputs)
    return (
        float(out_el * max(1, arity - 1))
        if op.node.op_type in ("Sum", "Mean", "Max", "Min")
        else float(out_el)
    )


def _einsum_flops(op: _Op) -> float | None:
    a, out_el = op.attrs.get("equation"), op.out_el
    ins = [op.shape(i) for i in range(len(op.inputs))]
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


_FORMULAS: Mapping[str, _Formula] = {
    **dict.fromkeys(_CONV_LIKE, _conv_flops),
    "ConvTranspose": _conv_transpose_flops,
    **dict.fromkeys(_MATMUL_LIKE, _matmul_flops),
    "Gemm": _gemm_flops,
    **dict.fromkeys(_ATTENTION_LIKE | {"Attention"}, _attention_flops),
    "Einsum": _einsum_flops,
    **dict.fromkeys(_RECURRENT, _recurrent_flops),
    **dict.fromkeys(_POOL, _pool_flops),
    **dict.fromkeys(_REDUCTION_LIKE, _reduction_flops),
    **dict.fromkeys(_ELEMENTWISE, _elementwise_flops),
}
"""The FLOP formula of each op that computes (an op not here, nor a ``Reduce*``, only moves data)."""


def constant_tensors(view: ModelView) -> set[str]:
    """Initializers and the tensors computed from them alone (:func:`onnxpipe.ir.shapevalues.constant_only`),
    which onnxruntime folds when it loads the model: they cost nothing per run."""
    return set(view.initializers) | constant_only(view)


# --------------------------------------------------------------------------------------------------
# static profile


def static_profile(
    view: ModelView, *, shapes: Mapping[str, Sequence[int]] | None = None, symbolic: bool = True
) -> Profile:
    """A :class:`~onnxpipe.cost.profile.Profile` from static costs (``source="static"``); never runs the
    model.

    ``shapes`` overrides input shapes as in :func:`onnxpipe.ir.shapes.resolve_input_shapes`; ``symbolic``
    as in :func:`concrete_shapes`.  Values whose size is not known (a sequence's length is data) are
    costed from what is known and listed in the notes: never a refusal.
    """
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
        flops = _flops(view, node, tshapes)
        seconds[node.name] = static_seconds(flops or 0.0, node_bytes(view, node, tshapes))
        if flops is None or not all(t in tshapes for t in node.outputs):  # a lower bound
            guessed.append(node.name)
        if node.has_subgraph:
            bodies.append(node.name)
    if guessed:
        notes.append(
            f"{len(guessed)} node(s) with shapes shape inference could not settle, costed as a lower bound: "
            + names_text(guessed)
        )
    if bodies:
        notes.append(
            f"{len(bodies)} node(s) with subgraphs costed by their inputs and outputs only: "
            + names_text(bodies)
        )
    names = list(view.inputs) + [t for n in view.nodes for t in n.outputs] + list(view.initializers)
    sizes = {t: n for t in dict.fromkeys(names) if (n := _nbytes(view, t, tshapes)) is not None}
    # sequences, maps and optionals have no size to count (their length is data): costed from what is
    # known, their bytes left out, and said so rather than refused
    unsized = [t for t in dict.fromkeys(names) if t and t not in sizes]
    if unsized:
        notes.append(
            f"{len(unsized)} value(s) of unknown size (sequences, maps, optionals, or dims inference left "
            "open) count no bytes in transfers and memory: " + names_text(unsized)
        )
    return Profile(
        schema_version=SCHEMA_VERSION,
        model_sha256=view.sha256,
        model_name=view.file_name,
        source=CostSource.STATIC,
        threads=1,
        runs=0,
        input_shapes=MappingProxyType(inputs),
        node_seconds=MappingProxyType(seconds),
        tensor_bytes=MappingProxyType(sizes),
        total_seconds=sum(seconds.values()),
        regions=(),
        unattributed=tuple(notes),
        exact_fraction=1.0,
    )
