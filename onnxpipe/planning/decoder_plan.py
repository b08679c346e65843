"""The plan of a decoder on identical workers: cuts between layers only, found exactly on the layers:
the layers as items, the KV cache as state, its memory per stage.

On a decoder (:func:`onnxpipe.ir.decoder.find_decoder`) the compute nodes are lined up by layer group
(before the layers, layer 0, ..., layer L-1, the head; inside a group in the view's order, which stays
topological since a node's group is never below its inputs'), and the partitioner sees one item per group
(:class:`LayerSequences`): its costs summed, the bytes a stage starting at the group receives.  The optimum
over that coarser sequence is exact for splits that cut only between layers, which is all that is then
allowed: each layer's past and present key and value land in one stage.

The past inputs are state: a stage's worker keeps its layers' cache, so they never cross a link and are
not charged to any (they are "free" in :func:`onnxpipe.ir.graph.cut_profile`, like weights); the presents
are the stage's own outputs and cross nothing either.  Each stage's cache at ``max_context`` tokens (or
the model's own context, where that is smaller) is reported and counted in the device memory check.

Where the embedding and the LM head go (:class:`~onnxpipe.core.choices.Ends`): anywhere the
balance puts them (``free``), with their neighbouring layer (``attached``), or each a stage of its own
(``own``, as Olive's ``unique_embeds_lm_head_splits`` does).

:func:`layer_plan` partitions that coarse sequence (one item per layer group) with
:func:`onnxpipe.partition.solve`, maps the bounds back to compute positions, scores them there with
:func:`onnxpipe.partition.evaluate` (the same cost formula), and adds each stage's KV layers and cache
bytes. Fused groups are not consulted: a cut between two layers splits none that matters, and keeping the
cache whole is not optional.

Given a profile at each phase (a prompt, prefill; a generation step, decode), which spread their time
differently over the layers, the cuts minimise exactly the larger of the two phases' bottlenecks, each
relative to that phase's own best split (:func:`onnxpipe.partition.phases.solve_two_phases`), so that
neither phase pays much for the other; both phases' estimates are kept per stage, and the plan reports
the decode ones (generation is where the steady state of a pipeline lies).

The layer line-up (:func:`layer_sequences`, :func:`layer_cut_items`) and the KV accounting
(:func:`with_kv`, :func:`own_cache_only`) serve the devices-file and interleaved planners too
(:mod:`onnxpipe.planning.cluster`, :mod:`onnxpipe.planning.workers`): a decoder is cut between layers,
and each stage keeps its own layers' cache, whichever planner places it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from onnxpipe import partition as _partition
from onnxpipe.core.choices import Ends, Phase, PhaseChoice
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo, io_contract
from onnxpipe.ir.decoder_dims import (
    batch_symbol,
    cache_batch,
    counted_context,
    kv_bytes_per_token,
    own_context,
)
from onnxpipe.ir.model import ModelView
from onnxpipe.partition.interleave import InterleavedPartition
from onnxpipe.partition.phases import solve_two_phases
from onnxpipe.partition.result import Partition
from onnxpipe.planning.decoder_recompute import Counted, InputCopies, PhaseCosts, counting_copies, priced_cuts
from onnxpipe.planning.recompute import shape_from_dims
from onnxpipe.planning.records import DecoderRecord, PhaseShape
from onnxpipe.planning.request import DecoderOptions
from onnxpipe.planning.sequences import Sequences, sequences
from onnxpipe.planning.stages import StageOptions, assign_stages, plan_from
from onnxpipe.planning.types import Plan, ShapeParts, StageSpec
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

OBJECTIVE = (
    "minimize the largest stage time (compute + transfer in), cutting only between a decoder's layers "
    "(each layer's KV cache in one stage; the cache is state, not link traffic)"
)
TWO_PHASE_OBJECTIVE = (
    "minimize the larger of the prefill and decode bottlenecks, each relative to its phase's own best "
    "layer-aligned split (stage times: compute + transfer in; reported at decode)"
)


CoarseSolver = Callable[[int, int, int, Sequence[bool]], Sequence[int]]
"""``solve(lo, hi, k, allowed)``: bounds (relative to ``lo``) of the best ``k``-stage split of the coarse
items ``lo .. hi - 1``, stages starting only where ``allowed`` (relative too) says."""


def coarse_bounds(
    layers: LayerSequences, dec: DecoderInfo, k: int, ends: Ends, solve: CoarseSolver
) -> tuple[int, ...]:
    """The coarse bounds of a ``k``-stage split under ``ends``: with ``own`` the embedding and the head
    are stages of their own and ``solve`` splits the layers in between; else ``solve`` splits all items
    with the cuts ``ends`` allows.  Refused when ``k`` is more than the layer boundaries allow."""
    n = len(layers.groups)
    refuse_stage_count(layers.groups, dec, k, ends)
    if ends == Ends.OWN:
        first = 1 if layers.groups[0] == -1 else 0
        last = n - 1 if layers.groups[-1] == dec.layers else n
        inner = solve(first, last, k - first - (n - last), [True] * (last - first + 1))
        return tuple(range(first)) + tuple(first + b for b in inner) + tuple(range(last + 1, n + 1))
    return tuple(solve(0, n, k, coarse_allowed(layers, dec, ends)))


def _solver(
    costs: Sequence[Sequence[float]], cuts: Sequence[Sequence[float]], bandwidth: float
) -> CoarseSolver:
    """The exact split of a run of coarse items (:func:`coarse_bounds` asks for each), on one phase's
    ``costs`` and ``cuts`` (per coarse item and position), or on prefill's and decode's at once
    (:func:`~onnxpipe.partition.phases.solve_two_phases`)."""

    def solve(lo: int, hi: int, kk: int, allowed: Sequence[bool]) -> Sequence[int]:
        if len(costs) == 1:
            return _partition.solve(
                costs[0][lo:hi], kk, cut_bytes=cuts[0][lo : hi + 1], bandwidth=bandwidth, allowed_cuts=allowed
            ).bounds
        return solve_two_phases(
            costs[0][lo:hi],
            costs[1][lo:hi],
            kk,
            cut_a=cuts[0][lo : hi + 1],
            cut_b=cuts[1][lo : hi + 1],
            bandwidth=bandwidth,
            allowed_cuts=allowed,
        ).bounds

    return solve


def split_layers(
    view: ModelView,
    profiles: Sequence[tuple[Phase, Profile]],
    k: int,
    dec: DecoderInfo,
    options: DecoderOptions,
    bandwidth: float,
) -> tuple[Counted, Sequences]:
    """The exact ``k``-stage split of ``dec``'s layer groups under ``options.ends`` for one phase's profile,
    or for prefill and decode together (the module): the stages with their KV cache
    and what they copy (:func:`counting_copies`), each phase's partition, and the last phase's line-up
    (the one a plan reports).  With ``copy_inputs`` the cuts are chosen knowing what the stages will
    copy (:func:`priced_cuts`), and scored on the bytes that really cross."""
    for _, profile in profiles:
        profile.check_matches(view)
    lines = [layer_sequences(view, profile, dec) for _, profile in profiles]
    if any(x.starts != lines[0].starts for x in lines):  # the order depends on the graph alone: a bug if not
        raise PartitionError("the prefill and decode profiles line the layers up differently")
    seqs, last = [x.seq for x in lines], lines[-1]
    # without copies, the cut bytes as they are (what priced_cuts gives for links it cannot price)
    priced = bandwidth if options.copy_inputs else math.inf
    cuts = priced_cuts(view, dec, seqs, [p.node_seconds for _, p in profiles], priced)
    solve = _solver([x.coarse_costs for x in lines], [[c[a] for a in last.starts] for c in cuts], bandwidth)
    try:
        fine = last.fine_bounds(coarse_bounds(last, dec, k, options.ends, solve))
    except PartitionError as e:
        raise named(view, e) from e
    parts = [
        _partition.evaluate(seq.costs, fine, cut_bytes=seq.cut_bytes, bandwidth=bandwidth) for seq in seqs
    ]
    phases = tuple(
        PhaseCosts(phase, profile.node_seconds, seq.sizes, part.compute)
        for (phase, profile), seq, part in zip(profiles, seqs, parts, strict=True)
    )
    return copying_stages(view, dec, last.seq, parts, phases, options, profiles[-1][1], bandwidth), last.seq


def check_stage_count(view: ModelView, dec: DecoderInfo, k: int, ends: Ends) -> None:
    """Refuse, before any cost is measured, a stage count that cuts between layers cannot make."""
    try:
        refuse_stage_count(sorted(set(dec.node_layer.values())), dec, k, ends)
    except PartitionError as e:
        raise named(view, e) from e


def refuse_stage_count(groups: Sequence[int], dec: DecoderInfo, k: int, ends: Ends) -> None:
    """Refuse ``k`` stages unless cuts between the layer ``groups`` (in order: ``-1`` before the layers,
    ``dec.layers`` the head) under ``ends`` can make them: at most one per group, fewer where ``attached``
    glues an end to its layer, at least one more than the ends' own stages with ``own``."""
    n = len(groups)
    has_ends = (groups[0] == -1, groups[-1] == dec.layers)
    if ends == Ends.OWN:
        lo, hi = sum(has_ends) + 1, n
    else:
        glued = (has_ends[0] and 0 in groups) + (has_ends[1] and dec.layers - 1 in groups)
        lo, hi = 1, n - (glued if ends == Ends.ATTACHED else 0)
    if not lo <= k <= hi:
        raise PartitionError(
            f"cannot make {k} stages cutting only between the decoder's {dec.layers} layers "
            f"({opt('ends', ends)}); choose {opt('stages')} between {lo} and {hi}, or "
            f"{opt('layer_cuts', False)}"
        )


def named(view: ModelView, error: PartitionError) -> PartitionError:
    """``error`` with the model's name in front, as every message names the file at fault."""
    return PartitionError(f"{view.label}: {error}")


def layer_plan(
    view: ModelView,
    profiles: Sequence[tuple[Phase, Profile]],
    k: int,
    dec: DecoderInfo,
    options: DecoderOptions,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
) -> Plan:
    """Partition the decoder ``view`` into ``k`` stages that cut only between layers, exactly, for one
    phase's profile or for prefill's and decode's (the module): the stage times it reports are the last
    phase's."""
    split, seq = split_layers(view, profiles, k, dec, options, bandwidth_bytes_per_s)
    record = decoder_record(view, dec, options, profiles)
    notes = [*decoder_notes(view, dec, split.stages, options)]
    if len(profiles) > 1:
        part_p, part_d = split.parts
        prompt, cached = record.phase_shapes[0].new_tokens, record.phase_shapes[1].past_tokens
        notes.append(
            f"balanced for both phases: prefill bottleneck {part_p.bottleneck * 1e3:.3f} ms "
            f"({_ratio(part_p)} its lower bound), decode {part_d.bottleneck * 1e3:.3f} ms ({_ratio(part_d)} "
            f"its lower bound); profiled at {prompt} prompt token(s) and at 1 token after {cached} cached"
        )
    notes += [split.note] if split.note else []
    return plan_from(
        view,
        profiles[-1][1],
        split.parts[-1],
        split.stages,
        seq.sizes,
        bandwidth_bytes_per_s,
        notes=tuple(notes),
        timeline=stream([s.cost_seconds for s in split.stages], microbatches),
        objective=OBJECTIVE if len(profiles) == 1 else TWO_PHASE_OBJECTIVE,
        decoder=record,
    )


def _ratio(part: Partition) -> str:
    return f"{part.bottleneck / part.lower_bound:.3f}x" if part.lower_bound > 0 else "1.000x"


def _tokens_and_past(profile: Profile, dec: DecoderInfo) -> tuple[int, int]:
    ids = profile.input_shapes.get(dec.ids_input, (1, 1))
    past = profile.input_shapes.get(dec.kv[0].past_key, (1, 1, 0, 1))
    return int(ids[-1]) if ids else 1, int(past[-2]) if len(past) >= 2 else 0


def profile_phase(profile: Profile, dec: DecoderInfo) -> Phase:
    """The phase ``profile``'s shapes are: decode for one new token after a cache, else prefill."""
    tokens, past = _tokens_and_past(profile, dec)
    return Phase.DECODE if tokens == 1 and past > 0 else Phase.PREFILL


def decoder_stages(
    view: ModelView,
    dec: DecoderInfo,
    seq: Sequences,
    part: Partition,
    options: DecoderOptions,
    profile: Profile,
    *,
    copies: InputCopies | None = None,
) -> tuple[StageSpec, ...]:
    """The named stages of ``part`` (over ``seq``, in layer order), each with the layers whose cache it
    holds and that cache's bytes; ``copies`` chooses the rotary tables and masks each makes instead of
    receiving them (:mod:`onnxpipe.planning.decoder_recompute`; the stage costs are ``part``'s, without
    the copies)."""
    drawn = StageOptions(seq=seq, copies=copies)
    stages = assign_stages(view, part.bounds, seq.sizes, part.compute, part.transfer, drawn)
    return with_kv(view, profile, dec, stages, options.max_context)


def interleaved_decoder_stages(
    view: ModelView,
    dec: DecoderInfo,
    seq: Sequences,
    part: InterleavedPartition,
    options: DecoderOptions,
    profile: Profile,
    bandwidth_bytes_per_s: float,
) -> tuple[tuple[StageSpec, ...], InterleavedPartition, str | None]:
    """:func:`decoder_stages` of an interleaved split (``part`` cut between layers), its estimate kept
    at the profiled phase; with ``part``'s figures counting the copies, and the copies' note (None
    when there are none)."""
    phases = (PhaseCosts(profile_phase(profile, dec), profile.node_seconds, seq.sizes, part.stages.compute),)
    counted = copying_stages(view, dec, seq, [part.stages], phases, options, profile, bandwidth_bytes_per_s)
    fixed = counted.parts[0]
    busy = [0.0] * part.k
    for worker, cost in zip(part.workers, fixed.stage_costs, strict=True):
        busy[worker] += cost
    dealt = dataclasses.replace(
        part,
        stages=fixed,
        worker_seconds=tuple(busy),
        bottleneck=max(busy),
        fastest=min(part.fastest, max(busy)),
        lower_bound=min(part.lower_bound, max(busy)),
    )
    return counted.stages, dealt, counted.note


def copying_stages(
    view: ModelView,
    dec: DecoderInfo,
    seq: Sequences,
    parts: Sequence[Partition],
    phases: Sequence[PhaseCosts],
    options: DecoderOptions,
    profile: Profile,
    bandwidth_bytes_per_s: float,
) -> Counted:
    """:func:`decoder_stages` of the last of ``parts`` (each phase's scores of one split, in ``phases``
    order) with the rotary tables and masks they copy instead of receiving them, with ``copy_inputs``
    (:mod:`onnxpipe.planning.decoder_recompute`), counted in each phase's partition
    (:func:`counting_copies`)."""
    copies = (
        InputCopies(view, dec, phases, bandwidth_bytes_per_s, seq.classes) if options.copy_inputs else None
    )
    made = decoder_stages(view, dec, seq, parts[-1], options, profile, copies=copies)
    return counting_copies(view, made, parts, copies, phases, bandwidth_bytes_per_s)


def decoder_record(
    view: ModelView, dec: DecoderInfo, options: DecoderOptions, profiles: Sequence[tuple[Phase, Profile]]
) -> DecoderRecord:
    """The manifest's ``plan.decoder`` of a plan cut between ``dec``'s layers, balanced for the phase of
    each of ``profiles`` (both: prefill's and decode's), with the shapes each was profiled at."""
    shapes = tuple(PhaseShape(phase, *_tokens_and_past(profile, dec)) for phase, profile in profiles)
    phase = PhaseChoice(profiles[0][0].value) if len(profiles) == 1 else PhaseChoice.BOTH
    context = counted_context(view, dec, options.max_context)
    return DecoderRecord(dec.layers, True, options.ends, context, phase, shapes, io_contract(view, dec))


def decoder_notes(
    view: ModelView, dec: DecoderInfo, stages: tuple[StageSpec, ...], options: DecoderOptions
) -> tuple[str, ...]:
    """What a plan cut between ``dec``'s layers says of them: the decoder found, each stage's layers and
    cache, the pasts a stage reads for their shape only (the model's own notes come from the planner)."""
    notes = [dec.describe()]
    per_stage = ", ".join(
        f"{st.index}: {_layer_range(st.kv_layers)} {st.kv_cache_bytes / 2**20:.1f} MiB" for st in stages
    )
    notes.append(
        f"cuts only between layers ({opt('ends', options.ends)}); KV cache per stage at "
        f"{context_words(view, dec, options.max_context)}: {per_stage}"
    )
    shaped = [(st.index, t) for st in stages for t in foreign_pasts(dec, st)]
    if shaped:
        listed = ", ".join(f"stage {i}: {t}" for i, t in shaped)
        notes.append(
            f"{len(shaped)} past input(s) stay in a stage that holds no cache of their layer, read for their "
            f"shape only (the past length, not made of the stage's own tensors): {listed}; a generating "
            "worker feeds zeros of that shape"
        )
    elif dec.shape_readers:
        notes.append(
            f"{len(dec.shape_readers)} node(s) read a past tensor of another layer for its shape only (the "
            "past length the exporter took from that layer's cache): each stage makes that length of its own "
            "tensors instead, so that it takes only its own layers' cache"
        )
    return tuple(notes)


def _layer_range(owned: tuple[int, ...]) -> str:
    if not owned:
        return "no layers"
    return f"layer {owned[0]}" if len(owned) == 1 else f"layers {owned[0]}-{owned[-1]}"


@dataclass(frozen=True)
class LayerSequences:
    """The fine sequence lined up by layer group, and the groups as coarse items.

    ``seq`` holds one entry per compute node in layer order (its ``allowed`` cuts fall between groups
    only); ``starts[g]`` is where coarse item ``g`` begins in it (``starts[-1]`` is the node count), and
    ``groups[g]`` the layer group of the item (``-1`` before the layers, ``L`` the head).
    """

    seq: Sequences
    starts: tuple[int, ...]
    groups: tuple[int, ...]

    @property
    def coarse_costs(self) -> list[float]:
        c = self.seq.costs
        return [float(sum(c[a:b])) for a, b in itertools.pairwise(self.starts)]

    @property
    def coarse_cut_bytes(self) -> list[int]:
        """What a stage starting at each coarse position receives (one per position ``0 .. n``)."""
        return [self.seq.cut_bytes[a] for a in self.starts]

    def fine_bounds(self, coarse: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.starts[b] for b in coarse)


def layer_sequences(view: ModelView, profile: Profile, dec: DecoderInfo) -> LayerSequences:
    """The compute nodes by layer group, their costs, and the cut bytes with the cache left out."""
    compute = sorted(view.compute_nodes, key=lambda n: (dec.node_layer[n.name], n.position))
    runs = itertools.groupby(range(len(compute)), key=lambda p: dec.node_layer[compute[p].name])
    groups, starts = [], []
    for g, positions in runs:
        groups.append(g)
        starts.append(next(positions))
    starts.append(len(compute))
    boundary = set(starts)
    seq = dataclasses.replace(
        sequences(view, profile, compute, set(view.weights) | set(dec.past_inputs)),
        allowed=tuple(p in boundary for p in range(len(compute) + 1)),
        cuttable=None,
    )
    return LayerSequences(seq, tuple(starts), tuple(groups))


def coarse_allowed(layers: LayerSequences, dec: DecoderInfo, ends: Ends) -> list[bool]:
    """Which coarse boundaries a stage may start at: all of them but those ``ends`` glues together."""
    n = len(layers.groups)
    allowed = [True] * (n + 1)
    if ends == Ends.ATTACHED:
        for g in range(1, n):
            before, here = layers.groups[g - 1], layers.groups[g]
            if (before == -1 and here == 0) or (before == dec.layers - 1 and here == dec.layers):
                allowed[g] = False
    return allowed


def layer_cut_items(
    view: ModelView, profile: Profile, dec: DecoderInfo, ends: Ends, what: str
) -> tuple[LayerSequences, list[bool], Sequences]:
    """The decoder's layer groups, which of their boundaries a stage may start at (``--ends attached``:
    not between the embedding and the first layer, the last layer and the head), and ``layers.seq`` with
    a stage allowed to start only there, for the partitioners that take one sequence with allowed cuts
    (devices, interleaved workers); ``what``: the option those plans come from, for ``--ends own``,
    which they cannot make."""
    refuse_own_ends(ends, what)
    layers = layer_sequences(view, profile, dec)
    coarse = coarse_allowed(layers, dec, ends)
    starts = {p for p, ok in zip(layers.starts, coarse, strict=True) if ok}
    fine = tuple(p in starts for p in range(len(layers.seq.compute) + 1))
    return layers, coarse, dataclasses.replace(layers.seq, allowed=fine)


def refuse_own_ends(ends: Ends, what: str) -> None:
    """``ends="own"`` is planned for a chain of identical workers only: refused with ``what`` (the
    option that asks for another plan: a devices file, workers)."""
    if ends == Ends.OWN:
        raise UsageError(
            f"{opt('ends', Ends.OWN)} with {what}: the embedding and LM head stages of their own are planned "
            f"for a chain of identical workers only; give {opt('ends', Ends.FREE)} or attached"
        )


def with_kv(
    view: ModelView, profile: Profile, dec: DecoderInfo, specs: Sequence[StageSpec], max_context: int
) -> tuple[StageSpec, ...]:
    """``specs`` with each stage's own layers (where their presents are made) and their cache's bytes at
    the context counted (:func:`counted_context`: ``max_context``, or the model's own where smaller) for
    the profiled batch and shapes, and only its own layers' pasts as inputs (:func:`own_cache_only`)."""
    makers = kv_makers(view, dec, profile.input_shapes, counted_context(view, dec, max_context))
    out = []
    for st in specs:
        mine = [makers[n] for n in st.node_names if n in makers]
        owned, nbytes = tuple(sorted({layer for layer, _ in mine})), sum(b for _, b in mine)
        out.append(own_cache_only(view, dec, dataclasses.replace(st, kv_layers=owned, kv_cache_bytes=nbytes)))
    return tuple(out)


def context_words(view: ModelView, dec: DecoderInfo, max_context: int) -> str:
    """ "N tokens of context", saying where the model's own context made N smaller than ``max_context``."""
    own = own_context(view, dec)
    if own is None or own.tokens >= max_context:
        return f"{max_context} tokens of context"
    under = opt("max_context", max_context)
    return f"{own.tokens} tokens of context (the model's own, from {own.source}, under {under})"


def kv_makers(
    view: ModelView, dec: DecoderInfo, shapes: Mapping[str, Sequence[int]], context: int
) -> dict[str, tuple[int, int]]:
    """For each node that makes a layer's present key: the layer, and its cache's bytes at ``context``
    tokens for the batch and the head dims of ``shapes`` (the profiled input shapes).  Where that node
    runs, the layer's cache is held.  An encoder-decoder's cross-attention cache counts at the encoder's
    frames (its present's length), not the context: it holds the encoder's output, whatever the tokens."""
    batch = cache_batch(view, dec.kv[0], dec.ids_input, shapes)
    symbol = batch_symbol(view, dec.ids_input)
    makers: dict[str, tuple[int, int]] = {}
    for p in dec.kv:
        pos = view.producer.get(p.present_key)
        if pos is None:
            continue
        frames = (view.tensor(p.present_key).shape or (None, None))[-2]
        length = frames if p.cross and isinstance(frames, int) else context
        makers[view.nodes[pos].name] = (p.layer, kv_bytes_per_token(view, p, batch, shapes, symbol) * length)
    return makers


def own_cache_only(view: ModelView, dec: DecoderInfo, stage: StageSpec) -> StageSpec:
    """``stage`` reading no other layer's cache: each ``Shape`` of another layer's past (the past length
    torch's exporter reads off one layer's cache, :attr:`DecoderInfo.shape_readers`) is made of the
    dims of tensors the stage has (its own layers' pasts, the mask), and that past leaves its inputs.

    Why: a worker holds only its own layers' cache, and ONNX Runtime GenAI's ``decoder-pipeline`` feeds
    each stage only its own layers' past.  A past that some node reads otherwise, or whose dims are not
    found so, stays an input (:func:`foreign_pasts` names it).
    """
    layer_of = dec.layer_of_tensor()
    owned = set(stage.kv_layers)
    pasts = set(dec.past_inputs)
    foreign = [t for t in stage.inputs if t in pasts and layer_of[t] not in owned]
    if not foreign:
        return stage
    have = {t for t in stage.inputs if t not in foreign}
    have |= {t for t in view.inputs if t not in pasts or layer_of[t] in owned}
    by_name = {n.name: n for n in view.nodes}
    file_nodes = [by_name[n] for n in (*stage.recomputed_nodes, *stage.file_node_names)]
    sources = dict(stage.shape_sources)
    dropped: list[str] = []
    for t in foreign:
        readers = [n for n in file_nodes if t in n.reads]
        found: dict[str, ShapeParts] = {}
        for n in readers:
            parts = shape_from_dims(view, n, have) if n.op_type == "Shape" else None
            if parts is None:
                break
            found[n.name] = parts
        else:
            sources.update(found)
            dropped.append(t)
    if not dropped:
        return stage
    used = [d[0] for parts in sources.values() for d in parts if isinstance(d, tuple)]
    inputs = [t for t in stage.inputs if t not in dropped]
    inputs += [t for t in dict.fromkeys(used) if t not in inputs]
    return dataclasses.replace(stage, inputs=tuple(inputs), shape_sources=tuple(sorted(sources.items())))


def foreign_pasts(dec: DecoderInfo, stage: StageSpec) -> tuple[str, ...]:
    """Past inputs of ``stage`` from layers whose cache it does not hold (none after
    :func:`own_cache_only`, on every exporter seen)."""
    layer_of = dec.layer_of_tensor()
    owned = set(stage.kv_layers)
    return tuple(t for t in stage.inputs if t in layer_of and layer_of[t] not in owned)
