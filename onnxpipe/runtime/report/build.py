"""From a measurement to a :class:`~onnxpipe.runtime.report.model.RunReport`: each stage's measured time
against the manifest's estimate (when the run is comparable with the plan), the bottleneck, the workers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.manifest import Manifest
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.cluster import hop_reports, overhead_ms
from onnxpipe.runtime.report.measure import Measurement, min_steady_microbatches
from onnxpipe.runtime.report.model import Latency, RunReport, StageReport
from onnxpipe.runtime.report.text import shapes_text
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement, WorkerSpec, manifest_placements


def check_estimates(
    manifest: Manifest, specs: Sequence[WorkerSpec], input_shapes: Mapping[str, tuple[int, ...]]
) -> tuple[bool, list[str]]:
    """Whether the stages ran as their estimates were made for, and notes saying where not.

    Each stage's actual placement (provider, threads) is compared with the one its estimate is for, not
    with the reference profile's threads: a split made with ``--devices`` estimates each stage on its own
    device (:func:`~onnxpipe.runtime.spec.manifest_placements`; ``device_costs`` says whether those costs
    were profiled there or scaled).  A device name that maps to no provider (such a split runs only with
    ``--devices``) leaves only the plan's threads to compare.
    """
    comparable = True
    notes: list[str] = []
    profiled = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    if profiled and dict(input_shapes) != profiled:
        comparable = False
        notes.append(
            f"the inputs' shapes differ from those the plan was made for ({shapes_text(profiled)}): "
            "the estimates are for those shapes"
        )
    try:
        expected: list[Placement] | None = manifest_placements(manifest)
    except UsageError:
        expected = None
    differs: list[str] = []
    for spec in specs:
        ran = spec.placement
        want = expected[spec.index] if expected is not None and spec.index < len(expected) else None
        threads = want.threads if want is not None else manifest.plan.threads
        if want is not None and ran.runs_on != want.runs_on:
            differs.append(
                f"stage {spec.index} ran on {ran.runs_on} with {ran.threads} thread(s), its estimate is "
                f"for {want.runs_on} with {want.threads}"
            )
        elif ran.threads != threads:
            differs.append(
                f"stage {spec.index} ran with {ran.threads} thread(s), its estimate is for {threads}"
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
    by_index = {s.index: s for s in measurement.stats[: len(specs)]}
    stages = tuple(stage_report(spec, by_index.get(spec.index), measurement.wall_seconds) for spec in specs)
    bottleneck = max(range(len(stages)), key=lambda i: stages[i].busy_seconds) if stages else 0
    comparable, notes = check_estimates(manifest, specs, input_shapes) if manifest is not None else (True, [])
    errors = [abs(s.estimate_error) for s in stages if s.estimate_error is not None]
    groups: tuple[tuple[int, ...], ...] = ()
    if (
        manifest is not None and manifest.plan.workers is not None
    ):  # an interleaved split: each worker's stages
        groups = tuple(manifest.stages_of(w) for w in range(manifest.workers))
    notes.extend(_run_notes(pipeline, stages, groups, measurement))
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
        wall_seconds=measurement.wall_seconds,
        latency_saturated=Latency.of(measurement.latencies_s),
        latency_in_flight=measurement.in_flight,
        latency_single=Latency.of(single) if single else None,
        bottleneck_stage=stages[bottleneck].index if stages else 0,
        estimates_comparable=comparable,
        estimate_max_error=max(errors) if errors else None,
        driver_peak_rss_bytes=driver_peak_rss_bytes,
        notes=tuple(notes),
        worker_stages=groups,
        **_cluster_part(pipeline, measurement, stages),
    )


def _cluster_part(
    pipeline: Pipeline, measurement: Measurement, stages: tuple[StageReport, ...]
) -> dict[str, Any]:
    """The report's stages, hops, overhead, recoveries and failure: on Ray, each stage with the node its
    actor ran on last and the bytes shipped there, and the hops and recoveries."""
    part: dict[str, Any] = {"failure": measurement.failure, "stages": stages}
    backend = pipeline.backend
    if isinstance(backend, RayBackend):
        part["stages"] = tuple(
            replace(s, node=backend.placed[i], shipped_bytes=backend.shipped_to(i))
            for i, s in enumerate(stages)
        )
        indexes = [s.index for s in pipeline.lanes[0]]
        part["hops"] = hop_reports(measurement.trips, measurement.single_trips, indexes)
        part["overhead_ms"] = overhead_ms(measurement.single_trips)
        part["recoveries"] = tuple(backend.recoveries)
    return part


def stage_report(spec: WorkerSpec, st: WorkerStats | None, wall: float) -> StageReport:
    """One stage's line of the report: what its worker measured (``st``) against what the manifest
    estimated (``spec.stage``); memory figures only where the stage's process is its own."""
    if st is None:  # a run that failed before its stats were taken: nothing measured
        st = WorkerStats(spec.index, spec.label, (), None, 0.0, None, None, None)
    runs = [r.run_seconds for r in st.records]
    busy = [r.busy_seconds for r in st.records]
    busy_total = float(sum(busy))
    return StageReport(
        worker=spec,
        stats=st,
        microbatches=len(st.records),
        measured_ms=statistics.median(runs) * 1e3 if runs else math.nan,
        mean_ms=statistics.fmean(runs) * 1e3 if runs else math.nan,
        handling_ms=statistics.median(busy) * 1e3 if busy else math.nan,
        busy_seconds=busy_total,
        busy_fraction=busy_total / wall if wall > 0 else math.nan,
        alone=None if st.process_shared else st,
    )


def _run_notes(
    pipeline: Pipeline,
    stages: Sequence[StageReport],
    groups: tuple[tuple[int, ...], ...],
    measurement: Measurement,
) -> list[str]:
    """What the reader of the figures must know about how they were taken."""
    notes: list[str] = []
    if pipeline.pin_note is not None:
        notes.append(pipeline.pin_note)
    local = pipeline.backend.kind != "ray"  # a Ray worker's actor has the CPUs Ray gave it
    unpinned = not any(spec.placement.cpus for spec in pipeline.lanes[0]) and pipeline.pin_note is None
    if groups and local and unpinned:
        notes.append(
            f"the {len(stages)} stages share {len(groups)} workers but were not pinned "
            f"({opt('pin', True)}): a worker's stages took turns, but on any CPUs, not on the worker's own "
            "as "
            "its estimate assumes"
        )
    if any(s.stats.process_shared for s in stages):
        notes.append(
            "thread workers share one process: a stage's peak RSS is the process's, and its own memory "
            f"cannot be told apart (the allocator reuses memory across sessions); {opt('compare', True)} "
            f"measures each stage in a process of its own, {opt('local_mode', 'processes')} runs them so"
        )
    if measurement.steady_throughput_per_s is None:
        notes.append(
            f"no steady throughput: it needs at least {min_steady_microbatches(len(measurement.stats))} "
            f"micro-batches ({opt('microbatches')})"
        )
    return notes
