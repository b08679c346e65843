"""Plans on identical workers: one stage each, or K stages dealt out to fewer workers in turn.

:func:`make_plan` partitions into K stages, one per worker; :func:`make_interleaved_plan` deals K stages
out to fewer workers in turn.  Both line up the compute nodes (:mod:`onnxpipe.planning.sequences`), ask
:mod:`onnxpipe.partition` for the optimal bounds, and turn the bounds back into named stages
(:mod:`onnxpipe.planning.stages`); plans for a cluster of other devices are
:mod:`onnxpipe.planning.cluster`'s, and
:func:`onnxpipe.planning.planner.plan` chooses between them.

Cheap constant producers (see :mod:`onnxpipe.ir.model`) are left out of the sequence; each stage that
reads one gets its own copy (``constant_nodes``), so their values never cross a cut.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from onnxpipe import partition as _partition
from onnxpipe.core.errors import PartitionError
from onnxpipe.core.options import opt
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.partition.interleave import InterleavedPartition, evaluate_interleaved, solve_interleaved
from onnxpipe.planning.decoder import fine_allowed, layer_cut_items
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import (
    decoder_notes,
    decoder_summary,
    interleaved_decoder_stages,
    profile_phase,
)
from onnxpipe.planning.fused import keeping_fused_groups
from onnxpipe.planning.request import DEFAULT_TIME_SLACK
from onnxpipe.planning.sequences import Sequences, first_reader_param_bytes, sequences
from onnxpipe.planning.stages import plan_from, specs_from_bounds
from onnxpipe.planning.types import Plan
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES


def make_plan(
    view: ModelView,
    profile: Profile,
    k: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
) -> Plan:
    """Partition ``view`` into ``k`` stages that minimize the slowest stage, exactly.

    Stages run on identical workers; a received byte costs ``1 / bandwidth_bytes_per_s`` seconds on top
    of the stage's compute.  ``microbatches`` only sets the length of the simulated streaming timeline.
    For a cluster of different devices, memory limits and training schedules see
    :func:`onnxpipe.planning.cluster.plan_pipeline`.

    Fused groups reported by the profiler are kept whole when that still leaves ``k`` stages possible;
    otherwise the constraint is dropped and a note says so.
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
    notes: list[str] = []
    part = keeping_fused_groups(
        lambda allowed: _partition.solve(
            seq.costs, k, cut_bytes=seq.cut_bytes, bandwidth=bandwidth_bytes_per_s, allowed_cuts=allowed
        ),
        seq.allowed,
        notes,
    )

    stages = specs_from_bounds(view, seq, part.bounds, part.compute, part.transfer)
    timeline = stream([s.cost_seconds for s in stages], microbatches)
    return plan_from(
        view, profile, part, stages, seq.sizes, bandwidth_bytes_per_s, notes=tuple(notes), timeline=timeline
    )


def make_interleaved_plan(
    view: ModelView,
    profile: Profile,
    k: int,
    workers: int,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
    time_slack: float = DEFAULT_TIME_SLACK,
    decoder: DecoderInfo | None = None,
    decoder_options: DecoderOptions | None = None,
) -> Plan:
    """Partition ``view`` into ``k`` stages dealt out to ``workers`` identical workers in turn (stage ``s``
    on worker ``s % workers``), exactly: the busiest worker as fast as possible, then, among splits at most
    ``time_slack`` slower, the least weight memory on any worker (:mod:`onnxpipe.partition.interleave`).

    For models whose weights are not spread like their time (CNNs hold most weights in their last
    layers), this gives every worker about ``1/workers`` of both.  Weights count once, at their first
    reader.  With ``decoder`` (a decoder LLM, layer cuts on) the stages start only between layers, as
    ``decoder_options.ends`` allows, each holding its own layers' KV cache as state: the same exact
    search over the coarser cut positions.
    """
    profile.check_matches(view)
    name = view.label
    if workers < 1 or k % workers or k == workers:
        raise PartitionError(
            f"{name}: {opt('workers', workers)} must divide {opt('stages', k)} into two or more stages per "
            f"worker (for example {opt('stages', 2 * max(workers, 1))} {opt('workers', max(workers, 1))})"
        )
    options = decoder_options or DecoderOptions()
    notes: list[str] = []
    if decoder is None:
        seq = sequences(view, profile)
        item_mem = first_reader_param_bytes(view)
        costs, cuts, mems = list(seq.costs), list(seq.cut_bytes), item_mem
    else:  # the layer groups as items: the same exact search over far fewer cut positions
        layers, coarse_ok = layer_cut_items(view, profile, decoder, options.ends, opt("workers"))
        seq = fine_allowed(layers, coarse_ok)
        item_mem = first_reader_param_bytes(view, seq.compute)
        costs, cuts = layers.coarse_costs, layers.coarse_cut_bytes
        mems = [float(sum(item_mem[a:b])) for a, b in itertools.pairwise(layers.starts)]

    def solve(allowed: Sequence[bool] | None) -> InterleavedPartition:
        return solve_interleaved(
            costs,
            workers,
            k // workers,
            item_mem=mems,
            cut_bytes=cuts,
            bandwidth=bandwidth_bytes_per_s,
            allowed_cuts=allowed,
            time_slack=time_slack,
        )

    try:
        if decoder is None:
            part = keeping_fused_groups(solve, seq.allowed, notes)
        else:
            coarse = solve(coarse_ok)
            part = replace(coarse, bounds=layers.fine_bounds(coarse.bounds))
    except PartitionError as e:
        raise PartitionError(f"{name}: {e}") from e
    summary, copied = None, None
    if decoder is None:
        specs = specs_from_bounds(view, seq, part.bounds, part.compute, part.transfer)
    else:
        specs, part, copied = interleaved_decoder_stages(
            view, decoder, seq, part, options, profile, bandwidth_bytes_per_s
        )
        summary = decoder_summary(view, profile, decoder, options, profile_phase(profile, decoder))
    stages = tuple(replace(st, worker=part.workers[st.index]) for st in specs)
    mem = ", ".join(f"{m / 2**20:.1f}" for m in part.worker_memory)
    slower = part.bottleneck / part.fastest - 1 if part.fastest > 0 else 0.0  # all-zero costs: all tie
    notes.append(
        f"{k} stages interleaved on {workers} workers (stage s on worker s % {workers}); weights per worker "
        f"{mem} MiB; busiest worker {slower:.2%} slower than the fastest split"
    )
    if decoder is not None:
        kv = ", ".join(
            f"{sum(st.kv_cache_bytes for st in stages if st.worker == w) / 2**20:.1f}" for w in range(workers)
        )
        notes.extend(decoder_notes(view, decoder, stages, options))
        notes.append(
            f"balanced for the {profile_phase(profile, decoder)} profile; KV cache per worker at "
            f"{options.max_context} tokens of context: {kv} MiB"
        )
        if copied:
            notes.append(copied)
    notes.append(_contiguous_comparison(seq, item_mem, workers, bandwidth_bytes_per_s))
    timeline = stream([s.cost_seconds for s in stages], microbatches, workers=part.workers)
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
        tensor_bytes=seq.sizes,
        objective=(
            "minimize the busiest worker's time (compute + transfer in of its stages); then, within "
            "time_slack of it, the largest weight memory of a worker"
        ),
        notes=tuple(notes),
        timeline=timeline,
        workers=workers,
        time_slack=time_slack,
        decoder=summary,
    )


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
