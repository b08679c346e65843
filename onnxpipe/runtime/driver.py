"""The pipeline's driver: the queue of submitted micro-batches, the ones in flight, and the one thread that
waits on the backend and settles every future.  Kept apart from :class:`~onnxpipe.runtime.pipeline.Pipeline`
so that the thread keeps only this alive: a pipeline dropped without ``close()`` is collected, and its
finalizer tells the driver to finish."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from typing import Literal

import numpy as np

from onnxpipe.core.errors import CacheLost, RuntimeStageError, UsageError
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.base import WAIT_SECONDS, Delivery, Tensors

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
    """The pipeline's queue and in-flight jobs, shared by its callers and its driver thread (apart from
    the pipeline: see the module docstring; its finalizer calls :meth:`abandon`).  Every attribute
    except ``abandoned`` is guarded by ``lock``.  Only the driver thread waits on the backend and
    delivers results, and it never ends without settling every future: any error it meets fails the
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
            job = self.in_flight.pop(seq)
            result = outputs if isinstance(outputs, CacheLost) else {n: outputs[n] for n in self.output_names}
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
