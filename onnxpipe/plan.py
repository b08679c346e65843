"""From a model view and per-node costs to a :class:`Plan`: which nodes each stage holds and what flows.

This module is the bridge between the graph (names) and the partitioner (plain numbers): it lines up
the compute nodes in the view's order, builds the cost and cut-byte sequences, asks
:mod:`onnxpipe.partition` for the optimal bounds, and turns the bounds back into named stages.

Cheap constant producers (see :mod:`onnxpipe.model`) are left out of the sequence; each stage that
reads one gets its own copy (``constant_nodes``), so their values never cross a cut.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

from onnxpipe.core.errors import PartitionError
from onnxpipe.ir.graph import cut_profile
from onnxpipe.ir.model import ModelView, NodeInfo
from onnxpipe.ir.samevalue import value_classes

if TYPE_CHECKING:
    from onnxpipe.cluster.costs import DeviceCosts
    from onnxpipe.cluster.model import Cluster
    from onnxpipe.cost.profile import Profile
    from onnxpipe.partition import Partition
    from onnxpipe.schedule.timeline import Timeline


@dataclass(frozen=True)
class Alias:
    """A tensor a stage reads, received as another tensor of provably the same value."""

    name: str
    same_as: str


@dataclass(frozen=True)
class StageSpec:
    """One stage: its nodes, the tensors it receives and emits, and its estimated costs."""

    index: int
    node_names: tuple[str, ...]
    constant_nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    compute_seconds: float
    transfer_seconds: float
    bytes_in: int
    bytes_out: int
    param_bytes: int
    peak_activation_bytes: int
    device: str = "cpu"
    link_bytes_in: int = 0
    worker: int | None = None
    """The worker that runs the stage in an interleaved split (:func:`make_interleaved_plan`), else None."""
    aliases: tuple[Alias, ...] = ()
    """Tensors the stage remakes from an equal one with an ``Identity`` node: those it reads and
    receives as an equal tensor of ``inputs`` (an earlier stage sends each value once), and repeats of
    a value it emits, remade from that output."""
    skipped_nodes: tuple[str, ...] = ()
    """Nodes of ``node_names`` left out of the stage file: what they computed is remade from an equal
    tensor (see ``aliases``) or no longer needed."""

    @property
    def file_node_names(self) -> tuple[str, ...]:
        """The source nodes the stage file holds: ``node_names`` without ``skipped_nodes``."""
        skipped = set(self.skipped_nodes)
        return tuple(n for n in self.node_names if n not in skipped)

    @property
    def cost_seconds(self) -> float:
        return self.compute_seconds + self.transfer_seconds


@dataclass(frozen=True)
class Plan:
    """A K-stage partition of one model, with the numbers that justify it."""

    model_sha256: str
    stages: tuple[StageSpec, ...]
    bottleneck_seconds: float
    lower_bound_seconds: float
    cost_source: str
    threads: int
    bandwidth_bytes_per_s: float
    input_shapes: Mapping[str, tuple[int, ...]]
    tensor_bytes: Mapping[str, int] = field(repr=False)
    objective: str = "minimize the largest stage time (compute + transfer in)"
    notes: tuple[str, ...] = ()
    timeline: Timeline | None = None
    cluster: Cluster | None = None
    device_costs: tuple[DeviceCosts, ...] = ()
    microbatch_size: int = 1
    workers: int | None = None
    """How many workers an interleaved split deals its stages out to; None: a worker per stage."""
    time_slack: float = 0.0
    """The slowdown an interleaved split was allowed to trade for balanced weights."""
    reference_seconds: float | None = None
    """The whole model's time per run with the plan's threads at the profiled shapes, measured when the
    stage estimates were (see :attr:`onnxpipe.manifest.PlanSummary.reference_seconds`)."""

    @property
    def k(self) -> int:
        return len(self.stages)

    @property
    def ratio_to_lower_bound(self) -> float:
        if self.lower_bound_seconds <= 0:
            return 1.0
        return self.bottleneck_seconds / self.lower_bound_seconds

    def stage_of(self) -> dict[str, int]:
        """Node name -> stage index, for every compute node."""
        return {n: s.index for s in self.stages for n in s.node_names}


def tensor_sizes(view: ModelView, profile: Profile) -> dict[str, int]:
    """Bytes of each tensor at the profiled shapes; shape inference fills what the profile lacks."""
    dims: dict[str, int] = {}
    for name, shape in profile.input_shapes.items():
        info = view.tensors.get(name)
        if info is None or info.shape is None:
            continue
        for d, v in zip(info.shape, shape, strict=False):
            if isinstance(d, str):
                dims[d] = int(v)
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
    allowed, run = [], 0
    for p in range(m + 1):
        run += diff[p]
        allowed.append(run == 0 or p in (0, m))
    return allowed


@dataclass(frozen=True)
class Sequences:
    """The plain numbers the partitioner sees, one entry per compute node in the view's order.

    ``cut_bytes[p]`` is what a stage starting at ``p`` receives; ``allowed[p]`` says whether a stage may
    start there (not inside a fused group); ``sizes`` are every tensor's bytes at the profiled shapes;
    ``classes`` number the provably equal tensors (:func:`onnxpipe.samevalue.value_classes`), which
    :func:`assign_stages` is given again so that it sends what ``cut_bytes`` counts.
    """

    compute: tuple[NodeInfo, ...]
    costs: tuple[float, ...]
    cut_bytes: tuple[int, ...]
    allowed: tuple[bool, ...]
    sizes: Mapping[str, int] = field(repr=False)
    classes: Mapping[str, int] = field(repr=False, default_factory=dict)


def sequences(view: ModelView, profile: Profile) -> Sequences:
    """Line up costs, cut bytes and allowed cuts for :mod:`onnxpipe.partition` (weights never cross; a
    value that several equal tensors hold crosses a cut once, as the exported stages send it)."""
    compute = view.compute_nodes
    sizes = tensor_sizes(view, profile)
    classes = value_classes(view)
    cuts = cut_profile([n.reads for n in compute], [n.outputs for n in compute], sizes, view.weights, classes)
    return Sequences(
        compute=compute,
        costs=tuple(max(0.0, float(profile.node_seconds.get(n.name, 0.0))) for n in compute),
        cut_bytes=cuts.bytes,
        allowed=tuple(allowed_cuts_from_regions(compute, profile.regions)),
        sizes=sizes,
        classes=classes,
    )


def _stages_of(
    view: ModelView,
    seq: Sequences,
    bounds: Sequence[int],
    compute_seconds: Sequence[float],
    transfer_seconds: Sequence[float],
) -> tuple[StageSpec, ...]:
    """:func:`assign_stages` for a partition of ``seq``, with its sizes, cut bytes and value classes."""
    return assign_stages(
        view,
        bounds,
        seq.sizes,
        compute_seconds,
        transfer_seconds,
        link_bytes=seq.cut_bytes,
        classes=seq.classes,
    )


class _Solution(Protocol):
    @property
    def bottleneck(self) -> float: ...

    @property
    def lower_bound(self) -> float:
        """A bound no partition beats, with or without the fused groups (it never looks at cuts)."""
        ...


_Solved = TypeVar("_Solved", bound=_Solution)

FUSED_GROUP_SLACK = 0.05
"""Fused groups are kept whole only while that makes the slowest stage at most 5% slower than the best
split that may cut through them.  Cutting a group costs the fusion of a few nodes at one boundary (a
Conv's fused activation or residual sum run apart, measured and corrected by ``--calibrate``), while a
group that holds much of the model leaves no balanced cut at all: when value matching failed on an AVX2
machine, all of ResNet-50's Convs formed one group and its 2-stage split ran at 0.98x one session."""


def keeping_fused_groups(
    solve: Callable[[Sequence[bool] | None], _Solved], allowed: Sequence[bool], notes: list[str]
) -> _Solved:
    """``solve(allowed)``, unless cutting through the fused groups the profiler reported gives a
    slowest stage more than :data:`FUSED_GROUP_SLACK` faster, or they leave too few cut positions:
    then ``solve(None)`` with a note (given once, however often the caller asks)."""
    if all(allowed):
        return solve(allowed)
    try:
        kept = solve(allowed)
    except PartitionError:
        _note_once(notes, "fused groups had to be cut to make this many stages")
        return solve(None)
    if kept.bottleneck <= (1 + FUSED_GROUP_SLACK) * kept.lower_bound:
        return kept  # no split beats the bound, so none beats this one by more than the slack
    free = solve(None)
    if kept.bottleneck <= (1 + FUSED_GROUP_SLACK) * free.bottleneck:
        return kept
    _note_once(
        notes,
        f"fused groups were cut: keeping them whole would have made the slowest stage "
        f"{kept.bottleneck / free.bottleneck:.2f}x as slow (a group may hold much of the model when the "
        "profiler could not tell onnxruntime's fused nodes apart; see the profile's notes)",
    )
    return free


def _note_once(notes: list[str], note: str) -> None:
    if note not in notes:
        notes.append(note)


def make_plan(
    view: ModelView,
    profile: Profile,
    k: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = 8,
) -> Plan:
    """Partition ``view`` into ``k`` stages that minimize the slowest stage, exactly.

    Stages run on identical workers; a received byte costs ``1 / bandwidth_bytes_per_s`` seconds on top
    of the stage's compute.  ``microbatches`` only sets the length of the simulated streaming timeline.
    For a cluster of different devices, memory limits and training schedules see
    :func:`onnxpipe.planner.plan_pipeline`.

    Fused groups reported by the profiler are kept whole when that still leaves ``k`` stages possible;
    otherwise the constraint is dropped and a note says so.
    """
    from onnxpipe import partition as _partition

    profile.check_matches(view)
    compute = view.compute_nodes
    m = len(compute)
    if k < 1 or k > m:
        raise PartitionError(
            f"{view.path.name if view.path else 'model'}: cannot make {k} non-empty stages from {m} "
            f"compute nodes; choose --stages between 1 and {m}"
        )
    seq = sequences(view, profile)
    notes: list[str] = []
    part = keeping_fused_groups(
        lambda allowed: _partition.solve(
            seq.costs, k, cut_bytes=seq.cut_bytes, bandwidth=bandwidth_bytes_per_s, allowed_cuts=allowed
        ),
        seq.allowed,
        notes,
    )

    stages = _stages_of(view, seq, part.bounds, part.compute, part.transfer)
    from onnxpipe.schedule.simulate import simulate

    timeline = simulate("stream", [s.cost_seconds for s in stages], None, [0.0] * k, microbatches)
    return plan_from(
        view, profile, part, stages, seq.sizes, bandwidth_bytes_per_s, notes=tuple(notes), timeline=timeline
    )


DEFAULT_TIME_SLACK = 0.01
"""An interleaved split may be 1% slower than the fastest one if that balances the workers' weights:
on ResNet-50 the exactly fastest split leaves 64% of the weights on one worker, while allowing 0.5% finds
one that holds 50.3% at most and is 0.14% slower."""


def make_interleaved_plan(
    view: ModelView,
    profile: Profile,
    k: int,
    workers: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = 8,
    time_slack: float = DEFAULT_TIME_SLACK,
) -> Plan:
    """Partition ``view`` into ``k`` stages dealt out to ``workers`` identical workers in turn (stage ``s``
    on worker ``s % workers``), exactly: the busiest worker as fast as possible, then, among splits at most
    ``time_slack`` slower, the least weight memory on any worker (:mod:`onnxpipe.partition.interleave`).

    For models whose weights are not spread like their time (CNNs hold most weights in their last
    layers), this gives every worker about ``1/workers`` of both.  Weights count once, at their first
    reader.
    """
    from onnxpipe.partition.interleave import InterleavedPartition, solve_interleaved
    from onnxpipe.planner import first_reader_param_bytes
    from onnxpipe.schedule.simulate import simulate

    profile.check_matches(view)
    name = view.path.name if view.path else "model"
    if workers < 1 or k % workers or k == workers:
        raise PartitionError(
            f"{name}: --workers {workers} must divide --stages {k} into two or more stages per worker "
            f"(for example --stages {2 * max(workers, 1)} --workers {max(workers, 1)})"
        )
    seq = sequences(view, profile)
    notes: list[str] = []
    item_mem = first_reader_param_bytes(view)

    def solve(allowed: Sequence[bool] | None) -> InterleavedPartition:
        return solve_interleaved(
            seq.costs,
            workers,
            k // workers,
            item_mem=item_mem,
            cut_bytes=seq.cut_bytes,
            bandwidth=bandwidth_bytes_per_s,
            allowed_cuts=allowed,
            time_slack=time_slack,
        )

    try:
        part = keeping_fused_groups(solve, seq.allowed, notes)
    except PartitionError as e:
        raise PartitionError(f"{name}: {e}") from e
    stages = tuple(
        replace(st, worker=part.workers[st.index])
        for st in _stages_of(view, seq, part.bounds, part.compute, part.transfer)
    )
    mem = ", ".join(f"{m / 2**20:.1f}" for m in part.worker_memory)
    slower = part.bottleneck / part.fastest - 1 if part.fastest > 0 else 0.0  # all-zero costs: all tie
    notes.append(
        f"{k} stages interleaved on {workers} workers (stage s on worker s % {workers}); weights per worker "
        f"{mem} MiB; busiest worker {slower:.2%} slower than the fastest split"
    )
    notes.append(_contiguous_comparison(seq, item_mem, workers, bandwidth_bytes_per_s))
    timeline = simulate(
        "stream", [s.cost_seconds for s in stages], None, [0.0] * k, microbatches, workers=part.workers
    )
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=part.bottleneck,
        lower_bound_seconds=min(part.lower_bound, part.bottleneck),
        cost_source=profile.source,
        threads=profile.threads,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        input_shapes=profile.input_shapes,
        tensor_bytes=seq.sizes,
        objective=(
            "minimize the busiest worker's time (compute + transfer in of its stages); then, within "
            "time_slack of it, the largest weight memory of a worker"
        ),
        notes=tuple(notes),
        timeline=timeline,
        workers=workers,
        time_slack=time_slack,
    )


def _contiguous_comparison(
    seq: Sequences, item_mem: Sequence[float], workers: int, bandwidth_bytes_per_s: float
) -> str:
    """What the ordinary split into ``workers`` stages would give, for the user to weigh interleaving
    against: it costs extra handoffs and a session per stage, and buys nothing where the contiguous split
    already spreads the weights."""
    from onnxpipe import partition as _partition
    from onnxpipe.partition.interleave import evaluate_interleaved

    part = keeping_fused_groups(
        lambda allowed: _partition.solve(
            seq.costs, workers, cut_bytes=seq.cut_bytes, bandwidth=bandwidth_bytes_per_s, allowed_cuts=allowed
        ),
        seq.allowed,
        [],
    )
    plain = evaluate_interleaved(
        seq.costs,
        workers,
        part.bounds,
        item_mem=item_mem,
        cut_bytes=seq.cut_bytes,
        bandwidth=bandwidth_bytes_per_s,
    )
    mem = ", ".join(f"{m / 2**20:.1f}" for m in plain.worker_memory)
    return (
        f"a contiguous split into {workers} stages: slowest stage {plain.bottleneck * 1e3:.3f} ms, "
        f"weights per worker {mem} MiB"
    )


def plan_from(
    view: ModelView,
    profile: Profile,
    part: Partition,
    stages: tuple[StageSpec, ...],
    sizes: Mapping[str, int],
    bandwidth_bytes_per_s: float,
    *,
    notes: tuple[str, ...] = (),
    timeline: Timeline | None = None,
    objective: str = "minimize the largest stage time (compute + transfer in)",
    cluster: Cluster | None = None,
    device_costs: tuple[DeviceCosts, ...] = (),
    microbatch_size: int = 1,
) -> Plan:
    """A :class:`Plan` from a solved partition: the fields every planner fills the same way, and its own."""
    received = sum(1 for st in stages for a in st.aliases if a.same_as in st.inputs)
    if received:
        skipped = sum(len(st.skipped_nodes) for st in stages)
        notes = (
            *notes,
            f"{received} tensor(s) a stage reads across a cut equal another it receives: each value "
            f"crosses once, and the stages remake the rest with Identity nodes ({skipped} node(s) left out "
            "of the files)",
        )
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=part.bottleneck,
        lower_bound_seconds=part.lower_bound,
        cost_source=profile.source,
        threads=profile.threads,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        input_shapes=profile.input_shapes,
        tensor_bytes=sizes,
        objective=objective,
        notes=notes,
        timeline=timeline,
        cluster=cluster,
        device_costs=device_costs,
        microbatch_size=microbatch_size,
    )


def assign_stages(
    view: ModelView,
    bounds: Sequence[int],
    sizes: Mapping[str, int],
    compute_seconds: Sequence[float],
    transfer_seconds: Sequence[float],
    devices: Sequence[str] | None = None,
    link_bytes: Sequence[int] | None = None,
    *,
    share_equal_values: bool = True,
    classes: Mapping[str, int] | None = None,
) -> tuple[StageSpec, ...]:
    """Turn partition bounds over compute positions into named stages with their inputs and outputs.

    ``link_bytes[p]`` (the cut profile) is what crosses the link in front of a stage starting at ``p``:
    the stage's own inputs plus tensors it forwards to later stages.

    With ``share_equal_values`` a stage that reads tensors of an earlier stage that are provably equal
    to others (:mod:`onnxpipe.samevalue`) receives, for each value, the first tensor the earlier stage
    makes of it, and remakes the ones it reads from that (:attr:`StageSpec.aliases`).  The earlier
    stage remakes its own repeats of a value it emits the same way, and its nodes that then compute
    nothing anybody reads are left out of its file (:attr:`StageSpec.skipped_nodes`).  The stages are
    worked out last to first, since what a stage must emit depends on what the later ones receive.
    ``classes``: the view's value classes when the caller has them (:attr:`Sequences.classes`).
    """
    compute = view.compute_nodes
    k = len(bounds) - 1
    const_by_output = {o: n for n in view.nodes if n.is_constant for o in n.outputs}
    stage_nodes = [compute[bounds[s] : bounds[s + 1]] for s in range(k)]
    produced_in: dict[str, int] = {}
    for s, nodes in enumerate(stage_nodes):
        for n in nodes:
            for o in n.outputs:
                produced_in[o] = s
    last_reads: dict[str, int] = {}
    for s, nodes in enumerate(stage_nodes):
        for n in nodes:
            for t in n.reads:
                last_reads[t] = max(last_reads.get(t, -1), s)
    for t in view.outputs:
        last_reads[t] = k  # read "after" the last stage
    if not share_equal_values:
        classes = {}
    elif classes is None:
        classes = value_classes(view)
    equal = _EqualValues(classes, stage_nodes)
    sent_as = equal.first_in_stage
    model_outputs = set(view.outputs)
    wanted: list[set[str]] = [set() for _ in range(k)]  # what later stages receive from each stage
    specs: list[StageSpec] = []
    for s in reversed(range(k)):
        nodes = stage_nodes[s]
        outputs = tuple(o for n in nodes for o in n.outputs if o in wanted[s] or o in model_outputs)
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
        naive = {o for n in nodes for o in n.outputs if last_reads.get(o, -1) > s}
        skipped, used = _unneeded(nodes, naive, emitted, remade)
        if len(skipped) == len(nodes):
            # nothing of this stage is wanted now that a later stage takes an equal value from another
            # stage; left out, its nodes would leave a graph without inputs, nodes or outputs, which
            # onnxruntime cannot load: they stay, computing what nobody reads (a dead node of the source
            # stays so too).  Nothing is then emitted, so nothing was remade either.
            skipped, used = set(), set()
        kept = [n for n in nodes if n.name not in skipped]
        reads: dict[str, None] = {}
        for n in kept:
            for t in n.reads:
                reads.setdefault(t, None)
        inner = tuple(Alias(t, remade[t]) for n in nodes for t in n.outputs if t in used)
        # model outputs that no compute node makes (constants, weights) come out of the last stage
        extra_outputs = (
            [
                t
                for t in view.outputs
                if t not in produced_in
                and t not in view.inputs
                and (t in const_by_output or t in view.initializers)
            ]
            if s == k - 1
            else []
        )
        outputs += tuple(extra_outputs)
        consts = _constant_closure(view, list(reads) + extra_outputs, const_by_output)
        received = [
            t
            for t in reads
            if t not in view.initializers and t not in const_by_output and produced_in.get(t, -1) != s
        ]
        source = {t: equal.received_as(t, s) for t in received}
        aliases = tuple(Alias(t, source[t]) for t in received if source[t] != t) + inner
        inputs = tuple(dict.fromkeys(source.values()))
        for t in inputs:
            if t in produced_in:
                wanted[produced_in[t]].add(t)
        specs.append(
            StageSpec(
                index=s,
                node_names=tuple(n.name for n in nodes),
                constant_nodes=consts,
                inputs=inputs,
                outputs=outputs,
                compute_seconds=float(compute_seconds[s]),
                transfer_seconds=float(transfer_seconds[s]),
                bytes_in=sum(sizes.get(t, 0) for t in inputs),
                bytes_out=sum(sizes.get(t, 0) for t in outputs),
                param_bytes=sum(
                    view.weights.get(t, 0) for t in dict.fromkeys(t for n in kept for t in n.reads)
                ),
                peak_activation_bytes=_peak_activation(kept, inputs, outputs, sizes, view, aliases),
                device=devices[s] if devices is not None else "cpu",
                link_bytes_in=int(link_bytes[bounds[s]]) if link_bytes is not None and s > 0 else 0,
                aliases=aliases,
                skipped_nodes=tuple(n.name for n in nodes if n.name in skipped),
            )
        )
    return tuple(reversed(specs))


class _EqualValues:
    """Which tensor of each value a stage makes first, and which one a later stage receives.

    A stage receives each value once, as the first tensor of it made by the latest earlier stage that
    makes one.  Then a value crosses a cut only while some tensor of it does (read after the cut, made
    before it), whatever the other cuts: the bytes :func:`onnxpipe.graph.cut_profile` counts with value
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
    view: ModelView,
    aliases: Sequence[Alias] = (),
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
