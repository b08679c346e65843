"""Run a split folder as a pipeline: one worker per stage, micro-batches streaming through.

>>> with Pipeline.from_manifest("out/") as pipe:            # doctest: +SKIP
...     outputs = pipe.run({"input_ids": ids})              # one micro-batch
...     for out in pipe.stream(batches):                    # many, results in input order
...         use(out)

:meth:`Pipeline.submit` returns a :class:`concurrent.futures.Future` and may be called from many threads
at once (a server's request handlers): micro-batches enter the pipeline in the order they were
submitted, up to its capacity, and the rest wait in an unbounded queue.  ``submit`` checks and copies
the inputs, so a malformed request fails alone (:class:`~onnxpipe.core.errors.UsageError`) and the caller may
reuse its arrays at once.  A driver thread collects what comes out and sets the futures, so callbacks
added to them run on that thread: they must be quick and must not wait for another result of the same
pipeline.  A future can be cancelled while it is queued, not once a worker has it.

When a stage fails, or the driver meets any unexpected error, every pending future fails with the same
:class:`~onnxpipe.core.errors.RuntimeStageError`, every worker is stopped, and the pipeline refuses further
work.  :meth:`Pipeline.close` (and a normal exit from ``with``) lets what was submitted finish first;
Ctrl-C in :meth:`run` or :meth:`stream` stops the workers at once.  A pipeline dropped without
``close()`` finishes what was submitted and stops its workers once it is garbage-collected.

Process workers are started with ``spawn`` but never import the caller's ``__main__``
(:mod:`onnxpipe.runtime.backends.processes`): a script needs no ``if __name__ == "__main__":`` guard, and
``python -`` and notebooks work too.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from onnxpipe.core.dims import Shape
from onnxpipe.core.errors import CacheLost, RuntimeStageError, UsageError
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.progress import ClosesOnExit
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.affinity import assign_cpus
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.backends.processes import ProcessBackend
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import WAIT_SECONDS, BackendConfig, Delivery, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    check_providers_here,
    generation_inputs,
    generation_specs,
    manifest_placements,
    stage_specs,
)
from onnxpipe.runtime.trips import Trip

CLOSE_TIMEOUT_S = 60.0
"""How long a graceful :meth:`Pipeline.close` waits for the submitted micro-batches before failing them."""


Stop = Literal["drain", "now"]
"""How the driver ends: after the submitted work finished (or its deadline passed), or at once."""


class Job(Future[Tensors]):
    """A submitted micro-batch: a future with its sequence number and timestamps (``perf_counter``).

    It can be cancelled while it waits in the pipeline's queue (it then never reaches a worker); once a
    worker has it, it is running and ``cancel()`` returns False.  Its callbacks usually run on the
    pipeline's driver thread: they must be quick and must not wait for another result of the same
    pipeline, which only that thread could deliver.
    """

    def __init__(self, seq: int, feeds: Mapping[str, np.ndarray] | None, lane: int | None = None) -> None:
        super().__init__()
        self.seq = seq
        self.feeds = feeds
        self.lane = lane
        """The lane it must run in (a generating sequence's), or None: any."""
        self.queued_at = time.perf_counter()
        self.submitted_at: float | None = None
        self.done_at: float | None = None


class Driver:
    """The pipeline's queue and in-flight jobs, shared by its callers and its driver thread.  Kept apart
    from :class:`Pipeline` so that the thread keeps only this alive: a pipeline dropped without
    ``close()`` is collected, and its finalizer tells the driver to finish (:meth:`abandon`).  Every
    attribute except ``abandoned`` is guarded by ``lock``.  Only the driver thread waits on the backend
    and delivers results, and it never ends without settling every future: any error it meets fails the
    pipeline."""

    def __init__(self, backend: Lanes, output_names: tuple[str, ...]) -> None:
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

    def check_open(self) -> None:
        """Refuse work once the pipeline failed or was closed."""
        if self.error is not None:
            raise RuntimeStageError(f"the pipeline stopped after a failure: {self.error}")
        if not self.accepting:
            raise UsageError("the pipeline is closed; open it again with Pipeline.from_manifest")

    def submit(self, feeds: dict[str, np.ndarray], lane: int | None = None) -> Job:
        with self.lock:
            self.check_open()
            job = Job(self.next_seq, feeds, lane)
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
                failed = self._fail(driver_error(e))
            self._settle(failed)
        with self.lock:
            closes = not self.caller_closes
        if closes:  # a failure, a close from a callback, or a collected pipeline: nobody else will
            self.close_backend()

    def _round(self) -> bool:
        """Wait for the backend, deliver what came out, hand queued jobs over; False once finished."""
        self.backend.wait(self._wait_seconds())
        finished: list[tuple[Job, Delivery]] = []
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
                    failed = self._fail(driver_error(e))
            if self.error is None and self.stop != "now":
                failed = self._pump()
            end = self._finished()
            if end:
                failed += self._take_all()
        for job, outputs in finished:  # what came out is delivered, even if a failure followed it
            with contextlib.suppress(InvalidStateError):  # cancelled as it was handed over
                if isinstance(outputs, CacheLost):  # this step alone failed; the pipeline goes on
                    job.set_exception(outputs)
                else:
                    job.set_result(outputs)
        self._settle(failed)
        return not end

    def _wait_seconds(self) -> float:
        if self.stop == "now":
            return 0.0
        if self.stop == "drain":
            return max(0.0, min(WAIT_SECONDS, self.deadline - time.monotonic()))
        return WAIT_SECONDS

    def _collect(self, finished: list[tuple[Job, Delivery]]) -> None:
        """Append what the backend returned to ``finished`` (under the lock)."""
        now = time.perf_counter()
        for seq, outputs in self.backend.poll():
            job = self.in_flight[seq]  # popped once its result is whole: a failure below still settles it
            if not isinstance(outputs, CacheLost):
                missing = [n for n in self.output_names if n not in outputs]
                if missing:
                    sent = ", ".join(map(repr, outputs))
                    raise RuntimeStageError(
                        f"the last stage sent back no {missing[0]!r} (it sent {sent}): "
                        "start the pipeline with output names its last stage makes"
                    )
                outputs = {n: outputs[n] for n in self.output_names}
            del self.in_flight[seq]
            job.done_at = now
            finished.append((job, outputs))

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
                if not job.cancelled():  # else its caller gave up before a worker had it: drop it
                    assert job.feeds is not None
                    if not self.backend.try_submit(job.seq, job.feeds, job.lane):
                        break  # FIFO: a job for a full lane holds back the ones behind it
                    job.submitted_at = time.perf_counter()
                    self.in_flight[job.seq] = job
                self.queue.popleft()
                job.feeds = None
                # a dropped job: tells concurrent.futures.wait(); a handed-over one: from now on cancel() is
                # refused (one that slipped in since the check just loses the result)
                job.set_running_or_notify_cancel()
        except RuntimeStageError as e:
            return self._fail(e)
        except Exception as e:  # noqa: BLE001 - a backend bug must fail the futures, not hang them
            return self._fail(driver_error(e))
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


def driver_error(e: BaseException) -> RuntimeStageError:
    return RuntimeStageError(f"the pipeline's driver failed: {type(e).__name__}: {e}")


class Pipeline(ClosesOnExit):
    """Workers running the stages of a split folder (or any chain of :class:`WorkerSpec`).

    The model inputs' shapes (from the manifest) let :meth:`submit` refuse an input of the wrong rank or
    fixed dimension before it enters the pipeline, where it would fail a stage and with it every request.
    """

    def __init__(
        self,
        backend: Lanes,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        lanes: Sequence[Sequence[WorkerSpec]],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        pin_note: str | None = None,
    ) -> None:
        self.backend = backend
        self.input_types = dict(input_types)
        self.input_shapes: dict[str, Shape] = (
            {t.name: t.shape for t in manifest.model_inputs} if manifest is not None else {}
        )
        self.output_names = tuple(output_names)
        self.lanes = tuple(tuple(lane) for lane in lanes)
        self.manifest = manifest
        self.directory = directory
        self.pin_note = pin_note
        """Why the workers were not pinned although asked to be (too few CPUs), else None."""
        self._driver = Driver(backend, self.output_names)
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
        manifest: Manifest | None = None,
        contract: IOContract | None = None,
    ) -> Pipeline:
        """Start one worker per stage of the split folder ``directory``.

        ``backend`` says where: :class:`~onnxpipe.runtime.base.LocalConfig` (the default: threads of
        this process, or processes; pinned to CPUs of their own with ``pin``, :attr:`pin_note` saying why
        not when there are too few) or :class:`~onnxpipe.runtime.base.RayConfig`.  Each stage runs as the
        manifest records (:func:`~onnxpipe.runtime.spec.manifest_placements`): with the provider,
        provider options and threads of its device in the manifest's ``cluster`` (a split made with
        ``--devices``; a device may name another runtime, OpenVINO or tract, and one pipeline may mix
        them: docs/runtimes.md), else with the provider its ``device`` name implies (``cpu0``,
        ``cuda:1``) and the plan's threads; ``threads`` replaces every stage's intra-op threads.
        ``placements`` gives each stage's explicitly instead.  On the local backend a provider (or
        runtime) from the manifest that this machine lacks is a :class:`UsageError`, before any worker
        starts.  The stages of an interleaved split (``--workers``) share their worker.  ``manifest``:
        the folder's, where the caller loaded it already.

        ``contract``: a decoder's split's IO contract, for a pipeline that generates: each worker keeps
        its layers' KV caches (:func:`~onnxpipe.runtime.spec.generation_specs`), the caller sends the
        inputs but the cache (:func:`~onnxpipe.runtime.spec.generation_inputs`) and gets the logits back;
        a :class:`~onnxpipe.runtime.generation.generator.Generator` drives it.
        """
        d = Path(directory)
        manifest = manifest or load_manifest(d, check_files=check_files)
        placed = manifest_placements(manifest, threads) if placements is None else placements
        if len(placed) != manifest.k:
            raise UsageError(f"{len(placed)} placements given for the {manifest.k} stages of {d}")
        if contract is None:
            specs = stage_specs(d, manifest, placed)
            inputs = {t.name: t.dtype for t in manifest.model_inputs}
            outputs = [o.name for o in manifest.model_outputs]
        else:
            specs = generation_specs(d, manifest, placed, contract)
            inputs, outputs = generation_inputs(manifest, contract), [str(contract.logits)]
        interleaved = manifest.plan.workers is not None  # its stages share their worker
        return cls.start(
            [specs],
            backend,
            manifest=manifest,
            directory=d,
            input_types=inputs,
            output_names=outputs,
            workers=[manifest.worker_of(i) for i in range(manifest.k)] if interleaved else None,
            check_here=placements is None,
        )

    @classmethod
    def start(
        cls,
        lanes: Sequence[Sequence[WorkerSpec]],
        backend: BackendConfig | None = None,
        *,
        input_types: Mapping[str, str],
        output_names: Sequence[str],
        manifest: Manifest | None = None,
        directory: Path | None = None,
        workers: Sequence[int] | None = None,
        check_here: bool = False,
    ) -> Pipeline:
        """Start the workers of ``lanes`` (the chains of one split: one lane, or replicas) as ``backend``
        says; ``input_types``: the inputs the first worker takes (name: dtype), ``output_names`` the
        outputs the last sends back; ``manifest`` and ``directory``: the split's, if any; ``workers``:
        the worker of each stage of an interleaved split (:meth:`Manifest.worker_of`); ``check_here``: refuse
        a provider this machine lacks before any worker starts (the local backend; Ray actors check on
        their own node)."""
        config = backend if backend is not None else LocalConfig()
        if check_here and isinstance(config, LocalConfig):
            check_providers_here([s for lane in lanes for s in lane], ort.get_available_providers())
        pin_note = None
        if isinstance(config, LocalConfig) and config.pin:
            lanes, pin_note = assign_cpus(lanes, workers=workers)
        return cls(
            make_backend(lanes, config, workers=workers),
            input_types=input_types,
            output_names=output_names,
            lanes=lanes,
            manifest=manifest,
            directory=directory,
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

    def submit(self, feeds: Mapping[str, np.ndarray], lane: int | None = None) -> Job:
        """Queue one micro-batch (model inputs by name); the future's result is the model outputs.
        ``lane``: the lane it must run in (a generation step, whose sequences' caches live there); by
        default the next free one.

        The inputs are checked first (names, dtypes, ranks, fixed dimensions): a malformed request raises
        :class:`UsageError` here and the pipeline goes on serving the others.  They are copied, so the
        caller may reuse its arrays as soon as this returns.  See :class:`Job` for cancelling and
        callbacks.
        """
        return self._driver.submit(self._check_feeds(feeds), lane)

    def run(self, feeds: Mapping[str, np.ndarray]) -> Tensors:
        """Model outputs for one micro-batch of model inputs."""
        return self.run_many([feeds])[0]

    def stream(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Tensors]:
        """Model outputs for each micro-batch of ``inputs``, in input order, while later ones run.

        At most :attr:`capacity` micro-batches are taken from ``inputs`` ahead of the one yielded, so an
        endless stream is fine; each is copied as it is taken, so ``inputs`` may yield one buffer over
        and over.  Stopping the iteration early leaves nothing behind: what was submitted finishes and
        is dropped.
        """
        try:
            for job in self.jobs(inputs):
                yield job.result()
        except KeyboardInterrupt:
            self.close(graceful=False)
            raise

    def jobs(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Job]:
        """The job of each micro-batch of ``inputs``, in input order, once it is done or :attr:`capacity`
        are in flight (its result then comes next): :meth:`stream`'s window, for a caller that wants
        the jobs' times too."""
        window = max(1, self.capacity)
        pending: deque[Job] = deque()
        for feeds in inputs:
            pending.append(self.submit(feeds))
            while len(pending) >= window or (pending and pending[0].done()):
                yield pending.popleft()
        while pending:
            yield pending.popleft()

    def run_many(self, inputs: Iterable[Mapping[str, np.ndarray]]) -> list[Tensors]:
        """``list(stream(inputs))``, stopping the workers on Ctrl-C."""
        return list(self.stream(inputs))

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
        self._driver.check_open()
        return self.backend.stats()

    def reset_stats(self) -> None:
        self._driver.check_open()
        self.backend.reset_stats()

    def trips(self) -> list[Trip]:
        """Each delivered micro-batch's hops since the stats were reset, where the backend times them
        (Ray, :mod:`onnxpipe.runtime.trips`); empty for local workers."""
        return self.backend.trips()

    def worker_pids(self) -> list[int]:
        """Process ids of the local worker processes (empty for threads and Ray)."""
        return self.backend.worker_pids()

    def idle(self) -> bool:
        """Whether no micro-batch is queued or running."""
        return self._driver.idle()

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


def make_backend(
    lanes: Sequence[Sequence[WorkerSpec]], config: BackendConfig, *, workers: Sequence[int] | None = None
) -> Lanes:
    """Start the workers of ``lanes`` as ``config`` says (``workers``: the worker of each stage of an
    interleaved split, whose stages then share a worker process, take turns as threads, or share a Ray
    actor)."""
    if isinstance(config, RayConfig):
        return RayBackend(lanes, config, workers=workers)
    if config.mode == "processes":
        return ProcessBackend(lanes, slots=config.slots, workers=workers)
    return ThreadBackend(lanes, slots=config.slots, workers=workers)
