"""One plan for both phases of a decoder: layer cuts balanced for the prompt and for each new token.

A prompt (prefill: many tokens, no cache) and a generation step (decode: one token over a long cache)
spread their time differently over the layers: attention over the cache weighs more at decode, the
projections at prefill, the LM head differently again.  A split balanced for one phase is off balance at
the other.  Given a profile at each shape, :func:`make_two_phase_plan` chooses the layer cuts that
minimise, exactly, the larger of the two phases' bottlenecks each relative to that phase's own best
split (:func:`onnxpipe.partition.phases.solve_two_phases`)::

    minimise  max( prefill bottleneck / best prefill bottleneck,  decode bottleneck / best decode bottleneck )

so neither phase pays much for the other; both phases' estimates are kept per stage.  The stage times
the plan reports (``compute_seconds``, the bottleneck) are the decode ones: generation is where the
steady state of a pipeline lies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from onnxpipe.core.choices import Phase, PhaseChoice
from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest.entries import DecoderRecord
from onnxpipe.partition import evaluate
from onnxpipe.partition.phases import solve_two_phases
from onnxpipe.planning.decoder import decoder_io, layer_sequences
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import coarse_bounds, decoder_notes, decoder_stages, named, phase_shape_of
from onnxpipe.planning.decoder_recompute import (
    InputCopies,
    PhaseCosts,
    adjusted,
    copies_note,
    gone_bytes,
    priced_cuts,
    with_copy_costs,
)
from onnxpipe.planning.stages import plan_from
from onnxpipe.planning.types import Plan
from onnxpipe.schedule.simulate import stream
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES

OBJECTIVE = (
    "minimize the larger of the prefill and decode bottlenecks, each relative to its phase's own best "
    "layer-aligned split (stage times: compute + transfer in; reported at decode)"
)


def make_two_phase_plan(
    view: ModelView,
    prefill: Profile,
    decode: Profile,
    k: int,
    dec: DecoderInfo,
    options: DecoderOptions,
    *,
    bandwidth_bytes_per_s: float = math.inf,
    microbatches: int = DEFAULT_MICROBATCHES,
) -> Plan:
    """The layer-aligned ``k``-stage split of ``view`` balanced for both phases (see the module)."""
    prefill.check_matches(view)
    decode.check_matches(view)
    lp = layer_sequences(view, prefill, dec)
    ld = layer_sequences(view, decode, dec)
    if lp.starts != ld.starts:  # the order depends on the graph alone: a bug if not
        raise PartitionError("the prefill and decode profiles line the layers up differently")
    ca, cb = lp.coarse_costs, ld.coarse_costs
    if options.copy_inputs:  # the cuts chosen knowing what stages will copy (decoder_recompute)
        fine_a, fine_b = priced_cuts(
            view, dec, [lp.seq, ld.seq], [prefill.node_seconds, decode.node_seconds], bandwidth_bytes_per_s
        )
    else:
        fine_a, fine_b = [float(x) for x in lp.seq.cut_bytes], [float(x) for x in ld.seq.cut_bytes]
    cut_a = [fine_a[a] for a in lp.starts]
    cut_b = [fine_b[a] for a in ld.starts]

    def solve(lo: int, hi: int, kk: int, allowed: Sequence[bool]) -> tuple[int, ...]:
        return solve_two_phases(
            ca[lo:hi],
            cb[lo:hi],
            kk,
            cut_a=cut_a[lo : hi + 1],
            cut_b=cut_b[lo : hi + 1],
            bandwidth=bandwidth_bytes_per_s,
            allowed_cuts=allowed,
        ).bounds

    try:
        fine = ld.fine_bounds(coarse_bounds(ld, dec, k, options.ends, solve))
    except PartitionError as e:
        raise named(view, e) from e
    part_p = evaluate(lp.seq.costs, fine, cut_bytes=lp.seq.cut_bytes, bandwidth=bandwidth_bytes_per_s)
    part_d = evaluate(ld.seq.costs, fine, cut_bytes=ld.seq.cut_bytes, bandwidth=bandwidth_bytes_per_s)
    phases = (
        PhaseCosts(Phase.PREFILL, prefill.node_seconds, lp.seq.sizes, part_p.compute),
        PhaseCosts(Phase.DECODE, decode.node_seconds, ld.seq.sizes, part_d.compute),
    )
    copies = (
        InputCopies(view, dec, phases, bandwidth_bytes_per_s, ld.seq.classes) if options.copy_inputs else None
    )
    made = decoder_stages(view, dec, ld, part_d, options, decode, copies=copies)
    chosen = copies.chosen if copies is not None else {}
    gone_p = gone_bytes(view, made, chosen, lp.seq.sizes)
    gone_d = gone_bytes(view, made, chosen, ld.seq.sizes)
    part_p = adjusted(part_p, chosen, gone_p, 0, bandwidth_bytes_per_s)
    part_d = adjusted(part_d, chosen, gone_d, 1, bandwidth_bytes_per_s)
    stages = tuple(
        dataclasses.replace(st, phase_seconds=((Phase.PREFILL, p), (Phase.DECODE, d)))
        for st, p, d in zip(
            with_copy_costs(made, part_d, gone_d), part_p.stage_costs, part_d.stage_costs, strict=True
        )
    )
    copied = copies_note(chosen, phases, [gone_p, gone_d])
    shapes = (phase_shape_of(prefill, dec, Phase.PREFILL), phase_shape_of(decode, dec, Phase.DECODE))
    notes = (
        *decoder_notes(view, dec, stages, options),
        f"balanced for both phases: prefill bottleneck {part_p.bottleneck * 1e3:.3f} ms "
        f"({_ratio(part_p.bottleneck, part_p.lower_bound)} its lower bound), decode "
        f"{part_d.bottleneck * 1e3:.3f} ms ({_ratio(part_d.bottleneck, part_d.lower_bound)} its lower "
        "bound); "
        f"profiled at {shapes[0][1]} prompt token(s) and at 1 token after {shapes[1][2]} cached",
        *([copied] if copied else []),
    )
    timeline = stream([s.cost_seconds for s in stages], microbatches)
    plan = plan_from(
        view, decode, part_d, stages, ld.seq.sizes, bandwidth_bytes_per_s, notes=notes, timeline=timeline
    )
    summary = DecoderRecord(
        dec.layers, True, options.ends, options.max_context, PhaseChoice.BOTH, shapes, decoder_io(view, dec)
    )
    return dataclasses.replace(plan, objective=OBJECTIVE, decoder=summary)


def _ratio(value: float, bound: float) -> str:
    return f"{value / bound:.3f}x" if bound > 0 else "1.000x"
