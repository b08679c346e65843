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

from onnxpipe.core.choices import Phase, PhaseChoice
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import decoder_notes, decoder_record, phase_shape_of, split_layers
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
    profiles = ((Phase.PREFILL, prefill), (Phase.DECODE, decode))
    costed, seq = split_layers(view, profiles, k, dec, options, bandwidth_bytes_per_s)
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
    return plan_from(
        view,
        decode,
        part_d,
        costed.stages,
        seq.sizes,
        bandwidth_bytes_per_s,
        notes=notes,
        timeline=stream([s.cost_seconds for s in costed.stages], microbatches),
        objective=OBJECTIVE,
        decoder=decoder_record(view, dec, options, PhaseChoice.BOTH, shapes),
    )


def _ratio(value: float, bound: float) -> str:
    return f"{value / bound:.3f}x" if bound > 0 else "1.000x"
