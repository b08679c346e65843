"""Plan a pipeline for a cluster: devices, memory, links, device order, stage count and schedule.

:func:`onnxpipe.planning.workers.make_plan` balances K stages on identical workers.  This module does what
BaPipe does for a real cluster: stage ``i`` runs on device ``i`` of a devices file, each device computes
at its own speed (or with its own profile), must hold its stage's parameters and the activations of the
micro-batches in flight, and each link between consecutive devices costs ``bytes / bandwidth +
latency`` per micro-batch, overlapping compute.  For every candidate schedule (streaming inference, or
the GPipe and 1F1B training schedules with M micro-batches) it solves the exact partition under that
schedule's memory model, simulates the timeline, and keeps the fastest plan that fits.

The exact work happens elsewhere: :func:`onnxpipe.partition.solve_heterogeneous` (the partition),
:mod:`onnxpipe.planning.orders` (device orders and ``--stages auto``) and :mod:`onnxpipe.schedule.simulate`
(timelines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from onnxpipe.cluster.costs import DeviceCosts, device_costs
from onnxpipe.cluster.model import Cluster, Device
from onnxpipe.core.choices import DeviceOrder, LinkModel, Objective, ScheduleKind
from onnxpipe.core.errors import MemoryFitError, PartitionError, UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.core.text import human_bytes
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.runtime_profile import profile_on_runtime
from onnxpipe.ir.decoder import DecoderInfo, FoundDecoder, decoder_of
from onnxpipe.ir.decoder_dims import counted_context
from onnxpipe.ir.model import ModelView
from onnxpipe.partition import solve_heterogeneous
from onnxpipe.partition.inputs import HeterogeneousRequest
from onnxpipe.partition.numeric import chain_bound
from onnxpipe.partition.result import Partition
from onnxpipe.planning.decoder_plan import (
    decoder_notes,
    decoder_record,
    kv_makers,
    layer_cut_items,
    profile_phase,
    with_kv,
)
from onnxpipe.planning.decoder_recompute import (
    InputCopies,
    PhaseCosts,
    adjusted,
    copies_note,
    gone_bytes,
    with_copy_costs,
)
from onnxpipe.planning.orders import SCORE_TIE_RTOL, KeptDevices, OrderSearch, place, stages_auto
from onnxpipe.planning.request import PlanRequest, ScheduleOption
from onnxpipe.planning.sequences import Sequences, first_reader_param_bytes, keeping_fused_groups, sequences
from onnxpipe.planning.stages import StageOptions, assign_stages, plan_from
from onnxpipe.planning.types import Plan, StageSpec
from onnxpipe.schedule.simulate import in_flight, simulate, stream
from onnxpipe.schedule.timeline import Timeline

OBJECTIVE = (
    "minimize the pipeline bottleneck: the largest stage compute time on its device or link transfer "
    "time (transfers overlap compute)"
)
LATENCY_OBJECTIVE = (
    "minimize the latency of one request alone: the sum of every stage's compute time on its device and "
    "every link's transfer time"
)

TRAINING_STATE_FACTOR = 4.0
"""Bytes held per parameter byte when training with Adam: weights, gradients and two moments."""


def stage_memory_bytes(
    kind: ScheduleKind,
    stage: int,
    k: int,
    microbatches: int,
    size: int,
    weight_bytes: float,
    activation_bytes: float,
    bytes_in: float,
) -> float:
    """What stage ``stage`` must hold on its device under a schedule: the planner's memory model.

    * streaming inference: its weights, plus the micro-batch it computes and the next one arriving
      (``2 * size * bytes_in``, with ``bytes_in`` what crosses the link in front of it; stage 0's input
      comes from the caller and is not counted); the working set inside one run is reported separately
      (``peak_activation_bytes``);
    * training: weights, gradients and Adam's two moments (``4 *`` weights), plus every activation of the
      stage for each micro-batch in flight (GPipe ``M``, 1F1B ``min(M, K - s)``).
    """
    if kind == "stream":
        return weight_bytes + 2.0 * size * bytes_in
    held = in_flight(kind, stage, k, microbatches) * size
    return TRAINING_STATE_FACTOR * weight_bytes + held * activation_bytes


@dataclass(frozen=True)
class _Costs:
    """What every candidate plan is solved on: the sequences, and each device's cost of every node."""

    seq: Sequences
    rows: Mapping[str, tuple[float, ...]]
    """Device name -> its cost of each compute node (scaled, measured on it, or from its profile)."""
    params: tuple[float, ...]
    """Weight bytes per compute node, each weight at its first reader."""
    acts: tuple[float, ...]
    """Bytes of each compute node's outputs: what training keeps for the backward pass."""
    records: tuple[DeviceCosts, ...]
    kv: tuple[float, ...]
    """KV cache bytes at the maximum context per compute node (at the node making a layer's present; 0
    for all but a decoder's)."""
    decoder: DecoderInfo | None = None
    """Set for a decoder cut between layers only: ``seq`` is then in layer order, cuts between layers."""


@dataclass(frozen=True)
class _Candidate:
    """One schedule's best plan for ``k`` stages: the devices and the partition found, and its timeline."""

    option: ScheduleOption
    search: OrderSearch[Partition]
    timeline: Timeline

    @property
    def iteration_seconds(self) -> float:
        """Streaming: time per micro-batch in steady state; training: the simulated batch (makespan)."""
        return self.search.result.bottleneck if not self.option.training else self.timeline.makespan

    def score(self, objective: Objective) -> float:
        """What the schedules compete on: the iteration's time, or one request's (``latency``)."""
        return self.search.result.latency if objective == Objective.LATENCY else self.iteration_seconds


def plan_pipeline(
    view: ModelView, profile: Profile, request: PlanRequest, *, decoder: FoundDecoder | None = None
) -> Plan:
    """The fastest pipeline of ``request.stages`` stages (or, for ``"auto"``, the fewest within
    ``request.tolerance`` of the best) over ``request.devices``, under the requested schedule, within
    every device's memory.

    Without devices they are ``stages`` copies of the profiling machine joined by links of
    ``request.bandwidth_bytes_per_s``.
    """
    profile.check_matches(view)
    cluster = _cluster(profile, request)
    max_k = _max_stages(view, cluster, request)
    costs = _costs(view, profile, cluster, request, decoder)
    best, reason, left_out = _best(view, costs, cluster, request, max_k)
    notes = [*_search_notes(best, reason), *left_out]
    part, arranged, option = best.search.result, best.search.cluster, best.option
    copies = _input_copies(view, profile, costs, arranged, part, option, request)
    # the manifest's stage times are one sample's forward pass (what inference and `run` measure);
    # training step times live in the timeline
    per_sample = _work(option, request) if option.training else 1.0
    specs = assign_stages(
        view,
        part.bounds,
        costs.seq.sizes,
        [c / per_sample for c in part.compute],
        [t / option.size for t in part.transfer] if option.training else part.transfer,
        StageOptions(seq=costs.seq, devices=arranged.names, copies=copies),
    )
    timeline, record, dec = best.timeline, None, costs.decoder
    if dec is not None:  # the stages' KV layers and cache, and the inputs they copy priced in
        specs = with_kv(view, profile, dec, specs, request.decoder.max_context)
        notes += decoder_notes(view, dec, specs, request.decoder)
        if copies is not None:
            gone = gone_bytes(view, specs, copies.chosen, costs.seq.sizes)
            sent = [g * option.size for g in gone]
            part = adjusted(part, copies.chosen, sent, 0, arranged.bandwidths, overlap=True)
            specs = with_copy_costs(specs, part, gone)
            timeline = stream(part.compute, option.microbatches, link=part.transfer)
            copied = copies_note(copies.chosen, copies.phases, [gone])
            notes += [copied] if copied else []
        record = decoder_record(view, dec, request.decoder, [(profile_phase(profile, dec), profile)])
    _check_final_memory(specs, arranged, best, costs.acts)
    kept = {d.name for d in arranged.devices}
    return plan_from(
        view,
        profile,
        _bounded(part, best, costs, request),
        specs,
        costs.seq.sizes,
        request.bandwidth_bytes_per_s,
        notes=tuple(notes),
        timeline=timeline,
        objective=LATENCY_OBJECTIVE if request.objective == Objective.LATENCY else OBJECTIVE,
        cluster=arranged,
        device_costs=tuple(r for r in costs.records if r.device in kept),
        microbatch_size=option.size,
        decoder=record,
    )


def _bounded(part: Partition, best: _Candidate, costs: _Costs, request: PlanRequest) -> Partition:
    """``part`` with the contiguous bound of its device order as lower bound where that is tighter: it
    holds for devices kept in the file's order (a free order searched others)."""
    if best.search.free:
        return part
    rows = [[c * _work(best.option, request) for c in costs.rows[name]] for name in best.search.cluster.names]
    tighter = min(chain_bound(rows, part.bottleneck), part.bottleneck)
    return replace(part, lower_bound=max(part.lower_bound, tighter))


def _cluster(profile: Profile, request: PlanRequest) -> Cluster:
    """The devices asked for, else ``stages`` copies of the profiling machine."""
    if request.devices is not None:
        return request.devices
    stages = request.stages
    if not isinstance(stages, int):
        raise UsageError(
            f"{opt('stages', 'auto')} needs {opt('devices')} here: plan_pipeline plans for a cluster; "
            "onnxpipe.planning.planner.plan chooses the stages of this machine without one"
        )
    return Cluster.homogeneous(stages, profile.threads, bandwidth_bytes_per_s=request.bandwidth_bytes_per_s)


def _max_stages(view: ModelView, cluster: Cluster, request: PlanRequest) -> int:
    """The most stages the plan can have (a device and a compute node each); refused when the request
    asks for more."""
    stages = request.stages
    m = len(view.compute_nodes)
    max_k = min(cluster.size, m)
    if stages != "auto" and not 1 <= stages <= max_k:
        what = f"{m} compute nodes" if stages > m else f"{cluster.size} devices in {cluster.label}"
        raise PartitionError(
            f"cannot make {stages} stages: the plan has {what}; the largest number of stages that works "
            f"is {max_k}: choose {opt('stages')} between 1 and {max_k}"
        )
    return max_k


def _search_notes(best: _Candidate, reason: str) -> list[str]:
    """What the search chose: the stage count (``auto``), the device order (``free``)."""
    notes: list[str] = []
    if reason:
        notes.append(f"{opt('stages', 'auto')} chose {best.search.k}: {reason}")
    if best.search.free:
        notes.append(
            f"{opt('order', 'free')} tried {best.search.evaluated} device orders; "
            f"chose {', '.join(best.search.cluster.names)}"
        )
    return notes


def _input_copies(
    view: ModelView,
    profile: Profile,
    costs: _Costs,
    arranged: Cluster,
    part: Partition,
    option: ScheduleOption,
    request: PlanRequest,
) -> InputCopies | None:
    """A decoder's choice of the rotary tables and masks each stage makes instead of receiving them
    (:mod:`onnxpipe.planning.decoder_recompute`), priced on each stage's device and the link in front of it;
    none for training schedules (their stage times are a forward and a backward pass)."""
    if costs.decoder is None or option.training or not request.decoder.copy_inputs:
        return None
    seconds = {r.device: r.node_seconds for r in costs.records}
    phase = PhaseCosts(
        profile_phase(profile, costs.decoder),
        profile.node_seconds,
        costs.seq.sizes,
        part.compute,
        stage_node_seconds=tuple(seconds[name] for name in arranged.names),
        scale=float(option.size),
    )
    return InputCopies(view, costs.decoder, (phase,), arranged.bandwidths, costs.seq.classes)


def _costs(
    view: ModelView, profile: Profile, cluster: Cluster, request: PlanRequest, decoder: FoundDecoder | None
) -> _Costs:
    dec = decoder_of(view, decoder) if request.decoder.layer_cuts else None
    if dec is None:
        seq, makers = sequences(view, profile), {}
    else:
        off = request.off_the_chain or opt("devices")
        seq = layer_cut_items(view, profile, dec, request.decoder.ends, off)[2]
        # each layer's KV cache bytes at the maximum context, at the node that makes its present key
        makers = kv_makers(
            view, dec, profile.input_shapes, counted_context(view, dec, request.decoder.max_context)
        )
    compute = seq.compute
    records = device_costs(
        cluster,
        {n.name: c for n, c in zip(compute, seq.costs, strict=True)},
        {n.name: n.op_type for n in compute},
        measure=_measure_fn(view, profile),
        load=_load_fn(view),
        reference_threads=profile.threads,
    )
    return _Costs(
        seq=seq,
        rows={r.device: tuple(float(r.node_seconds.get(n.name, 0.0)) for n in compute) for r in records},
        params=tuple(first_reader_param_bytes(view, compute)),
        acts=tuple(float(sum(seq.sizes.get(o, 0) for o in n.outputs)) for n in compute),
        records=records,
        decoder=dec,
        kv=tuple(float(makers[n.name][1]) if n.name in makers else 0.0 for n in compute),
    )


def _best(
    view: ModelView, costs: _Costs, cluster: Cluster, request: PlanRequest, max_k: int
) -> tuple[_Candidate, str, list[str]]:
    """The fastest candidate over the schedules asked for (:func:`_best_of`).  The last failure is raised
    when no schedule fits."""
    best: tuple[_Candidate, str, list[str]] | None = None
    last_error: PartitionError | None = None
    objective = request.objective
    for option in request.schedule.candidates():
        try:
            found = _best_of(view, costs, cluster, request, max_k, option)
        except PartitionError as e:
            last_error = e
            continue
        if best is None or found[0].score(objective) < best[0].score(objective) * (1 - SCORE_TIE_RTOL):
            best = found
    if best is None:
        assert last_error is not None
        raise last_error
    return best


def _best_of(
    view: ModelView, costs: _Costs, cluster: Cluster, request: PlanRequest, max_k: int, option: ScheduleOption
) -> tuple[_Candidate, str, list[str]]:
    """The best candidate under ``option``, why its stage count (``auto``: the fewest within the
    tolerance of the best), and, for ``auto`` in the file's order, the devices it left out because they
    slow the pipeline (:class:`onnxpipe.planning.orders.KeptDevices`)."""
    objective = request.objective
    found: dict[int, _Candidate] = {}

    def solve(arranged: Cluster) -> Partition:
        return _solve(view, costs, arranged, request, option)

    auto_kept = request.stages == "auto" and request.order == DeviceOrder.FIXED
    kept = KeptDevices(cluster, solve, objective) if auto_kept else None

    def search_k(k: int) -> OrderSearch[Partition]:
        if k not in found:
            search = (
                kept.search(k)
                if kept is not None
                else place(cluster, k, solve, order=request.order, objective=objective)
            )
            found[k] = _candidate(request, option, search)
        return found[k].search

    if request.stages == "auto":
        choice = stages_auto(max_k, search_k, tolerance=request.tolerance, objective=objective)
        k, reason = choice.k, choice.reason
    else:
        k, reason = request.stages, ""
    search_k(k)
    return found[k], reason, kept.notes(found[k].search) if kept is not None else []


def _candidate(request: PlanRequest, option: ScheduleOption, search: OrderSearch[Partition]) -> _Candidate:
    """The devices and partition ``search`` found, with their timeline under ``option``."""
    part = search.result
    if not option.training:
        timeline = stream(part.compute, option.microbatches, link=part.transfer)
    else:
        fwd = [c / (1.0 + request.schedule.backward_ratio) for c in part.compute]
        bwd = [c - f for c, f in zip(part.compute, fwd, strict=True)]
        timeline = simulate(option.kind, fwd, bwd, list(part.transfer), option.microbatches)
    return _Candidate(option, search, timeline)


def _work(option: ScheduleOption, request: PlanRequest) -> float:
    """Forward-pass units of work one micro-batch costs on a stage: its samples, times forward plus
    backward when training."""
    return (1.0 + request.schedule.backward_ratio) * option.size if option.training else float(option.size)


def _heterogeneous_request(
    costs: _Costs, arranged: Cluster, request: PlanRequest, option: ScheduleOption
) -> HeterogeneousRequest:
    """The partitioner's request for ``option`` on the devices in the order ``arranged``: per-device
    costs of one micro-batch, what crosses each cut, and what each stage must hold."""
    k, size, work = arranged.size, option.size, _work(option, request)
    training = option.training
    return HeterogeneousRequest(
        None,
        device_costs=[[c * work for c in costs.rows[name]] for name in arranged.names],
        cut_bytes=[c * size for c in costs.seq.cut_bytes],
        bandwidths=arranged.bandwidths,
        latencies=arranged.latencies,
        overlap=request.effective_link_model == LinkModel.OVERLAP,
        # a decoder's KV cache at the maximum context is held where its layer runs
        item_mem=[
            (TRAINING_STATE_FACTOR if training else 1.0) * p + kv
            for p, kv in zip(costs.params, costs.kv, strict=True)
        ],
        mem_caps=arranged.mem_caps,
        # inference holds the micro-batch it computes and the next one arriving
        cut_mem_factor=[0.0 if training else 2.0 * size] * k,
        # training: every activation of the stage, for each micro-batch it holds (GPipe M, 1F1B min(M, K-s))
        item_act=costs.acts if training else None,
        act_factor=[float(in_flight(option.kind, s, k, option.microbatches) * size) for s in range(k)]
        if training
        else None,
        objective=request.objective,
    )


def _solve(
    view: ModelView, costs: _Costs, arranged: Cluster, request: PlanRequest, option: ScheduleOption
) -> Partition:
    """The exact partition for ``option`` on ``arranged``, fused groups kept whole while that costs
    little (the candidates the search tries are noted nowhere: only the plan it keeps has notes)."""
    base = _heterogeneous_request(costs, arranged, request, option)
    try:
        if costs.decoder is not None:  # cuts between layers are not optional: no fused-group fallback
            return solve_heterogeneous(replace(base, allowed_cuts=costs.seq.allowed), arranged.size)
        return keeping_fused_groups(
            lambda allowed: solve_heterogeneous(replace(base, allowed_cuts=allowed), arranged.size),
            costs.seq.allowed,
            [],
            costs.seq.cuttable,
        )
    except MemoryFitError as e:
        raise MemoryFitError(
            f"{arranged.source or 'the devices'}: {arranged.size} stages of {view.label} do not fit the "
            f"devices' memory under {option.describe()}; the smallest memory that fits is "
            f"{human_bytes(e.smallest_fit_bytes)} ({e.smallest_fit_bytes:.0f} bytes) per device: raise "
            "memory_bytes, add devices, or "
            "choose another schedule",
            e.smallest_fit_bytes,
        ) from e


def _measure_fn(view: ModelView, profile: Profile) -> Callable[[Device], Mapping[str, float]]:
    """The device's costs measured here: onnxruntime's profiler on the CPU, else the whole model timed
    on the device's runtime, its per-layer reports mapped to nodes (:mod:`.cost.runtime_profile`)."""

    measured: dict[EngineConfig, Mapping[str, float]] = {}  # devices set up alike are measured once

    def measure(device: Device) -> Mapping[str, float]:
        config = device.engine_config()
        if config not in measured:
            measured[config] = profile_on_runtime(view, config, shapes=profile.input_shapes).node_seconds
        return measured[config]

    return measure


def _load_fn(view: ModelView) -> Callable[[Device, str], Mapping[str, float]]:
    def load(device: Device, path: str) -> Mapping[str, float]:
        prof = Profile.load(Path(path))
        prof.check_matches(view)
        return prof.node_seconds

    return load


def _check_final_memory(
    specs: Sequence[StageSpec], arranged: Cluster, best: _Candidate, acts: Sequence[float]
) -> None:
    """The memory model again with shared weights counted in every stage that copies them.

    The partitioner counts a weight shared by two stages once (at its first reader), so a plan can pass
    the partitioner and still overflow by the copies; such a plan is refused rather than written.
    """
    k = len(specs)
    bounds = best.search.result.bounds
    option = best.option
    for s, spec in enumerate(specs):
        cap = arranged.devices[s].memory_bytes
        if cap is None:
            continue
        act = float(sum(acts[bounds[s] : bounds[s + 1]]))
        need = spec.kv_cache_bytes + stage_memory_bytes(
            option.kind, s, k, option.microbatches, option.size, spec.param_bytes, act, spec.link_bytes_in
        )
        if need > cap:
            raise MemoryFitError(
                f"{arranged.source or 'the devices'}: stage {s} on {arranged.names[s]} needs "
                f"{human_bytes(need)} ({need:.0f} bytes) once the weights it shares with other stages are "
                f"copied in, over the device's {human_bytes(cap)}; give it at least that much memory_bytes, "
                "or use more stages",
                need,
            )
