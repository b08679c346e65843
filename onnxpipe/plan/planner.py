"""The one entry to planning: a :class:`~onnxpipe.plan.request.PlanRequest` in, a plan out.

A streaming plan on copies of this machine in a fixed order goes to :mod:`onnxpipe.plan.workers` (one
stage per worker, or interleaved); anything else (a devices file, a free device order, a training
schedule, ``--stages auto``) to :func:`onnxpipe.plan.cluster.plan_pipeline`.  A decoder with a KV cache
on identical workers is cut between its layers only (:mod:`onnxpipe.plan.decoder_plan`).  All are exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_kinds import Phase
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.cluster import plan_pipeline
from onnxpipe.plan.decoder_plan import make_decoder_plan, profile_phase
from onnxpipe.plan.phases import make_two_phase_plan
from onnxpipe.plan.request import DEFAULT_TIME_SLACK, PlanRequest
from onnxpipe.plan.types import Plan
from onnxpipe.plan.workers import make_interleaved_plan, make_plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES


def plan(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    *,
    phase_profiles: Mapping[Phase, Profile] | None = None,
) -> Plan:
    """The plan ``request`` asks for, from ``profile``'s costs of ``view`` (checked first).

    ``phase_profiles``: a decoder's profiles at the prefill and decode shapes
    (:func:`onnxpipe.cost.phases.phase_profiles`); with both, the layer cuts are balanced for both
    phases (:mod:`onnxpipe.plan.phases`).
    """
    request.check()
    made = _plan(view, profile, request, phase_profiles)
    missing = tuple(n for n in view.notes if n not in made.notes)  # what loading accepted with a remark
    return dataclasses.replace(made, notes=(*missing, *made.notes)) if missing else made


def _plan(
    view: ModelView, profile: Profile, request: PlanRequest, phase_profiles: Mapping[Phase, Profile] | None
) -> Plan:
    dec = find_decoder(view) if request.decoder.layer_cuts else None
    if dec is not None and request.on_identical_workers and not request.interleaved:
        assert isinstance(request.stages, int)  # on_identical_workers
        phases = phase_profiles or {}
        if Phase.PREFILL in phases and Phase.DECODE in phases:
            return make_two_phase_plan(
                view,
                phases[Phase.PREFILL],
                phases[Phase.DECODE],
                request.stages,
                dec,
                request.decoder,
                bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
                microbatches=request.schedule.microbatches or DEFAULT_MICROBATCHES,
            )
        return make_decoder_plan(
            view,
            profile,
            request.stages,
            dec,
            request.decoder,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.microbatches or DEFAULT_MICROBATCHES,
            phase=profile_phase(profile, dec),
        )
    if not request.on_identical_workers or not isinstance(request.stages, int):
        return plan_pipeline(view, profile, request)
    microbatches = request.schedule.microbatches or DEFAULT_MICROBATCHES
    if request.workers is not None and request.interleaved:
        interleaved = make_interleaved_plan(
            view,
            profile,
            request.stages,
            request.workers,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=microbatches,
            time_slack=DEFAULT_TIME_SLACK if request.time_slack is None else request.time_slack,
        )
        if dec is None:
            return interleaved
        note = (
            f"{dec.describe()}; an interleaved split cuts anywhere (layer cuts, the KV cache as state and "
            "its memory are planned for one stage per worker): a layer's cache may span two stages"
        )
        return dataclasses.replace(interleaved, notes=(*interleaved.notes, note))
    return make_plan(
        view,
        profile,
        request.stages,
        bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
        microbatches=microbatches,
    )
