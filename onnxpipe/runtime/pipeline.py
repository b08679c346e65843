"""Run a split folder as a pipeline: one worker per stage, micro-batches streaming through.

>>> with Pipeline.from_manifest("out/") as pipe:            # doctest: +SKIP
...     outputs = pipe.run({"input_ids": ids})              # one micro-batch
...     for out in pipe.stream(batches):                    # many, results in input order
...         use(out)

:meth:`Pipeline.submit` returns a :class:`concurrent.futures.Future` and may be called from many threads
at once (a server's request handlers): micro-batches enter the pipeline in the order they were
submitted, up to its capacity, and the rest wait in an unbounded queue.  A driver thread collects what
comes out.  When a stage fails, every pending future fails with the same
:class:`~onnxpipe.errors.RuntimeStageError`, every worker is stopped, and the pipeline refuses further
work.  Ctrl-C in :meth:`run` or :meth:`stream` stops the workers too.

Process workers are started with ``spawn``: a script that opens a pipeline must guard its top level with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from onnxpipe.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.base import WAIT_SECONDS, Backend, Tensors
from onnxpipe.runtime.processes import DEFAULT_SLOTS, ProcessBackend
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    check_providers_here,
    manifest_placements,
    stage_specs,
)
from onnxpipe.runtime.threads import ThreadBackend

LocalMode = Literal["processes", "threads"]
LOCAL_MODES: tuple[LocalMode, ...] = ("processes", "threads")
DEFAULT_LOCAL_MODE: LocalMode = "threads"
"""Measured on 2 cores (benchmarks/bench_pipeline.py, docs/runtime.md): threads were faster than
processes on every model (no copies, no inter-process wake-ups), by 15-25% on the small transformers and
2-6% on the CNNs.  Processes isolate the stages and measure each one's memory."""
BACKENDS = ("local", "ray")


class Job(Future[Tensors]):
    """A submitted micro-batch: a future with its sequence number and timestamps (``perf_counter``)."""

    def __init__(self, seq: int, feeds: Mapping[str, np.ndarray] | None) -> None:
        super().__init__()
        self.seq = seq
        self.feeds = feeds
        self.queued_at = time.perf_counter()
        self.submitted_at: float | None = None
        self.done_at: float | None = None


class Pipeline:
    """Workers running the stages of a split folder (or any chain of :class:`WorkerSpec`)."""

    def __init__(
        self,
        backend: Backend,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        lanes: Sequence[Sequence[WorkerSpec]],
        manifest: Manifest | None = None,
        directory: Path | None = None,
    ) -> None:
        self.backend = backend
        self.input_types = dict(input_types)
        self.output_names = tuple(output_names)
        self.lanes = tuple(tuple(lane) for lane in lanes)
        self.manifest = manifest
        self.directory = directory
        self._lock = threading.Lock()
        self._queue: deque[Job] = deque()
        self._in_flight: dict[int, Job] = {}
        self._next_seq = 0
        self._error: RuntimeStageError | None = None
        self._closed = False
        self._driver = threading.Thread(target=self._drive, name="onnxpipe driver", daemon=True)
        self._driver.start()

    # ---------------------------------------------------------------------------------- opening

    @classmethod
    def from_manifest(
        cls,
        directory: str | Path,
        *,
        backend: str = "local",
        mode: LocalMode | None = None,
        threads: int | None = None,
        placements: Sequence[Placement] | None = None,
        slots: int = DEFAULT_SLOTS,
        check_files: bool = True,
        ray_address: str | None = None,
        ray_resources: Sequence[Mapping[str, Any]] | None = None,
    ) -> Pipeline:
        """Start one worker per stage of the split folder ``directory``.

        ``backend`` is ``"local"`` (``mode`` ``"threads"``, the default, or ``"processes"``) or ``"ray"``.
        Each stage runs as the manifest records (:func:`~onnxpipe.runtime.spec.manifest_placements`): with
        the provider, provider options and threads of its device in the manifest's ``cluster`` (a split
        made with ``--devices``), else with the provider its ``device`` name implies (``cpu0``,
        ``cuda:1``) and the plan's threads; ``threads`` replaces every stage's intra-op threads.
        ``placements`` gives each stage's explicitly instead.  On the local backend a provider from the
        manifest that this machine lacks is a :class:`UsageError`, before any worker starts.
        ``ray_resources`` are per-stage actor options (``num_cpus``, ``num_gpus``, ``resources``).
        """
        d = Path(directory)
        manifest = load_manifest(d, check_files=check_files)
        from_manifest = placements is None
        if placements is None:
            placements = manifest_placements(manifest, threads)
        elif len(placements) != manifest.k:
            raise UsageError(f"{len(placements)} placements given for the {manifest.k} stages of {d}")
        if slots < 1:
            raise UsageError(f"slots {slots}: a channel needs at least one slot")
        specs = stage_specs(d, manifest, placements)
        if from_manifest and backend == "local":  # Ray actors check the provider on their own node
            check_providers_here(specs, ort.get_available_providers())
        back = make_backend(
            [specs],
            backend=backend,
            mode=mode,
            slots=slots,
            ray_address=ray_address,
            ray_resources=ray_resources,
        )
        return cls(
            back,
            input_types={t.name: t.dtype for t in manifest.model_inputs},
            output_names=[o.name for o in manifest.model_outputs],
            lanes=[specs],
            manifest=manifest,
            directory=d,
        )

    # ---------------------------------------------------------------------------------- running

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.input_types)

    @property
    def capacity(self) -> int:
        """Micro-batches the workers hold at most; more wait in the pipeline's queue."""
        return self.backend.capacity

    def submit(self, feeds: Mapping[str, np.ndarray]) -> Job:
        """Queue one micro-batch (model inputs by name); the future's result is the model outputs."""
        checked = self._check_feeds(feeds)
        with self._lock:
            if self._error is not None:
                raise RuntimeStageError(f"the pipeline stopped after a failure: {self._error}")
            if self._closed:
                raise UsageError("the pipeline is closed; open it again with Pipeline.from_manifest")
            job = Job(self._next_seq, checked)
            self._next_seq += 1
            self._queue.append(job)
            failed = self._pump()
            waiting = bool(self._queue)
        self._settle(failed)
        if waiting:  # the driver hands it over once a worker makes room; a job handed over needs no one
            self.backend.wake()
        return job

    def run(self, feeds: Mapping[str, np.ndarray]) -> Tensors:
        """Model outputs for one micro-batch of model inputs."""
        result: Tensors = self._interruptible(lambda: self.submit(feeds).result())
        return result

    def stream(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Tensors]:
        """Model outputs for each micro-batch of ``inputs``, in input order, while later ones run.

        At most :attr:`capacity` micro-batches are taken from ``inputs`` ahead of the one yielded, so an
        endless stream is fine.  Stopping the iteration early leaves nothing behind: what was submitted
        finishes and is dropped.
        """
        window = max(1, self.capacity)
        pending: deque[Job] = deque()
        try:
            for feeds in inputs:
                pending.append(self.submit(feeds))
                while len(pending) >= window or (pending and pending[0].done()):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def run_many(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> list[Tensors]:
        """``list(stream(inputs))``, stopping the workers on Ctrl-C."""
        result: list[Tensors] = self._interruptible(lambda: list(self.stream(inputs)))
        return result

    def _interruptible(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_types if n not in feeds]
        if missing:
            listed = ", ".join(self.input_types)
            raise UsageError(f"model input {missing[0]!r} is not in the feeds; give every input: {listed}")
        extra = [n for n in feeds if n not in self.input_types]
        if extra:
            raise UsageError(
                f"{extra[0]!r} is not a model input; the inputs are {', '.join(self.input_types)}"
            )
        checked: dict[str, np.ndarray] = {}
        for name, expected in self.input_types.items():
            value = np.asarray(feeds[name], order="C")
            if expected not in ("", "undefined") and str(value.dtype) != expected:
                raise UsageError(
                    f"model input {name!r} is {value.dtype}, the model takes {expected}; convert it first"
                )
            checked[name] = value
        return checked

    # ---------------------------------------------------------------------------------- driving

    def _pump(self) -> list[Job]:
        """Hand queued jobs to the backend while it has room (under the lock); failed jobs if it broke."""
        try:
            while self._queue:
                job = self._queue[0]
                assert job.feeds is not None
                if not self.backend.try_submit(job.seq, job.feeds):
                    break
                self._queue.popleft()
                job.feeds = None
                job.submitted_at = time.perf_counter()
                self._in_flight[job.seq] = job
        except RuntimeStageError as e:
            return self._fail(e)
        return []

    def _fail(self, error: RuntimeStageError) -> list[Job]:
        """Record ``error``, stop the workers, and return every unfinished job (under the lock)."""
        if self._error is None:
            self._error = error
        self._closed = True
        jobs = list(self._in_flight.values()) + list(self._queue)
        self._in_flight.clear()
        self._queue.clear()
        self.backend.close(graceful=False)
        return jobs

    def _settle(self, failed: list[Job]) -> None:
        error = self._error or RuntimeStageError("the pipeline was closed before this micro-batch finished")
        for job in failed:
            if not job.done():
                job.set_exception(error)

    def _drive(self) -> None:
        while True:
            self.backend.wait(WAIT_SECONDS)
            finished: list[tuple[Job, Tensors]] = []
            with self._lock:
                if self._closed:
                    failed = self._fail_remaining()
                    stop = True
                else:
                    stop = False
                    try:
                        done = self.backend.poll()
                    except RuntimeStageError as e:
                        failed = self._fail(e)
                        stop = True
                        done = []
                    except Exception as e:  # noqa: BLE001 - a backend bug must fail the futures, not hang them
                        failed = self._fail(RuntimeStageError(f"the pipeline's driver failed: {e!r}"))
                        stop = True
                        done = []
                    now = time.perf_counter()
                    for seq, outputs in done:
                        job = self._in_flight.pop(seq)
                        job.done_at = now
                        finished.append((job, outputs))
                    if not stop:
                        failed = self._pump()
                        stop = bool(failed)
            for job, outputs in finished:
                job.set_result({n: outputs[n] for n in self.output_names})
            self._settle(failed)
            if stop:
                return

    def _fail_remaining(self) -> list[Job]:
        jobs = list(self._in_flight.values()) + list(self._queue)
        self._in_flight.clear()
        self._queue.clear()
        return jobs

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        """Each worker's timing records and memory since it started or since :meth:`reset_stats`."""
        self._raise_if_failed()
        return self.backend.stats()

    def reset_stats(self) -> None:
        self._raise_if_failed()
        self.backend.reset_stats()

    def worker_pids(self) -> list[int]:
        """Process ids of the local worker processes (empty for threads and Ray)."""
        return self.backend.worker_pids()

    def idle(self) -> bool:
        with self._lock:
            return not self._queue and not self._in_flight

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeStageError(f"the pipeline stopped after a failure: {self._error}")
        if self._closed:
            raise UsageError("the pipeline is closed; open it again with Pipeline.from_manifest")

    @property
    def failure(self) -> RuntimeStageError | None:
        """The error that stopped the pipeline, if one did."""
        return self._error

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True) -> None:
        """Stop and join every worker; pending futures fail.  Safe to call twice."""
        with self._lock:
            self._closed = True
        self.backend.wake()
        if threading.current_thread() is not self._driver:  # close() from a future's callback
            self._driver.join()
        self.backend.close(graceful=graceful)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(graceful=exc_type is None)


def make_backend(
    lanes: Sequence[Sequence[WorkerSpec]],
    *,
    backend: str = "local",
    mode: LocalMode | None = None,
    slots: int = DEFAULT_SLOTS,
    ray_address: str | None = None,
    ray_resources: Sequence[Mapping[str, Any]] | None = None,
) -> Backend:
    """Start the workers of ``lanes`` on ``backend``."""
    if backend == "local":
        chosen = DEFAULT_LOCAL_MODE if mode is None else mode
        if chosen == "processes":
            return ProcessBackend(lanes, slots=slots)
        if chosen == "threads":
            return ThreadBackend(lanes, slots=slots)
        raise UsageError(f"local mode {chosen!r}: choose one of {', '.join(LOCAL_MODES)}")
    if backend == "ray":
        if len(lanes) != 1:
            raise UsageError("the ray backend runs one chain of stages")
        from onnxpipe.runtime.ray_backend import RayBackend

        return RayBackend(lanes[0], address=ray_address, resources=ray_resources, slots=slots)
    raise UsageError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
