"""Profiles of a decoder at each phase's shapes: a prompt (prefill) and a generation step (decode).

:mod:`onnxpipe.planning.decoder_plan` balances the layer cuts for both; each phase's profile is an ordinary
profile taken at that phase's sizes (:mod:`onnxpipe.ir.decoder_dims`).  The user's ``--shape`` values
for the decoder's own inputs (tokens, mask, positions, cache) would pin both phases to one size, so on
the axes a phase sets (new tokens, cached tokens, total) they give way to the phase's; their other dims
(the batch, a head size the exporter left symbolic, as GenAI's builder names ``kv_cache_dim``) are kept,
as are the shapes of any other input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from onnxpipe.core.choices import Phase
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.decoder_dims import decoder_inputs, decoder_roles, decoder_symbol_sizes, expression_size
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes


def phase_profiles(
    view: ModelView, options: ProfileOptions, shapes: Sequence[PhaseShape], *, progress: bool = False
) -> dict[Phase, Profile]:
    """One profile per phase in ``shapes``, measured (or counted) as ``options`` says."""
    own = decoder_inputs(view)
    kept = {n: s for n, s in options.shapes.items() if n not in own}
    out: dict[Phase, Profile] = {}
    for shape in shapes:
        given = dict(kept) | phase_overrides(view, options.shapes, shape)
        sized = resolve_input_shapes(view, given, phase=shape)
        what = f"{shape.describe()} phase" if progress else False
        out[shape.phase] = get_profile(view, dataclasses.replace(options, shapes=sized), progress=what)
    return out


def phase_overrides(
    view: ModelView, overrides: Mapping[str, Sequence[int]], shape: PhaseShape
) -> dict[str, tuple[int, ...]]:
    """The user's shapes of the decoder's own inputs with the axes ``shape`` sets replaced by its sizes
    (a symbol of the new, cached or total tokens, or a sum of them); the other dims as given."""
    roles = decoder_roles(view)
    own = decoder_inputs(view)
    if roles is None:
        return {}
    phase_symbols = {s for s in (roles.sequence, roles.past, roles.total) if s}
    sizes = decoder_symbol_sizes(view, {}, shape)
    out: dict[str, tuple[int, ...]] = {}
    for name, given in overrides.items():
        declared = view.tensor(name).shape
        if name not in own or declared is None or len(declared) != len(given):
            continue
        dims: list[int] = []
        for d, g in zip(declared, given, strict=True):
            if isinstance(d, str) and d in phase_symbols:
                dims.append(sizes[d])
            elif isinstance(d, str) and (total := expression_size(d, sizes)) is not None:
                dims.append(total)
            else:
                dims.append(int(g))
        out[name] = tuple(dims)
    return out
