"""From partition bounds over compute positions to named stages (what each holds, receives and emits),
and to the :class:`~onnxpipe.planning.types.Plan` every planner returns.

The stages are worked out last to first, since what a stage must emit depends on what the later ones
receive; provably equal tensors (:func:`onnxpipe.ir.shapevalues.value_classes`) cross a cut once and are
remade.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import RUNTIMES
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView, NodeInfo
from onnxpipe.ir.shapevalues import ValueKinds, value_classes, value_kinds
from onnxpipe.partition.interleave import InterleavedPartition
from onnxpipe.partition.result import Partition
from onnxpipe.planning.recompute import MAX_COPIED_BYTES, MAX_NODES, Recomputed, recompute
from onnxpipe.planning.records import SameValue
from onnxpipe.planning.sequences import Sequences
from onnxpipe.planning.types import Plan, StageSpec

StageCopies = Callable[[int, ValueKinds, Sequence[str], Recomputed], Recomputed]
"""``copies(stage, kinds, received, recomputed)``: what the stage recomputes given the data tensors it
would receive and what :func:`~onnxpipe.planning.recompute.recompute` chose, with more copies added when a
planner finds them cheaper than receiving (a decoder's rotary tables and masks,
:mod:`onnxpipe.planning.decoder_recompute`).  Called for each stage, last to first."""


@dataclass(frozen=True)
class StageOptions:
    """What a planner tells :func:`assign_stages` beyond the bounds and the stage costs (all optional)."""

    seq: Sequences | None = None
    """The partitioner's line-up the bounds count in: its compute order (default: the view's; a decoder's
    is lined up by layer, :mod:`onnxpipe.planning.decoder`), its cut profile (``cut_bytes[p]``: what
    crosses the link in front of a stage starting at ``p``, the stage's inputs plus what it forwards) and
    its value classes (else worked out from the view)."""
    devices: Sequence[str] | None = None
    """Each stage's device (default ``cpu``)."""
    share_equal_values: bool = True
    """Send each value once, remaking the tensors provably equal to it (see :func:`assign_stages`)."""
    copies: StageCopies | None = None
    """A planner's choice of more values to recompute (:data:`StageCopies`); the stage costs are left as
    given (the planner adds the copies' cost)."""


def plan_from(
    view: ModelView,
    profile: Profile,
    part: Partition | InterleavedPartition,
    stages: tuple[StageSpec, ...],
    sizes: Mapping[str, int],
    bandwidth_bytes_per_s: float,
    *,
    notes: tuple[str, ...] = (),
    **figures: Any,
) -> Plan:
    """The :class:`Plan` of a solved partition, made once: the fields every planner fills the same way,
    and ``figures``, the :class:`Plan` fields a planner sets its own way (its objective, timeline,
    devices, workers or decoder)."""
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=part.bottleneck,
        lower_bound_seconds=min(part.lower_bound, part.bottleneck),
        cost_source=profile.source,
        threads=profile.threads,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        input_shapes=profile.input_shapes,
        profiled_inputs=profile.inputs,
        tensor_bytes=sizes,
        notes=(*notes, *_stage_notes(stages)),
        **figures,
    )


def _stage_notes(stages: Sequence[StageSpec]) -> tuple[str, ...]:
    """What the stages recompute and remake instead of receiving, said once per plan; the values of
    shapes or weights alone that still cross a cut, by name."""
    notes: list[str] = []
    recomputed = sum(len(st.recomputed_tensors) for st in stages)
    if recomputed:
        copies = sum(len(st.recomputed_nodes) for st in stages)
        notes.append(
            f"{recomputed} value(s) of shapes or weights alone that a stage would receive are recomputed "
            f"there ({copies} node(s) copied), so that runtimes other than onnxruntime can take the stages"
        )
    crossing = [st for st in stages if st.crossing_shape_values]
    if crossing:
        named = "; ".join(
            f"stage {st.index} receives {', '.join(st.crossing_shape_values)}" for st in crossing
        )
        count = sum(len(st.crossing_shape_values) for st in crossing)
        refusing = " and ".join(k.name for k in RUNTIMES.values() if not k.sends_shape_values)
        why = (
            f"; {refusing} cannot hand out an integer it computed from shapes and fails the stage that "
            f"sends one: another stage count, or {opt('static', True)}, may avoid them"
            if refusing
            else ""
        )
        notes.append(
            f"{count} value(s) of shapes or weights alone still cross a cut: {named} (no copy of at most "
            f"{MAX_NODES} nodes and {MAX_COPIED_BYTES >> 20} MiB of weights makes them of what the stage "
            f"has, or the stage that makes them has nothing else to send){why}"
        )
    received = sum(1 for st in stages for a in st.aliases if a.same_as in st.inputs)
    if received:
        skipped = sum(len(st.skipped_nodes) for st in stages)
        notes.append(
            f"{received} tensor(s) a stage reads across a cut equal another it receives: each value "
            f"crosses once, and the stages remake the rest with Identity nodes ({skipped} node(s) left out "
            "of the files)"
        )
    return tuple(notes)


def assign_stages(
    view: ModelView,
    bounds: Sequence[int],
    sizes: Mapping[str, int],
    compute_seconds: Sequence[float],
    transfer_seconds: Sequence[float],
    options: StageOptions | None = None,
) -> tuple[StageSpec, ...]:
    """Turn partition bounds over compute positions into named stages with their inputs and outputs.

    With ``share_equal_values`` (:class:`StageOptions`) a stage that reads tensors of an earlier stage
    that are provably equal to others (:func:`onnxpipe.ir.shapevalues.value_classes`) receives, for each
    value, the first tensor the earlier stage makes of it, and remakes the ones it reads from that
    (:attr:`StageSpec.aliases`).  The earlier stage remakes its own repeats of a value it emits the same
    way, and its nodes that then compute nothing anybody reads are left out of its file
    (:attr:`StageSpec.skipped_nodes`).  The stages are worked out last to first, since what a stage must
    emit depends on what the later ones receive.

    A stage recomputes the shape values and constant-only values it would receive
    (:mod:`onnxpipe.planning.recompute`): copies of the nodes that make them go into its file
    (:attr:`StageSpec.recomputed_nodes`), and their producer stage no longer emits them for it.  A stage
    that would then emit nothing at all (its nodes made only such values) keeps sending them: a stage
    file without outputs cannot be loaded.
    """
    lineup = _Lineup.of(view, bounds, sizes, compute_seconds, transfer_seconds, options or StageOptions())
    keep_from: set[int] = set()
    while True:
        specs = _assign(lineup, frozenset(keep_from))
        empty = {st.index for st in specs if not st.outputs and st.index < len(specs) - 1} - keep_from
        if not empty:
            return specs
        keep_from |= empty


@dataclass(frozen=True)
class _Lineup:
    """What drawing the stages needs, worked out once for every try of :func:`assign_stages`: each
    stage's nodes, where each tensor is made and last read, and the equal values."""

    view: ModelView
    bounds: Sequence[int]
    sizes: Mapping[str, int]
    compute_seconds: Sequence[float]
    transfer_seconds: Sequence[float]
    options: StageOptions
    kinds: ValueKinds
    stage_nodes: tuple[Sequence[NodeInfo], ...]
    const_by_output: Mapping[str, NodeInfo]
    """Each output of a cheap constant producer, and its node (every stage copies those)."""
    produced_in: Mapping[str, int]
    """The stage whose compute nodes make each tensor."""
    last_reads: Mapping[str, int]
    """The last stage that reads each tensor (``k`` for a model output, read "after" the last stage)."""
    equal: _EqualValues

    @property
    def k(self) -> int:
        return len(self.stage_nodes)

    @staticmethod
    def of(
        view: ModelView,
        bounds: Sequence[int],
        sizes: Mapping[str, int],
        compute_seconds: Sequence[float],
        transfer_seconds: Sequence[float],
        options: StageOptions,
    ) -> _Lineup:
        seq = options.seq
        compute = seq.compute if seq is not None else view.compute_nodes
        k = len(bounds) - 1
        stage_nodes = tuple(compute[bounds[s] : bounds[s + 1]] for s in range(k))
        produced_in = {o: s for s, nodes in enumerate(stage_nodes) for n in nodes for o in n.outputs}
        # the stages count up: each tensor keeps the last that reads it
        last_reads = {t: s for s, nodes in enumerate(stage_nodes) for n in nodes for t in n.reads}
        for t in view.outputs:
            last_reads[t] = k  # read "after" the last stage
        if not options.share_equal_values:
            classes: Mapping[str, int] = {}
        else:
            classes = seq.classes if seq is not None else value_classes(view)
        return _Lineup(
            view,
            bounds,
            sizes,
            compute_seconds,
            transfer_seconds,
            options,
            value_kinds(view),
            stage_nodes,
            {o: n for n in view.nodes if n.is_constant for o in n.outputs},
            produced_in,
            last_reads,
            _EqualValues(classes, stage_nodes),
        )


def _assign(lineup: _Lineup, keep_from: frozenset[int]) -> tuple[StageSpec, ...]:
    """:func:`assign_stages`, where the values made by the stages of ``keep_from`` are received."""
    wanted: list[set[str]] = [set() for _ in range(lineup.k)]  # what later stages receive from each stage
    specs: list[StageSpec] = []
    for s in reversed(range(lineup.k)):
        spec = _stage(lineup, s, wanted[s], keep_from)
        for t in spec.inputs:
            if t in lineup.produced_in:
                wanted[lineup.produced_in[t]].add(t)
        specs.append(spec)
    return tuple(reversed(specs))


def _stage(lineup: _Lineup, s: int, wanted: set[str], keep_from: frozenset[int]) -> StageSpec:
    """Stage ``s``, once the later stages said what they receive from it (``wanted``): what it keeps of
    its nodes and emits, what it receives and recomputes, and its costs."""
    view = lineup.view
    kept = _keep(lineup, s, wanted)
    reads = dict.fromkeys(t for n in kept.nodes for t in n.reads)
    # model outputs that no compute node makes (constants, weights) come out of the last stage
    extra_outputs = _constant_model_outputs(lineup) if s == lineup.k - 1 else []
    got = _receive(lineup, s, list(reads), keep_from)
    consts = _constant_closure(view, list(reads) + got.copy_reads + extra_outputs, lineup.const_by_output)
    # a value received under the name of a tensor this stage makes again itself (its copies') would be
    # an input and a node's output at once: such a tensor is received under its own name
    made_here = {o for n in got.copies for o in n.outputs}
    source = {t: lineup.equal.received_as(t, s) for t in got.received}
    source = {t: t if sent in made_here else sent for t, sent in source.items()}
    aliases = tuple(SameValue(t, source[t]) for t in got.received if source[t] != t) + kept.inner
    inputs = tuple(dict.fromkeys(source.values()))
    outputs = kept.outputs + tuple(extra_outputs)
    sizes, options, copies = lineup.sizes, lineup.options, got.copies
    link_bytes = options.seq.cut_bytes if options.seq is not None else None
    return StageSpec(
        index=s,
        node_names=tuple(n.name for n in kept.all_nodes),
        constant_nodes=consts,
        inputs=inputs,
        outputs=outputs,
        compute_seconds=float(lineup.compute_seconds[s]),
        transfer_seconds=float(lineup.transfer_seconds[s]),
        bytes_in=sum(sizes.get(t, 0) for t in inputs),
        bytes_out=sum(sizes.get(t, 0) for t in outputs),
        param_bytes=sum(
            view.weights.get(t, 0) for t in dict.fromkeys(t for n in [*copies, *kept.nodes] for t in n.reads)
        ),
        peak_activation_bytes=_peak_activation(kept.nodes, inputs, outputs, sizes, aliases),
        device=options.devices[s] if options.devices is not None else "cpu",
        link_bytes_in=int(link_bytes[lineup.bounds[s]]) if link_bytes is not None and s > 0 else 0,
        aliases=aliases,
        skipped_nodes=tuple(n.name for n in kept.all_nodes if n.name in kept.skipped),
        recomputed_nodes=tuple(n.name for n in copies),
        recomputed_tensors=got.recomputed.tensors,
        shape_sources=got.recomputed.shape_sources,
        crossing_shape_values=(
            *got.recomputed.still_received,
            *(t for t in got.received if t not in got.movable and lineup.kinds.recomputable(t)),
        ),
    )


@dataclass(frozen=True)
class _Kept:
    """What a stage keeps of its nodes (:func:`_keep`) and the outputs it emits."""

    all_nodes: Sequence[NodeInfo]
    nodes: tuple[NodeInfo, ...]
    """The nodes its file holds: ``all_nodes`` without ``skipped``."""
    outputs: tuple[str, ...]
    skipped: set[str]
    inner: tuple[SameValue, ...]
    """Repeats of a value it emits, remade from that output."""


def _keep(lineup: _Lineup, s: int, wanted: set[str]) -> _Kept:
    """What stage ``s`` emits (what the later stages receive from it, and model outputs), and the nodes
    it keeps to make it."""
    nodes = lineup.stage_nodes[s]
    sent_as = lineup.equal.first_in_stage
    model_outputs = set(lineup.view.outputs)
    outputs = tuple(o for n in nodes for o in n.outputs if o in wanted or o in model_outputs)
    # a value the stage emits is made once: its repeats here are remade from it, since onnxruntime
    # does not always merge a repeat into a node whose output is a graph output
    emitted = set(outputs)
    remade = {
        o: sent_as[o]
        for n in nodes
        if len(n.outputs) == 1
        for o in n.outputs
        if sent_as.get(o, o) != o and sent_as[o] in emitted
    }
    naive = {o for n in nodes for o in n.outputs if lineup.last_reads.get(o, -1) > s}
    skipped, used = _unneeded(nodes, naive, emitted, remade)
    if len(skipped) == len(nodes):
        # nothing of this stage is wanted now that a later stage takes an equal value from another
        # stage; left out, its nodes would leave a graph without inputs, nodes or outputs, which
        # onnxruntime cannot load: they stay, computing what nobody reads (a dead node of the source
        # stays so too).  Nothing is then emitted, so nothing was remade either.
        skipped, used = set(), set()
    kept = tuple(n for n in nodes if n.name not in skipped)
    inner = tuple(SameValue(t, remade[t]) for n in nodes for t in n.outputs if t in used)
    return _Kept(nodes, kept, outputs, skipped, inner)


def _constant_model_outputs(lineup: _Lineup) -> list[str]:
    """Model outputs that no compute node makes (constants, weights): the last stage emits them."""
    view = lineup.view
    return [
        t
        for t in view.outputs
        if t not in lineup.produced_in
        and t not in view.inputs
        and (t in lineup.const_by_output or t in view.initializers)
    ]


@dataclass(frozen=True)
class _Received:
    """What a stage receives (:func:`_receive`) and what it recomputes instead."""

    received: list[str]
    movable: list[str]
    """What it would receive from stages not in ``keep_from``: what it may recompute."""
    recomputed: Recomputed
    copies: list[NodeInfo]
    """The nodes it copies to recompute them."""
    copy_reads: list[str]
    """What those copies read, the tensors that ``Shape`` copies take their dims from included."""


def _receive(lineup: _Lineup, s: int, reads: list[str], keep_from: frozenset[int]) -> _Received:
    """What stage ``s`` receives of what it ``reads``: neither weights nor constants (it copies them) nor
    what it makes, nor the shape and constant-only values it recomputes, but the model inputs its
    copies read."""
    view, produced_in = lineup.view, lineup.produced_in
    received = [
        t
        for t in reads
        if t not in view.initializers and t not in lineup.const_by_output and produced_in.get(t, -1) != s
    ]
    movable = [t for t in received if produced_in.get(t, -1) not in keep_from]
    rec = recompute(view, lineup.kinds, movable, view.weights)
    more_copies = lineup.options.copies
    if more_copies is not None:
        rec = more_copies(s, lineup.kinds, movable, rec)
    copies = [view.nodes[p] for p in rec.positions]
    spared = set(rec.tensors)
    copy_reads = [t for n in copies for t in n.reads]
    received = [t for t in received if t not in spared]
    copy_reads += [d[0] for _, dims in rec.shape_sources for d in dims if isinstance(d, tuple)]
    received += [t for t in dict.fromkeys(copy_reads) if t in view.inputs and t not in received]
    return _Received(received, movable, rec, copies, copy_reads)


class _EqualValues:
    """Which tensor of each value a stage makes first, and which one a later stage receives.

    A stage receives each value once, as the first tensor of it made by the latest earlier stage that
    makes one.  Then a value crosses a cut only while some tensor of it does (read after the cut, made
    before it), whatever the other cuts: the bytes :func:`onnxpipe.ir.graph.cut_profile` counts with value
    classes, which are the bytes the partitioner weighs (or fewer, when a later stage makes the value
    anew).  The tensor received is made before the stage starts, and no stage in between makes the
    value, so it passes the cuts in between, where some tensor of the value crosses too.
    """

    def __init__(self, classes: Mapping[str, int], stage_nodes: Sequence[Sequence[NodeInfo]]) -> None:
        self.classes = classes
        first: dict[tuple[int, int], str] = {}
        self.first_in_stage: dict[str, str] = {}
        """For each tensor a compute node makes, the first tensor of its stage with the same value."""
        self._makers: dict[int, list[tuple[int, str]]] = {}  # class -> (stage, its first tensor), ascending
        for s, nodes in enumerate(stage_nodes):
            for n in nodes:
                for o in n.outputs:
                    c = classes.get(o)
                    if c is None:
                        continue
                    if (c, s) not in first:
                        first[c, s] = o
                        self._makers.setdefault(c, []).append((s, o))
                    self.first_in_stage[o] = first[c, s]

    def received_as(self, tensor: str, stage: int) -> str:
        """The tensor ``stage`` receives for ``tensor``, which an earlier stage made or the caller feeds."""
        makers = self._makers.get(self.classes.get(tensor, -1), [])
        i = bisect.bisect_left(makers, (stage, "")) - 1
        return makers[i][1] if i >= 0 else tensor


def _unneeded(
    nodes: Sequence[NodeInfo], before: set[str], after: set[str], remade: Mapping[str, str]
) -> tuple[set[str], set[str]]:
    """``(skipped, used)``: the names of the nodes that computed part of ``before`` (what the stage
    emitted) and nothing of ``after`` (what it emits now), where a tensor of ``remade`` is made from its
    equal instead of by its node; and the tensors of ``remade`` that are still read or emitted, which
    the stage file makes with ``Identity`` nodes.  A node nobody read before (dead in the source)
    stays, with all it reads."""
    need_before, need_after = set(before), set(after)
    unneeded: set[str] = set()
    used: set[str] = set()
    for n in reversed(nodes):
        live_before = any(o in need_before for o in n.outputs)
        if live_before:
            need_before.update(n.reads)
        if not live_before:
            live_after = True
        else:
            for o in n.outputs:
                if o in need_after and o in remade:
                    used.add(o)
                    need_after.add(remade[o])  # made by an earlier node of the stage
            live_after = any(o in need_after and o not in remade for o in n.outputs)
        if live_after:
            need_after.update(n.reads)
        else:
            unneeded.add(n.name)
    return unneeded, used


def _constant_closure(
    view: ModelView, wanted: Sequence[str], const_by_output: Mapping[str, NodeInfo]
) -> tuple[str, ...]:
    """Names of the constant nodes needed to make ``wanted``, in the view's order."""
    need: set[int] = set()
    stack = [t for t in wanted if t in const_by_output]
    while stack:
        node = const_by_output[stack.pop()]
        if node.position in need:
            continue
        need.add(node.position)
        if node.op_type == "Shape":
            continue  # exported as a Constant of the static shape; its input is not needed
        stack.extend(t for t in node.reads if t in const_by_output)
    return tuple(view.nodes[p].name for p in sorted(need))


def _peak_activation(
    nodes: Sequence[NodeInfo],
    inputs: Sequence[str],
    outputs: Sequence[str],
    sizes: Mapping[str, int],
    aliases: Sequence[SameValue],
) -> int:
    """Largest sum of live activation bytes while the stage runs its nodes in order (a remade input is
    its source's bytes: it lives as long as its last reader)."""
    same = {a.name: a.same_as for a in aliases}
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.reads:
            last[same.get(t, t)] = i
    keep = set(outputs)
    live = {t: sizes.get(t, 0) for t in inputs}
    current = sum(live.values())
    peak = current
    for i, n in enumerate(nodes):
        for o in n.outputs:
            if o not in live:
                live[o] = sizes.get(o, 0)
                current += live[o]
        peak = max(peak, current)
        for t in list(live):
            if t not in keep and last.get(t, -1) <= i:
                current -= live.pop(t)
    return peak
