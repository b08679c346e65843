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

from onnxpipe.core.choices import Phase
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import layer_plan
from onnxpipe.planning.types import Plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES


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
    profiles = [(Phase.PREFILL, prefill), (Phase.DECODE, decode)]
    return layer_plan(view, profiles, k, dec, options, bandwidth_bytes_per_s, microbatches)
