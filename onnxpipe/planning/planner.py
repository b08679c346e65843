"""The one entry to planning: a :class:`~onnxpipe.planning.request.PlanRequest` in, a plan out.

A streaming plan on copies of this machine in a fixed order goes to :mod:`onnxpipe.planning.workers` (one
stage per worker, or interleaved); anything else (a devices file, a free device order, a training
schedule, ``--stages auto``) to :func:`onnxpipe.planning.cluster.plan_pipeline`.  A decoder with a KV cache
on identical workers is cut between its layers only, balanced for one phase or both
(:mod:`onnxpipe.planning.decoder_plan`).  All are exact.

A tied token embedding and LM head is held once (:func:`keeping_tied`): the first and the last stage on one
worker. Where one table is both the embedding (read by the model's first nodes) and the LM head (its last
ones, :func:`onnxpipe.ir.decoder.tied_tables`), ``K`` stages on ``K`` workers hold it twice, the first
worker and the last: +30% over the whole model's weights for a tied 0.5B int4 model at two stages, the
memory a pipeline exists to save. ``K + 1`` stages dealt out to the same ``K`` workers in turn put the last
stage back on worker 0 with the first, which holds the table once (the interleaved search of
:func:`onnxpipe.planning.workers.make_interleaved_plan`, which balances the workers, not the stages).

For a plain ``stages=K`` (no ``workers``) the planner makes both and keeps the tied layout where the share
of weight memory it saves is at least the share of bottleneck it costs (:func:`worth_it`): one percent of
the pipeline's weights buys one percent of its speed. ``workers=K`` keeps a stage per worker, ``stages=K+1
workers=K`` the tied layout, whatever they cost.

Boundaries compressed on the link (``boundary_dtype``, :func:`plan_with_wire`): which tensors travel
narrower, and what the planner counts for them. Only float32 activations are compressed: the model's inputs
and outputs, weights, values of weights or shapes alone, integers and booleans cross as they are. For a
fixed dtype every float32 activation that crosses a cut is compressed, and the planner plans with their
compressed bytes (:meth:`BoundaryDtype.wire_bytes`: half for float16, a quarter plus a 4-byte scale for
int8), so a cut is placed where the bytes it really sends are few. ``auto`` plans with float32 first, finds
the cuts whose transfer into a stage takes longer than the slowest stage computes (those that bound the
pipeline at their link's rate), and plans again with the tensors entering those stages as float16; without
links of a finite rate it compresses nothing and says so. The exporter writes the casts into the stage files
(:func:`onnxpipe.export.stages.compress_stage`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from onnxpipe.core.choices import BoundaryDtype, Ends, Phase, SplitNodes
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.machine import available_cpu_count
from onnxpipe.core.options import opt
from onnxpipe.core.text import human_bytes
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.ir.decoder import FoundDecoder, decoder_of, tied_tables
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import value_kinds
from onnxpipe.planning.cluster import plan_pipeline
from onnxpipe.planning.decoder_plan import layer_plan, profile_phase
from onnxpipe.planning.nodesplit.plan import Planned, plan_splitting_nodes
from onnxpipe.planning.orders import stages_auto
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.sequences import tensor_sizes
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import make_interleaved_plan, make_plan, worker_weights


def plan(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    *,
    phase_profiles: Mapping[Phase, Profile] | None = None,
    decoder: FoundDecoder | None = None,
) -> Plan:
    """The plan ``request`` asks for, from ``profile``'s costs of ``view`` (checked first).

    With ``split_nodes="auto"`` its stages may name the parts of a cut node: :func:`planned` also gives
    the view that holds them, which is what the exporter needs.  ``phase_profiles``: a decoder's
    profiles at the prefill and decode shapes (:func:`onnxpipe.cost.phases.phase_profiles`); with both,
    the layer cuts are balanced for both phases (:mod:`onnxpipe.planning.decoder_plan`).  ``decoder``: the
    model's decoder as the request's door found it (default: found here).
    """
    return planned(view, profile, request, phase_profiles=phase_profiles, decoder=decoder).plan


def planned(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    *,
    phase_profiles: Mapping[Phase, Profile] | None = None,
    decoder: FoundDecoder | None = None,
) -> Planned:
    """:func:`plan`'s plan with the view (and profile) its stages are made of."""
    if request.split_nodes == SplitNodes.AUTO:
        assert isinstance(request.stages, int)  # the request refused the rest when it was made
        cut = plan_splitting_nodes(
            view,
            profile,
            request.stages,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.stream_microbatches,
        )
        return dataclasses.replace(cut, plan=_finished(cut.plan, view, profile, request, bounded=False))

    def on_the_wire(wire: Mapping[str, BoundaryDtype]) -> Plan:  # compressed boundaries' bytes
        phases = {ph: compressed_profile(view, p, wire) for ph, p in (phase_profiles or {}).items()}
        costs = compressed_profile(view, profile, wire)
        return keeping_tied(view, request, lambda r: _plan(view, costs, r, phases, decoder))

    made = plan_with_wire(view, profile, request, on_the_wire)
    return Planned(_finished(made, view, profile, request, bounded=True), view, profile)


def _finished(made: Plan, view: ModelView, profile: Profile, request: PlanRequest, *, bounded: bool) -> Plan:
    """``made`` as the request has it: its link model; what loading accepted with a remark (an onnxruntime
    op in the default domain) first in its notes; for a streaming plan on this machine, when ``bounded``
    (no node was cut), a note when one node bounds it (:func:`bound_note`); and for a
    measured profile of this machine, its median whole run as the speed the estimates saw
    (``reference_seconds``); where an embedding model was joined ahead of the text model, which stage
    runs it."""
    notes = [*(n for n in view.notes if n not in made.notes), *made.notes]
    here = request.devices is None
    if bounded and here and request.schedule.kind == "stream":
        bound = bound_note(view, profile, made)
        notes += [bound] if bound is not None else []
    embedding = _embedding_note(made, view, request)
    if embedding is not None and embedding not in notes:
        notes.append(embedding)
    measured = here and profile.source == CostSource.PROFILE.value and profile.total_seconds > 0
    return dataclasses.replace(
        made,
        link_model=request.effective_link_model,
        optimized_for=request.objective,
        notes=tuple(notes),
        reference_seconds=profile.total_seconds if measured else made.reference_seconds,
    )


def bound_note(view: ModelView, profile: Profile, made: Plan) -> str | None:
    """``made``'s note when one node bounds it (the largest node's cost reaches ``total / K``): which
    node, its share of the model's time and of the bottleneck, and the most stages that can still help
    (``ceil(total / largest)``), and what could go below it (:mod:`onnxpipe.planning.nodesplit`); None
    when no node bounds it.

    Why: the lower bound a plan reports is ``max(total / K, largest node)``; once the largest node wins,
    no cut goes below it and every further stage only adds links.  A ratio of 1.000 to that bound then
    reads as perfect while a stage may sit at a tenth of the bottleneck (GPT-2's LM head bounds every
    split past three stages)."""
    costs = {n: profile.node_seconds.get(n, 0.0) for s in made.stages for n in s.node_names}
    total = sum(costs.values())
    if made.k < 2 or total <= 0:
        return None
    node, seconds = max(costs.items(), key=lambda item: item[1])
    if seconds * made.k < total * (1 - 1e-9):
        return None
    info = view.node_by_name.get(node)
    useful = max(1, math.ceil(total / seconds - 1e-9))
    of_bottleneck = seconds / made.bottleneck_seconds if made.bottleneck_seconds > 0 else 1.0
    beyond = (
        f"{made.k} stages are no faster than {useful}"
        if made.k > useful
        else f"more than {useful} stages cannot help"
    )
    return (
        f"one node bounds this plan: {node} ({info.op_type if info is not None else '?'}) costs "
        f"{seconds * 1e3:.3f} ms, {seconds / total:.0%} of the model's time and {of_bottleneck:.0%} of the "
        f"bottleneck, and no cut goes below it: {beyond}; only splitting that node itself could go further: "
        f"{opt('split_nodes', 'auto')} cuts a MatMul, Gemm or Conv with constant weights into parts in "
        "consecutive stages"
    )


def _embedding_note(made: Plan, view: ModelView, request: PlanRequest) -> str | None:
    """Which stage and worker run the embedding model joined ahead of the text model
    (:mod:`onnxpipe.ir.joined`), and why there; ``None`` where none was joined."""
    if view.embedding is None:
        return None
    ids = view.inputs[0]  # the joined graph's first input is the embedding model's token ids
    at = next(s for s in made.stages if ids in s.inputs)
    if not any(s.kv_layers for s in made.stages):  # no decoder found: cut as any graph, --ends unused
        with_layers, why = f"with {len(at.node_names)} node(s)", "where the balance put it"
    else:
        with_layers = (
            f"with layers {at.kv_layers[0]}-{at.kv_layers[-1]}" if at.kv_layers else "a stage of its own"
        )
        why = {
            Ends.FREE: f"where the balance put it ({opt('ends', Ends.FREE)}; {opt('ends', Ends.OWN)} gives "
            "it a stage of its own)",
            Ends.ATTACHED: f"with the first layer ({opt('ends', Ends.ATTACHED)})",
            Ends.OWN: f"as {opt('ends', Ends.OWN)} asks",
        }[request.decoder.ends]
    worker = at.worker if at.worker is not None else at.index
    return (
        f"the embedding model {view.embedding.name} runs in stage {at.index} on worker {worker}, "
        f"{with_layers}: {why}; the split takes the token ids {ids!r}"
    )


@dataclass(frozen=True)
class _Tried:
    plan: Plan

    @property
    def bottleneck(self) -> float:
        return self.plan.bottleneck_seconds

    @property
    def latency(self) -> float:
        return self.plan.latency_seconds


def auto_here(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    cpus: int | None = None,
    phase_profiles: Mapping[Phase, Profile] | None = None,
    decoder: FoundDecoder | None = None,
) -> Plan:
    """``--stages auto`` without a devices file: the stages run on this machine, ``profile.threads`` each,
    so at most ``cpus // threads`` of them run without sharing CPUs (more would only look faster on
    paper); the fewest of those within ``request.tolerance`` of the best bottleneck.  The plan records
    each count tried (:attr:`Plan.stage_counts_tried`) and why it chose."""
    cpus = available_cpu_count() if cpus is None else cpus
    threads = max(1, profile.threads)
    max_k = max(1, min(cpus // threads, len(view.compute_nodes)))

    def solve_k(k: int) -> _Tried:
        return _Tried(_plan(view, profile, dataclasses.replace(request, stages=k), phase_profiles, decoder))

    choice = stages_auto(max_k, solve_k, tolerance=request.tolerance, objective=request.objective)
    note = (
        f"{opt('stages', 'auto')} chose {choice.k} of 1..{max_k} (this machine's {cpus} CPU(s) at {threads} "
        f"thread(s) per stage): {choice.reason}"
    )
    chosen = choice.result.plan
    return dataclasses.replace(chosen, notes=(*chosen.notes, note), stage_counts_tried=choice.bottlenecks)


def _plan(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    phase_profiles: Mapping[Phase, Profile] | None = None,
    decoder: FoundDecoder | None = None,
) -> Plan:
    if request.stages == "auto" and request.devices is None:
        return auto_here(view, profile, request, phase_profiles=phase_profiles, decoder=decoder)
    dec = decoder_of(view, decoder) if request.decoder.layer_cuts else None
    if dec is not None and request.on_identical_workers and not request.interleaved:
        assert isinstance(request.stages, int)  # on_identical_workers
        phases = phase_profiles or {}
        both = Phase.PREFILL in phases and Phase.DECODE in phases
        profiles = [(ph, phases[ph]) for ph in (Phase.PREFILL, Phase.DECODE)] if both else []
        return layer_plan(
            view,
            profiles or [(profile_phase(profile, dec), profile)],
            request.stages,
            dec,
            request.decoder,
            bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
            microbatches=request.schedule.stream_microbatches,
        )
    if not request.on_identical_workers or not isinstance(request.stages, int):
        return plan_pipeline(view, profile, request, decoder=decoder)
    if request.interleaved:
        return make_interleaved_plan(view, profile, request, dec)
    return make_plan(
        view,
        profile,
        request.stages,
        bandwidth_bytes_per_s=request.bandwidth_bytes_per_s,
        microbatches=request.schedule.stream_microbatches,
    )


# --------------------------------------------------------------------------------------------------
# boundaries compressed on the link

FLOAT32 = 1
"""``onnx.TensorProto.FLOAT``."""


def compressible(view: ModelView) -> frozenset[str]:
    """The float32 activations of ``view``: what a compressed boundary may narrow.  Not the values of
    weights or shapes alone (:mod:`onnxpipe.ir.shapevalues`), should one still cross: a ``Resize``'s
    scales or a mask of ``-3.4e38`` would change meaning, rounded."""
    ends = set(view.inputs) | set(view.outputs) | set(view.weights)
    kinds = value_kinds(view)
    return frozenset(
        n
        for n, t in view.tensors.items()
        if t.elem_type == FLOAT32 and n not in ends and not kinds.recomputable(n)
    )


def compressed_profile(view: ModelView, profile: Profile, wire: Mapping[str, BoundaryDtype]) -> Profile:
    """``profile`` with the tensors of ``wire`` at the bytes they take on the link."""
    if not wire:
        return profile
    sizes = tensor_sizes(view, profile)
    sizes.update({t: dtype.wire_bytes(sizes.get(t, 0)) for t, dtype in wire.items()})
    return dataclasses.replace(profile, tensor_bytes=MappingProxyType(sizes))


def plan_with_wire(
    view: ModelView,
    profile: Profile,
    request: PlanRequest,
    make: Callable[[Mapping[str, BoundaryDtype]], Plan],
) -> Plan:
    """The plan ``make`` makes with the tensors it is given at their compressed bytes
    (:func:`compressed_profile` of its profiles), those ``request.boundary_dtype`` compresses, and the
    tensors it compresses (:attr:`Plan.boundary_dtypes`, those that cross a cut)."""
    dtype = request.boundary_dtype
    if dtype == BoundaryDtype.FLOAT32:
        return make({})
    floats = compressible(view)
    sizes = MappingProxyType(tensor_sizes(view, profile))
    if dtype == BoundaryDtype.AUTO:
        first = make({})
        links = request.devices is not None or not math.isinf(request.bandwidth_bytes_per_s)
        slowest = max(s.compute_seconds for s in first.stages)
        # the stages whose transfer in takes longer than the slowest stage computes (at their links' rates)
        slow = [s.index for s in first.stages[1:] if links and s.transfer_seconds > slowest]
        if not slow:
            why = (
                "no link is slow enough to bound the pipeline"
                if links
                else f"there are no links to weigh (no {opt('devices')})"
            )
            note = f"{opt('boundary_dtype', BoundaryDtype.AUTO)}: every boundary stays float32: {why}"
            return dataclasses.replace(first, notes=(*first.notes, note))
        entering = {t for i in slow for t in first.stages[i].inputs if t in floats}
        wire = dict.fromkeys(entering, BoundaryDtype.FLOAT16)
    else:
        wire = dict.fromkeys(floats, dtype)
    made = make(wire)
    return dataclasses.replace(
        made, tensor_bytes=sizes, boundary_dtypes=MappingProxyType(_crossing(made, wire))
    )


def _crossing(plan: Plan, wire: Mapping[str, BoundaryDtype]) -> dict[str, BoundaryDtype]:
    """The tensors of ``wire`` that some stage of ``plan`` receives."""
    received: Collection[str] = {t for s in plan.stages for t in s.inputs}
    return {t: d for t, d in wire.items() if t in received}


# --------------------------------------------------------------------------------------------------
# a tied embedding and LM head


def worth_it(plain: Plan, tied: Plan, plain_bytes: int, tied_bytes: int) -> bool:
    """The rule: the tied layout is kept when it holds fewer bytes over the workers and its bottleneck is
    slower than the plain split's by at most the share of those bytes it saves."""
    saved = 1 - tied_bytes / plain_bytes if plain_bytes > 0 else 0.0
    return saved > 0 and _slower(plain, tied) <= saved


def _slower(plain: Plan, tied: Plan) -> float:
    if plain.bottleneck_seconds <= 0:
        return 0.0 if tied.bottleneck_seconds <= 0 else float("inf")
    return tied.bottleneck_seconds / plain.bottleneck_seconds - 1


def keeping_tied(view: ModelView, request: PlanRequest, plan_for: Callable[[PlanRequest], Plan]) -> Plan:
    """The plan ``plan_for`` makes of ``request``; for a plain ``stages=K`` (K >= 2, no ``workers``) on
    identical workers of a model with a tied table, the better by :func:`worth_it` of K stages on K
    workers and K + 1 stages on K workers, its notes saying which and why (and why not, off identical
    workers or with ``ends="own"``)."""
    k = request.stages
    if not (isinstance(k, int) and k >= 2 and request.workers is None):
        return plan_for(request)
    tables = tied_tables(view)
    if not tables:
        return plan_for(request)
    named = ", ".join(f"{t} ({human_bytes(view.weights[t])})" for t in tables)
    what = f"the token embedding and the LM head share {named}"
    held = f"{what}, held by the first and the last of {k} workers: {k + 1} stages on {k} workers"
    if not request.on_identical_workers:
        return _noted(
            plan_for(request),
            f"{what}, held by the first and the last stage's devices: {k + 1} stages on {k} workers, "
            f"which would hold it once, are planned on identical workers only, not with "
            f"{request.off_the_chain}",
        )
    if request.decoder.ends == Ends.OWN:
        return _noted(
            plan_for(request),
            f"{held}, which would hold it once, are not planned with {opt('ends', Ends.OWN)}",
        )
    plain = plan_for(dataclasses.replace(request, workers=k))
    try:
        tied = plan_for(dataclasses.replace(request, stages=k + 1, workers=k))
    except (PartitionError, UsageError):
        return _noted(plain, f"{held} cannot be made")
    plain_bytes = sum(worker_weights(view, plain.stages, k))
    tied_bytes = sum(worker_weights(view, tied.stages, k))
    saved, slower = plain_bytes - tied_bytes, _slower(plain, tied)
    figures = (
        f"{human_bytes(saved)} ({saved / max(1, plain_bytes):.1%}) less weight memory over the workers for "
        f"a {abs(slower):.2%} {'slower' if slower >= 0 else 'faster'} bottleneck"
    )
    if worth_it(plain, tied, plain_bytes, tied_bytes):
        return _noted(
            tied,
            f"{what}: {k + 1} stages on {k} workers, the last on worker 0 with the first, "
            f"hold it once: {figures} (kept: the share of memory it saves is at least the share of time); "
            f"{opt('workers', k)} keeps a stage per worker",
        )
    return _noted(
        plain,
        f"{held} would hold it once, {figures} (not kept: the share of time is above that of memory); "
        f"{opt('stages', k + 1)} {opt('workers', k)} asks for it",
    )


def _noted(plan: Plan, note: str) -> Plan:
    return dataclasses.replace(plan, notes=(*plan.notes, note))
