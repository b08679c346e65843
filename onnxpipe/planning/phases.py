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

import math
from collections.abc import Sequence
from dataclasses import dataclass

from onnxpipe.core.choices import Phase, PhaseChoice
from onnxpipe.core.errors import PartitionError
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.partition import evaluate
from onnxpipe.partition.phases import solve_two_phases
from onnxpipe.planning.decoder import LayerSequences, layer_sequences
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import (
    CoarseSolver,
    coarse_bounds,
    decoder_notes,
    decoder_record,
    decoder_stages,
    input_copies,
    named,
    phase_shape_of,
)
from onnxpipe.planning.decoder_recompute import Counted, PhaseCosts, counting_copies, priced_cuts
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
    both = _Phases.of(view, prefill, decode, dec, options, bandwidth_bytes_per_s)
    try:
        fine = both.ld.fine_bounds(coarse_bounds(both.ld, dec, k, options.ends, both.solver()))
    except PartitionError as e:
        raise named(view, e) from e
    costed = _costed_stages(both, fine)
    shapes = (phase_shape_of(prefill, dec, Phase.PREFILL), phase_shape_of(decode, dec, Phase.DECODE))
    part_p, part_d = costed.parts
    notes = (
        *decoder_notes(view, dec, costed.stages, options),
        f"balanced for both phases: prefill bottleneck {part_p.bottleneck * 1e3:.3f} ms "
        f"({_ratio(part_p.bottleneck, part_p.lower_bound)} its lower bound), decode "
        f"{part_d.bottleneck * 1e3:.3f} ms ({_ratio(part_d.bottleneck, part_d.lower_bound)} its lower "
        "bound); "
        f"profiled at {shapes[0][1]} prompt token(s) and at 1 token after {shapes[1][2]} cached",
        *([costed.note] if costed.note else []),
    )
    timeline = stream([s.cost_seconds for s in costed.stages], microbatches)
    sizes = both.ld.seq.sizes
    return plan_from(
        view,
        decode,
        part_d,
        costed.stages,
        sizes,
        bandwidth_bytes_per_s,
        notes=notes,
        timeline=timeline,
        objective=OBJECTIVE,
        decoder=decoder_record(view, dec, options, PhaseChoice.BOTH, shapes),
    )


@dataclass(frozen=True)
class _Phases:
    """The decoder's layers lined up for each phase's profile, and the cut costs the solver weighs."""

    view: ModelView
    dec: DecoderInfo
    prefill: Profile
    decode: Profile
    options: DecoderOptions
    bandwidth_bytes_per_s: float
    lp: LayerSequences
    ld: LayerSequences
    cut_a: list[float]
    """What a stage starting at each coarse position receives at prefill (priced with the copies it
    would make instead, with ``copy_inputs``); ``cut_b`` the same at decode."""
    cut_b: list[float]

    @staticmethod
    def of(
        view: ModelView,
        prefill: Profile,
        decode: Profile,
        dec: DecoderInfo,
        options: DecoderOptions,
        bandwidth_bytes_per_s: float,
    ) -> _Phases:
        prefill.check_matches(view)
        decode.check_matches(view)
        lp = layer_sequences(view, prefill, dec)
        ld = layer_sequences(view, decode, dec)
        if lp.starts != ld.starts:  # the order depends on the graph alone: a bug if not
            raise PartitionError("the prefill and decode profiles line the layers up differently")
        if options.copy_inputs:  # the cuts chosen knowing what stages will copy (decoder_recompute)
            fine_a, fine_b = priced_cuts(
                view,
                dec,
                [lp.seq, ld.seq],
                [prefill.node_seconds, decode.node_seconds],
                bandwidth_bytes_per_s,
            )
        else:
            fine_a, fine_b = [float(x) for x in lp.seq.cut_bytes], [float(x) for x in ld.seq.cut_bytes]
        cut_a = [fine_a[a] for a in lp.starts]
        cut_b = [fine_b[a] for a in ld.starts]
        return _Phases(view, dec, prefill, decode, options, bandwidth_bytes_per_s, lp, ld, cut_a, cut_b)

    def solver(self) -> CoarseSolver:
        """The exact two-phase split of a run of coarse items (:func:`coarse_bounds` asks for each)."""
        ca, cb = self.lp.coarse_costs, self.ld.coarse_costs

        def solve(lo: int, hi: int, kk: int, allowed: Sequence[bool]) -> tuple[int, ...]:
            return solve_two_phases(
                ca[lo:hi],
                cb[lo:hi],
                kk,
                cut_a=self.cut_a[lo : hi + 1],
                cut_b=self.cut_b[lo : hi + 1],
                bandwidth=self.bandwidth_bytes_per_s,
                allowed_cuts=allowed,
            ).bounds

        return solve


def _costed_stages(both: _Phases, fine: Sequence[int]) -> Counted:
    """The stages at ``fine``, each with its decode cost and both phases' (the copies' costs added)."""
    view, dec, lp, ld, bandwidth = both.view, both.dec, both.lp, both.ld, both.bandwidth_bytes_per_s
    part_p = evaluate(lp.seq.costs, fine, cut_bytes=lp.seq.cut_bytes, bandwidth=bandwidth)
    part_d = evaluate(ld.seq.costs, fine, cut_bytes=ld.seq.cut_bytes, bandwidth=bandwidth)
    phases = (
        PhaseCosts(Phase.PREFILL, both.prefill.node_seconds, lp.seq.sizes, part_p.compute),
        PhaseCosts(Phase.DECODE, both.decode.node_seconds, ld.seq.sizes, part_d.compute),
    )
    copies = input_copies(view, dec, phases, bandwidth, ld.seq, both.options)
    made = decoder_stages(view, dec, ld, part_d, both.options, both.decode, copies=copies)
    return counting_copies(view, made, [part_p, part_d], copies, phases, bandwidth)


def _ratio(value: float, bound: float) -> str:
    return f"{value / bound:.3f}x" if bound > 0 else "1.000x"
