"""Workers as threads of the caller's process, bounded channels between them.

onnxruntime releases the GIL while a session runs, so stages overlap; tensors pass by reference (no
copy).  The workers share the process, so memory is reported for the process as a whole.  A thread cannot
be killed: closing stops each worker after the session run it is in, if any.

A channel has ``slots`` places, as a process channel has shared-memory slots: a micro-batch takes one
when it is put in and gives it back once its receiver has passed it on (or the caller has polled it), so
the one a worker runs still counts.  A lane of ``k`` workers thus holds at most ``slots * (k + 1)``
micro-batches, which is :attr:`ThreadBackend.capacity`.

The stages of one worker of an interleaved split (``workers``) take turns (:class:`_Turns`): one of
their sessions runs at a time, the deepest waiting stage next, as a worker process hosting them runs
them and as the plan assumes.  Without turns the scheduler would slice the worker's CPU between its
stages' runs, and each stage's measured time would include the others' slices.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.choices import DEFAULT_SLOTS
from onnxpipe.runtime.session import Record, StageFailure, StageRunner, WorkerStats, current_rss_bytes
from onnxpipe.runtime.spec import WorkerSpec

_POLL_S = 0.1
STOP_GRACE_S = 10.0

Item = tuple[int, Tensors]


@dataclass
class _Channel:
    """A FIFO of micro-batches with ``slots`` places (see the module docstring): an item taken from
    ``items`` keeps its place until ``places.release()``."""

    slots: int
    items: queue.SimpleQueue[Item] = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        self.places = threading.Semaphore(self.slots)

    def put(self, item: Item, timeout: float = 0.0) -> bool:
        """Put ``item`` if a place frees within ``timeout`` seconds (0: is free now)."""
        if not self.places.acquire(timeout=timeout):
            return False
        self.items.put(item)
        return True


class _Turns:
    """One worker of an interleaved split: its stages' threads run their sessions one at a time, the
    deepest stage waiting going next.  A turn covers the session run only, never a wait for room
    downstream: the worker's next stage may be the one that makes that room."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._busy = False
        self._waiting: set[int] = set()

    def take(self, stage: int, stopping: threading.Event) -> bool:
        """Wait for ``stage``'s turn; False if the pipeline stops first."""
        with self._changed:
            self._waiting.add(stage)
            try:
                while self._busy or max(self._waiting) != stage:
                    if stopping.is_set():
                        return False
                    self._changed.wait(_POLL_S)
            finally:
                self._waiting.discard(stage)
            self._busy = True
            return True

    def give_back(self) -> None:
        with self._changed:
            self._busy = False
            self._changed.notify_all()


@dataclass
class _Shared:
    wake: threading.Event = field(default_factory=threading.Event)
    stopping: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, text: str) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = text
        self.stopping.set()
        self.wake.set()


@dataclass
class _Worker:
    runner: StageRunner
    inbox: _Channel
    outbox: _Channel
    shared: _Shared
    first: bool
    last: bool
    turns: _Turns | None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(
            target=self._loop, name=f"onnxpipe {self.runner.spec.label}", daemon=True
        )

    def _loop(self) -> None:
        shared = self.shared
        seq: int | None = None
        try:
            pin_thread(self.runner.spec.placement.cpus)
            while not shared.stopping.is_set():
                try:
                    seq, tensors = self.inbox.items.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                turns = self.turns
                if turns is not None and not turns.take(self.runner.spec.index, shared.stopping):
                    return
                try:
                    received = run_start = time.perf_counter()
                    sends = self.runner.run(seq, tensors)
                    run_end = time.perf_counter()
                finally:
                    if turns is not None:
                        turns.give_back()
                # the record is written with the put, under the lock that stats() and reset_stats() take:
                # once a result can be collected, its record is there (and a reset after it clears it)
                with self.lock:
                    while not self.outbox.put((seq, sends), timeout=_POLL_S):
                        if shared.stopping.is_set():
                            return
                    done = time.perf_counter()
                    self.runner.recorder.add(Record(seq, received, run_start, run_end, done, done))
                self.inbox.places.release()
                if self.first or self.last:
                    shared.wake.set()  # room for the next micro-batch, or a result for the driver
                seq = None
        except StageFailure as e:
            shared.fail(str(e))
        except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
            shared.fail(
                f"{self.runner.spec.label}: internal error on micro-batch {seq}: {type(e).__name__}: {e}"
            )


@dataclass
class _Lane:
    inbox: _Channel
    workers: list[_Worker]
    results: _Channel


class ThreadBackend(Lanes):
    """Lanes of worker threads joined by bounded channels."""

    kind = "threads"

    def __init__(
        self,
        lanes: Sequence[Sequence[WorkerSpec]],
        *,
        slots: int = DEFAULT_SLOTS,
        workers: Sequence[int] | None = None,
    ) -> None:
        """``workers``: the worker of each stage of a single lane (an interleaved split's
        ``manifest.worker_of``), whose stages then take turns; None: every stage runs when it can."""
        super().__init__(lanes, slots, workers)
        if slots < 1:
            raise ValueError(f"slots {slots}: a channel needs at least one slot")
        self._shared = _Shared()
        self._startup_rss = current_rss_bytes()
        self._lanes: list[_Lane] = []
        try:
            runners = [[StageRunner(spec) for spec in lane] for lane in lanes]
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from e
        turns = {w: _Turns() for w in workers} if workers is not None else {}
        for lane_runners in runners:
            channels = [_Channel(slots) for _ in range(len(lane_runners) + 1)]
            chain = [
                _Worker(
                    runner,
                    channels[i],
                    channels[i + 1],
                    self._shared,
                    first=i == 0,
                    last=i == len(lane_runners) - 1,
                    turns=turns[workers[i]] if workers is not None else None,
                )
                for i, runner in enumerate(lane_runners)
            ]
            self._lanes.append(_Lane(channels[0], chain, channels[-1]))
        for w in self._workers:
            w.thread.start()

    @property
    def _workers(self) -> list[_Worker]:
        return [w for lane in self._lanes for w in lane.workers]

    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        lane = self._lanes[li]
        return lane.inbox.put((seq, {name: feeds[name] for name in lane.workers[0].runner.spec.receives}))

    def poll(self) -> list[tuple[int, Tensors]]:
        """What came out; after a failure, first what came out before it, then the failure next call."""
        done: list[tuple[int, Tensors]] = []
        for lane in self._lanes:
            while True:
                try:
                    done.append(lane.results.items.get_nowait())
                except queue.Empty:
                    break
                lane.results.places.release()
        if not done:
            self._check_open()
        elif self._shared.failure is not None:
            self._shared.wake.set()  # so that the driver's next wait returns and polls the failure
        return done

    def wait(self, timeout: float) -> None:
        self._shared.wake.wait(timeout)
        self._shared.wake.clear()

    def wake(self) -> None:
        self._shared.wake.set()

    def _check_open(self) -> None:
        if self._shared.failure is not None:
            self._failure = RuntimeStageError(self._shared.failure)
        super()._check_open()

    def stats(self) -> list[WorkerStats]:
        result: list[WorkerStats] = []
        for w in self._workers:
            with w.lock:
                result.append(w.runner.stats(pid=os.getpid(), startup_rss=self._startup_rss, shared=True))
        return result

    def reset_stats(self) -> None:
        for w in self._workers:
            with w.lock:
                w.runner.recorder.reset()

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._shared.stopping.set()
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self._workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
