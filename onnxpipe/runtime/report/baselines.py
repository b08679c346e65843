"""Baselines for ``onnxpipe run --compare``: the original model run without a pipeline, like with like.

* ``session_1_thread``: one onnxruntime session with one intra-op thread, micro-batches one after
  another in this process;
* ``session_total_threads``: the same with as many threads as all the stages together;
* ``replicas``: K copies of the whole model fed in turn (data parallel), in the pipeline's local mode
  (threads when it runs threads; an actor each when it runs on Ray, placed by Ray as the stages are),
  sharing the pipeline's total threads (:func:`replica_threads`).

Every baseline runs on the stages' provider (:func:`baseline_placement`), so that a GPU pipeline is not
measured against a CPU session.  A replica's memory is measured in a fresh process of its own (the
replicas' own processes or actors, or one short extra run when they ran as threads), like a stage
worker's (the stage workers' own processes, or one short processes run of the stages when they ran as
threads).
The sessions run in this process with no inter-process traffic at all: the strongest form of each
baseline, not a strawman.  :func:`compare_outputs` checks that the pipeline
computed what the model does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, cast

import numpy as np

from onnxpipe.core.choices import LocalMode
from onnxpipe.core.errors import RuntimeStageError, error_line
from onnxpipe.core.runtimes import Engine, open_engine
from onnxpipe.manifest import Manifest
from onnxpipe.runtime.affinity import cpu_sets, pinned
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import BackendConfig, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.ceiling import MIN_RUN_S, balanced_ceiling
from onnxpipe.runtime.report.measure import Measurement, measure
from onnxpipe.runtime.report.model import BaselineReport, RunReport
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import CPU_PROVIDER, Placement, WorkerSpec, model_spec
from onnxpipe.verification.compare import compare
from onnxpipe.verification.options import BY_BOUNDARY, DEFAULT_ATOL, DEFAULT_RTOL, Tolerance, loosest_boundary

Feeds = Mapping[str, np.ndarray]

MEMORY_MICROBATCHES = 4
"""Micro-batches of the one-replica memory run: its peak then includes running, not only loading."""


def baseline_placement(specs: Sequence[WorkerSpec]) -> tuple[Placement, str | None]:
    """The provider (and options) every baseline runs the whole model on, and a note when it is a choice.

    The stages' provider when they share one.  Stages on several providers: the first stage's, because
    one session (or one replica) runs on one provider while the pipeline spreads the model over several;
    the note says so, since then no baseline is quite like the pipeline.  ``threads`` is left at 1: each
    baseline sets its own.
    """
    first = specs[0]
    providers = list(dict.fromkeys(s.placement.runs_on for s in specs))
    note = None
    if len(providers) > 1:
        note = (
            f"the stages run on several providers ({', '.join(providers)}); the baselines run the whole "
            f"model on the first stage's ({first.placement.provider}, device {first.device!r}), since one "
            "session runs on one provider"
        )
    if not first.placement.kind.reference:
        note = (
            f"the stages run on {', '.join(providers)}; the baselines and the reference outputs run the "
            f"whole model in onnxruntime ({first.placement.provider})"
        )
    return Placement(first.placement.provider, first.placement.provider_options, 1), note


def replica_threads(stage_threads: Sequence[int]) -> list[int]:
    """Intra-op threads of each of the K replicas: the pipeline's total split as evenly as possible.

    ``total // K`` each, the first ``total % K`` replicas one more, so that K replicas hold exactly as
    many threads as the K stages (each stage has at least one, so each replica does too) and neither
    side wins by using more cores.
    """
    total, k = sum(stage_threads), len(stage_threads)
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


def worker_threads(pipeline: Pipeline) -> list[int]:
    """Intra-op threads of each of the pipeline's workers: a stage's own, or, where stages share a worker
    (an interleaved split), the most any of them runs, since they share the worker's CPUs.  The
    baselines get as many threads, and as many replicas, as the pipeline has workers."""
    specs = pipeline.lanes[0]
    m = pipeline.manifest
    if m is None or m.plan.workers is None:
        return [s.placement.threads for s in specs]
    return [max(specs[s].placement.threads for s in m.stages_of(w)) for w in range(m.workers)]


ReplicaMode = Literal["threads", "processes", "ray"]


def replica_mode(pipeline: Pipeline) -> ReplicaMode:
    """How the replicas run: as the pipeline's workers do (threads, processes or Ray actors), so that
    neither side pays for (or is spared) copies, wake-ups or Ray's object store alone."""
    return cast(ReplicaMode, pipeline.backend.kind)


def session_throughput(model: Path, inputs: Sequence[Feeds], *, placement: Placement, warmup: int) -> float:
    """Micro-batches per second of one session on ``placement`` (provider, threads, CPUs).

    The session runs in the calling thread, pinned to ``placement.cpus`` while it runs (if any).  Its
    outputs are dropped as they come, as the measured pipeline's are (:func:`~.report.measure`).
    """
    with pinned(placement.cpus):
        engine = _open(model, placement)
        names = engine.output_names
        for j in range(warmup):
            engine.run(names, inputs[j % len(inputs)])
        start = time.perf_counter()
        for feeds in inputs:
            engine.run(names, feeds)
        wall = time.perf_counter() - start
    return len(inputs) / wall if wall > 0 else math.inf


def reference_outputs(model: Path, inputs: Sequence[Feeds], *, placement: Placement) -> list[Tensors]:
    """What the original model computes for each of ``inputs``, untimed, on ``placement``'s provider."""
    engine = _open(model, placement)
    names = engine.output_names
    return [dict(zip(names, engine.run(names, feeds), strict=True)) for feeds in inputs]


def distinct(inputs: Sequence[Feeds]) -> list[Feeds]:
    """``inputs`` without repeats of the same feeds object (``--microbatches`` cycles a small set)."""
    return list({id(f): f for f in inputs}.values())


def _open(model: Path, placement: Placement) -> Engine:
    return open_engine(
        model,
        placement,
        fail=lambda e: RuntimeStageError(f"{model}: the original model does not load ({error_line(e)})"),
    )


def _replicas(
    model: Path, pipeline: Pipeline, placement: Placement, threads: Sequence[int], config: BackendConfig
) -> Pipeline:
    """One one-worker lane of the whole model per entry of ``threads``, started as ``config`` says
    (pinned to CPUs of their own with its ``pin``: :func:`~onnxpipe.runtime.affinity.assign_cpus`)."""
    lanes = [
        [
            model_spec(
                model, pipeline.input_names, pipeline.output_names, replace(placement, threads=n), index=i
            )
        ]
        for i, n in enumerate(threads)
    ]
    return Pipeline.start(lanes, config, input_types=pipeline.input_types, output_names=pipeline.output_names)


def replicas_measurement(
    model: Path,
    inputs: Sequence[Feeds],
    *,
    pipeline: Pipeline,
    placement: Placement,
    threads: Sequence[int],
    mode: ReplicaMode,
    warmup: int,
) -> Measurement:
    """Run ``inputs`` through one one-worker lane of the whole model per entry of ``threads``."""
    with _replicas(model, pipeline, placement, threads, _replica_config(pipeline, mode)) as data_parallel:
        return measure(data_parallel, inputs, warmup=warmup)


def _replica_config(pipeline: Pipeline, mode: ReplicaMode) -> BackendConfig:
    """The replicas' backend: the pipeline's cluster, files and restarts, each replica placed by Ray
    (no stage's resources), for Ray; local workers in ``mode``, pinned where the pipeline's are,
    otherwise."""
    if mode != "ray":
        return LocalConfig(mode=LocalMode(mode), pin=is_pinned(pipeline))
    if isinstance(pipeline.backend, RayBackend):
        return replace(pipeline.backend.config, resources=None)
    return RayConfig()


def replica_memory(
    model: Path, inputs: Sequence[Feeds], *, pipeline: Pipeline, placement: Placement
) -> WorkerStats:
    """One replica in a fresh worker process, run for a few micro-batches: what a replica's worker
    holds, measured as a stage's is with ``--local-mode processes`` (threads share the process, whose
    growth while a session loads says little)."""
    config = LocalConfig(mode=LocalMode.PROCESSES)
    with _replicas(model, pipeline, placement, [placement.threads], config) as one:
        return _memory_run(one, inputs)[0]


def stage_worker_memory(pipeline: Pipeline, inputs: Sequence[Feeds]) -> list[WorkerStats] | None:
    """Each stage of a thread pipeline in a worker process of its own (or, for an interleaved split,
    each worker's stages in one process), run for a few micro-batches.

    Thread workers share one process, so none of their memory can be told apart; the same stages, with
    the same placements, as processes give each stage's (each worker's) memory measured like a
    replica's.  None for a pipeline not opened from a split folder.
    """
    if pipeline.directory is None:
        return None
    placements = [s.placement for s in pipeline.lanes[0]]
    with Pipeline.from_manifest(
        pipeline.directory, LocalConfig(mode=LocalMode.PROCESSES), placements=placements
    ) as alone:
        return _memory_run(alone, inputs)


def _memory_run(pipeline: Pipeline, inputs: Sequence[Feeds]) -> list[WorkerStats]:
    """The workers' stats after a few micro-batches: their peaks then include running, not only loading."""
    pipeline.run_many([inputs[j % len(inputs)] for j in range(MEMORY_MICROBATCHES)])
    return pipeline.stats()


def _with_worker_memory(report: RunReport, stats: Sequence[WorkerStats]) -> RunReport:
    by_index = {st.index: st for st in stats}
    stages = tuple(replace(s, alone=by_index.get(s.index, s.alone)) for s in report.stages)
    return replace(report, stages=stages)


def is_pinned(pipeline: Pipeline) -> bool:
    """Whether the pipeline's workers are pinned to CPUs: its baselines then are too."""
    return any(spec.placement.cpus for lane in pipeline.lanes for spec in lane)


def _pinned_first(placement: Placement, pin: bool) -> Placement:
    """``placement`` pinned to the first of this process's CPUs (one per thread, on cores of their own where
    there are enough: :func:`~onnxpipe.runtime.affinity.cpu_sets`), when ``pin``."""
    if not pin:
        return placement
    sets = cpu_sets([placement.threads])
    return replace(placement, cpus=sets[0]) if sets else placement


def compare_outputs(
    expected: Sequence[Mapping[str, np.ndarray]],
    actual: Sequence[Mapping[str, np.ndarray]],
    manifest: Manifest | None = None,
) -> tuple[bool, float]:
    """Whether every output of ``actual`` matches ``expected`` (verify's tolerance, looser for ``manifest``'s
    compressed boundaries); the worst rel diff."""
    stages = manifest.stages if manifest is not None else ()
    tol = BY_BOUNDARY.get(
        loosest_boundary(st.boundary_dtype for st in stages), Tolerance(DEFAULT_RTOL, DEFAULT_ATOL)
    )
    ok = len(expected) == len(actual)
    worst = 0.0
    for e, a in zip(expected, actual, strict=False):
        for name, value in e.items():
            if name not in a:
                return False, math.inf
            c = compare(name, value, a[name], rtol=tol.rtol, atol=tol.atol)
            ok = ok and c.ok
            worst = max(worst, c.max_rel_diff)
    return ok, worst


def _alike(pipeline: Pipeline) -> bool:
    """Whether the split was planned for alike devices, so that a balanced split gives each worker an
    equal share of the model, as :func:`~onnxpipe.runtime.report.ceiling.balanced_ceiling` assumes."""
    m = pipeline.manifest
    if m is None or m.cluster is None:
        return True
    # what sets a device's pace, not cluster.model.device_type, which also tells apart devices that only
    # differ in memory or in provider options (two GPUs by device_id), as alike here as they ever were
    kinds = {
        (
            d.engine.provider,
            d.engine.threads,
            d.speed,
            tuple(sorted(d.op_speeds.items())),
            d.profile_path,
            d.profile_here,
        )
        for d in m.cluster.devices
    }
    return len(kinds) == 1


def _most(values: Sequence[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def add_baselines(
    report: RunReport,
    pipeline: Pipeline,
    model: Path,
    inputs: Sequence[Feeds],
    *,
    warmup: int,
    checked: Sequence[tuple[Feeds, Tensors]] = (),
) -> RunReport:
    """``report`` with the three baselines, the output check and the memory comparison added.

    ``checked``: inputs with the outputs the pipeline gave for them (an untimed run, or the measured
    stream's kept outputs), compared with the original model's; no check when empty.
    """
    place, note = baseline_placement(pipeline.lanes[0])
    notes = list(report.notes) + ([note] if note else [])
    runs = _Runs(model, inputs, pipeline, place, is_pinned(pipeline), warmup, report.throughput_per_s)
    baselines = runs.sessions()
    baselines["replicas"] = runs.replicas(usable_ceiling=note is None, notes=notes)
    if report.memory_shared and pipeline.backend.kind == "threads":
        try:
            alone = stage_worker_memory(pipeline, inputs)
        except (RuntimeStageError, OSError) as e:
            alone = None
            notes.append(f"the stages' memory could not be measured in processes of their own: {e}")
        if alone is not None:
            report = _with_worker_memory(report, alone)
    ok: bool | None = None
    worst: float | None = None
    if checked:
        expected = reference_outputs(model, [f for f, _ in checked], placement=place)
        ok, worst = compare_outputs(expected, [o for _, o in checked], pipeline.manifest)
    slowdown, at_speed = machine_speed(
        report, pipeline.manifest, baselines["session_1_thread"].throughput_per_s
    )
    return replace(
        report,
        baselines=baselines,
        outputs_match=ok,
        outputs_max_rel_diff=worst,
        notes=tuple(notes),
        machine_slowdown=slowdown,
        estimate_max_error_at_machine_speed=at_speed,
    )


@dataclass(frozen=True)
class _Runs:
    """What every baseline of one pipeline runs: the model on the same inputs, placed as its stages are
    (pinned like them), against the pipeline's throughput."""

    model: Path
    inputs: Sequence[Feeds]
    pipeline: Pipeline
    place: Placement
    pin: bool
    warmup: int
    pipeline_throughput: float

    @property
    def on(self) -> str:
        where = "" if self.place.provider == CPU_PROVIDER else f" on {self.place.provider}"
        return where + (", pinned" if self.pin else "")

    def sessions(self) -> dict[str, BaselineReport]:
        """One session of the model at 1 thread, and at all the pipeline's threads (when more than 1)."""
        out = {"session_1_thread": self._session("session_1_thread", 1)}
        total = sum(worker_threads(self.pipeline))
        if total > 1:
            out["session_total_threads"] = self._session("session_total_threads", total)
        return out

    def _session(self, name: str, threads: int) -> BaselineReport:
        place = replace(self.place, threads=threads)  # baseline_placement leaves it at 1
        tp = session_throughput(
            self.model, self.inputs, placement=_pinned_first(place, self.pin), warmup=self.warmup
        )
        return BaselineReport(
            name,
            f"one session{self.on}, {threads} thread{'s' if threads > 1 else ''}",
            1,
            threads,
            tp,
            self.pipeline_throughput / tp,
            provider=place.provider,
            total_threads=threads,
        )

    def replicas(self, *, usable_ceiling: bool, notes: list[str]) -> BaselineReport:
        """As many replicas of the model as the pipeline has workers, each with a worker's threads; a
        replica's memory from a process of its own (a note when it cannot be measured)."""
        threads = replica_threads(worker_threads(self.pipeline))
        mode = replica_mode(self.pipeline)
        rep = replicas_measurement(
            self.model,
            self.inputs,
            pipeline=self.pipeline,
            placement=self.place,
            threads=threads,
            mode=mode,
            warmup=self.warmup,
        )
        # memory per replica worker from a process of its own: the replicas' own, else one short run
        # (those extra runs only measure memory: one that fails, e.g. on a small /dev/shm, costs a note)
        mem: Sequence[WorkerStats] = rep.stats
        if mode == "threads":
            one = _pinned_first(replace(self.place, threads=threads[0]), self.pin)
            try:
                mem = [replica_memory(self.model, self.inputs, pipeline=self.pipeline, placement=one)]
            except (RuntimeStageError, OSError) as e:
                mem = []
                notes.append(f"a replica's memory could not be measured in a process of its own: {e}")
        # Ray's actors keep their own clocks; stages planned for unlike devices are not equal shares
        usable = mode != "ray" and usable_ceiling and _alike(self.pipeline)
        ceiling = balanced_ceiling(rep.stats, min_run_seconds=MIN_RUN_S) if usable else math.nan
        split = "+".join(str(n) for n in threads)
        return BaselineReport(
            "replicas",
            f"{len(threads)} replicas of the model{self.on}, {split} threads ({mode})",
            len(threads),
            max(threads),
            rep.throughput_per_s,
            self.pipeline_throughput / rep.throughput_per_s,
            peak_rss_bytes=_most([s.peak_rss_bytes for s in mem]),
            model_rss_bytes=_most([s.model_rss_bytes for s in mem]),
            load_rss_bytes=_most([s.load_rss_bytes for s in mem]),
            provider=self.place.provider,
            mode=mode,
            total_threads=sum(threads),
            balanced_ceiling=ceiling if math.isfinite(ceiling) else None,
        )


def machine_speed(
    report: RunReport, manifest: Manifest | None, session_1_per_s: float
) -> tuple[float | None, float | None]:
    """The machine's slowdown since the estimates were made, and the estimates' largest error once
    scaled by it (see :attr:`RunReport.machine_slowdown`); ``(None, None)`` where it does not apply.

    Why: on a shared or throttled machine every CPU may run a quarter slower an hour later, and then no
    estimate made before could hold; the one-thread session, timed now as the whole model was then,
    says by how much, so that what remains is what the estimates themselves got wrong."""
    reference = manifest.plan.reference_seconds if manifest is not None else None
    if (
        manifest is None
        or reference is None
        or manifest.plan.threads != 1
        or report.backend == "ray"  # its actors may run on other machines than this session
        or not report.estimates_comparable
        or reference < MIN_RUN_S  # there Python's per-call cost, not the machine, sets the pace
        or not (math.isfinite(session_1_per_s) and session_1_per_s > 0)
    ):
        return None, None
    slowdown = 1.0 / session_1_per_s / reference
    errors = [
        abs(s.estimated_ms * slowdown - s.measured_ms) / s.measured_ms
        for s in report.stages
        if s.estimated_ms is not None and s.measured_ms > 0
    ]
    return slowdown, max(errors) if errors else None
