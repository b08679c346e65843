"""Measure a running pipeline and describe what it delivered: throughput, latency, each stage's time
against the manifest's estimate, the bottleneck, each worker's memory, and (with
:mod:`onnxpipe.runtime.compare`) how it fares against running the model without a pipeline.

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

from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.pipeline import Job, Pipeline
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.tables import human_bytes, table

Feeds = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Measurement:
    """Outputs and timings of one measured stream (``perf_counter`` seconds of the caller)."""

    outputs: tuple[Tensors, ...]
    queued_at: tuple[float, ...]
    done_at: tuple[float, ...]
    start: float
    end: float
    stats: tuple[WorkerStats, ...]

    @property
    def wall_seconds(self) -> float:
        return self.end - self.start

    @property
    def throughput_per_s(self) -> float:
        return len(self.outputs) / self.wall_seconds if self.wall_seconds > 0 else math.inf

    @property
    def steady_throughput_per_s(self) -> float:
        """Micro-batches per second between the first and the last output: the pipeline's fill excluded."""
        if len(self.done_at) < 2:
            return self.throughput_per_s
        span = self.done_at[-1] - self.done_at[0]
        return (len(self.done_at) - 1) / span if span > 0 else math.inf

    @property
    def latencies_s(self) -> list[float]:
        return [d - q for q, d in zip(self.queued_at, self.done_at, strict=True)]


def measure(pipeline: Pipeline, inputs: Sequence[Feeds], *, warmup: int = 0) -> Measurement:
    """Stream ``warmup`` micro-batches (cycling through ``inputs``), reset the workers' stats, then
    stream ``inputs`` and return their outputs, timings and the workers' stats."""
    if warmup > 0 and inputs:
        pipeline.run_many([inputs[j % len(inputs)] for j in range(warmup)])
    pipeline.reset_stats()
    window = max(1, pipeline.capacity)
    pending: deque[Job] = deque()
    finished: list[Job] = []
    outputs: list[Tensors] = []
    start = time.perf_counter()
    for feeds in inputs:
        pending.append(pipeline.submit(feeds))
        while len(pending) >= window:
            job = pending.popleft()
            outputs.append(job.result())
            finished.append(job)
    while pending:
        job = pending.popleft()
        outputs.append(job.result())
        finished.append(job)
    done_at = tuple(j.done_at if j.done_at is not None else time.perf_counter() for j in finished)
    end = max(done_at, default=time.perf_counter())
    return Measurement(
        outputs=tuple(outputs),
        queued_at=tuple(j.queued_at for j in finished),
        done_at=done_at,
        start=start,
        end=end,
        stats=tuple(pipeline.stats()),
    )


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
    """Peak minus the memory before loading (own process), or the growth while loading (threads)."""


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
    """Largest worker's peak resident memory (workers in their own processes only)."""
    model_rss_bytes: int | None = None
    """Largest worker's peak minus its memory before loading the model."""
    load_rss_bytes: int | None = None
    """Largest growth of a worker's memory while its session loaded."""


@dataclass(frozen=True)
class RunReport:
    backend: str
    mode: str
    k: int
    microbatches: int
    warmup: int
    input_shapes: Mapping[str, tuple[int, ...]]
    throughput_per_s: float
    steady_throughput_per_s: float
    wall_seconds: float
    latency: Latency
    stages: tuple[StageReport, ...]
    bottleneck_stage: int
    estimates_comparable: bool
    estimate_max_error: float | None
    driver_peak_rss_bytes: int | None
    baselines: Mapping[str, BaselineReport] = field(default_factory=dict)
    outputs_match: bool | None = None
    outputs_max_rel_diff: float | None = None
    notes: tuple[str, ...] = ()

    def to_obj(self) -> dict[str, Any]:
        """The report as JSON-ready data (NaN and infinity as ``null``)."""
        return {
            "backend": self.backend,
            "mode": self.mode,
            "k": self.k,
            "microbatches": self.microbatches,
            "warmup": self.warmup,
            "input_shapes": {n: list(s) for n, s in self.input_shapes.items()},
            "throughput_per_s": _num(self.throughput_per_s),
            "steady_throughput_per_s": _num(self.steady_throughput_per_s),
            "wall_seconds": _num(self.wall_seconds),
            "latency_ms": {
                "mean": _num(self.latency.mean_ms),
                "p50": _num(self.latency.p50_ms),
                "p90": _num(self.latency.p90_ms),
                "p99": _num(self.latency.p99_ms),
                "max": _num(self.latency.max_ms),
            },
            "bottleneck_stage": self.bottleneck_stage,
            "estimates_comparable": self.estimates_comparable,
            "estimate_max_error": _num(self.estimate_max_error),
            "driver_peak_rss_bytes": self.driver_peak_rss_bytes,
            "stages": [
                {
                    "index": s.index,
                    "label": s.label,
                    "file": s.file,
                    "device": s.device,
                    "threads": s.threads,
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
                }
                for s in self.stages
            ],
            "baselines": {
                name: {
                    "description": b.description,
                    "workers": b.workers,
                    "threads_per_worker": b.threads_per_worker,
                    "throughput_per_s": _num(b.throughput_per_s),
                    "pipeline_speedup": _num(b.pipeline_speedup),
                    "peak_rss_bytes": b.peak_rss_bytes,
                    "model_rss_bytes": b.model_rss_bytes,
                    "load_rss_bytes": b.load_rss_bytes,
                }
                for name, b in self.baselines.items()
            },
            "outputs_match": self.outputs_match,
            "outputs_max_rel_diff": _num(self.outputs_max_rel_diff),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, allow_nan=False) + "\n"


def _num(x: float | None) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return float(x)


def build_report(
    pipeline: Pipeline,
    measurement: Measurement,
    *,
    warmup: int,
    input_shapes: Mapping[str, tuple[int, ...]],
    driver_peak_rss_bytes: int | None = None,
) -> RunReport:
    """Summarize ``measurement`` of ``pipeline`` (one lane: the stages)."""
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
                memory_shared_with_other_workers=st.process_shared if st is not None else False,
                model_rss_bytes=st.model_rss_bytes if st is not None else None,
            )
        )
    bottleneck = max(range(len(stages)), key=lambda i: stages[i].busy_seconds) if stages else 0
    comparable = True
    if manifest is not None:
        profiled = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
        if profiled and dict(input_shapes) != profiled:
            comparable = False
            notes.append(
                f"the inputs' shapes differ from those the plan was made for ({_shapes(profiled)}): "
                "the estimates are for those shapes"
            )
        if any(s.placement.threads != manifest.plan.threads for s in specs):
            comparable = False
            notes.append(f"the plan's estimates are for {manifest.plan.threads} thread(s) per stage")
        if manifest.plan.cost_source == "static":
            notes.append("the estimates are static costs (FLOPs and bytes), not measured times")
    errors = [abs(s.estimate_error) for s in stages if s.estimate_error is not None]
    if any(s.memory_shared_with_other_workers for s in stages):
        notes.append(
            "thread workers share one process: peak RSS is the process's; a stage's model memory is "
            "what loading its session added"
        )
    return RunReport(
        backend="ray" if pipeline.backend.kind == "ray" else "local",
        mode=pipeline.backend.kind,
        k=len(specs),
        microbatches=len(measurement.outputs),
        warmup=warmup,
        input_shapes=dict(input_shapes),
        throughput_per_s=measurement.throughput_per_s,
        steady_throughput_per_s=measurement.steady_throughput_per_s,
        wall_seconds=wall,
        latency=Latency.of(measurement.latencies_s),
        stages=tuple(stages),
        bottleneck_stage=stages[bottleneck].index if stages else 0,
        estimates_comparable=comparable,
        estimate_max_error=max(errors) if errors else None,
        driver_peak_rss_bytes=driver_peak_rss_bytes,
        notes=tuple(notes),
    )


def _shapes(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{n}={'x'.join(str(d) for d in s)}" for n, s in shapes.items())


# --------------------------------------------------------------------------------------------------
# text


def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2f}"


def _bytes(x: int | None) -> str:
    return "-" if x is None else human_bytes(x)


def format_report(report: RunReport) -> str:
    """The report as the CLI prints it: a stage table, the totals, then the baselines if any."""
    rows = []
    for s in report.stages:
        err = "-" if s.estimate_error is None else f"{s.estimate_error * 100:+.1f}%"
        mark = " *" if s.index == report.bottleneck_stage else ""
        rows.append(
            [
                f"{s.index}{mark}",
                s.file or s.label,
                str(s.threads),
                _ms(s.estimated_ms),
                _ms(s.measured_ms),
                err,
                f"{s.busy_fraction * 100:.0f}%" if not math.isnan(s.busy_fraction) else "-",
                _bytes(s.peak_rss_bytes),
                _bytes(s.model_rss_bytes),
            ]
        )
    lines = [
        table(
            ["stage", "file", "threads", "est ms", "measured ms", "error", "busy", "peak RSS", "model mem"],
            rows,
        ),
        f"{report.microbatches} micro-batches ({_shapes(report.input_shapes)}) on {report.k} {report.mode} "
        f"workers: {report.throughput_per_s:.2f}/s ({report.steady_throughput_per_s:.2f}/s once full), "
        f"latency p50 {report.latency.p50_ms:.2f} ms, p90 {report.latency.p90_ms:.2f} ms; "
        f"bottleneck stage {report.bottleneck_stage} (*)",
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
        stage_models = [s.model_rss_bytes for s in report.stages if s.model_rss_bytes is not None]
        shared = any(s.memory_shared_with_other_workers for s in report.stages)
        # like with like: what loading added (threads), or peak less memory before loading (processes)
        replica_model: int | None = None
        if replicas is not None:
            replica_model = replicas.load_rss_bytes if shared else replicas.model_rss_bytes
        if replicas is not None and replica_model and stage_models:
            worst = max(stage_models)
            how = "loading a stage's session added" if shared else "a stage's model takes"
            lines.append(
                f"memory: {how} up to {human_bytes(worst)}, a replica's {human_bytes(replica_model)} "
                f"({worst / replica_model:.2f}x; a replica worker peaks at {_bytes(replicas.peak_rss_bytes)})"
            )
    if report.outputs_match is not None:
        verdict = "match" if report.outputs_match else "DO NOT match"
        lines.append(
            f"outputs {verdict} the original model's (max rel diff {report.outputs_max_rel_diff or 0.0:.3g})"
        )
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)
