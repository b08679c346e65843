"""Profiles of a decoder at each phase's shapes: a prompt (prefill) and a generation step (decode).

:mod:`onnxpipe.plan.phases` balances the layer cuts for both; each phase's profile is an ordinary
profile taken at that phase's sizes (:mod:`onnxpipe.ir.decoder_shapes`).  The user's ``--shape`` values
for the decoder's own inputs (tokens, mask, positions, cache) would pin both phases to one size, so they
give way to the phase's; those for any other input are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import ProfileOptions, get_profile
from onnxpipe.ir.decoder_kinds import Phase, PhaseShape
from onnxpipe.ir.decoder_shapes import decoder_inputs
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes


def phase_profiles(
    view: ModelView, options: ProfileOptions, shapes: Sequence[PhaseShape]
) -> dict[Phase, Profile]:
    """One profile per phase in ``shapes``, measured (or counted) as ``options`` says."""
    own = decoder_inputs(view)
    kept = {n: s for n, s in options.shapes.items() if n not in own}
    out: dict[Phase, Profile] = {}
    for shape in shapes:
        sized = resolve_input_shapes(view, kept, phase=shape)
        out[shape.phase] = get_profile(view, dataclasses.replace(options, shapes=sized))
    return out
