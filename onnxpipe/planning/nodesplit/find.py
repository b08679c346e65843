"""Which nodes can be cut into independent parts, and by which kinds of cut.

A node is cut so that each part computes a slice of its output:

* **columns**: ``MatMul(A, W)`` or ``Gemm(A, B, C)`` with a constant weight: part ``i`` multiplies by
  the weight's output columns ``cols_i``; the parts' outputs are joined by ``Concat`` on the last axis;
* **reduction**: ``MatMul(A, W)`` with a constant 2-D weight: part ``i`` multiplies ``A[..., ks_i]``
  (a ``Slice``) by ``W[ks_i, :]``; the partial products are joined by ``Sum`` (exact up to the order
  of the additions);
* **channels**: ``Conv`` (``group = 1``) with constant weights: part ``i`` computes output channels
  ``chs_i``; joined by ``Concat`` on axis 1.

The nodes right after it in the order that work column by column (or channel by channel) are carried
along into every part, so that the join comes after them: unary activations, ``Add``/``Sub``/``Mul``/
``Div`` by a constant that broadcasts along the split axis (a bias), ``BatchNormalization`` with
constant statistics (channels).  Each is carried only when it is the sole reader of what it takes.  A
reduction cut carries nothing (a bias would be added once per part): a node that carries a chain offers
its other kinds only.

The values of the tensors a cut slices (:class:`Constants`): weights, read by value wherever they come from.
A weight is an initializer (inline or external) or a tensor computed from initializers alone
(``ConstantOfShape``, ``Transpose`` of an initializer...), evaluated with ``onnx.reference``: exporters
often transpose a weight in the graph, and the cut needs its value to slice it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxpipe.ir.external import inlined
from onnxpipe.ir.model import ModelView, NodeInfo

MAX_CONSTANT_NODES = 32
"""Most nodes a weight may be computed by and still count as constant (a chain from initializers)."""


class Constants:
    """Values of the tensors that depend on initializers and constants only, computed on demand."""

    def __init__(self, view: ModelView) -> None:
        self.view = view
        self.inits = {t.name: t for t in view.proto.graph.initializer}
        self.protos = {n.name: n for n in view.proto.graph.node}
        """The model's nodes by name (finding and cutting read their inputs and attributes)."""
        self.cache: dict[str, np.ndarray | None] = {}

    def is_constant(self, name: str) -> bool:
        return self._ancestors(name) is not None

    def value(self, name: str) -> np.ndarray | None:
        if name in self.cache:
            return self.cache[name]
        result: np.ndarray | None = None
        if name in self.inits:
            base = str(self.view.base_dir) if self.view.base_dir is not None else ""
            result = numpy_helper.to_array(self.inits[name], base)
        else:
            chain = self._ancestors(name)
            if chain is not None:
                result = self._evaluate(name, chain)
        self.cache[name] = result
        return result

    def weight(self, name: str) -> np.ndarray:
        """The value of ``name``, known to be constant (the node was found cuttable on it)."""
        value = self.value(name)
        assert value is not None
        return value

    def _ancestors(self, name: str) -> list[NodeInfo] | None:
        """The nodes that compute ``name`` from initializers alone, in order; None if it needs more."""
        if name in self.inits:
            return []
        found: dict[int, NodeInfo] = {}
        todo = [name]
        while todo:
            t = todo.pop()
            if t in self.inits or not t:
                continue
            pos = self.view.producer.get(t)
            if pos is None:
                return None  # a model input
            node = self.view.nodes[pos]
            if pos in found:
                continue
            if node.has_subgraph or node.domain not in ("", "ai.onnx") or len(found) >= MAX_CONSTANT_NODES:
                return None
            found[pos] = node
            todo.extend(node.reads)
        return [found[p] for p in sorted(found)]

    def _evaluate(self, name: str, chain: list[NodeInfo]) -> np.ndarray | None:
        needed = {t for n in chain for t in n.reads if t in self.inits}
        graph = helper.make_graph(
            [inlined(self.protos[n.name], self.view.base_dir) for n in chain],
            "constant",
            [],
            [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)],
            [numpy_helper.from_array(self.value(t), t) for t in sorted(needed)],  # type: ignore[arg-type]
        )
        model = helper.make_model(graph, opset_imports=list(self.view.proto.opset_import))
        model.ir_version = max(self.view.proto.ir_version, 4)
        try:
            (out,) = ReferenceEvaluator(model).run(None, {})
        except Exception:  # noqa: BLE001 - an op the reference cannot run: the weight is not usable
            return None
        return np.asarray(out)


class SplitKind(StrEnum):
    """How a node is cut: by output columns, by the reduction (with a sum), or by output channels."""

    COLUMNS = "columns"
    REDUCTION = "reduction"
    CHANNELS = "channels"


UNARY_OPS = frozenset(
    {"Relu", "Sigmoid", "Tanh", "Gelu", "Erf", "Softplus", "Softsign", "LeakyRelu", "Elu", "Selu",
     "HardSigmoid", "HardSwish", "Mish", "Neg", "Abs", "Exp", "Sqrt", "Identity"}
)  # fmt: skip
"""Elementwise nodes of one input that can run on any slice of their input."""
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div"})


@dataclass(frozen=True)
class Splittable:
    """A node that may be cut, with the nodes carried along (``chain``: the node first) and the kinds
    of cut it offers; ``width`` is the size of the split axis (columns, channels) and ``depth`` the
    reduction's length (0 when no reduction split is offered)."""

    node: str
    chain: tuple[str, ...]
    kinds: tuple[SplitKind, ...]
    width: int
    depth: int
    output: str
    """The tensor the chain ends with, which the join writes."""

    def extent(self, kind: SplitKind) -> int:
        """The length a cut by ``kind`` shares out among the parts: the reduction's, else the width."""
        return self.depth if kind == SplitKind.REDUCTION else self.width


def part_sizes(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` sizes as equal as possible, the larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass(frozen=True)
class _Head:
    """What a node that can be cut offers: its kinds of cut, the split axis's size (``width``), the
    reduction's length (``depth``, 0 without a reduction cut) and the split axis counted from the end."""

    kinds: tuple[SplitKind, ...]
    width: int
    depth: int
    axis: int


def find_splittable(view: ModelView) -> dict[str, Splittable]:
    """Every node of ``view`` that can be cut, by name."""
    consts = Constants(view)
    compute = view.compute_nodes
    found: dict[str, Splittable] = {}
    for i, info in enumerate(compute):
        head = _head(view, consts, info, consts.protos[info.name])
        if head is None:
            continue
        chain = [info]
        if head.kinds != (SplitKind.REDUCTION,):
            chain += _carried(view, consts, compute[i + 1 :], info.outputs[0], head)
        kinds = head.kinds
        if SplitKind.REDUCTION in kinds and len(chain) > 1:
            kinds = tuple(k for k in kinds if k != SplitKind.REDUCTION) or kinds
        names = tuple(n.name for n in chain)
        found[info.name] = Splittable(info.name, names, kinds, head.width, head.depth, chain[-1].outputs[0])
    return found


def _carried(
    view: ModelView, consts: Constants, after: tuple[NodeInfo, ...], out: str, head: _Head
) -> list[NodeInfo]:
    """The nodes ``after`` the cut node, in order, that work slice by slice on the running output."""
    carried: list[NodeInfo] = []
    for nxt in after:
        if not _carries(view, consts, consts.protos[nxt.name], nxt, out, head):
            break
        carried.append(nxt)
        out = nxt.outputs[0]
    return carried


# --------------------------------------------------------------------------------------------------
# the node that is cut


def _head(view: ModelView, consts: Constants, info: NodeInfo, proto: onnx.NodeProto) -> _Head | None:
    """What a node offers if it can be cut (an op of :data:`_HEADS` with a constant weight), else None."""
    if info.domain not in ("", "ai.onnx") or len(info.outputs) != 1 or info.has_subgraph:
        return None
    offers = _HEADS.get(info.op_type)
    ins = list(proto.input)
    if offers is None or len(ins) < 2 or not consts.is_constant(ins[1]):
        return None
    return offers(view, consts, info, proto)


def _matmul(view: ModelView, consts: Constants, info: NodeInfo, proto: onnx.NodeProto) -> _Head | None:
    """``MatMul(A, W)``, ``W`` constant 2-D: by columns, and by the reduction when it has 2 or more rows."""
    ins = list(proto.input)
    shape = view.tensor(ins[1]).shape
    rank_a = tensor_rank(view, ins[0])
    if len(ins) != 2 or not _fixed_2d(shape) or not rank_a:
        return None
    assert shape is not None
    depth, width = int(shape[0]), int(shape[1])  # type: ignore[arg-type]
    kinds = (SplitKind.COLUMNS, SplitKind.REDUCTION) if depth >= 2 else (SplitKind.COLUMNS,)
    return _Head(kinds, width, depth, 0) if width >= 2 else None


def _gemm(view: ModelView, consts: Constants, info: NodeInfo, proto: onnx.NodeProto) -> _Head | None:
    """``Gemm(A, B, C)``, ``B`` (and ``C``) constant: by the output columns (``B``'s rows when ``transB``)."""
    ins = list(proto.input)
    shape = view.tensor(ins[1]).shape
    if not _fixed_2d(shape) or not _bias_constant(consts, ins):
        return None
    assert shape is not None
    width = int(shape[0] if view.int_attributes(info).get("transB", 0) else shape[1])  # type: ignore[arg-type]
    return _Head((SplitKind.COLUMNS,), width, 0, 0) if width >= 2 else None


def _conv(view: ModelView, consts: Constants, info: NodeInfo, proto: onnx.NodeProto) -> _Head | None:
    """``Conv`` with ``group = 1`` and constant weights (and bias): by output channels (axis 1)."""
    ins = list(proto.input)
    shape = view.tensor(ins[1]).shape
    if view.int_attributes(info).get("group", 1) != 1 or shape is None or not isinstance(shape[0], int):
        return None
    if not _bias_constant(consts, ins):
        return None
    rank = tensor_rank(view, info.outputs[0]) or (len(shape) if shape else 0)
    width = int(shape[0])
    return _Head((SplitKind.CHANNELS,), width, 0, rank - 2) if width >= 2 and rank >= 3 else None


_HEADS: dict[str, Callable[[ModelView, Constants, NodeInfo, onnx.NodeProto], _Head | None]] = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Conv": _conv,
}
"""The ops that can be cut, each with what it offers (its weight, input 1, is known to be constant)."""


def _fixed_2d(shape: tuple[int | str | None, ...] | None) -> bool:
    return shape is not None and len(shape) == 2 and all(isinstance(d, int) for d in shape)


def _bias_constant(consts: Constants, ins: list[str]) -> bool:
    """Whether the optional third input (a bias) is absent or constant: its slices go with the parts."""
    return not (len(ins) > 2 and ins[2] and not consts.is_constant(ins[2]))


# --------------------------------------------------------------------------------------------------
# the nodes carried along


def _carries(
    view: ModelView, consts: Constants, proto: onnx.NodeProto, info: NodeInfo, src: str, head: _Head
) -> bool:
    """Whether ``info`` (the next node in the order) works slice by slice on ``src`` along the head's
    split axis (counted from the end) and may be carried into every part."""
    if not _single_reader(view, src) or len(info.outputs) != 1 or info.domain not in ("", "ai.onnx"):
        return False
    ins = list(proto.input)
    if info.op_type in UNARY_OPS:
        return ins == [src]
    if info.op_type in BINARY_OPS and len(ins) == 2 and src in ins and ins[0] != ins[1]:
        other = ins[1] if ins[0] == src else ins[0]
        rank = tensor_rank(view, src)
        value = consts.value(other) if consts.is_constant(other) else None
        if value is None or rank is None or value.ndim > rank:
            return False
        at = value.ndim - 1 - head.axis  # the split axis in the constant (right-aligned broadcasting)
        return at < 0 or value.shape[at] in (1, head.width)
    if info.op_type == "BatchNormalization" and head.axis >= 1 and ins[0] == src and len(proto.output) == 1:
        rank = tensor_rank(view, src)
        return rank is not None and rank - 1 - head.axis == 1 and all(consts.is_constant(t) for t in ins[1:5])
    return False


def _single_reader(view: ModelView, tensor: str) -> bool:
    return len(view.consumers.get(tensor, ())) == 1 and tensor not in view.outputs


def tensor_rank(view: ModelView, tensor: str) -> int | None:
    """How many dims ``tensor`` has, None when its shape is not known."""
    shape = view.tensor(tensor).shape
    return None if shape is None else len(shape)
