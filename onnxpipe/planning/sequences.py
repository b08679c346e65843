"""The plain numbers the partitioner sees: one cost, one cut size and one allowed cut per compute node.

This is the bridge between the graph (names) and :mod:`onnxpipe.partition` (plain numbers): the compute
nodes in the view's order, their costs from the profile, the bytes a stage starting at each position
receives (weights never cross; a value several equal tensors hold crosses once), and the positions a
cut may not take: inside a fused group, or right after a node whose values the later stages make again
themselves (:func:`cuttable_positions`).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from onnxpipe.cost.profile import Profile
from onnxpipe.ir.graph import cut_profile
from onnxpipe.ir.model import ModelView, NodeInfo
from onnxpipe.ir.shapes import symbol_sizes
from onnxpipe.ir.shapevalues import ValueKinds, value_classes, value_kinds


def tensor_sizes(view: ModelView, profile: Profile) -> dict[str, int]:
    """Bytes of each tensor at the profiled shapes; shape inference fills what the profile lacks."""
    dims = symbol_sizes(view, profile.input_shapes)
    sizes = {name: t.nbytes(dims) for name, t in view.tensors.items()}
    sizes.update(profile.tensor_bytes)
    return sizes


def allowed_cuts_from_regions(compute: Sequence[NodeInfo], regions: Sequence[Sequence[str]]) -> list[bool]:
    """Cut positions that do not split a fused group (cutting one breaks the fusion at deployment).

    Only compact groups are protected: a group whose nodes lie far apart in the order (a span of more
    than twice its size plus four) is usually a shape computation joined to its consumer, or two
    branches onnxruntime merged; keeping it whole would forbid every cut in between, which costs far
    more balance than the fusion is worth.
    """
    pos = {n.name: p for p, n in enumerate(compute)}
    m = len(compute)
    diff = [0] * (m + 2)
    for region in regions:
        ps = [pos[n] for n in region if n in pos]
        if len(ps) < 2:
            continue
        lo, hi = min(ps), max(ps)
        if hi - lo + 1 > 2 * len(ps) + 4:
            continue
        diff[lo + 1] += 1
        diff[hi + 1] -= 1
    return [run == 0 or p in (0, m) for p, run in enumerate(itertools.accumulate(diff[: m + 1]))]


@dataclass(frozen=True)
class Sequences:
    """The plain numbers the partitioner sees, one entry per compute node in the view's order.

    ``cut_bytes[p]`` is what a stage starting at ``p`` receives; ``allowed[p]`` says whether a stage may
    start there (not inside a fused group, and where ``cuttable`` allows); ``cuttable[p]`` whether a
    stage may start there at all (:func:`cuttable_positions`; None: anywhere), which a planner keeps when
    it cuts through fused groups; ``sizes`` are every tensor's bytes at the profiled shapes; ``classes``
    number the provably equal tensors (:func:`onnxpipe.ir.shapevalues.value_classes`), which
    :func:`assign_stages` is given again so that it sends what ``cut_bytes`` counts.
    """

    compute: tuple[NodeInfo, ...]
    costs: tuple[float, ...]
    cut_bytes: tuple[int, ...]
    allowed: tuple[bool, ...]
    sizes: Mapping[str, int] = field(repr=False)
    classes: Mapping[str, int] = field(repr=False, default_factory=dict)
    cuttable: tuple[bool, ...] | None = None


def sequences(
    view: ModelView,
    profile: Profile,
    compute: Sequence[NodeInfo] | None = None,
    free: Collection[str] | None = None,
) -> Sequences:
    """Line up costs, cut bytes and allowed cuts for :mod:`onnxpipe.partition` (weights, and ``free``
    tensors, never cross; a value that several equal tensors hold crosses a cut once, as the exported
    stages send it); ``compute``: the compute nodes in another topological order than the view's."""
    compute = tuple(view.compute_nodes if compute is None else compute)
    sizes = tensor_sizes(view, profile)
    classes = value_classes(view)
    reads, outputs = [n.reads for n in compute], [n.outputs for n in compute]
    cuts = cut_profile(reads, outputs, sizes, view.weights if free is None else free, classes)
    cuttable = cuttable_positions(view, compute, value_kinds(view))
    fused = allowed_cuts_from_regions(compute, profile.regions)
    return Sequences(
        compute=compute,
        costs=tuple(max(0.0, float(profile.node_seconds.get(n.name, 0.0))) for n in compute),
        cut_bytes=cuts,
        allowed=tuple(a and c for a, c in zip(fused, cuttable, strict=True)),
        sizes=sizes,
        classes=classes,
        cuttable=cuttable,
    )


def cuttable_positions(view: ModelView, compute: Sequence[NodeInfo], kinds: ValueKinds) -> tuple[bool, ...]:
    """Where a stage may start: anywhere but right after a node whose values no later stage receives,
    since each remakes them itself (values of shapes or weights alone, :mod:`onnxpipe.ir.shapevalues`)
    or only takes their shape, which it reads off a tensor of its own.

    Why: every stage then ends with a node that makes data, so that no stage holds nothing but such
    nodes.  That stage would have nothing to send (its readers make its values again), a stage file
    without outputs cannot be loaded, and it was kept sending them: a lone ``Shape(attention_mask)``
    as a stage of its own, whose result crossed to a stage that receives ``attention_mask`` anyway.
    Moving such a node to the stage after it costs nothing: the stage that reads its values makes them.
    """
    outputs = set(view.outputs)

    def remade(tensor: str) -> bool:
        if tensor in outputs:
            return False
        if kinds.recomputable(tensor):
            return True
        readers = view.consumers.get(tensor, ())
        return bool(readers) and all(view.nodes[r].op_type in ("Shape", "Size") for r in readers)

    m = len(compute)
    return tuple(p in (0, m) or not all(remade(t) for t in compute[p - 1].outputs) for p in range(m + 1))


def first_reader_param_bytes(view: ModelView, compute: Sequence[NodeInfo] | None = None) -> list[float]:
    """Parameter bytes per compute node, each weight counted once, at the first node that reads it.

    Summing this over a stage counts a weight shared with an earlier stage only there: the partitioner's
    memory check is then slightly optimistic for shared weights, which the final check below corrects.
    ``compute``: the compute nodes in the partitioner's order (default: the view's).
    """
    seen: set[str] = set()
    out: list[float] = []
    for n in view.compute_nodes if compute is None else compute:
        total = 0
        for t in n.reads:
            if t in view.weights and t not in seen:
                seen.add(t)
                total += view.weights[t]
        out.append(float(total))
    return out
