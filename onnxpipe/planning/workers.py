"""Plans on identical workers: one stage each, or K stages dealt out to fewer workers in turn.

:func:`make_plan` partitions into K stages, one per worker; :func:`make_interleaved_plan` deals K stages
out to fewer workers in turn.  Both line up the compute nodes (:mod:`onnxpipe.planning.sequences`), ask
:mod:`onnxpipe.partition` for the optimal bounds, and turn the bounds back into named stages
(:mod:`onnxpipe.planning.stages`); plans for a cluster of other devices are
:mod:`onnxpipe.planning.cluster`'s, and
:func:`onnxpipe.planning.planner.plan` chooses between them.

Cheap constant producers (see :mod:`onnxpipe.ir.model`) are left out of the sequence; each stage that
reads one gets its own copy (``constant_nodes``), so their values never cross a cut.

What a stage adds for where it starts (:func:`start_seconds`, :func:`counting_copies`): the nodes it copies
to make the values of shapes or weights alone it would otherwise receive (:mod:`onnxpipe.planning.recompute`:
a causal mask, position ids, shape arithmetic).  Those copies run on every call of the stage, yet the
partitioner saw each node once, at its place in the model, so a stage that starts after them was estimated
without them (GPT-2 tiny in 3 stages: about 0.12 ms of 0.42 ms in each later stage).  :func:`start_seconds`
gives the partitioner, for every position a stage may start at, the profiled seconds of the nodes that make
the recomputable values crossing that position (the union of their producers, back to data, inputs and
weights), so that it balances the stages with their copies; :func:`counting_copies` counts what each stage of
a plan really copies (its :attr:`~onnxpipe.planning.types.StageSpec.recomputed_nodes`), for the estimates.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from onnxpipe import partition as _partition
from onnxpipe.core.errors import PartitionError
from onnxpipe.core.options import opt
from onnxpipe.cost.callcost import call_seconds
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView, NodeInfo
from onnxpipe.ir.shapevalues import ValueKinds, value_kinds
from onnxpipe.partition.interleave import InterleavedPartition, evaluate_interleaved, solve_interleaved
from onnxpipe.partition.result import Partition
from onnxpipe.planning.decoder_plan import (
    LayerSequences,
    context_words,
    decoder_notes,
    decoder_record,
    interleaved_decoder_stages,
    layer_cut_items,
    profile_phase,
)
from onnxpipe.planning.decoder_recompute import with_copy_costs
from onnxpipe.planning.request import DEFAULT_TIME_SLACK, DecoderOptions, PlanRequest
from onnxpipe.planning.sequences import Sequences, first_reader_param_bytes, keeping_fused_groups, sequences
from onnxpipe.planning.stages import StageOptions, assign_stages, plan_from
from onnxpipe.planning.types import Plan, StageSpec
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

MEASURED_TIE_RTOL = 0.01
"""Splits of measured costs within 1% of the optimum tie, and the fewest bytes among them win: the bytes
are fixed by the graph, the costs move with each measurement (a median of a few runs on a busy machine),
so a near-tie resolved by the costs alone gave another cut on each profile (15 or 19 nodes in stage 0)."""


def near_tie_rtol(profile: Profile) -> float:
    """How close to the optimum a split of ``profile``'s costs ties: :data:`MEASURED_TIE_RTOL` for
    measured costs, the solver's own rounding tolerance for static ones (they do not move)."""
    return MEASURED_TIE_RTOL if profile.source == CostSource.PROFILE.value else _partition.TIE_RTOL


def per_call_cost(profile: Profile, given: float | None) -> float:
    """The fixed seconds a stage pays per call: ``given``, else measured here for measured costs (the
    machine they were measured on), none for static costs."""
    if given is not None:
        return given
    return call_seconds(profile.threads) if profile.source == CostSource.PROFILE.value else 0.0


def make_plan(
    view: ModelView,
    profile: Profile,
    k: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
    per_call_seconds: float | None = None,
) -> Plan:
    """Partition ``view`` into ``k`` stages that minimize the slowest stage, exactly.

    Stages run on identical workers; a received byte costs ``1 / bandwidth_bytes_per_s`` seconds on top
    of the stage's compute.  ``microbatches`` only sets the length of the simulated streaming timeline.
    For a cluster of different devices, memory limits and training schedules see
    :func:`onnxpipe.planning.cluster.plan_pipeline`.

    Fused groups reported by the profiler are kept whole when that still leaves ``k`` stages possible;
    otherwise the constraint is dropped and a note says so.  Each stage's estimate counts the nodes it
    copies (:func:`start_seconds`, which the partitioner balances too) and, for measured
    costs, ``per_call_seconds``: one session call's fixed cost (default: measured once here,
    :func:`onnxpipe.cost.callcost.call_seconds`; static costs: none).
    """
    profile.check_matches(view)
    compute = view.compute_nodes
    m = len(compute)
    if k < 1 or k > m:
        raise PartitionError(
            f"{view.label}: cannot make {k} non-empty stages from {m} compute nodes (Constant nodes "
            f"do not count); the largest number of stages that works is {m}: "
            f"choose {opt('stages')} between 1 and {m}"
        )
    seq = sequences(view, profile)
    extra = start_seconds(view, seq.compute, value_kinds(view), profile)
    notes: list[str] = []
    part = keeping_fused_groups(
        lambda allowed: _partition.solve(
            seq.costs,
            k,
            cut_bytes=seq.cut_bytes,
            bandwidth=bandwidth_bytes_per_s,
            allowed_cuts=allowed,
            tie_rtol=near_tie_rtol(profile),
            start_seconds=extra if any(extra) else None,
        ),
        seq.allowed,
        notes,
        seq.cuttable,
    )
    stages = assign_stages(view, part.bounds, seq.sizes, part.compute, part.transfer, StageOptions(seq=seq))
    per_call = per_call_cost(profile, per_call_seconds)
    stages, part = counting_copies(stages, part, extra, profile, per_call)
    if per_call > 0:
        notes.append(
            f"each stage's estimate counts {per_call * 1e3:.3f} ms per call, one session call's fixed cost "
            "on this machine (measured)"
        )
    timeline = stream([s.cost_seconds for s in stages], microbatches)
    return plan_from(
        view, profile, part, stages, seq.sizes, bandwidth_bytes_per_s, notes=tuple(notes), timeline=timeline
    )


INTERLEAVED_OBJECTIVE = (
    "minimize the busiest worker's time (compute + transfer in of its stages); then, within "
    "time_slack of it, the largest weight memory of a worker"
)


def make_interleaved_plan(
    view: ModelView, profile: Profile, request: PlanRequest, decoder: DecoderInfo | None = None
) -> Plan:
    """Partition ``view`` into ``request.stages`` stages dealt out to ``request.workers`` identical
    workers in turn (stage ``s`` on worker ``s % workers``), exactly: the busiest worker as fast as
    possible, then, among splits at most ``request.time_slack`` slower, the least weight memory on any
    worker (:mod:`onnxpipe.partition.interleave`).

    For models whose weights are not spread like their time (CNNs hold most weights in their last
    layers), this gives every worker about ``1/workers`` of both.  Weights count once, at their first
    reader.  With ``decoder`` (a decoder LLM, layer cuts on) the stages start only between layers, as
    ``request.decoder.ends`` allows, each holding its own layers' KV cache as state: the same exact
    search over the coarser cut positions.
    """
    profile.check_matches(view)
    k, workers = request.stages, request.workers
    assert isinstance(k, int) and workers is not None  # the planner's interleaved request
    if workers < 1 or k % workers > 1 or k <= workers:
        raise PartitionError(
            f"{view.label}: {opt('workers', workers)} must divide {opt('stages', k)} into two or more stages "
            f"per worker, or one stage more (for example {opt('stages', 2 * max(workers, 1))} "
            f"{opt('workers', max(workers, 1))})"
        )
    time_slack = DEFAULT_TIME_SLACK if request.time_slack is None else request.time_slack
    items = _Items.of(view, profile, decoder, request.decoder)
    notes: list[str] = []
    try:
        part = items.solve(k, workers, request.bandwidth_bytes_per_s, time_slack, notes)
    except PartitionError as e:
        raise PartitionError(f"{view.label}: {e}") from e
    return _dealt_plan(view, profile, request, items, part, decoder, notes, time_slack)


@dataclass(frozen=True)
class _Items:
    """What the interleaved search runs over: the compute nodes, or a decoder's layer groups (the same
    exact search over far fewer cut positions), with their costs, cut bytes and weight bytes."""

    seq: Sequences
    """The compute nodes (a decoder's in layer order), a stage allowed to start where ``seq.allowed`` says."""
    item_mem: list[float]
    """Weight bytes per compute node, each weight at its first reader."""
    costs: list[float]
    cuts: list[int]
    mems: list[float]
    """Weight bytes per item."""
    layers: LayerSequences | None = None
    """A decoder's layer groups, the items; None: the items are the compute nodes."""
    coarse_ok: list[bool] | None = None
    """Where a stage may start among the layer groups (``ends``)."""

    @staticmethod
    def of(view: ModelView, profile: Profile, decoder: DecoderInfo | None, options: DecoderOptions) -> _Items:
        if decoder is None:
            seq = sequences(view, profile)
            item_mem = first_reader_param_bytes(view)
            return _Items(seq, item_mem, list(seq.costs), list(seq.cut_bytes), item_mem)
        layers, coarse_ok, seq = layer_cut_items(view, profile, decoder, options.ends, opt("workers"))
        item_mem = first_reader_param_bytes(view, seq.compute)
        mems = [float(sum(item_mem[a:b])) for a, b in itertools.pairwise(layers.starts)]
        return _Items(seq, item_mem, layers.coarse_costs, layers.coarse_cut_bytes, mems, layers, coarse_ok)

    def solve(
        self, stages: int, workers: int, bandwidth_bytes_per_s: float, time_slack: float, notes: list[str]
    ) -> InterleavedPartition:
        """The exact interleaved split, its bounds over the compute nodes; fused groups kept whole while
        that costs little (``notes`` says when not), a decoder cut between layer groups only."""

        def solve(allowed: Sequence[bool] | None) -> InterleavedPartition:
            return solve_interleaved(
                self.costs,
                workers,
                stages,
                item_mem=self.mems,
                cut_bytes=self.cuts,
                bandwidth=bandwidth_bytes_per_s,
                allowed_cuts=allowed,
                time_slack=time_slack,
            )

        if self.layers is None:
            return keeping_fused_groups(solve, self.seq.allowed, notes, self.seq.cuttable)
        coarse = solve(self.coarse_ok)
        fine = self.layers.fine_bounds(coarse.stages.bounds)
        return replace(coarse, stages=replace(coarse.stages, bounds=fine))


def _dealt_plan(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    items: _Items,
    part: InterleavedPartition,
    decoder: DecoderInfo | None,
    notes: list[str],
    time_slack: float,
) -> Plan:
    """The plan of ``part``, its stages dealt out to the workers (a decoder's with their KV layers and
    cache), after ``notes``."""
    options, workers = request.decoder, part.k  # an interleaved partition's k counts its workers
    summary, copied = None, None
    if decoder is None:
        chain = part.stages
        drawn = StageOptions(seq=items.seq)
        specs = assign_stages(view, chain.bounds, items.seq.sizes, chain.compute, chain.transfer, drawn)
    else:
        specs, part, copied = interleaved_decoder_stages(
            view, decoder, items.seq, part, options, profile, request.bandwidth_bytes_per_s
        )
        summary = decoder_record(view, decoder, options, [(profile_phase(profile, decoder), profile)])
    stages = tuple(replace(st, worker=part.workers[st.index]) for st in specs)
    weights = worker_weights(view, stages, workers)
    mem = ", ".join(f"{m / 2**20:.1f}" for m in weights)
    slower = part.bottleneck / part.fastest - 1 if part.fastest > 0 else 0.0  # all-zero costs: all tie
    notes.append(
        f"{len(stages)} stages interleaved on {workers} workers (stage s on worker s % {workers}); weights "
        f"per worker {mem} MiB; busiest worker {slower:.2%} slower than the fastest split"
    )
    if decoder is not None:
        kv = ", ".join(
            f"{sum(st.kv_cache_bytes for st in stages if st.worker == w) / 2**20:.1f}" for w in range(workers)
        )
        notes.extend(decoder_notes(view, decoder, stages, options))
        notes.append(
            f"balanced for the {profile_phase(profile, decoder)} profile; KV cache per worker at "
            f"{context_words(view, decoder, options.max_context)}: {kv} MiB"
        )
        if copied:
            notes.append(copied)
    notes.append(_contiguous_comparison(items.seq, items.item_mem, workers, request.bandwidth_bytes_per_s))
    return plan_from(
        view,
        profile,
        part,
        stages,
        items.seq.sizes,
        request.bandwidth_bytes_per_s,
        notes=tuple(notes),
        timeline=stream(
            [s.cost_seconds for s in stages], request.schedule.stream_microbatches, workers=part.workers
        ),
        objective=INTERLEAVED_OBJECTIVE,
        workers=workers,
        time_slack=time_slack,
        worker_param_bytes=weights,
        decoder=summary,
    )


def worker_weights(view: ModelView, stages: Sequence[StageSpec], workers: int) -> tuple[int, ...]:
    """Each worker's weight bytes, every tensor its stages' nodes read counted once: a weight two of its
    stages share (a tied embedding and LM head) once, one its stages share with another worker's on
    both; a stage with no worker is its own (stage i on worker i)."""
    by_name = view.node_by_name
    held: list[set[str]] = [set() for _ in range(workers)]
    for st in stages:
        for name in (*st.node_names, *st.constant_nodes, *st.recomputed_nodes):
            held[st.index if st.worker is None else st.worker].update(
                t for t in by_name[name].reads if t in view.weights
            )
    return tuple(sum(view.weights[t] for t in h) for h in held)


def _contiguous_comparison(
    seq: Sequences, item_mem: Sequence[float], workers: int, bandwidth_bytes_per_s: float
) -> str:
    """What the ordinary split into ``workers`` stages would give, for the user to weigh interleaving
    against: it costs extra handoffs and a session per stage, and buys nothing where the contiguous split
    already spreads the weights."""
    part = keeping_fused_groups(
        lambda allowed: _partition.solve(
            seq.costs, workers, cut_bytes=seq.cut_bytes, bandwidth=bandwidth_bytes_per_s, allowed_cuts=allowed
        ),
        seq.allowed,
        [],
        seq.cuttable,
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


def start_seconds(
    view: ModelView, compute: Sequence[NodeInfo], kinds: ValueKinds, profile: Profile
) -> tuple[float, ...]:
    """Per position ``0..n`` of ``compute``: the seconds of the nodes a stage starting there copies to
    make the recomputable values that cross it (0 at position 0: the first stage receives nothing)."""
    n = len(compute)
    pos = {node.name: p for p, node in enumerate(compute)}
    closure: dict[str, frozenset[str]] = {}
    enter: list[list[str]] = [[] for _ in range(n + 1)]
    leave: list[list[str]] = [[] for _ in range(n + 2)]
    for p, node in enumerate(compute):
        for t in node.outputs:
            readers = [
                pos[view.nodes[r].name] for r in view.consumers.get(t, ()) if view.nodes[r].name in pos
            ]
            last = max((r for r in readers if r > p), default=-1)
            if last < 0 or not kinds.recomputable(t):
                continue
            enter[p + 1].append(t)  # crosses every start p + 1 .. last
            leave[last + 1].append(t)
    count: dict[str, int] = {}
    held = 0.0
    out = [0.0]
    for a in range(1, n + 1):
        for t, sign in [*((t, -1) for t in leave[a]), *((t, 1) for t in enter[a])]:
            # in name order: a set's order follows PYTHONHASHSEED, and so would the sum's last bits
            for name in sorted(_makers(view, kinds, t, closure)):
                before = count.get(name, 0)
                count[name] = before + sign
                if (before == 0) != (count[name] == 0):
                    held += sign * max(0.0, float(profile.node_seconds.get(name, 0.0)))
        out.append(max(held, 0.0))
    return tuple(out)


def _makers(
    view: ModelView, kinds: ValueKinds, tensor: str, memo: dict[str, frozenset[str]]
) -> frozenset[str]:
    """The nodes that make ``tensor`` from data, inputs and weights: its producer and, through the inputs
    that are themselves recomputable, theirs."""
    if tensor in memo:
        return memo[tensor]
    memo[tensor] = frozenset()  # a cycle cannot occur in a graph; guards the recursion anyway
    producer = view.producer.get(tensor)
    if producer is None:
        return memo[tensor]
    node = view.nodes[producer]
    found = {node.name}
    for t in node.inputs:
        if t and kinds.recomputable(t):
            found |= _makers(view, kinds, t, memo)
    memo[tensor] = frozenset(found)
    return memo[tensor]


def counting_copies(
    stages: tuple[StageSpec, ...],
    part: Partition,
    extra: Sequence[float],
    profile: Profile,
    per_call: float = 0.0,
) -> tuple[tuple[StageSpec, ...], Partition]:
    """``stages`` and ``part`` with each stage's copies in its compute (what it really copies, not the
    estimate :func:`start_seconds` gave the partitioner, which ``part`` counted with the transfer), and
    ``per_call`` seconds each (one session call's fixed cost: the same for every stage, so it moves no
    cut)."""
    copied = [
        sum(max(0.0, float(profile.node_seconds.get(n, 0.0))) for n in st.recomputed_nodes) for st in stages
    ]
    compute = tuple(c + x + per_call for c, x in zip(part.compute, copied, strict=True))
    transfer = tuple(
        max(0.0, t - (extra[a] if s > 0 else 0.0))
        for s, (t, a) in enumerate(zip(part.transfer, part.bounds[:-1], strict=True))
    )
    if compute == part.compute and transfer == part.transfer:
        return stages, part
    counted = part.recosted(compute, transfer)
    return with_copy_costs(stages, counted), counted
