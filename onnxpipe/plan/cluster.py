"""Plan a pipeline for a cluster: devices, memory, links, device order, stage count and schedule.

:func:`onnxpipe.plan.planner.make_plan` balances K stages on identical workers.  This module does what
BaPipe does for a real cluster: stage ``i`` runs on device ``i`` of a devices file, each device computes
at its own speed (or with its own profile), must hold its stage's parameters and the activations of the
micro-batches in flight, and each link between consecutive devices costs ``bytes / bandwidth +
latency`` per micro-batch, overlapping compute.  For every candidate schedule (streaming inference, or
the GPipe and 1F1B training schedules with M micro-batches) it solves the exact partition under that
schedule's memory model, simulates the timeline, and keeps the fastest plan that fits.

The exact work happens elsewhere: :func:`onnxpipe.partition.solve_heterogeneous` (the partition),
:mod:`onnxpipe.plan.orders` (device orders and ``--stages auto``) and :mod:`onnxpipe.schedule.simulate`
(timelines).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from onnxpipe import partition as _partition
from onnxpipe.cluster.costs import device_costs
from onnxpipe.cluster.model import Cluster, Device
from onnxpipe.core.errors import MemoryFitError, PartitionError, UsageError
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.model import ModelView
from onnxpipe.plan.fused import keeping_fused_groups
from onnxpipe.plan.memory import TRAINING_STATE_FACTOR, stage_memory_bytes
from onnxpipe.plan.orders import OrderSearch, place, stages_auto
from onnxpipe.plan.planner import plan_from
from onnxpipe.plan.request import ScheduleRequest
from onnxpipe.plan.sequences import first_reader_param_bytes, sequences
from onnxpipe.plan.stages import assign_stages
from onnxpipe.plan.types import Plan, StageSpec
from onnxpipe.schedule.simulate import in_flight, simulate
from onnxpipe.schedule.timeline import ScheduleKind, Timeline


def _measure_fn(view: ModelView, profile: Profile) -> Callable[[Device], Mapping[str, float]]:
    def measure(device: Device) -> Mapping[str, float]:
        if device.provider != "CPUExecutionProvider" or device.provider_options:
            raise UsageError(
                f"device {device.name!r}: profiling on {device.provider} is not supported here; "
                "set profile_here to false and give its speed, or a profile_path measured on it"
            )
        prof = profile_model(view, threads=device.threads, shapes=profile.input_shapes)
        return prof.node_seconds

    return measure


def _load_fn(view: ModelView) -> Callable[[Device, str], Mapping[str, float]]:
    def load(device: Device, path: str) -> Mapping[str, float]:
        prof = Profile.load(Path(path))
        prof.check_matches(view)
        return prof.node_seconds

    return load


@dataclass(frozen=True)
class _Candidate:
    kind: ScheduleKind
    microbatches: int
    size: int
    search: OrderSearch[_partition.Partition]
    timeline: Timeline


def plan_pipeline(
    view: ModelView,
    profile: Profile,
    stages: int | Literal["auto"],
    *,
    cluster: Cluster | None = None,
    bandwidth_bytes_per_s: float = math.inf,
    order: Literal["fixed", "free"] = "fixed",
    schedule: ScheduleRequest | None = None,
    tolerance: float = 0.05,
) -> Plan:
    """The fastest pipeline of ``stages`` stages (or the fewest within ``tolerance`` of the best, for
    ``"auto"``) over ``cluster``'s devices, under the requested schedule, within every device's memory.

    Without a cluster the devices are ``stages`` copies of the profiling machine joined by links of
    ``bandwidth_bytes_per_s``.
    """
    profile.check_matches(view)
    request = schedule or ScheduleRequest()
    if cluster is not None and bandwidth_bytes_per_s != math.inf:
        raise UsageError(
            f"--bandwidth: the links of {cluster.source or 'the devices file'} set the bandwidth; "
            "give it there (links[].bandwidth_bytes_per_s) instead"
        )
    compute = view.compute_nodes
    m = len(compute)
    if cluster is None:
        if stages == "auto":
            raise UsageError("--stages auto needs --devices: the cluster bounds how many stages to try")
        cluster = Cluster.homogeneous(stages, profile.threads, bandwidth_bytes_per_s=bandwidth_bytes_per_s)
    max_k = min(cluster.size, m)
    if stages != "auto" and not 1 <= stages <= max_k:
        what = (
            f"{m} compute nodes"
            if stages > m
            else f"{cluster.size} devices in {cluster.source or 'the cluster'}"
        )
        raise PartitionError(
            f"cannot make {stages} stages: the plan has {what}; choose --stages between 1 and {max_k}"
        )

    seq = sequences(view, profile)
    sizes, cuts, costs, allowed = seq.sizes, seq.cut_bytes, seq.costs, seq.allowed
    reference = {n.name: c for n, c in zip(compute, costs, strict=True)}
    records = device_costs(
        cluster,
        reference,
        {n.name: n.op_type for n in compute},
        measure=_measure_fn(view, profile),
        load=_load_fn(view),
        reference_threads=profile.threads,
    )
    # each device's own cost of every node: scaled by its speed or per-op speeds, or measured on it
    row_of = {r.device: [float(r.node_seconds.get(n.name, 0.0)) for n in compute] for r in records}
    params = first_reader_param_bytes(view)
    acts = [float(sum(sizes.get(o, 0) for o in n.outputs)) for n in compute]
    notes: list[str] = []

    def solver(kind: ScheduleKind, mb: int, size: int) -> Callable[[Cluster], _partition.Partition]:
        training = kind != "stream"
        work = (1.0 + request.backward_ratio) * size if training else float(size)

        def solve_on(arr: Cluster) -> _partition.Partition:
            k = arr.size
            state = TRAINING_STATE_FACTOR if training else 1.0
            kwargs: dict[str, object] = {
                "device_costs": [[c * work for c in row_of[name]] for name in arr.names],
                "cut_bytes": [c * size for c in cuts],
                "bandwidths": arr.bandwidths,
                "latencies": arr.latencies,
                "overlap": True,
                "item_mem": [state * p for p in params],
                "mem_caps": arr.mem_caps,
                # inference holds the micro-batch it computes and the next one arriving
                "cut_mem_factor": [0.0 if training else 2.0 * size] * k,
            }
            if training:
                # every activation of the stage, for each micro-batch it holds (GPipe M, 1F1B min(M, K-s))
                kwargs["item_act"] = acts
                kwargs["act_factor"] = [float(in_flight(kind, st, k, mb) * size) for st in range(k)]
            try:
                # the candidates the search tries are noted nowhere: only the plan it keeps has notes
                return keeping_fused_groups(
                    lambda cuts: _partition.solve_heterogeneous(None, k, allowed_cuts=cuts, **kwargs),  # type: ignore[arg-type]
                    allowed,
                    [],
                )
            except MemoryFitError as e:
                where = arr.source or "the devices"
                schedule_text = "streaming" if kind == "stream" else f"{kind} with {mb} micro-batches"
                raise MemoryFitError(
                    f"{where}: {k} stages of {view.path.name if view.path else 'the model'} do not fit the "
                    f"devices' memory under {schedule_text}; the smallest memory that fits is "
                    f"{e.smallest_fit_bytes:.0f} bytes per device: raise memory_bytes, add devices, or "
                    "choose another schedule",
                    e.smallest_fit_bytes,
                ) from e

        return solve_on

    def candidate(kind: ScheduleKind, mb: int, size: int, k: int) -> _Candidate:
        search = place(cluster, k, solver(kind, mb, size), order=order)
        part = search.result
        if kind == "stream":
            timeline = simulate(kind, list(part.compute), None, list(part.transfer), mb)
        else:
            fwd = [c / (1.0 + request.backward_ratio) for c in part.compute]
            bwd = [c - f for c, f in zip(part.compute, fwd, strict=True)]
            timeline = simulate(kind, fwd, bwd, list(part.transfer), mb)
        return _Candidate(kind, mb, size, search, timeline)

    best: _Candidate | None = None
    chosen_k_reason = ""
    last_error: PartitionError | None = None
    for kind, mb, size in request.candidates():
        cache: dict[int, _Candidate] = {}

        def search_k(
            k: int,
            kind: ScheduleKind = kind,
            mb: int = mb,
            size: int = size,
            cache: dict[int, _Candidate] = cache,
        ) -> OrderSearch[_partition.Partition]:
            if k not in cache:
                cache[k] = candidate(kind, mb, size, k)
            return cache[k].search

        try:
            if stages == "auto":
                choice = stages_auto(max_k, search_k, tolerance=tolerance)
                search_k(choice.k)
                cand, reason = cache[choice.k], choice.reason
            else:
                search_k(stages)
                cand, reason = cache[stages], ""
        except PartitionError as e:
            last_error = e
            continue
        if best is None or _iteration_time(cand) < _iteration_time(best) * (1 - 1e-12):
            best, chosen_k_reason = cand, reason
    if best is None:
        assert last_error is not None
        raise last_error
    if chosen_k_reason:
        notes.append(f"--stages auto chose {best.search.k}: {chosen_k_reason}")
    if best.search.free:
        notes.append(
            f"--order free tried {best.search.evaluated} device orders; "
            f"chose {', '.join(best.search.cluster.names)}"
        )
    part = best.search.result
    arranged = best.search.cluster
    # the manifest's stage times are one sample's forward pass (what inference and `run` measure);
    # training step times live in the timeline
    per_sample = 1.0 if best.kind == "stream" else (1.0 + request.backward_ratio) * best.size
    specs = assign_stages(
        view,
        part.bounds,
        sizes,
        [c / per_sample for c in part.compute],
        [t / best.size for t in part.transfer] if best.kind != "stream" else part.transfer,
        devices=arranged.names,
        link_bytes=cuts,
        classes=seq.classes,
    )
    _check_final_memory(specs, arranged, best, acts)
    kept = {d.name for d in arranged.devices}
    return plan_from(
        view,
        profile,
        part,
        specs,
        sizes,
        bandwidth_bytes_per_s,
        objective=(
            "minimize the pipeline bottleneck: the largest stage compute time on its device or link "
            "transfer time (transfers overlap compute)"
        ),
        notes=tuple(notes),
        timeline=best.timeline,
        cluster=arranged,
        device_costs=tuple(r for r in records if r.device in kept),
        microbatch_size=best.size,
    )


def _iteration_time(c: _Candidate) -> float:
    """Streaming: time per micro-batch in steady state; training: the simulated batch (makespan)."""
    if c.kind == "stream":
        return c.search.result.bottleneck
    return c.timeline.makespan


def _check_final_memory(
    specs: Sequence[StageSpec],
    arranged: Cluster,
    best: _Candidate,
    acts: Sequence[float],
) -> None:
    """The memory model again with shared weights counted in every stage that copies them.

    The partitioner counts a weight shared by two stages once (at its first reader), so a plan can pass
    the partitioner and still overflow by the copies; such a plan is refused rather than written.
    """
    k = len(specs)
    bounds = best.search.result.bounds
    for s, spec in enumerate(specs):
        cap = arranged.devices[s].memory_bytes
        if cap is None:
            continue
        act = float(sum(acts[bounds[s] : bounds[s + 1]]))
        need = stage_memory_bytes(
            best.kind, s, k, best.microbatches, best.size, spec.param_bytes, act, spec.link_bytes_in
        )
        if need > cap:
            raise MemoryFitError(
                f"{arranged.source or 'the devices'}: stage {s} on {arranged.names[s]} needs {need:.0f} "
                f"bytes once the weights it shares with other stages are copied in, over the device's "
                f"{cap}; give it at least that much memory_bytes, or use more stages",
                need,
            )
