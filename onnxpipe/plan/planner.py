"""The one entry to planning: a :class:`~onnxpipe.plan.request.PlanRequest` in, a plan out.

A streaming plan on copies of this machine in a fixed order goes to :mod:`onnxpipe.plan.workers` (one
stage per worker, or interleaved); anything else (a devices file, a free device order, a training
schedule, ``--stages auto``) to :func:`onnxpipe.plan.cluster.plan_pipeline`.  Both are exact.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnxpipe.core.machine import available_cpu_count
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.bound import bound_note, bounding_node
from onnxpipe.plan.cluster import plan_pipeline
from onnxpipe.plan.nodesplit import Planned, plan_splitting_nodes
from onnxpipe.plan.orders import stages_auto
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
        cut = plan_splitting_nodes(
            view,
            profile,
            request.stages,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.microbatches or DEFAULT_MICROBATCHES,
        )
        return dataclasses.replace(
            cut, plan=dataclasses.replace(cut.plan, link_model=request.effective_link_model)
        )
    return Planned(_noted(view, profile, request), view, profile)


def _noted(view: ModelView, profile: Profile, request: PlanRequest) -> Plan:
    """The plan ``request`` asks for, from ``profile``'s costs of ``view`` (checked first), with a note
    when one node bounds it (:mod:`onnxpipe.plan.bound`)."""
    the_plan = dataclasses.replace(_plan(view, profile, request), link_model=request.effective_link_model)
    if request.devices is None and request.schedule.kind == "stream":
        bound = bounding_node(view, profile, the_plan)
        if bound is not None:
            the_plan = dataclasses.replace(the_plan, notes=(*the_plan.notes, bound_note(bound, the_plan.k)))
    return the_plan


@dataclass(frozen=True)
class _Tried:
    plan: Plan

    @property
    def bottleneck(self) -> float:
        return self.plan.bottleneck_seconds


def auto_here(view: ModelView, profile: Profile, request: PlanRequest, cpus: int | None = None) -> Plan:
    """``--stages auto`` without a devices file: the stages run on this machine, ``profile.threads`` each,
    so at most ``cpus // threads`` of them run without sharing CPUs (more would only look faster on
    paper); the fewest of those within ``request.tolerance`` of the best bottleneck.  The plan records
    each count tried (:attr:`Plan.stage_counts_tried`) and why it chose."""
    cpus = available_cpu_count() if cpus is None else cpus
    threads = max(1, profile.threads)
    max_k = max(1, min(cpus // threads, len(view.compute_nodes)))

    def solve_k(k: int) -> _Tried:
        return _Tried(_plan(view, profile, dataclasses.replace(request, stages=k)))

    choice = stages_auto(max_k, solve_k, tolerance=request.tolerance)
    note = (
        f"--stages auto chose {choice.k} of 1..{max_k} (this machine's {cpus} CPU(s) at {threads} "
        f"thread(s) per stage): {choice.reason}"
    )
    chosen = choice.result.plan
    return dataclasses.replace(chosen, notes=(*chosen.notes, note), stage_counts_tried=choice.bottlenecks)


def _plan(view: ModelView, profile: Profile, request: PlanRequest) -> Plan:
    request.check()
    if request.stages == "auto" and request.devices is None:
        return auto_here(view, profile, request)
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
