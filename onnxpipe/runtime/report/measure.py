"""Measure a running pipeline: stream micro-batches after a warm-up, keep every timestamp (and the
outputs when asked), and time a few micro-batches alone for the latency of one."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.trips import Trip

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
    trips: tuple[Trip, ...] = ()
    """Each streamed micro-batch's hops, where the backend times them (Ray)."""
    single_trips: tuple[Trip, ...] = ()
    """The hops of the micro-batches run one at a time."""
    failure: str | None = None
    """Why the stream stopped before its end (``measure(..., partial=True)``); what came before counts."""

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
    partial: bool = False,
) -> Measurement:
    """Stream ``warmup`` micro-batches (cycling through ``inputs``), reset the workers' stats, then
    stream ``inputs`` and return their timings and the workers' stats (and outputs if ``keep_outputs``).

    The stream keeps the pipeline full (``capacity`` micro-batches in flight), which is what its
    throughput needs but makes each latency mostly the wait behind the others; ``single`` more
    micro-batches are then run one at a time, after the stats were taken, for the latency of one alone.

    Outputs are dropped as they arrive, as a server sends them on, unless ``keep_outputs``: keeping
    every one makes each new output fresh memory that the last stage faults in page by page (megabytes of
    logits per micro-batch are a visible share of a small model's last stage), which the sessions the
    pipeline is compared with do not pay.

    ``partial``: a pipeline that fails during the stream ends it there, and the measurement holds what
    was delivered before, and why it stopped (:attr:`Measurement.failure`), instead of raising.
    """
    if warmup > 0 and inputs:
        pipeline.run_many([inputs[j % len(inputs)] for j in range(warmup)])
    pipeline.reset_stats()
    window = max(1, pipeline.capacity)
    queued_at: list[float] = []
    done_at: list[float] = []
    outputs: list[Tensors] = []
    start = time.perf_counter()
    failure: str | None = None
    try:
        for job in pipeline.jobs(inputs):  # keeps the job's times, not the job: it holds its result
            result = job.result()
            if keep_outputs:
                outputs.append(result)
            queued_at.append(job.queued_at)
            done_at.append(job.done_at if job.done_at is not None else time.perf_counter())
    except RuntimeStageError as e:  # its workers are gone: no stats, no single runs
        if not partial:
            raise
        failure = str(e)
    end = max(done_at, default=start if failure is not None else time.perf_counter())
    stats = tuple(pipeline.stats()) if failure is None else ()
    trips = pipeline.trips() if failure is None else []
    single_latencies, single_trips = _alone(pipeline, inputs, single if failure is None else 0)
    return Measurement(
        queued_at=tuple(queued_at),
        done_at=tuple(done_at),
        start=start,
        end=end,
        stats=stats,
        in_flight=min(window, len(inputs)) if failure is None else window,
        output_workers=_last_positions(pipeline.lanes),
        single_latencies_s=tuple(single_latencies),
        outputs=tuple(outputs),
        trips=tuple(trips),
        single_trips=tuple(single_trips),
        failure=failure,
    )


def _alone(pipeline: Pipeline, inputs: Sequence[Feeds], single: int) -> tuple[list[float], list[Trip]]:
    """The latencies and trips of ``single`` micro-batches run one at a time."""
    before = len(pipeline.trips()) if single else 0
    latencies: list[float] = []
    for j in range(single if inputs else 0):
        job = pipeline.submit(inputs[j % len(inputs)])
        job.result()
        latencies.append((job.done_at or time.perf_counter()) - job.queued_at)
    return latencies, pipeline.trips()[before:] if single else []


def _last_positions(lanes: Sequence[Sequence[object]]) -> tuple[int, ...]:
    """Positions of each lane's last worker in the backends' stats, which list the lanes in order."""
    return tuple(end - 1 for end in accumulate(len(lane) for lane in lanes))
