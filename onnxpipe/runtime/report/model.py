"""What a run delivered, as data: throughput, latency, each stage and worker against the estimates, the
baselines, and the report as JSON (``onnxpipe run --report``)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxpipe.runtime.backends.ray_resources import Recovery
from onnxpipe.runtime.report.cluster import HopReport, recovery_obj
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import CPU_PROVIDER, WorkerSpec
from onnxpipe.runtime.trips import NodePlace


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
        p50, p90, p99 = (float(p) for p in np.percentile(ms, [50, 90, 99]))
        return Latency(float(ms.mean()), p50, p90, p99, float(ms.max()))

    def to_obj(self) -> dict[str, float | None]:
        return {k.removesuffix("_ms"): num(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class StageReport:
    """One stage of the run: the spec its worker ran (label, placement, and the manifest's record of the
    stage: its file, weights and estimate, none for a chain not opened from a split folder), what its
    worker measured (``stats``), and the figures taken from those records.

    ``measured_ms`` is the median time of the stage's session run; ``handling_ms`` adds the worker's own
    work around it (mapping and copying tensors); ``busy_fraction`` is the share of the measured wall
    time the worker was busy (not waiting for input or for room downstream).
    """

    worker: WorkerSpec
    stats: WorkerStats
    """What the stage's worker measured: its records, its process and the process's memory (for thread
    workers the one process's they share, ``process_shared``)."""
    microbatches: int
    measured_ms: float
    mean_ms: float
    handling_ms: float
    busy_seconds: float
    busy_fraction: float
    alone: WorkerStats | None = None
    """The stats of a worker process running this stage alone: the worker's own (processes), or one
    short run in processes of their own when the pipeline ran threads (``--compare`` only); for a stage
    whose process hosts other stages too (:attr:`hosted_with`), what all their models cost it."""
    node: NodePlace | None = None
    """The node the stage ran on (last, after a recovery); None for local workers."""
    shipped_bytes: int | None = None
    """Bytes of the stage's files the driver shipped to its node for this run (0: its node had them);
    None when they were not shipped (local workers, or a folder the nodes share)."""

    @property
    def index(self) -> int:
        return self.worker.index

    @property
    def param_bytes(self) -> int | None:
        stage = self.worker.stage
        return stage.param_bytes if stage is not None else None

    @property
    def estimated_ms(self) -> float | None:
        stage = self.worker.stage
        return stage.estimated_compute_seconds * 1e3 if stage is not None else None

    @property
    def estimate_error(self) -> float | None:
        """``(estimated - measured) / measured``."""
        return _error(self.estimated_ms, self.measured_ms)

    @property
    def model_rss_bytes(self) -> int | None:
        """Peak minus the memory before loading, for a worker with its own process; None for thread
        workers, whose process's growth while a session loads hides what the allocator reused."""
        return None if self.stats.process_shared else self.stats.model_rss_bytes

    @property
    def worker_model_rss_bytes(self) -> int | None:
        """What the stage's model costs a worker process of its own (:attr:`alone`); None: not measured."""
        return self.alone.model_rss_bytes if self.alone is not None else None

    @property
    def hosted_with(self) -> tuple[int, ...]:
        """The stages, this one among them, whose sessions shared the worker process of :attr:`alone` (an
        interleaved split's worker in processes or on Ray); empty: the process ran this stage alone."""
        return (self.alone or self.stats).hosted_with

    def to_obj(self) -> dict[str, Any]:
        """The stage as the report's JSON has it: what its spec and record say, what was measured, then
        where it ran."""
        place, st, alone, node = self.worker.placement, self.stats, self.alone, self.node
        held: dict[str, Any] = {
            "index": self.index,
            "label": self.worker.label,
            "file": self.worker.stage.file if self.worker.stage is not None else None,
            "device": self.worker.device,
            "provider": place.runs_on,
            "threads": place.threads,
            "cpus": place.cpus,
            "param_bytes": self.param_bytes,
            "estimated_ms": self.estimated_ms,
            "estimate_error": self.estimate_error,
            **_fields_obj(self, skip=("worker", "stats", "alone", "node", "shipped_bytes")),
            **{key: getattr(st, key) for key in ("peak_rss_bytes", "rss_bytes", "startup_rss_bytes", "pid")},
            "memory_shared_with_other_workers": st.process_shared,
            "model_rss_bytes": self.model_rss_bytes,
            "worker_peak_rss_bytes": alone.peak_rss_bytes if alone is not None else None,
            "worker_model_rss_bytes": self.worker_model_rss_bytes,
            "hosted_with": self.hosted_with,
            "node_id": node.node_id if node is not None else None,
            "node_address": node.address if node is not None else None,
            "host": node.host if node is not None else None,
            "shipped_bytes": self.shipped_bytes,
        }
        return {k: _json(v) for k, v in held.items()}


def _error(estimated: float | None, measured: float) -> float | None:
    return (estimated - measured) / measured if estimated is not None and measured > 0 else None


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
        busy = sum(s.busy_seconds for s in stages)
        return WorkerReport(
            index=index,
            stages=tuple(s.index for s in stages),
            estimated_ms=estimated,
            measured_ms=measured,
            estimate_error=_error(estimated, measured),
            busy_seconds=busy,
            busy_fraction=busy / wall_seconds if wall_seconds > 0 else math.nan,
            param_bytes=_total([s.param_bytes for s in stages]),
            model_rss_bytes=_total(
                [s.worker_model_rss_bytes for s in stages if s.index == min(s.hosted_with or (s.index,))]
            ),
            cpus=tuple(sorted({c for s in stages for c in s.worker.placement.cpus})),
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
    against them, at the speeds those CPUs ran (:func:`onnxpipe.runtime.report.ceiling.balanced_ceiling`);
    ``None`` where it does not apply (Ray, unlike devices, too few records, runs under a millisecond)."""


@dataclass(frozen=True, kw_only=True)
class RunReport:
    """What a run delivered; its fields in the order ``--report`` writes them (:meth:`to_obj`)."""

    backend: str
    mode: str
    k: int
    microbatches: int
    warmup: int
    input_shapes: Mapping[str, tuple[int, ...]]
    throughput_per_s: float
    steady_throughput_per_s: float | None
    steady_throughput_from: str | None = None
    wall_seconds: float
    latency_saturated: Latency
    """Submission to result while ``latency_in_flight`` micro-batches are in flight: mostly queueing."""
    latency_in_flight: int = 1
    latency_single: Latency | None = None
    """Submission to result of micro-batches run one at a time (None when not measured)."""
    bottleneck_stage: int
    estimates_comparable: bool
    estimate_max_error: float | None
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
    driver_peak_rss_bytes: int | None
    stages: tuple[StageReport, ...]
    baselines: Mapping[str, BaselineReport] = field(default_factory=dict)
    hops: tuple[HopReport, ...] = ()
    """Each hop's bytes and time, on a cluster (Ray): :mod:`onnxpipe.runtime.report.cluster`."""
    overhead_ms: float | None = None
    """A micro-batch's median time beyond its stages' own work, run one at a time (Ray)."""
    recoveries: tuple[Recovery, ...] = ()
    """Each lost actor the run brought back on another node (Ray)."""
    failure: str | None = None
    """Why the run stopped before its end; the figures are those of what it delivered before."""
    outputs_match: bool | None = None
    outputs_max_rel_diff: float | None = None
    notes: tuple[str, ...] = ()
    worker_stages: tuple[tuple[int, ...], ...] = ()
    """The stages each worker runs when stages share workers (an interleaved split, the manifest's
    ``plan.workers``); empty: a worker per stage.  :attr:`workers` sums the stages' rows by it."""

    @property
    def bounding_hop(self) -> HopReport | None:
        """The hop that bounds the pipeline's rate, where one does (Ray): its own time (a micro-batch at a
        time) is longer than the slowest stage's handling of a micro-batch, so the link it crosses, not a
        stage, sets the pace (the data plane sends while the stages compute, so a hop costs the rate only
        where it is the longest step).  None when every hop is quicker, or none was timed."""
        timed = [h for h in self.hops if h.single_ms is not None]
        if not timed or not self.stages:
            return None
        slowest = max(timed, key=lambda h: h.single_ms or 0.0)
        return slowest if (slowest.single_ms or 0.0) > max(s.handling_ms for s in self.stages) else None

    @property
    def hop_overhead_ms(self) -> float | None:
        """:attr:`overhead_ms` shared among a micro-batch's hops, each taking its stage's handling along."""
        if self.overhead_ms is None or not self.hops or math.isnan(self.overhead_ms):
            return None
        return self.overhead_ms / len(self.hops)

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
        return any(s.stats.process_shared for s in self.stages)

    def to_obj(self) -> dict[str, Any]:
        """The report as JSON-ready data (NaN and infinity as ``null``); ``bottleneck_worker`` and
        ``workers`` only when stages share workers, the hops, overhead and recoveries only on a cluster."""
        renamed = {"latency_saturated": "latency_ms", "latency_single": "latency_single_ms"}
        on_cluster = bool(self.hops or self.recoveries or self.overhead_ms is not None)
        beside = {"bottleneck_stage": "bottleneck_worker", "stages": "workers"} if self.workers else {}
        if on_cluster:
            beside["overhead_ms"] = "hop_overhead_ms"
        skip = ("worker_stages",) if on_cluster else ("worker_stages", "hops", "overhead_ms", "recoveries")
        obj: dict[str, Any] = {}
        for key, value in _fields_obj(self, skip).items():
            obj[renamed.get(key, key)] = value
            if key in beside:  # the workers' figures beside their stages', a hop's share of the overhead
                obj[beside[key]] = _json(getattr(self, beside[key]))
        if on_cluster:
            bound = self.bounding_hop
            obj["bounding_hop"] = None if bound is None else f"{bound.source} -> {bound.target}"
            obj["recoveries"] = [recovery_obj(r) for r in self.recoveries]
        return obj

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, allow_nan=False) + "\n"


def num(x: float | None) -> float | None:
    if x is None or math.isnan(x) or math.isinf(x):
        return None
    return float(x)


def _json(value: Any) -> Any:
    """``value`` as JSON-ready data: a record as an object of its fields (its own ``to_obj`` where it has
    one), floats through :func:`num` (NaN and infinity as ``null``), tuples as lists."""
    if hasattr(value, "to_obj"):
        return value.to_obj()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_obj(value)
    if isinstance(value, float):
        return num(value)
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def _fields_obj(record: Any, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The fields of the dataclass ``record``, but ``skip``, as JSON-ready data (:func:`_json`)."""
    return {f.name: _json(getattr(record, f.name)) for f in dataclasses.fields(record) if f.name not in skip}
