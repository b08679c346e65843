"""The model as every step after loading reads it: a read-only, typed view of the graph.

Everything after loading (ordering, profiling, partitioning, export) reads this view instead of walking
protobuf.  The view keeps the :class:`onnx.ModelProto` only so that the exporter can copy nodes and
weights out of it.  :mod:`onnxpipe.ir.load` makes one, and settles once, so that nobody downstream has
to:

* every node has a stable unique name (unnamed and duplicate names are made unique, deterministically);
* the real model inputs exclude initializers that old (IR < 4) exporters also listed as graph inputs;
* a node with subgraphs (If, Loop, Scan) lists the outer-scope tensors its bodies read, to any depth, as
  ``outer_inputs``: they are real dependencies for ordering, cutting and export;
* dtypes and shapes come from ONNX shape inference, with symbolic dims kept as strings;
* nodes whose outputs are cheap constants (``Constant``, ``ConstantOfShape`` of constants, ``Identity``
  of an initializer, ``Shape`` of a fully static tensor, and chains of these) are marked ``is_constant``
  so that the partitioner never sends their values across a cut.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxpipe.core.dims import Dim


@dataclass(frozen=True)
class TensorInfo:
    """Type of one tensor as shape inference saw it; ``shape`` is ``None`` when even the rank is unknown."""

    name: str
    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def dtype(self) -> str:
        """numpy name of the element type (``"float32"``), or ``"undefined"``."""
        return dtype_name(self.elem_type)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def nbytes(self, dims: Mapping[str, int] | None = None) -> int:
        """Bytes of one instance, with symbolic dims taken from ``dims`` (else counted as 1)."""
        if self.shape is None:
            return 0
        given = dims or {}
        count = math.prod(
            d if isinstance(d, int) else given.get(d, 1) if isinstance(d, str) else 1 for d in self.shape
        )
        return count * itemsize(self.elem_type)


@dataclass(frozen=True)
class NodeInfo:
    """One node of the main graph.

    ``inputs`` are the node's own non-empty inputs; ``outer_inputs`` the main-graph tensors that its
    subgraph bodies read without listing them.  ``position`` is the node's place in
    :attr:`ModelView.nodes` (the chosen topological order), ``index`` its place in the file.
    """

    position: int
    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outer_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    param_bytes: int
    is_constant: bool
    has_subgraph: bool

    @property
    def reads(self) -> tuple[str, ...]:
        """Every tensor the node depends on: its inputs, then its bodies' outer reads."""
        return self.inputs + tuple(t for t in self.outer_inputs if t not in self.inputs)


@dataclass(frozen=True)
class Rewritten:
    """A model loading rewrote (a merged decoder unwrapped to its with-past branch,
    :func:`.joined.unwrap_merged_decoder`; a text model joined with its embedding model ahead of it,
    :mod:`.joined`), and the note saying what was done."""

    proto: onnx.ModelProto
    note: str


@dataclass(frozen=True)
class ModelView:
    """A read-only view of a loaded model: nodes in topological order, tensors, producers, consumers."""

    path: Path | None
    sha256: str
    nodes: tuple[NodeInfo, ...]
    tensors: Mapping[str, TensorInfo]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: Mapping[str, int]
    weights: Mapping[str, int]
    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[int, ...]]
    proto: onnx.ModelProto = field(repr=False, compare=False)
    base_dir: Path | None = None
    notes: tuple[str, ...] = ()
    """What loading accepted with a remark (onnxruntime's own ops the checker refuses,
    :func:`onnxpipe.ir.load.check_model`); plans repeat them."""
    rewritten: bool = False
    """Whether loading changed the graph (a merged decoder unwrapped,
    :func:`onnxpipe.ir.joined.unwrap_merged_decoder`): what runs the model as onnxpipe sees it is
    :attr:`proto` (its external weights in :attr:`base_dir`), not the file."""
    embedding: Path | None = None
    """The embedding model joined ahead of the file's graph (:mod:`onnxpipe.ir.joined`), recorded with the
    split's source."""

    @property
    def file_name(self) -> str:
        """The model file's name, as records keep it (``""`` for a model that was never a file)."""
        return self.path.name if self.path is not None else ""

    @property
    def label(self) -> str:
        """How messages name the model: its file name, or ``"model"`` for one built in memory."""
        return self.file_name or "model"

    def session_source(self) -> bytes | Path | None:
        """What onnxruntime opens to run the whole model as onnxpipe sees it: the file, or, for a graph
        loading changed (:attr:`rewritten`), its bytes, whose external weights lie in :attr:`base_dir`;
        ``None`` for a model never read from a file."""
        return self.proto.SerializeToString() if self.rewritten else self.path

    @property
    def node_by_name(self) -> Mapping[str, NodeInfo]:
        return {n.name: n for n in self.nodes}

    def int_attributes(self, node: NodeInfo) -> dict[str, int]:
        """``node``'s integer attributes (an axis, a head count), by name."""
        proto = self.proto.graph.node[node.index]
        return {a.name: int(a.i) for a in proto.attribute if a.type == onnx.AttributeProto.INT}

    def tensor(self, name: str) -> TensorInfo:
        info = self.tensors.get(name)
        return info if info is not None else TensorInfo(name, 0, None)

    @property
    def compute_nodes(self) -> tuple[NodeInfo, ...]:
        """Nodes the partitioner places: everything but the cheap constant producers."""
        return tuple(n for n in self.nodes if not n.is_constant)

    @property
    def param_bytes(self) -> int:
        """Bytes of every weight: initializers and the tensors cheap constant nodes make."""
        return sum(self.weights.values())


# --------------------------------------------------------------------------------------------------
# dtype helpers

PROTOBUF_LIMIT = 2_000_000_000
"""The largest model protobuf serialises (2 GiB less some headroom): past it a model is written with its
weights in an external file, and the checker is given a copy whose weights are inputs."""

FLOAT_TYPES = frozenset({1, 10, 11, 16})
"""float, float16, double, bfloat16: the element types of logits, caches and embeddings."""

INTEGER_TYPES = frozenset({6, 7})
"""int32, int64: the element types of token ids and of shape arithmetic."""


def np_dtype(elem_type: int) -> np.dtype[Any] | None:
    """numpy's dtype of an ONNX element type; None for ``undefined`` and types numpy lacks."""
    if elem_type == 0:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def dtype_name(elem_type: int) -> str:
    dtype = np_dtype(elem_type)
    if dtype is not None:
        return str(dtype)
    return "undefined" if elem_type == 0 else str(onnx.TensorProto.DataType.Name(elem_type)).lower()


def itemsize(elem_type: int) -> int:
    if elem_type == onnx.TensorProto.STRING:
        return 8
    dtype = np_dtype(elem_type)
    return 0 if elem_type == 0 else 1 if dtype is None else int(dtype.itemsize)


def default_opset(model: onnx.ModelProto, missing: int = 0) -> int:
    """``model``'s version of ONNX's default domain (``missing`` where it imports none)."""
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), missing)


def initializer_nbytes(tensor: onnx.TensorProto) -> int:
    """Size of an initializer from its dims and type: works for external data without reading it."""
    return math.prod(int(d) for d in tensor.dims) * itemsize(tensor.data_type)


# --------------------------------------------------------------------------------------------------
# types


def dims_text(shape: Sequence[Dim]) -> str:
    """``[batch, 3, ?]``: dims as messages show them, ``?`` for an unnamed unknown."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def value_dims(vi: onnx.ValueInfoProto) -> tuple[Dim, ...] | None:
    """A tensor value info's dims: an ``int`` where known, the symbol's name, or None for an unnamed
    unknown; None for a non-tensor or a tensor of unknown rank."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    return tuple(
        int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else d.dim_param or None
        for d in vi.type.tensor_type.shape.dim
    )


def tensor_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    """A value info's element type and dims; None for a sequence, a map or an optional."""
    if not vi.type.HasField("tensor_type"):
        return None
    return TensorInfo(vi.name, vi.type.tensor_type.elem_type, value_dims(vi))


def set_input_shapes(graph: onnx.GraphProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Declare ``graph``'s tensor inputs named in ``shapes`` at those sizes (in place)."""
    for vi in graph.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            dims = [onnx.TensorShapeProto.Dimension(dim_value=int(d)) for d in shapes[vi.name]]
            vi.type.tensor_type.shape.CopyFrom(onnx.TensorShapeProto(dim=dims))


def set_items(field: Any, items: Iterable[Any]) -> None:
    """Make a protobuf repeated field (a graph's nodes, inputs, initializers...) hold ``items``, which may
    be read from the field itself."""
    kept = list(items)
    del field[:]
    field.extend(kept)


# --------------------------------------------------------------------------------------------------
# bodies


def subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    """The bodies of ``node`` (an If's branches, a Loop's or a Scan's body)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def subgraph_outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names that ``node``'s bodies (and their nested bodies) read from scopes outside the node."""
    reads: set[str] = set()
    for g in subgraphs(node):
        reads |= graph_free_names(g)
    return reads


def graph_free_names(graph: onnx.GraphProto) -> set[str]:
    """Names ``graph`` (and its nested bodies) read from outside itself."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    free: set[str] = set()
    for n in graph.node:
        free |= {i for i in n.input if i and i not in defined}
        free |= subgraph_outer_reads(n) - defined
        defined.update(o for o in n.output if o)
    free |= {o.name for o in graph.output if o.name not in defined}
    return free
