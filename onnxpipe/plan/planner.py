"""The one entry to planning: a :class:`~onnxpipe.plan.request.PlanRequest` in, a plan out.

A streaming plan on copies of this machine in a fixed order goes to :mod:`onnxpipe.plan.workers` (one
stage per worker, or interleaved); anything else (a devices file, a free device order, a training
schedule, ``--stages auto``) to :func:`onnxpipe.plan.cluster.plan_pipeline`.  A decoder with a KV cache
on identical workers is cut between its layers only (:mod:`onnxpipe.plan.decoder_plan`).  All are exact.
"""

from __future__ import annotations

from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.cluster import plan_pipeline
from onnxpipe.plan.decoder_plan import make_decoder_plan
from onnxpipe.plan.request import DEFAULT_TIME_SLACK, PlanRequest
from onnxpipe.plan.types import Plan
from onnxpipe.plan.workers import make_interleaved_plan, make_plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES


def plan(view: ModelView, profile: Profile, request: PlanRequest) -> Plan:
    """The plan ``request`` asks for, from ``profile``'s costs of ``view`` (checked first)."""
    request.check()
    dec = find_decoder(view) if request.decoder.layer_cuts else None
    if dec is not None and request.on_identical_workers and not request.interleaved:
        assert isinstance(request.stages, int)  # on_identical_workers
        return make_decoder_plan(
            view,
            profile,
            request.stages,
            dec,
            request.decoder,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.microbatches or DEFAULT_MICROBATCHES,
        )
    if not request.on_identical_workers or not isinstance(request.stages, int):
        return plan_pipeline(view, profile, request)
    microbatches = request.schedule.microbatches or DEFAULT_MICROBATCHES
    if request.workers is not None and request.interleaved:
        return make_interleaved_plan(
            view,
            profile,
            request.stages,
            request.workers,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=microbatches,
            time_slack=DEFAULT_TIME_SLACK if request.time_slack is None else request.time_slack,
        )
    return make_plan(
        view,
        profile,
        request.stages,
        bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
        microbatches=microbatches,
    )
