"""The one entry to planning: a :class:`~onnxpipe.plan.request.PlanRequest` in, a plan out.

A streaming plan on copies of this machine in a fixed order goes to :mod:`onnxpipe.plan.workers` (one
stage per worker, or interleaved); anything else (a devices file, a free device order, a training
schedule, ``--stages auto``) to :func:`onnxpipe.plan.cluster.plan_pipeline`.  Both are exact.
"""

from __future__ import annotations

from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.cluster import plan_pipeline
from onnxpipe.plan.nodesplit import Planned, plan_splitting_nodes
from onnxpipe.plan.request import DEFAULT_TIME_SLACK, PlanRequest, SplitNodes
from onnxpipe.plan.types import Plan
from onnxpipe.plan.workers import make_interleaved_plan, make_plan
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES


def plan(view: ModelView, profile: Profile, request: PlanRequest) -> Plan:
    """The plan ``request`` asks for, from ``profile``'s costs of ``view`` (checked first).

    With ``split_nodes="auto"`` its stages may name the parts of a cut node: :func:`planned` also gives
    the view that holds them, which is what the exporter needs.
    """
    return planned(view, profile, request).plan


def planned(view: ModelView, profile: Profile, request: PlanRequest) -> Planned:
    """:func:`plan`'s plan with the view (and profile) its stages are made of."""
    request.check()
    if request.split_nodes == SplitNodes.AUTO:
        assert isinstance(request.stages, int)  # check() refused the rest
        return plan_splitting_nodes(
            view,
            profile,
            request.stages,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.microbatches or DEFAULT_MICROBATCHES,
        )
    return Planned(_plan(view, profile, request), view, profile)


def _plan(view: ModelView, profile: Profile, request: PlanRequest) -> Plan:
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
