"""Run a split folder as a pipeline: one worker per stage, micro-batches streaming through.

>>> with Pipeline.from_manifest("out/") as pipe:            # doctest: +SKIP
...     outputs = pipe.run({"input_ids": ids})              # one micro-batch
...     for out in pipe.stream(batches):                    # many, results in input order
...         use(out)

:meth:`Pipeline.submit` returns a :class:`concurrent.futures.Future` and may be called from many threads
at once (a server's request handlers): micro-batches enter the pipeline in the order they were
submitted, up to its capacity, and the rest wait in an unbounded queue.  ``submit`` checks and copies
the inputs, so a malformed request fails alone (:class:`~onnxpipe.errors.UsageError`) and the caller may
reuse its arrays at once.  A driver thread collects what comes out and sets the futures, so callbacks
added to them run on that thread: they must be quick and must not wait for another result of the same
pipeline.  A future can be cancelled while it is queued, not once a worker has it.

When a stage fails, or the driver meets any unexpected error, every pending future fails with the same
:class:`~onnxpipe.errors.RuntimeStageError`, every worker is stopped, and the pipeline refuses further
work.  :meth:`Pipeline.close` (and a normal exit from ``with``) lets what was submitted finish first;
Ctrl-C in :meth:`run` or :meth:`stream` stops the workers at once.  A pipeline dropped without
``close()`` finishes what was submitted and stops its workers once it is garbage-collected.

Process workers are started with ``spawn``: a script that opens a pipeline must guard its top level with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.affinity import assign_cpus
from onnxpipe.runtime.backends.processes import ProcessBackend
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import WAIT_SECONDS, Backend, BackendConfig, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    check_providers_here,
    manifest_placements,
    stage_specs,
)

CLOSE_TIMEOUT_S = 60.0
"""How long a graceful :meth:`Pipeline.close` waits for the submitted micro-batches before failing them."""

_CLOSED = "the pipeline is closed; open it again with Pipeline.from_manifest"

Stop = Literal["drain", "now"]
"""How the driver ends: after the submitted work finished (or its deadline passed), or at once."""


class Job(Future[Tensors]):
    """A submitted micro-batch: a future with its sequence number and timestamps (``perf_counter``).

    It can be cancelled while it waits in the pipeline's queue (it then never reaches a worker); once a
    worker has it, it is running and ``cancel()`` returns False.  Its callbacks usually run on the
    pipeline's driver thread: they must be quick and must not wait for another result of the same
    pipeline, which only that thread could deliver.
    """

    def __init__(self, seq: int, feeds: Mapping[str, np.ndarray] | None) -> None:
        super().__init__()
        self.seq = seq
        self.feeds = feeds
        self.queued_at = time.perf_counter()
        self.submitted_at: float | None = None
        self.done_at: float | None = None


class _Driver:
    """The pipeline's queue and in-flight jobs, shared by its callers and its driver thread.

    Kept apart from :class:`Pipeline` so that the thread keeps only this alive: a pipeline dropped
    without ``close()`` is collected, and its finalizer (:meth:`abandon`) tells the driver to finish.
    Every attribute except ``abandoned`` is guarded by ``lock``.  Only the driver thread waits on the
    backend and delivers results, and it never ends without settling every future: any error it meets
    fails the pipeline.
    """

    def __init__(self, backend: Backend, output_names: tuple[str, ...]) -> None:
        self.backend = backend
        self.output_names = output_names
        self.lock = threading.Lock()
        self.queue: deque[Job] = deque()
        self.in_flight: dict[int, Job] = {}
        self.next_seq = 0
        self.error: RuntimeStageError | None = None
        self.accepting = True
        self.stop: Stop | None = None
        self.deadline = math.inf
        self.drained = False
        self.caller_closes = False
        self.abandoned = False
        self.thread = threading.Thread(target=self._run, name="onnxpipe driver", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------------------ from callers

    def submit(self, feeds: dict[str, np.ndarray]) -> Job:
        with self.lock:
            if self.error is not None:
                raise RuntimeStageError(f"the pipeline stopped after a failure: {self.error}")
            if not self.accepting:
                raise UsageError(_CLOSED)
            job = Job(self.next_seq, feeds)
            self.next_seq += 1
            self.queue.append(job)
            failed = self._pump()
            waiting = bool(self.queue)
        self._settle(failed)
        if waiting or failed:  # the driver hands it over once a worker makes room, or stops the workers
            self.backend.wake()
        return job

    def request_stop(self, graceful: bool, timeout: float) -> None:
        """Refuse new work; the driver ends once the submitted work finished (or ``timeout``), or now."""
        with self.lock:
            self.accepting = False
            if threading.current_thread() is not self.thread:
                self.caller_closes = True  # it joins the driver, then stops the workers itself
            if not graceful:
                self.stop = "now"
            elif self.stop is None:
                self.stop = "drain"
            self.deadline = min(self.deadline, time.monotonic() + timeout)
        self.backend.wake()

    def close_backend(self) -> None:
        """Stop the workers: gracefully when every submitted micro-batch finished, at once otherwise."""
        self.backend.close(graceful=self.drained)

    def abandon(self) -> None:
        """The pipeline's finalizer: finish the submitted work, then stop.

        It only sets a flag, which the driver reads within :data:`WAIT_SECONDS`: a finalizer may run in
        any thread, even in one that holds ``lock`` or is inside the backend.
        """
        self.abandoned = True

    def idle(self) -> bool:
        with self.lock:
            return not self.queue and not self.in_flight

    # -------------------------------------------------------------------------- the driver thread

    def _run(self) -> None:
        try:
            while self._round():
                pass
        except BaseException as e:  # noqa: BLE001 - the driver must never die silently: fail the futures
            with self.lock:
                failed = self._fail(_driver_error(e))
            self._settle(failed)
        with self.lock:
            closes = not self.caller_closes
        if closes:  # a failure, a close from a callback, or a collected pipeline: nobody else will
            self.close_backend()

    def _round(self) -> bool:
        """Wait for the backend, deliver what came out, hand queued jobs over; False once finished."""
        self.backend.wait(self._wait_seconds())
        finished: list[tuple[Job, Tensors]] = []
        failed: list[Job] = []
        with self.lock:
            if self.abandoned and self.stop is None:
                self.accepting = False
                self.stop = "drain"
                self.deadline = time.monotonic() + CLOSE_TIMEOUT_S
            if self.error is None:
                try:
                    self._collect(finished)
                except RuntimeStageError as e:
                    failed = self._fail(e)
                except Exception as e:  # noqa: BLE001 - a backend bug must fail the futures, not hang them
                    failed = self._fail(_driver_error(e))
            if self.error is None and self.stop != "now":
                failed = self._pump()
            end = self._finished()
            if end:
                failed += self._take_all()
        for job, outputs in finished:  # what came out is delivered, even if a failure followed it
            with contextlib.suppress(InvalidStateError):  # cancelled as it was handed over
                job.set_result(outputs)
        self._settle(failed)
        return not end

    def _wait_seconds(self) -> float:
        if self.stop == "now":
            return 0.0
        if self.stop == "drain":
            return max(0.0, min(WAIT_SECONDS, self.deadline - time.monotonic()))
        return WAIT_SECONDS

    def _collect(self, finished: list[tuple[Job, Tensors]]) -> None:
        """Append what the backend returned to ``finished`` (under the lock)."""
        now = time.perf_counter()
        for seq, outputs in self.backend.poll():
            job = self.in_flight[seq]
            result = {n: outputs[n] for n in self.output_names}
            del self.in_flight[seq]
            job.done_at = now
            finished.append((job, result))

    def _finished(self) -> bool:
        """Whether the driver should end now (under the lock)."""
        if self.error is not None or self.stop == "now":
            return True
        if self.stop == "drain":
            self.drained = not self.queue and not self.in_flight
            return self.drained or time.monotonic() >= self.deadline
        return False

    # ------------------------------------------------------------------------------------- shared

    def _pump(self) -> list[Job]:
        """Hand queued jobs to the backend while it has room (under the lock); failed jobs if it broke."""
        try:
            while self.queue:
                job = self.queue[0]
                if job.cancelled():  # its caller gave up before a worker had it: drop it
                    self.queue.popleft()
                    job.feeds = None
                    job.set_running_or_notify_cancel()  # tells concurrent.futures.wait()
                    continue
                assert job.feeds is not None
                if not self.backend.try_submit(job.seq, job.feeds):
                    break
                self.queue.popleft()
                job.feeds = None
                job.submitted_at = time.perf_counter()
                self.in_flight[job.seq] = job
                # from now on cancel() is refused; one that slipped in since the check just loses the result
                job.set_running_or_notify_cancel()
        except RuntimeStageError as e:
            return self._fail(e)
        except Exception as e:  # noqa: BLE001 - a backend bug must fail the futures, not hang them
            return self._fail(_driver_error(e))
        return []

    def _fail(self, error: RuntimeStageError) -> list[Job]:
        """Record ``error`` and end the pipeline (the driver stops the workers); every unfinished job."""
        if self.error is None:
            self.error = error
        self.accepting = False
        self.stop = "now"
        return self._take_all()

    def _take_all(self) -> list[Job]:
        jobs = list(self.in_flight.values()) + list(self.queue)
        self.in_flight.clear()
        self.queue.clear()
        return jobs

    def _settle(self, jobs: list[Job]) -> None:
        """Fail ``jobs`` (outside the lock: callbacks run here); a cancelled queued one is only notified."""
        error = self.error or RuntimeStageError("the pipeline was closed before this micro-batch finished")
        for job in jobs:
            job.feeds = None
            if job.submitted_at is None and not job.set_running_or_notify_cancel():
                continue
            with contextlib.suppress(InvalidStateError):  # cancelled as it was handed over
                job.set_exception(error)


def _driver_error(e: BaseException) -> RuntimeStageError:
    return RuntimeStageError(f"the pipeline's driver failed: {type(e).__name__}: {e}")


class Pipeline:
    """Workers running the stages of a split folder (or any chain of :class:`WorkerSpec`).

    ``input_shapes`` (from the manifest) lets :meth:`submit` refuse an input of the wrong rank or fixed
    dimension before it enters the pipeline, where it would fail a stage and with it every request.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        lanes: Sequence[Sequence[WorkerSpec]],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        input_shapes: Mapping[str, Shape] | None = None,
        pin_note: str | None = None,
    ) -> None:
        self.backend = backend
        self.input_types = dict(input_types)
        self.input_shapes: dict[str, Shape] = dict(input_shapes or {})
        self.output_names = tuple(output_names)
        self.lanes = tuple(tuple(lane) for lane in lanes)
        self.manifest = manifest
        self.directory = directory
        self.pin_note = pin_note
        """Why the workers were not pinned although asked to be (too few CPUs), else None."""
        self._driver = _Driver(backend, self.output_names)
        self._finalizer = weakref.finalize(self, self._driver.abandon)
        self._finalizer.atexit = False  # at exit the workers go with the process

    # ---------------------------------------------------------------------------------- opening

    @classmethod
    def from_manifest(
        cls,
        directory: str | Path,
        backend: BackendConfig | None = None,
        *,
        threads: int | None = None,
        placements: Sequence[Placement] | None = None,
        check_files: bool = True,
    ) -> Pipeline:
        """Start one worker per stage of the split folder ``directory``.

        ``backend`` says where: :class:`~onnxpipe.runtime.base.LocalConfig` (the default: threads of
        this process, or processes; pinned to CPUs of their own with ``pin``, :attr:`pin_note` saying why
        not when there are too few) or :class:`~onnxpipe.runtime.base.RayConfig`.  Each stage runs as the
        manifest records (:func:`~onnxpipe.runtime.spec.manifest_placements`): with the provider,
        provider options and threads of its device in the manifest's ``cluster`` (a split made with
        ``--devices``), else with the provider its ``device`` name implies (``cpu0``, ``cuda:1``) and the
        plan's threads; ``threads`` replaces every stage's intra-op threads.  ``placements`` gives each
        stage's explicitly instead.  On the local backend a provider from the manifest that this machine
        lacks is a :class:`UsageError`, before any worker starts.
        """
        config = backend if backend is not None else LocalConfig()
        d = Path(directory)
        manifest = load_manifest(d, check_files=check_files)
        from_manifest = placements is None
        if placements is None:
            placements = manifest_placements(manifest, threads)
        elif len(placements) != manifest.k:
            raise UsageError(f"{len(placements)} placements given for the {manifest.k} stages of {d}")
        specs = stage_specs(d, manifest, placements)
        local = isinstance(config, LocalConfig)
        if from_manifest and local:  # Ray actors check the provider on their own node
            check_providers_here(specs, ort.get_available_providers())
        pin_note = None
        shared = (
            [manifest.worker_of(i) for i in range(manifest.k)] if manifest.plan.workers is not None else None
        )
        if isinstance(config, LocalConfig) and config.pin:
            lanes, pin_note = assign_cpus([specs], workers=shared)
            specs = lanes[0]
        return cls(
            make_backend([specs], config, workers=shared),
            input_types={t.name: t.dtype for t in manifest.model_inputs},
            input_shapes={t.name: t.shape for t in manifest.model_inputs},
            output_names=[o.name for o in manifest.model_outputs],
            lanes=[specs],
            manifest=manifest,
            directory=d,
            pin_note=pin_note,
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
        """Queue one micro-batch (model inputs by name); the future's result is the model outputs.

        The inputs are checked first (names, dtypes, ranks, fixed dimensions): a malformed request raises
        :class:`UsageError` here and the pipeline goes on serving the others.  They are copied, so the
        caller may reuse its arrays as soon as this returns.  See :class:`Job` for cancelling and
        callbacks.
        """
        return self._driver.submit(self._check_feeds(feeds))

    def run(self, feeds: Mapping[str, np.ndarray]) -> Tensors:
        """Model outputs for one micro-batch of model inputs."""
        result: Tensors = self._interruptible(lambda: self.submit(feeds).result())
        return result

    def stream(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Tensors]:
        """Model outputs for each micro-batch of ``inputs``, in input order, while later ones run.

        At most :attr:`capacity` micro-batches are taken from ``inputs`` ahead of the one yielded, so an
        endless stream is fine; each is copied as it is taken, so ``inputs`` may yield one buffer over
        and over.  Stopping the iteration early leaves nothing behind: what was submitted finishes and
        is dropped.
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
        """Private C-ordered copies of the model inputs in ``feeds``; a :class:`UsageError` if malformed."""
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
            value = np.asarray(feeds[name])
            if expected not in ("", "undefined") and str(value.dtype) != expected:
                raise UsageError(
                    f"model input {name!r} is {value.dtype}, the model takes {expected}; convert it first"
                )
            self._check_shape(name, value.shape)
            # a copy, never a view: the caller may refill its buffer while this waits or runs
            checked[name] = np.array(value, order="C", copy=True)
        return checked

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a wrong rank or a wrong fixed dimension; symbolic and unknown dimensions take any size."""
        expected = self.input_shapes.get(name)
        if expected is None:
            return
        if len(shape) == len(expected) and all(
            not isinstance(want, int) or want == got for want, got in zip(expected, shape, strict=True)
        ):
            return
        dims = ", ".join("?" if d is None else str(d) for d in expected)
        raise UsageError(f"model input {name!r} has shape {tuple(shape)}; the model takes [{dims}]")

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
        """Whether no micro-batch is queued or running."""
        return self._driver.idle()

    def _raise_if_failed(self) -> None:
        if self._driver.error is not None:
            raise RuntimeStageError(f"the pipeline stopped after a failure: {self._driver.error}")
        if not self._driver.accepting:
            raise UsageError(_CLOSED)

    @property
    def failure(self) -> RuntimeStageError | None:
        """The error that stopped the pipeline, if one did."""
        return self._driver.error

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Refuse new work, then stop and join every worker.  Safe to call twice.

        ``graceful`` (also a normal exit from ``with``): the micro-batches already submitted, queued
        ones included, finish first, for at most ``timeout`` seconds; those still pending then fail.
        Otherwise (Ctrl-C, an exception in the ``with`` block) every pending future fails at once.
        Called from a future's callback, on the driver thread, it cannot wait: the driver finishes the
        close once the callback returns.
        """
        driver = self._driver
        driver.request_stop(graceful, timeout)
        if threading.current_thread() is driver.thread:
            return
        try:
            driver.thread.join()
        except KeyboardInterrupt:  # Ctrl-C during a graceful close: stop at once
            driver.request_stop(False, 0.0)
            driver.thread.join()
            driver.close_backend()
            raise
        driver.close_backend()
        self._finalizer.detach()

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
    lanes: Sequence[Sequence[WorkerSpec]], config: BackendConfig, *, workers: Sequence[int] | None = None
) -> Backend:
    """Start the workers of ``lanes`` as ``config`` says (``workers``: the worker of each stage of an
    interleaved split, whose stages then share a worker process, take turns as threads, or share a Ray
    actor)."""
    if isinstance(config, RayConfig):
        return RayBackend(
            lanes, address=config.address, resources=config.resources, slots=config.slots, workers=workers
        )
    if config.mode == "processes":
        return ProcessBackend(lanes, slots=config.slots, workers=workers)
    return ThreadBackend(lanes, slots=config.slots, workers=workers)
