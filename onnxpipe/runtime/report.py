"""Measure a running pipeline and describe what it delivered: throughput, latency, each stage's time
against the manifest's estimate, the bottleneck, each worker's memory, and (with
:mod:`onnxpipe.runtime.compare`) how it fares against running the model without a pipeline.  An
interleaved split's stages share workers: the report then also sums each worker's stages
(:class:`WorkerReport`).

:func:`measure` streams micro-batches through a :class:`Pipeline` after a warm-up and keeps every
output; :func:`build_report` turns that into a :class:`RunReport`, which :meth:`RunReport.to_obj` writes
as JSON (``onnxpipe run --report``) and :func:`format_report` as text.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxpipe.core.errors import UsageError
from onnxpipe.core.text import human_bytes, table
from onnxpipe.manifest import Manifest
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.pipeline import Job, Pipeline
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import CPU_PROVIDER, Placement, WorkerSpec, manifest_placements

Feeds = Mapping[str, np.ndarray]


def min_steady_microbatches(workers: int) -> int:
    """Fewest micro-batches for which :attr:`Measurement.steady_throughput_per_s` is given: ``2K + 2``
    for K workers, since the first K or so are the pipeline filling up and a rate needs a few more."""
    return 2 * max(1, workers) + 2


@dataclass(frozen=True)
class Measurement:
    """Timings of one measured stream (``perf_counter`` seconds of the caller), and its outputs if kept.

    ``queued_at``/``done_at`` are the driver's times: several outputs collected in one poll share one
    ``done_at``, so rates between outputs come from the workers' own records (``stats``) instead.
    """

    queued_at: tuple[float, ...]
    done_at: tuple[float, ...]
    start: float
    end: float
    stats: tuple[WorkerStats, ...]
    in_flight: int = 1
    """Micro-batches kept in flight during the stream (the pipeline's capacity): the latencies of
    :attr:`latencies_s` are latencies at saturation, about ``in_flight / throughput``."""
    output_workers: tuple[int, ...] = ()
    """Positions in ``stats`` of the workers whose outputs leave the pipeline (each lane's last)."""
    single_latencies_s: tuple[float, ...] = ()
    """Latencies of micro-batches run one at a time after the stream (``measure(..., single=N)``)."""
    outputs: tuple[Tensors, ...] = ()
    """Every micro-batch's outputs in input order with ``measure(..., keep_outputs=True)``, else empty."""

    @property
    def microbatches(self) -> int:
        """Micro-batches the stream delivered."""
        return len(self.done_at)

    @property
    def wall_seconds(self) -> float:
        return self.end - self.start

    @property
    def throughput_per_s(self) -> float:
        return self.microbatches / self.wall_seconds if self.wall_seconds > 0 else math.inf

    def _worker_done_times(self) -> list[float]:
        """When each output left its lane's last worker, by that worker's clock (``Record.done``).

        Local workers share the machine's monotonic clock, so several lanes' times merge; a pipeline
        on Ray has one lane, whose last worker's times are all on one clock."""
        times = [r.done for i in self.output_workers if i < len(self.stats) for r in self.stats[i].records]
        return sorted(times)

    @property
    def steady_throughput_from(self) -> str | None:
        """``"worker"`` (the last workers' records), ``"driver"`` (its poll times) or None (too few)."""
        if self.microbatches < min_steady_microbatches(len(self.stats)):
            return None
        return "worker" if len(self._worker_done_times()) >= 2 else "driver"

    @property
    def steady_throughput_per_s(self) -> float | None:
        """Micro-batches per second between the first and the last output (the pipeline's fill excluded).

        From the last worker's own completion times, because the driver stamps every output it collects
        in one poll with the same time, which shortens the span and inflates the rate; from the
        driver's times only when no worker records are there.  None for fewer than
        :func:`min_steady_microbatches` micro-batches, where the fill dominates.
        """
        source = self.steady_throughput_from
        if source is None:
            return None
        times = self._worker_done_times() if source == "worker" else sorted(self.done_at)
        span = times[-1] - times[0]
        return (len(times) - 1) / span if span > 0 else None

    @property
    def latencies_s(self) -> list[float]:
        """Submission-to-result time of each micro-batch of the stream, at saturation (see ``in_flight``)."""
        return [d - q for q, d in zip(self.queued_at, self.done_at, strict=True)]


def measure(
    pipeline: Pipeline,
    inputs: Sequence[Feeds],
    *,
    warmup: int = 0,
    single: int = 0,
    keep_outputs: bool = False,
) -> Measurement:
    """Stream ``warmup`` micro-batches (cycling through ``inputs``), reset the workers' stats, then
    stream ``inputs`` and return their timings and the workers' stats (and outputs if ``keep_outputs``).

    The stream keeps the pipeline full (``capacity`` micro-batches in flight), which is what its
    throughput needs but makes each latency mostly the wait behind the others; ``single`` more
    micro-batches are then run one at a time, after the stats were taken, for the latency of one alone.

    Outputs are dropped as they arrive, as a server sends them on, unless ``keep_outputs``: keeping
    every one makes each new output fresh memory that the last stage faults in page by page (a tiny
    GPT-2's 2 MB of logits cost its last stage about 1 ms, 14%, per micro-batch on this project's
    2-core machine), which the sessions the pipeline is compared with do not pay.
    """
    if warmup > 0 and inputs:
        pipeline.run_many([inputs[j % len(inputs)] for j in range(warmup)])
    pipeline.reset_stats()
    window = max(1, pipeline.capacity)
    pending: deque[Job] = deque()
    queued_at: list[float] = []
    done_at: list[float] = []
    outputs: list[Tensors] = []

    def take() -> None:  # keeps the job's times, not the job: a done future holds its result
        job = pending.popleft()
        result = job.result()
        if keep_outputs:
            outputs.append(result)
        queued_at.append(job.queued_at)
        done_at.append(job.done_at if job.done_at is not None else time.perf_counter())

    start = time.perf_counter()
    for feeds in inputs:
        pending.append(pipeline.submit(feeds))
        while len(pending) >= window:
            take()
    while pending:
        take()
    end = max(done_at, default=time.perf_counter())
    stats = tuple(pipeline.stats())
    single_latencies: list[float] = []
    for j in range(single if inputs else 0):
        job = pipeline.submit(inputs[j % len(inputs)])
        job.result()
        single_latencies.append((job.done_at or time.perf_counter()) - job.queued_at)
    return Measurement(
        queued_at=tuple(queued_at),
        done_at=tuple(done_at),
        start=start,
        end=end,
        stats=stats,
        in_flight=min(window, len(inputs)),
        output_workers=_last_positions(pipeline.lanes),
        single_latencies_s=tuple(single_latencies),
        outputs=tuple(outputs),
    )


def _last_positions(lanes: Sequence[Sequence[object]]) -> tuple[int, ...]:
    """Positions of each lane's last worker in the backends' stats, which list the lanes in order."""
    positions: list[int] = []
    total = 0
    for lane in lanes:
        total += len(lane)
        positions.append(total - 1)
    return tuple(positions)


# --------------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Latency:
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Latency:
        if not seconds:
            return Latency(math.nan, math.nan, math.nan, math.nan, math.nan)
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        return Latency(
            float(ms.mean()),
            float(np.percentile(ms, 50)),
            float(np.percentile(ms, 90)),
            float(np.percentile(ms, 99)),
            float(ms.max()),
        )


@dataclass(frozen=True)
class StageReport:
    """One worker of the pipeline: its measured time per micro-batch against the estimate, its memory.

    ``measured_ms`` is the median time of the stage's session run; ``handling_ms`` adds the worker's own
    work around it (mapping and copying tensors); ``busy_fraction`` is the share of the measured wall
    time the worker was busy (not waiting for input or for room downstream).  ``estimate_error`` is
    ``(estimated - measured) / measured``.
    """

    index: int
    label: str
    file: str | None
    device: str
    threads: int
    microbatches: int
    measured_ms: float
    mean_ms: float
    handling_ms: float
    estimated_ms: float | None
    estimate_error: float | None
    busy_seconds: float
    busy_fraction: float
    peak_rss_bytes: int | None
    rss_bytes: int | None
    startup_rss_bytes: int | None
    param_bytes: int | None
    pid: int | None
    memory_shared_with_other_workers: bool = False
    model_rss_bytes: int | None = None
    """Peak minus the memory before loading, for a worker with its own process; None for thread
    workers, whose process's growth while a session loads hides what the allocator reused."""
    provider: str = CPU_PROVIDER
    cpus: tuple[int, ...] = ()
    """The CPUs the worker was pinned to (``--pin``); empty: not pinned."""
    worker_peak_rss_bytes: int | None = None
    """Peak RSS of a worker process running this stage alone: the worker's own (processes), or one
    short run in processes of their own when the pipeline ran threads (``--compare`` only)."""
    worker_model_rss_bytes: int | None = None
    """That worker's peak minus its memory before loading: what the stage's model costs a worker (for a
    stage whose process hosts other stages too, :attr:`hosted_with`, what all their models cost it)."""
    hosted_with: tuple[int, ...] = ()
    """The stages, this one among them, whose sessions shared that worker process (an interleaved split's
    worker in processes or on Ray); empty: the process ran this stage alone."""


@dataclass(frozen=True)
class WorkerReport:
    """One worker of an interleaved split: the stages it runs (each in a thread or process of its own,
    pinned with ``--pin`` to the worker's CPUs, which they share), their numbers summed.

    ``estimated_ms`` and ``measured_ms`` are the sums of its stages' (the time the worker spends per
    micro-batch), ``estimate_error`` is ``(estimated - measured) / measured`` of those sums,
    ``busy_seconds`` the stages' busy time together and ``busy_fraction`` its share of the wall time
    (above 1 only where the stages ran at once: not pinned to shared CPUs).  ``model_rss_bytes`` sums the
    ``worker_model_rss_bytes`` of the worker's processes, once per process (its stages hosted by one
    process, or each in a process of its own; None unless every stage's was measured), ``param_bytes``
    their weights.
    """

    index: int
    stages: tuple[int, ...]
    estimated_ms: float | None
    measured_ms: float
    estimate_error: float | None
    busy_seconds: float
    busy_fraction: float
    param_bytes: int | None
    model_rss_bytes: int | None
    cpus: tuple[int, ...] = ()
    """The CPUs its stages were pinned to (``--pin``), together; empty: not pinned."""

    @staticmethod
    def of(index: int, stages: Sequence[StageReport], wall_seconds: float) -> WorkerReport:
        """Worker ``index``, which runs ``stages``, over a run of ``wall_seconds``."""
        estimates = [s.estimated_ms for s in stages]
        estimated = None if any(e is None for e in estimates) else sum(e for e in estimates if e is not None)
        measured = sum(s.measured_ms for s in stages)
        error = (estimated - measured) / measured if estimated is not None and measured > 0 else None
        busy = sum(s.busy_seconds for s in stages)
        return WorkerReport(
            index=index,
            stages=tuple(s.index for s in stages),
            estimated_ms=estimated,
            measured_ms=measured,
            estimate_error=error,
            busy_seconds=busy,
            busy_fraction=busy / wall_seconds if wall_seconds > 0 else math.nan,
            param_bytes=_total([s.param_bytes for s in stages]),
            model_rss_bytes=_total(
                [s.worker_model_rss_bytes for s in stages if s.index == min(s.hosted_with or (s.index,))]
            ),
            cpus=tuple(sorted({c for s in stages for c in s.cpus})),
        )


def _total(values: Sequence[int | None]) -> int | None:
    """The sum, or None when any is unknown (a part missing makes the sum no one's)."""
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


@dataclass(frozen=True)
class BaselineReport:
    """The same micro-batches run another way; ``pipeline_speedup`` is the pipeline's throughput / this."""

    name: str
    description: str
    workers: int
    threads_per_worker: int
    throughput_per_s: float
    pipeline_speedup: float
    peak_rss_bytes: int | None = None
    """Largest worker's peak resident memory (a worker in its own process)."""
    model_rss_bytes: int | None = None
    """Largest worker's peak minus its memory before loading the model."""
    load_rss_bytes: int | None = None
    """Largest growth of a worker's memory while its session loaded."""
    provider: str = CPU_PROVIDER
    mode: str = "session"
    """How its throughput was measured: ``session`` (in this process), ``threads`` or ``processes``."""
    total_threads: int | None = None
    """Intra-op threads of all its workers together."""
    balanced_ceiling: float | None = None
    """Replicas only: the most a perfectly balanced pipeline on the replicas' CPUs could have reached
    against them, at the speeds those CPUs ran (:func:`onnxpipe.runtime.ceiling.balanced_ceiling`);
    ``None`` where it does not apply (Ray, unlike devices, too few records, runs under a millisecond)."""


@dataclass(frozen=True)
class RunReport:
    backend: str
    mode: str
    k: int
    microbatches: int
    warmup: int
    input_shapes: Mapping[str, tuple[int, ...]]
    throughput_per_s: float
    steady_throughput_per_s: float | None
    wall_seconds: float
    latency_saturated: Latency
    """Submission to result while ``latency_in_flight`` micro-batches are in flight: mostly queueing."""
    stages: tuple[StageReport, ...]
    bottleneck_stage: int
    estimates_comparable: bool
    estimate_max_error: float | None
    driver_peak_rss_bytes: int | None
    baselines: Mapping[str, BaselineReport] = field(default_factory=dict)
    outputs_match: bool | None = None
    outputs_max_rel_diff: float | None = None
    notes: tuple[str, ...] = ()
    latency_in_flight: int = 1
    latency_single: Latency | None = None
    """Submission to result of micro-batches run one at a time (None when not measured)."""
    steady_throughput_from: str | None = None
    worker_stages: tuple[tuple[int, ...], ...] = ()
    """The stages each worker runs when stages share workers (an interleaved split, the manifest's
    ``plan.workers``); empty: a worker per stage.  :attr:`workers` sums the stages' rows by it."""
    machine_slowdown: float | None = None
    """``--compare`` only: the one-thread session's time per micro-batch in this run over the whole
    model's when the estimates were made (the manifest's ``plan.reference_seconds``): above 1, the
    machine ran slower than then, and every estimate made then is short by as much.  None without a
    reference, on Ray (the actors may run on other machines than the session), for plans of more than
    one thread per stage (no baseline runs their threads alone), for models that run in under a
    millisecond (Python's per-call cost sets their pace), or when the estimates are not comparable."""
    estimate_max_error_at_machine_speed: float | None = None
    """The largest ``|estimated * machine_slowdown - measured| / measured``: what the estimates got
    wrong besides the machine's change of speed."""

    @property
    def workers(self) -> tuple[WorkerReport, ...]:
        """Each shared worker's stages summed (empty for a worker per stage).

        Derived from :attr:`stages` on each access, so a report whose stages were replaced (``--compare``
        adds each stage's memory measured in a process of its own) sums the new numbers."""
        by_index = {s.index: s for s in self.stages}
        return tuple(
            WorkerReport.of(w, [by_index[i] for i in group if i in by_index], self.wall_seconds)
            for w, group in enumerate(self.worker_stages)
        )

    @property
    def bottleneck_worker(self) -> int | None:
        """The worker busy longest (all its stages together); None for a worker per stage."""
        workers = self.workers
        return max(workers, key=lambda w: w.busy_seconds).index if workers else None

    @property
    def memory_shared(self) -> bool:
        """Whether the stages share one process (threads), so no stage's memory can be told apart."""
        return any(s.memory_shared_with_other_workers for s in self.stages)

    def to_obj(self) -> dict[str, Any]:
        """The report as JSON-ready data (NaN and infinity as ``null``); ``bottleneck_worker`` and
        ``workers`` only when stages share workers."""
        obj: dict[str, Any] = {
            "backend": self.backend,
            "mode": self.mode,
            "k": self.k,
            "microbatches": self.microbatches,
            "warmup": self.warmup,
            "input_shapes": {n: list(s) for n, s in self.input_shapes.items()},
            "throughput_per_s": _num(self.throughput_per_s),
            "steady_throughput_per_s": _num(self.steady_throughput_per_s),
            "steady_throughput_from": self.steady_throughput_from,
            "wall_seconds": _num(self.wall_seconds),
            "latency_ms": _latency_obj(self.latency_saturated),
            "latency_in_flight": self.latency_in_flight,
            "latency_single_ms": _latency_obj(self.latency_single) if self.latency_single else None,
            "bottleneck_stage": self.bottleneck_stage,
            "estimates_comparable": self.estimates_comparable,
            "estimate_max_error": _num(self.estimate_max_error),
            "machine_slowdown": _num(self.machine_slowdown),
            "estimate_max_error_at_machine_speed": _num(self.estimate_max_error_at_machine_speed),
            "driver_peak_rss_bytes": self.driver_peak_rss_bytes,
            "stages": [
                {
                    "index": s.index,
                    "label": s.label,
                    "file": s.file,
                    "device": s.device,
                    "provider": s.provider,
                    "threads": s.threads,
                    "cpus": list(s.cpus),
                    "microbatches": s.microbatches,
                    "measured_ms": _num(s.measured_ms),
                    "mean_ms": _num(s.mean_ms),
                    "handling_ms": _num(s.handling_ms),
                    "estimated_ms": _num(s.estimated_ms),
                    "estimate_error": _num(s.estimate_error),
                    "busy_seconds": _num(s.busy_seconds),
                    "busy_fraction": _num(s.busy_fraction),
                    "peak_rss_bytes": s.peak_rss_bytes,
                    "rss_bytes": s.rss_bytes,
                    "startup_rss_bytes": s.startup_rss_bytes,
                    "param_bytes": s.param_bytes,
                    "pid": s.pid,
                    "memory_shared_with_other_workers": s.memory_shared_with_other_workers,
                    "model_rss_bytes": s.model_rss_bytes,
                    "worker_peak_rss_bytes": s.worker_peak_rss_bytes,
                    "worker_model_rss_bytes": s.worker_model_rss_bytes,
                    "hosted_with": list(s.hosted_with),
                }
                for s in self.stages
            ],
            "baselines": {
                name: {
                    "description": b.description,
                    "provider": b.provider,
                    "mode": b.mode,
                    "workers": b.workers,
                    "threads_per_worker": b.threads_per_worker,
                    "total_threads": b.total_threads,
                    "throughput_per_s": _num(b.throughput_per_s),
                    "pipeline_speedup": _num(b.pipeline_speedup),
                    "peak_rss_bytes": b.peak_rss_bytes,
                    "model_rss_bytes": b.model_rss_bytes,
                    "load_rss_bytes": b.load_rss_bytes,
                    "balanced_ceiling": _num(b.balanced_ceiling),
                }
                for name, b in self.baselines.items()
            },
            "outputs_match": self.outputs_match,
            "outputs_max_rel_diff": _num(self.outputs_max_rel_diff),
            "notes": list(self.notes),
        }
        workers = self.workers
        if not workers:
            return obj
        shared: dict[str, Any] = {}
        for key, value in obj.items():
            shared[key] = value
            if key == "bottleneck_stage":
                shared["bottleneck_worker"] = self.bottleneck_worker
            elif key == "stages":
                shared["workers"] = [
                    {
                        "index": w.index,
                        "stages": list(w.stages),
                        "cpus": list(w.cpus),
                        "estimated_ms": _num(w.estimated_ms),
                        "measured_ms": _num(w.measured_ms),
                        "estimate_error": _num(w.estimate_error),
                        "busy_seconds": _num(w.busy_seconds),
                        "busy_fraction": _num(w.busy_fraction),
                        "param_bytes": w.param_bytes,
                        "model_rss_bytes": w.model_rss_bytes,
                    }
                    for w in workers
                ]
        return shared

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, allow_nan=False) + "\n"


def _latency_obj(latency: Latency) -> dict[str, float | None]:
    return {
        "mean": _num(latency.mean_ms),
        "p50": _num(latency.p50_ms),
        "p90": _num(latency.p90_ms),
        "p99": _num(latency.p99_ms),
        "max": _num(latency.max_ms),
    }


def _num(x: float | None) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return float(x)


def estimate_placements(manifest: Manifest) -> list[Placement] | None:
    """Where each stage's estimate is for: its device in the manifest's cluster (provider and threads;
    ``device_costs`` says whether those costs were profiled there or scaled from the reference), else
    the provider its device name implies with the plan's threads.  None when a device name maps to no
    provider (such a split runs only with ``--devices``): then only the plan's threads are known."""
    try:
        return manifest_placements(manifest)
    except UsageError:
        return None


def check_estimates(
    manifest: Manifest, specs: Sequence[WorkerSpec], input_shapes: Mapping[str, tuple[int, ...]]
) -> tuple[bool, list[str]]:
    """Whether the stages ran as their estimates were made for, and notes saying where not.

    Each stage's actual placement (provider, threads) is compared with the one its estimate is for
    (:func:`estimate_placements`), not with the reference profile's threads: a split made with
    ``--devices`` estimates each stage on its own device.
    """
    comparable = True
    notes: list[str] = []
    profiled = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    if profiled and dict(input_shapes) != profiled:
        comparable = False
        notes.append(
            f"the inputs' shapes differ from those the plan was made for ({_shapes(profiled)}): "
            "the estimates are for those shapes"
        )
    expected = estimate_placements(manifest)
    differs: list[str] = []
    for spec in specs:
        ran = spec.placement
        if expected is not None and spec.index < len(expected):
            want = expected[spec.index]
            if ran.provider != want.provider:
                differs.append(
                    f"stage {spec.index} ran on {ran.provider} with {ran.threads} thread(s), its estimate is "
                    f"for {want.provider} with {want.threads}"
                )
            elif ran.threads != want.threads:
                differs.append(
                    f"stage {spec.index} ran with {ran.threads} thread(s), its estimate is for {want.threads}"
                )
        elif ran.threads != manifest.plan.threads:
            differs.append(
                f"stage {spec.index} ran with {ran.threads} thread(s), its estimate is for "
                f"{manifest.plan.threads}"
            )
    if differs:
        comparable = False
        notes.append("; ".join(differs))
    if manifest.plan.cost_source == "static":
        notes.append("the estimates are static costs (FLOPs and bytes), not measured times")
    stage_devices = {st.device for st in manifest.stages}
    scaled = [d for d in manifest.device_costs if d.method == "scaled" and d.device in stage_devices]
    if scaled and manifest.plan.cost_source != "static":
        notes.append(
            "estimates extrapolated, not measured on the device: "
            + "; ".join(f"{d.device}: {d.source}" for d in scaled)
        )
    return comparable, notes


def build_report(
    pipeline: Pipeline,
    measurement: Measurement,
    *,
    warmup: int,
    input_shapes: Mapping[str, tuple[int, ...]],
    driver_peak_rss_bytes: int | None = None,
) -> RunReport:
    """Summarize ``measurement`` of ``pipeline`` (one lane: the stages); where the manifest's stages share
    workers (an interleaved split), each worker's stages summed too (:attr:`RunReport.workers`)."""
    manifest = pipeline.manifest
    specs = pipeline.lanes[0]
    wall = measurement.wall_seconds
    notes: list[str] = []
    by_index = {s.index: s for s in measurement.stats[: len(specs)]}
    stages: list[StageReport] = []
    for spec in specs:
        st = by_index.get(spec.index)
        records = st.records if st is not None else ()
        runs = [r.run_seconds for r in records]
        busy = [r.busy_seconds for r in records]
        measured = statistics.median(runs) * 1e3 if runs else math.nan
        entry = manifest.stages[spec.index] if manifest is not None else None
        estimated = entry.estimated_compute_seconds * 1e3 if entry is not None else None
        error = (estimated - measured) / measured if estimated is not None and measured > 0 else None
        busy_total = float(sum(busy))
        shared = st.process_shared if st is not None else False
        stages.append(
            StageReport(
                index=spec.index,
                label=spec.label,
                file=entry.file if entry is not None else None,
                device=spec.device,
                threads=spec.placement.threads,
                microbatches=len(records),
                measured_ms=measured,
                mean_ms=statistics.fmean(runs) * 1e3 if runs else math.nan,
                handling_ms=statistics.median(busy) * 1e3 if busy else math.nan,
                estimated_ms=estimated,
                estimate_error=error,
                busy_seconds=busy_total,
                busy_fraction=busy_total / wall if wall > 0 else math.nan,
                peak_rss_bytes=st.peak_rss_bytes if st is not None else None,
                rss_bytes=st.rss_bytes if st is not None else None,
                startup_rss_bytes=st.startup_rss_bytes if st is not None else None,
                param_bytes=entry.param_bytes if entry is not None else None,
                pid=st.pid if st is not None else None,
                memory_shared_with_other_workers=shared,
                model_rss_bytes=st.model_rss_bytes if st is not None and not shared else None,
                provider=spec.placement.provider,
                cpus=spec.placement.cpus,
                worker_peak_rss_bytes=st.peak_rss_bytes if st is not None and not shared else None,
                worker_model_rss_bytes=st.model_rss_bytes if st is not None and not shared else None,
                hosted_with=st.hosted_with if st is not None else (),
            )
        )
    bottleneck = max(range(len(stages)), key=lambda i: stages[i].busy_seconds) if stages else 0
    comparable = True
    if manifest is not None:
        comparable, estimate_notes = check_estimates(manifest, specs, input_shapes)
        notes.extend(estimate_notes)
    errors = [abs(s.estimate_error) for s in stages if s.estimate_error is not None]
    if pipeline.pin_note is not None:
        notes.append(pipeline.pin_note)
    groups: tuple[tuple[int, ...], ...] = ()
    if manifest is not None and manifest.plan.workers is not None:
        groups = tuple(manifest.stages_of(w) for w in range(manifest.workers))
        local = pipeline.backend.kind != "ray"  # a Ray worker's actor has the CPUs Ray gave it
        if local and not any(spec.placement.cpus for spec in specs) and pipeline.pin_note is None:
            notes.append(
                f"the {len(specs)} stages share {len(groups)} workers but were not pinned (--pin): a "
                "worker's stages took turns, but on any CPUs, not on the worker's own as its estimate "
                "assumes"
            )
    if any(s.memory_shared_with_other_workers for s in stages):
        notes.append(
            "thread workers share one process: a stage's peak RSS is the process's, and its own memory "
            "cannot be told apart (the allocator reuses memory across sessions); --compare measures each "
            "stage in a process of its own, --local-mode processes runs them so"
        )
    if measurement.steady_throughput_per_s is None:
        notes.append(
            f"no steady throughput: it needs at least {min_steady_microbatches(len(measurement.stats))} "
            "micro-batches (--microbatches)"
        )
    single = measurement.single_latencies_s
    return RunReport(
        backend="ray" if pipeline.backend.kind == "ray" else "local",
        mode=pipeline.backend.kind,
        k=len(specs),
        microbatches=measurement.microbatches,
        warmup=warmup,
        input_shapes=dict(input_shapes),
        throughput_per_s=measurement.throughput_per_s,
        steady_throughput_per_s=measurement.steady_throughput_per_s,
        steady_throughput_from=measurement.steady_throughput_from,
        wall_seconds=wall,
        latency_saturated=Latency.of(measurement.latencies_s),
        latency_in_flight=measurement.in_flight,
        latency_single=Latency.of(single) if single else None,
        stages=tuple(stages),
        bottleneck_stage=stages[bottleneck].index if stages else 0,
        estimates_comparable=comparable,
        estimate_max_error=max(errors) if errors else None,
        driver_peak_rss_bytes=driver_peak_rss_bytes,
        notes=tuple(notes),
        worker_stages=groups,
    )


def _shapes(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{n}={'x'.join(str(d) for d in s)}" for n, s in shapes.items())


# --------------------------------------------------------------------------------------------------
# text


def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


def _bytes(x: int | None) -> str:
    return "-" if x is None else human_bytes(x)


def _stage_list(stages: Sequence[int]) -> str:
    return ", ".join(str(s) for s in stages)


def worker_line(worker: WorkerReport, *, bottleneck: bool = False) -> str:
    """One shared worker's stages summed, as :func:`format_report` prints it (``*``: the bottleneck)."""
    mark = " *" if bottleneck else ""
    err = "" if worker.estimate_error is None else f" ({worker.estimate_error * 100:+.1f}%)"
    busy = "-" if math.isnan(worker.busy_fraction) else f"{worker.busy_fraction * 100:.0f}%"
    line = (
        f"worker {worker.index}{mark}: stages {_stage_list(worker.stages)}: "
        f"est {_ms(worker.estimated_ms)} ms, measured {_ms(worker.measured_ms)} ms{err}, "
        f"busy {busy}, weights {_bytes(worker.param_bytes)}"
    )
    if worker.model_rss_bytes is not None:
        line += f", model memory {human_bytes(worker.model_rss_bytes)}"
    return line


def format_report(report: RunReport) -> str:
    """The report as the CLI prints it: a stage table, the totals, then the baselines if any.

    Per-worker memory (peak RSS, model memory) is shown only where each worker has its own process;
    thread workers show their weights and the memory line says what can be compared.  Where stages share
    workers (an interleaved split), a line per worker after the table sums its stages (:func:`worker_line`)
    and the totals name the bottleneck worker as well as the busiest stage.
    """
    shared = report.memory_shared
    rows = []
    for s in report.stages:
        err = "-" if s.estimate_error is None else f"{s.estimate_error * 100:+.1f}%"
        mark = " *" if s.index == report.bottleneck_stage else ""
        row = [
            f"{s.index}{mark}",
            s.file or s.label,
            f"{s.threads} @{','.join(str(c) for c in s.cpus)}" if s.cpus else str(s.threads),
            _ms(s.estimated_ms),
            _ms(s.measured_ms),
            err,
            f"{s.busy_fraction * 100:.0f}%" if not math.isnan(s.busy_fraction) else "-",
            _bytes(s.param_bytes),
        ]
        if not shared:
            row += [_bytes(s.peak_rss_bytes), _bytes(s.model_rss_bytes)]
        rows.append(row)
    headers = ["stage", "file", "threads", "est ms", "measured ms", "error", "busy", "weights"]
    if not shared:
        headers += ["peak RSS", "model mem"]
    steady = (
        f"{report.steady_throughput_per_s:.2f}/s once full"
        if report.steady_throughput_per_s is not None
        else "too few for a steady rate"
    )
    sat = report.latency_saturated
    latency = (
        f"latency at saturation ({report.latency_in_flight} in flight) p50 {sat.p50_ms:.2f} ms, "
        f"p90 {sat.p90_ms:.2f} ms"
    )
    if report.latency_single is not None:
        one = report.latency_single
        latency += f"; one at a time p50 {one.p50_ms:.2f} ms, p90 {one.p90_ms:.2f} ms"
    workers = report.workers
    if workers:
        on = f"{len(workers)} workers ({report.k} interleaved stages, {report.mode})"
        bottleneck = (
            f"bottleneck worker {report.bottleneck_worker} (*), busiest stage {report.bottleneck_stage} (*)"
        )
    else:
        on = f"{report.k} {report.mode} workers"
        bottleneck = f"bottleneck stage {report.bottleneck_stage} (*)"
    lines = [
        table(headers, rows),
        *(worker_line(w, bottleneck=w.index == report.bottleneck_worker) for w in workers),
        f"{report.microbatches} micro-batches ({_shapes(report.input_shapes)}) on {on}: "
        f"{report.throughput_per_s:.2f}/s ({steady}); {latency}; {bottleneck}",
    ]
    if report.baselines:
        brows = [
            [
                name,
                b.description,
                f"{b.throughput_per_s:.2f}",
                f"{b.pipeline_speedup:.2f}x",
                _bytes(b.peak_rss_bytes),
            ]
            for name, b in report.baselines.items()
        ]
        lines.append(table(["baseline", "how", "per s", "pipeline is", "peak RSS/worker"], brows))
        replicas = report.baselines.get("replicas")
        if replicas is not None and replicas.balanced_ceiling is not None:
            lines.append(
                "ceiling: at the speeds the replicas' CPUs ran (their own records), a perfectly balanced "
                f"pipeline on them would have reached about {replicas.balanced_ceiling:.2f}x the replicas "
                f"(this one: {replicas.pipeline_speedup:.2f}x)"
            )
    if report.machine_slowdown is not None:
        line = (
            f"machine: the one-thread session took {report.machine_slowdown:.2f}x as long a micro-batch as "
            "the model did when the estimates were made"
        )
        if report.estimate_max_error is not None and report.estimate_max_error_at_machine_speed is not None:
            line += (
                f"; at that speed the estimates were off by up to "
                f"{report.estimate_max_error_at_machine_speed * 100:.1f}% "
                f"(as made: {report.estimate_max_error * 100:.1f}%)"
            )
        lines.append(line)
    memory = memory_line(report)
    if memory:
        lines.append(memory)
    if report.outputs_match is not None:
        verdict = "match" if report.outputs_match else "DO NOT match"
        lines.append(
            f"outputs {verdict} the original model's (max rel diff {report.outputs_max_rel_diff or 0.0:.3g})"
        )
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def memory_line(report: RunReport) -> str | None:
    """What the memory numbers allow to say, like with like: a stage worker's model memory against a
    replica's, both measured in a fresh process of their own.

    Thread workers share one process, where what loading a session adds depends on what the allocator
    already holds; ``--compare`` then measures each stage in a short processes run
    (``worker_model_rss_bytes``).  Without those numbers, no ratio: only the stages' weights and peaks.
    Where stages share workers (an interleaved split), a worker's model memory and weights are its
    stages' together, and the largest worker's is compared.
    """
    replicas = report.baselines.get("replicas")
    workers = report.workers
    if replicas is not None and replicas.model_rss_bytes:
        if workers:
            hosted = any(s.hosted_with for s in report.stages)
            ratio = _worker_memory_ratio(workers, replicas.model_rss_bytes, report.memory_shared, hosted)
        else:
            ratio = _stage_memory_ratio(report.stages, replicas.model_rss_bytes, report.memory_shared)
        if ratio is not None:
            return f"{ratio} (a replica worker peaks at {_bytes(replicas.peak_rss_bytes)})"
    if not report.memory_shared:
        return None
    peaks = [p for p in [report.driver_peak_rss_bytes, *(s.peak_rss_bytes for s in report.stages)] if p]
    parts = []
    if workers:
        weighed = [(w, w.param_bytes) for w in workers if w.param_bytes is not None]
        if weighed:
            each = ", ".join(f"{human_bytes(b)} (stages {_stage_list(w.stages)})" for w, b in weighed)
            parts.append(f"worker weights {each}")
    else:
        weights = [s.param_bytes for s in report.stages if s.param_bytes is not None]
        if weights:
            parts.append(f"stage weights {', '.join(human_bytes(w) for w in weights)}")
    if peaks:
        parts.append(f"this process (every stage and the driver) peaked at {human_bytes(max(peaks))}")
    if replicas is not None and replicas.peak_rss_bytes:
        parts.append(f"one replica in its own process peaks at {human_bytes(replicas.peak_rss_bytes)}")
    return "memory: " + "; ".join(parts)


def _stage_memory_ratio(stages: Sequence[StageReport], replica: int, shared: bool) -> str | None:
    """Each stage worker's model memory against a replica's; None when no stage's was measured."""
    models = [s.worker_model_rss_bytes for s in stages if s.worker_model_rss_bytes is not None]
    if not models:
        return None
    where = " (each in a process of its own, a short run)" if shared else ""
    return (
        f"memory: a stage worker's model takes {', '.join(human_bytes(m) for m in models)}, a "
        f"replica's {human_bytes(replica)}{where}: the largest stage {max(models) / replica:.2f}x a replica"
    )


def _worker_memory_ratio(
    workers: Sequence[WorkerReport], replica: int, shared: bool, hosted: bool
) -> str | None:
    """Each shared worker's model memory (its stages' together) against a replica's; None when no
    worker's was measured.  ``hosted``: a worker's stages ran in one process (else one each)."""
    models = [(w, w.model_rss_bytes) for w in workers if w.model_rss_bytes is not None]
    if not models:
        return None
    alone = "each worker's stages in one process" if hosted else "each stage in a process of its own"
    where = f" ({alone}, a short run)" if shared else ""
    largest, most = max(models, key=lambda wm: wm[1])
    each = ", ".join(f"{human_bytes(m)} (stages {_stage_list(w.stages)})" for w, m in models)
    return (
        f"memory: a worker's model (its stages' together) takes {each}, a replica's {human_bytes(replica)}"
        f"{where}: the largest worker (stages {_stage_list(largest.stages)}) {most / replica:.2f}x a replica"
    )
