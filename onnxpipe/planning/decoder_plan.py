"""The plan of a decoder on identical workers: cuts between layers only, found exactly on the layers.

:func:`layer_plan` partitions the coarse sequence of :mod:`onnxpipe.planning.decoder` (one item per
layer group) with :func:`onnxpipe.partition.solve`, maps the bounds back to compute positions, scores
them there with :func:`onnxpipe.partition.evaluate` (the same cost formula), and adds each stage's KV
layers and cache bytes.  Fused groups are not consulted: a cut between two layers splits none that
matters, and keeping the cache whole is not optional.

Given a profile at each phase (a prompt, prefill; a generation step, decode), which spread their time
differently over the layers, the cuts minimise exactly the larger of the two phases' bottlenecks, each
relative to that phase's own best split (:func:`onnxpipe.partition.phases.solve_two_phases`), so that
neither phase pays much for the other; both phases' estimates are kept per stage, and the plan reports
the decode ones (generation is where the steady state of a pipeline lies).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from onnxpipe import partition as _partition
from onnxpipe.core.choices import Ends, Phase, PhaseChoice
from onnxpipe.core.errors import PartitionError
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.decoder_dims import counted_context
from onnxpipe.ir.model import ModelView
from onnxpipe.partition.interleave import InterleavedPartition
from onnxpipe.partition.phases import solve_two_phases
from onnxpipe.partition.result import Partition
from onnxpipe.planning.decoder import (
    LayerSequences,
    coarse_allowed,
    context_words,
    foreign_pasts,
    io_contract,
    layer_sequences,
    with_kv,
)
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_recompute import Counted, InputCopies, PhaseCosts, counting_copies, priced_cuts
from onnxpipe.planning.records import DecoderRecord, PhaseShape
from onnxpipe.planning.sequences import Sequences
from onnxpipe.planning.stages import StageOptions, assign_stages, plan_from
from onnxpipe.planning.types import Plan, StageSpec
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
