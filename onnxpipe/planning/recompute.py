"""Make a stage recompute the values of shapes or weights alone that it would otherwise receive: shape
values, shape-derived values and constant-only values (:mod:`onnxpipe.ir.shapevalues`).

Why: other runtimes than onnxruntime cannot take such tensors as stage inputs (see
:mod:`onnxpipe.ir.shapevalues`), and they are cheap to make again: shape arithmetic is a handful of
integer ops on a few elements, a value made of shapes (a causal mask, an index grid) a few elementwise
ops the size of the tensor it spares sending, a constant-only value at most a copy of the weights it is
made from.  So a stage receives none: it holds copies of the nodes that make them (its
:attr:`~onnxpipe.planning.types.StageSpec.recomputed_nodes`), reading what it has anyway.

What a copy may read, walking back from the tensor: initializers and constants (the stage copies them),
model inputs (the caller feeds them to any stage), and the data tensors the stage receives anyway.  A
``Shape`` of a data tensor the stage does not receive is made of its dims: a number, or the same symbol
on an axis of a tensor the stage has (ONNX's inference propagates a symbol only where the sizes are
equal; where it left dims unknown, onnxruntime's symbolic inference is asked once per model, see
:attr:`ValueKinds.settled_shapes`).  Where a dim cannot be found so, the stage makes that tensor too if
shape arithmetic makes it (a detector's anchor grid); where not, and when the copies would carry more
than :data:`MAX_COPIED_BYTES` of weights or :data:`MAX_NODES` nodes, the value still
crosses, and the plan's notes name it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import onnx

from onnxpipe.core.dims import Dim
from onnxpipe.ir.external import tensor_values
from onnxpipe.ir.model import ModelView, NodeInfo, TensorInfo
from onnxpipe.ir.shapevalues import SHAPE_ARITHMETIC, ValueKinds
from onnxpipe.planning.types import ShapeParts

MAX_COPIED_BYTES = 1 << 20
"""Weights a stage may copy to recompute one value (1 MiB): above that, the value crosses the cut."""
Shaped = TensorInfo | tuple[Dim, ...]
"""A tensor's shape as ONNX inference gave it (in a :class:`TensorInfo`) or as a second opinion did."""
MAX_NODES = 256
"""Nodes a stage may copy to recompute one value."""


@dataclass(frozen=True)
class Recomputed:
    """What one stage recomputes: the nodes (by view position) and the tensors they spare it receiving."""

    positions: tuple[int, ...]
    tensors: tuple[str, ...]
    still_received: tuple[str, ...]
    """Shape or constant-only values the stage still receives (no cheap way to make them)."""
    shape_sources: tuple[tuple[str, ShapeParts], ...] = ()
    """``(shape node, dims)``: the copy of that ``Shape`` node, whose input the stage does not have, is
    made of its dims instead (see :attr:`onnxpipe.planning.types.StageSpec.shape_sources`)."""


def recompute(
    view: ModelView,
    kinds: ValueKinds,
    received: Sequence[str],
    weights: Collection[str],
) -> Recomputed:
    """Which of ``received`` the stage makes itself, and the nodes that make them.

    ``weights``: tensors any stage has without receiving them (initializers, cheap constant outputs).
    The other ``received`` tensors (data) stay received and may be read by the copies.
    """
    targets = [t for t in received if kinds.recomputable(t)]
    if not targets:
        return Recomputed((), (), ())
    have: set[str] = set(view.inputs) | {t for t in received if not kinds.recomputable(t)}
    chosen: set[int] = set()
    done: list[str] = []
    left: list[str] = []
    sources: dict[str, ShapeParts] = {}
    stage = _Stage.of(view, kinds, have, weights)
    for t in targets:
        found = stage.closure(t, chosen)
        if found is None:
            left.append(t)
            continue
        nodes, subs = found
        chosen.update(nodes)
        sources.update(subs)
        done.append(t)
    return Recomputed(tuple(sorted(chosen)), tuple(done), tuple(left), tuple(sorted(sources.items())))


def copy_closure(
    view: ModelView,
    kinds: ValueKinds,
    tensor: str,
    have: Collection[str],
    weights: Collection[str],
    chosen: Collection[int],
    extra: Collection[int],
) -> tuple[set[int], dict[str, ShapeParts]] | None:
    """The nodes (view positions, none of ``chosen``) that make ``tensor`` from ``have``, ``weights`` and
    what ``chosen`` makes, copying shape arithmetic, constant-only values and the nodes of ``extra``; the
    ``Shape`` copies made of dims (as :func:`recompute`).  None when that takes anything else, more than
    :data:`MAX_NODES` nodes or :data:`MAX_COPIED_BYTES` of weights.

    Why: a decoder's stage may make its rotary tables and masks from the model inputs as well
    (:mod:`onnxpipe.planning.decoder_recompute` says which nodes ``extra`` holds and when it is cheaper).
    """
    return _Stage.of(view, kinds, set(have), weights, extra).closure(tensor, set(chosen))


def shape_from_dims(view: ModelView, shape_node: NodeInfo, have: Collection[str]) -> ShapeParts | None:
    """The dims of ``shape_node``'s input as numbers and ``(tensor, axis)`` of tensors in ``have``
    (ONNX inference's shapes only); None when one is not found so."""
    if not shape_node.inputs:
        return None
    by_dim = _same_shape_index(view.tensors, have)
    return _parts(_shape(view.tensors, shape_node.inputs[0]), by_dim, _used_axes(view, shape_node))


def _same_shape_index(shapes: Mapping[str, Shaped], have: Collection[str]) -> dict[Dim, tuple[str, int]]:
    """For each symbolic dim of the tensors the stage has, one (tensor, axis) that carries it: one
    symbol in two places is one size, which shape inference proved when it propagated the symbol."""
    index: dict[Dim, tuple[str, int]] = {}
    for t in sorted(have):
        shape = _shape(shapes, t)
        for axis, d in enumerate(shape or ()):
            if isinstance(d, str):
                index.setdefault(d, (t, axis))
    return index


def _parts(
    shape: tuple[Dim, ...] | None, by_dim: Mapping[Dim, tuple[str, int]], used: frozenset[int] | None
) -> ShapeParts | None:
    """The dims of ``shape`` as numbers and (tensor, axis) the stage has; None if one is unknown.

    A dim nobody reads (``used``: the axes the ``Shape``'s readers pick, None for all) is written as
    0: only its position matters."""
    if shape is None:
        return None
    parts: list[int | tuple[str, int]] = []
    for axis, d in enumerate(shape):
        if isinstance(d, int) and d >= 0:
            parts.append(d)
        elif d is not None and d in by_dim:
            parts.append(by_dim[d])
        elif used is not None and axis not in used and axis - len(shape) not in used:
            parts.append(0)
        else:
            return None
    return tuple(parts)


def _used_axes(view: ModelView, shape_node: NodeInfo) -> frozenset[int] | None:
    """The axes of a ``Shape`` node's output that its readers pick, when every reader is a ``Gather``
    along axis 0 with constant indices and the node has no ``start``/``end``; else None (all)."""
    proto = view.proto.graph.node[shape_node.index]
    if proto.attribute or not shape_node.outputs:
        return None
    used: set[int] = set()
    for pos in view.consumers.get(shape_node.outputs[0], ()):
        reader = view.nodes[pos]
        rp = view.proto.graph.node[reader.index]
        if reader.op_type != "Gather" or len(reader.inputs) != 2 or reader.inputs[0] != shape_node.outputs[0]:
            return None
        if any(a.name == "axis" and a.i != 0 for a in rp.attribute):
            return None
        value = _constant_value(view, reader.inputs[1])
        if value is None:
            return None
        used.update(value)
    return frozenset(used)


def _constant_value(view: ModelView, tensor: str) -> list[int] | None:
    """The integers of a ``Constant`` node's or an initializer's tensor; None otherwise."""
    pos = view.producer.get(tensor)
    found: onnx.TensorProto | None = None
    if pos is not None:
        node = view.proto.graph.node[view.nodes[pos].index]
        if node.op_type == "Constant":
            found = next((a.t for a in node.attribute if a.name == "value"), None)
    else:
        found = next((t for t in view.proto.graph.initializer if t.name == tensor), None)
    if found is None or found.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return None
    return [int(v) for v in tensor_values(found, view.base_dir).reshape(-1)]


def _shape(shapes: Mapping[str, Shaped], tensor: str) -> tuple[Dim, ...] | None:
    found = shapes.get(tensor)
    if found is None:
        return None
    return found.shape if isinstance(found, TensorInfo) else found


@dataclass(frozen=True)
class _Stage:
    """What a stage may make a value from: the tensors it has (``have``) and has anyway (``weights``),
    the nodes of ``extra`` it may copy besides the cheap ones (:func:`copy_closure`), and the shapes its
    ``Shape`` copies read dims from (``by_dim``: a tensor and axis it has for each symbol of them)."""

    view: ModelView
    kinds: ValueKinds
    have: Collection[str]
    weights: Collection[str]
    extra: Collection[int]
    shapes: Mapping[str, Shaped]
    by_dim: Mapping[Dim, tuple[str, int]]

    @staticmethod
    def of(
        view: ModelView,
        kinds: ValueKinds,
        have: Collection[str],
        weights: Collection[str],
        extra: Collection[int] = frozenset(),
    ) -> _Stage:
        """With ONNX inference's shapes."""
        return _Stage(view, kinds, have, weights, extra, view.tensors, _same_shape_index(view.tensors, have))

    def closure(self, tensor: str, chosen: Collection[int]) -> tuple[set[int], dict[str, ShapeParts]] | None:
        """:func:`_closure` with ONNX inference's shapes, else with the settled ones (dearer: only when
        ONNX's shapes did not do)."""
        found = _closure(self, tensor, chosen)
        if found is None and self.settled is not None:
            found = _closure(self.settled, tensor, chosen)
        return found

    @cached_property
    def settled(self) -> _Stage | None:
        """This stage with the settled dims (made on the first value ONNX's shapes did not do).  They
        type what the model computes; its inputs keep their declared symbols, so that a stage that
        has only flattened tensors reads a batch or a sequence length off a model input (which every
        stage may read)."""
        if self.kinds.settled_shapes is None:
            return None
        dims: Mapping[str, Shaped] = {**self.view.tensors, **self.kinds.settled_shapes()}
        return dataclasses.replace(self, shapes=dims, by_dim=_same_shape_index(dims, self.have))


def _closure(
    stage: _Stage, tensor: str, chosen: Collection[int]
) -> tuple[set[int], dict[str, ShapeParts]] | None:
    """Positions of the nodes that make ``tensor`` from what the stage has, none of ``chosen`` (what it
    makes already), and the ``Shape`` copies that read a tensor of the same shape instead of their own
    input; None when too dear."""
    view, have = stage.view, stage.have
    nodes: set[int] = set()
    subs: dict[str, ShapeParts] = {}
    copied = 0
    stack = [tensor]
    seen: set[str] = set()
    while stack:
        t = stack.pop()
        if t in seen or t in have:
            continue
        seen.add(t)
        pos = view.producer.get(t)
        if pos is None:
            if t in stage.weights:
                copied += view.initializers.get(t, 0)
                continue
            return None  # a tensor nobody makes and the stage does not have
        if pos in nodes or pos in chosen:
            continue
        node: NodeInfo = view.nodes[pos]
        if node.is_constant:
            copied += sum(view.weights.get(o, 0) for o in node.outputs)
            continue  # the stage copies constant producers anyway
        if pos not in stage.extra and not _cheap(stage.kinds, node):
            return None
        nodes.add(pos)
        if len(nodes) > MAX_NODES or copied > MAX_COPIED_BYTES:
            return None
        if node.op_type == "Shape":
            if node.inputs and node.inputs[0] not in have:
                parts = _parts(_shape(stage.shapes, node.inputs[0]), stage.by_dim, _used_axes(view, node))
                if parts is not None:
                    subs[node.name] = parts
                    continue
                # no way to read it off: make the tensor too, when shape arithmetic makes it (an
                # anchor grid's Range)
            else:
                continue
        stack.extend(node.reads)
    return (nodes, subs) if copied <= MAX_COPIED_BYTES else None


def _cheap(kinds: ValueKinds, node: NodeInfo) -> bool:
    """A node a stage may copy: it makes only values of weights or shapes alone, or it is shape
    arithmetic."""
    if all(o in kinds.constant_only or o in kinds.shape_derived for o in node.outputs):
        return True
    return node.op_type in SHAPE_ARITHMETIC and not node.has_subgraph and node.domain in ("", "ai.onnx")
