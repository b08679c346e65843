"""Workers as threads of the caller's process, bounded channels between them.

onnxruntime releases the GIL while a session runs, so stages overlap; tensors pass by reference (no
copy).  The workers share the process, so memory is reported for the process as a whole.  A thread cannot
be killed: closing stops each worker after the session run it is in, if any.

A channel has ``slots`` places, as a process channel has shared-memory slots: a micro-batch takes one
when it is put in and gives it back once its receiver has passed it on (or the caller has polled it), so
the one a worker runs still counts.  A lane of ``k`` workers thus holds at most ``slots * (k + 1)``
micro-batches, which is :attr:`ThreadBackend.capacity`.

A thread runs one stage, or all the stages of one worker of an interleaved split (``workers``), taking
turns of them as a worker process does (:class:`~.lanes.Host`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.backends.lanes import Host, Hosted, Lanes
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.options import DEFAULT_SLOTS
from onnxpipe.runtime.session import StageFailure, StageRunner, WorkerStats, current_rss_bytes
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.schedule.timeline import worker_groups

_POLL_S = 0.1
STOP_GRACE_S = 10.0


class _Channel:
    """A FIFO of micro-batches with ``slots`` places (see the module docstring) that wakes its receiver
    when one comes in and its sender when a place frees (an :class:`~.lanes.Inbox` and an
    :class:`~.lanes.Outbox`).  One sender and one receiver: a place counted free stays free."""

    def __init__(self, slots: int, sender: threading.Event, receiver: threading.Event) -> None:
        self.slots = slots
        self.sender = sender
        self.receiver = receiver
        self.items: deque[tuple[int, Tensors]] = deque()
        self.used = 0
        self.lock = threading.Lock()

    def has_room(self) -> bool:
        return self.used < self.slots

    def send(self, seq: int, tensors: Mapping[str, np.ndarray]) -> None:
        with self.lock:
            self.used += 1
        self.items.append((seq, dict(tensors)))
        self.receiver.set()

    def pending(self) -> bool:
        return bool(self.items)

    def take(self) -> tuple[int, Tensors, int]:
        seq, tensors = self.items.popleft()
        return seq, tensors, 0

    def release(self, slot: int) -> None:
        with self.lock:
            self.used -= 1
        self.sender.set()


class _Worker:
    """One worker thread and the stages it hosts; ``lock`` is held while it works, so that the stats
    and a reset never see a result sent without its record."""

    def __init__(self, host: Host[_Channel, _Channel], wake: threading.Event, backend: ThreadBackend) -> None:
        self.host = host
        self.wake = wake
        self.backend = backend
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=f"onnxpipe {host.label}", daemon=True)

    def _loop(self) -> None:
        backend = self.backend
        try:
            pin_thread(sorted({c for h in self.host.hosted for c in h.runner.spec.placement.cpus}))
            while not backend.stopping.is_set():
                self.wake.clear()  # before the pass: a wake-up during it is not lost
                with self.lock:
                    worked = self.host.one_pass()
                if not worked:
                    self.wake.wait(_POLL_S)
        except StageFailure as e:
            backend.fail(str(e))
        except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
            backend.fail(self.host.internal_error(e))


@dataclass
class _Lane:
    inbox: _Channel
    receives: tuple[str, ...]
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
        self._wake = threading.Event()
        self.stopping = threading.Event()
        self._failing = threading.Lock()
        self._startup_rss = current_rss_bytes()
        self._lanes: list[_Lane] = []
        self._workers: list[_Worker] = []
        self._stages: list[tuple[StageRunner, _Worker]] = []
        """Each stage's runner and the worker hosting it, in lane and stage order."""
        try:
            runners = [[StageRunner(spec) for spec in lane] for lane in lanes]
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from e
        for lane_runners in runners:
            self._start_lane(
                lane_runners, worker_groups(range(len(lane_runners)) if workers is None else workers)
            )
        for w in self._workers:
            w.thread.start()

    def _start_lane(self, runners: Sequence[StageRunner], hosts: Sequence[Sequence[int]]) -> None:
        """A lane's channels (channel ``c`` into stage ``c``) and its workers (``hosts``: the positions of
        the stages each one hosts); each channel wakes the workers at its ends (the driver at the lane's)."""
        wakes = [threading.Event() for _ in hosts]
        wake_of = {i: wakes[w] for w, positions in enumerate(hosts) for i in positions}
        ends = [self._wake, *(wake_of[i] for i in range(len(runners))), self._wake]
        channels = [_Channel(self._slots, ends[c], ends[c + 1]) for c in range(len(runners) + 1)]
        worker_of: dict[int, _Worker] = {}
        for positions, wake in zip(hosts, wakes, strict=True):
            host = Host([Hosted(runners[i], channels[i], channels[i + 1]) for i in positions])
            self._workers.append(_Worker(host, wake, self))
            worker_of.update((i, self._workers[-1]) for i in positions)
        self._stages += [(r, worker_of[i]) for i, r in enumerate(runners)]
        self._lanes.append(_Lane(channels[0], runners[0].spec.receives, channels[-1]))

    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        lane = self._lanes[li]
        if not lane.inbox.has_room():
            return False
        lane.inbox.send(seq, {name: feeds[name] for name in lane.receives})
        return True

    def poll(self) -> list[tuple[int, Tensors]]:
        """What came out; after a failure, first what came out before it, then the failure next call."""
        done: list[tuple[int, Tensors]] = []
        for lane in self._lanes:
            while lane.results.pending():
                seq, tensors, slot = lane.results.take()
                done.append((seq, tensors))
                lane.results.release(slot)
        if not done:
            self._check_open()
        elif self._failure is not None:
            self._wake.set()  # so that the driver's next wait returns and polls the failure
        return done

    def wait(self, timeout: float) -> None:
        self._wake.wait(timeout)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def fail(self, text: str) -> None:
        """A worker's failure: the first one is kept (every later call raises it), and every worker
        stops."""
        with self._failing:
            if self._failure is None:
                self._failure = RuntimeStageError(text)
        self.stopping.set()
        self._wake.set()

    def stats(self) -> list[WorkerStats]:
        result: list[WorkerStats] = []
        for runner, w in self._stages:
            with w.lock:
                result.append(runner.stats(pid=os.getpid(), startup_rss=self._startup_rss, shared=True))
        return result

    def reset_stats(self) -> None:
        for runner, w in self._stages:
            with w.lock:
                runner.records.clear()

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self.stopping.set()
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self._workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
