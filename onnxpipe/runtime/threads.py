"""Workers as threads of the caller's process, bounded queues between them.

onnxruntime releases the GIL while a session runs, so stages overlap; tensors pass by reference (no
copy).  The workers share the process, so memory is reported for the process as a whole.  A thread cannot
be killed: closing stops each worker after the session run it is in, if any.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxpipe.errors import RuntimeStageError
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.processes import DEFAULT_SLOTS
from onnxpipe.runtime.session import Record, StageFailure, StageRunner, WorkerStats, current_rss_bytes
from onnxpipe.runtime.spec import WorkerSpec

_POLL_S = 0.1
STOP_GRACE_S = 10.0

Item = tuple[int, Tensors]


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


class _Worker:
    def __init__(
        self,
        runner: StageRunner,
        inbox: queue.Queue[Item],
        outbox: queue.Queue[Item],
        shared: _Shared,
        *,
        first: bool,
        last: bool,
    ) -> None:
        self.runner = runner
        self.inbox = inbox
        self.outbox = outbox
        self.shared = shared
        self.first = first
        self.last = last
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name=f"onnxpipe {runner.spec.label}", daemon=True)

    def _loop(self) -> None:
        shared = self.shared
        seq: int | None = None
        try:
            while not shared.stopping.is_set():
                try:
                    seq, tensors = self.inbox.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                received = time.perf_counter()
                if self.first:
                    shared.wake.set()  # room for the next micro-batch
                run_start = time.perf_counter()
                sends = self.runner.run(seq, tensors)
                run_end = time.perf_counter()
                while True:
                    if shared.stopping.is_set():
                        return
                    try:
                        self.outbox.put((seq, sends), timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue
                done = time.perf_counter()
                if self.last:
                    shared.wake.set()
                with self.lock:
                    self.runner.recorder.add(Record(seq, received, run_start, run_end, done, done))
                seq = None
        except StageFailure as e:
            shared.fail(str(e))
        except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
            shared.fail(
                f"{self.runner.spec.label}: internal error on micro-batch {seq}: {type(e).__name__}: {e}"
            )


class ThreadBackend:
    """Lanes of worker threads joined by bounded queues."""

    kind = "threads"

    def __init__(self, lanes: Sequence[Sequence[WorkerSpec]], *, slots: int = DEFAULT_SLOTS) -> None:
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
        self._shared = _Shared()
        self._startup_rss = current_rss_bytes()
        self._results: queue.Queue[Item] = queue.Queue()
        self._slots = slots
        # a queue holds what waits; the worker holds what it runs: slots - 1 waiting matches processes
        size = max(1, slots - 1)
        self._lanes: list[tuple[queue.Queue[Item], list[_Worker]]] = []
        self._next_lane = 0
        self._closed = False
        try:
            runners = [[StageRunner(spec) for spec in lane] for lane in lanes]
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from e
        for lane_runners in runners:
            queues: list[queue.Queue[Item]] = [queue.Queue(maxsize=size) for _ in lane_runners]
            queues.append(self._results)
            workers = [
                _Worker(
                    runner,
                    queues[i],
                    queues[i + 1],
                    self._shared,
                    first=i == 0,
                    last=i == len(lane_runners) - 1,
                )
                for i, runner in enumerate(lane_runners)
            ]
            self._lanes.append((queues[0], workers))
        for w in self._workers:
            w.thread.start()

    @property
    def _workers(self) -> list[_Worker]:
        return [w for _, workers in self._lanes for w in workers]

    @property
    def capacity(self) -> int:
        return sum(self._slots * (len(workers) + 1) for _, workers in self._lanes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        self._check()
        n = len(self._lanes)
        for step in range(n):
            li = (self._next_lane + step) % n
            inbox, workers = self._lanes[li]
            received = {name: feeds[name] for name in workers[0].runner.spec.receives}
            try:
                inbox.put_nowait((seq, received))
            except queue.Full:
                continue
            self._next_lane = (li + 1) % n
            return True
        return False

    def poll(self) -> list[tuple[int, Tensors]]:
        done: list[tuple[int, Tensors]] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                break
        self._check()
        return done

    def wait(self, timeout: float) -> None:
        self._shared.wake.wait(timeout)
        self._shared.wake.clear()

    def wake(self) -> None:
        self._shared.wake.set()

    def _check(self) -> None:
        if self._shared.failure is not None:
            raise RuntimeStageError(self._shared.failure)
        if self._closed:
            raise RuntimeStageError("the pipeline's workers were stopped; open the pipeline again")

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

    def worker_pids(self) -> list[int]:
        return []

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        self._shared.stopping.set()
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self._workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
