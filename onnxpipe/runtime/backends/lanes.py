"""What the three backends do alike with their lanes: check them, feed them in turn (or the lane a
micro-batch must go to), and hold ``slots`` micro-batches per channel, ``k + 1`` channels per lane of
``k`` stages, so that a backend's capacity means the same whatever runs its workers.

And the one loop of a worker that hosts stages and takes turns of their micro-batches (:class:`Host`),
whatever carries them: a thread of :class:`~onnxpipe.runtime.backends.threads.ThreadBackend` (in-process
channels) and a worker process of :class:`~onnxpipe.runtime.backends.processes.ProcessBackend`
(shared-memory channels) run this one loop.

A worker hosts one stage, or all the stages of one worker of an interleaved split, each with its own
session: one session runs at a time, as the plan assumes (without turns the scheduler would slice the
worker's CPUs between its stages' runs, and each stage's measured time would include the others').  It
never waits on one stage while another could work: each pass runs the deepest stage that has a
micro-batch and no result waiting for room (a stage holds at most one result that its full downstream
channel cannot take yet), so no cycle of full channels between two workers can stall it.
"""

from __future__ import annotations

import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.base import Delivery, check_slots
from onnxpipe.runtime.session import Record, StageRunner, WorkerStats
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import Trip


class Lanes(ABC):
    """The base of every backend (the contract: :mod:`onnxpipe.runtime.base`): its lanes, fed in turn.  A
    subclass offers a micro-batch to one lane (:meth:`_offer`), moves what comes out, reports and stops
    its workers, and records its failure in ``_failure``, which every later call raises."""

    kind: str
    """``"processes"``, ``"threads"`` or ``"ray"``."""

    def __init__(
        self, lanes: Sequence[Sequence[WorkerSpec]], slots: int, workers: Sequence[int] | None
    ) -> None:
        """``workers``: the worker of each stage of a single lane (an interleaved split's)."""
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
        if workers is not None and (len(lanes) != 1 or len(workers) != len(lanes[0])):
            raise UsageError("workers gives the worker of each stage of one lane")
        check_slots(slots)
        self._sizes = [len(lane) for lane in lanes]
        self._slots = slots
        self._next_lane = 0
        self._closed = False
        self._failure: RuntimeStageError | None = None

    @property
    def capacity(self) -> int:
        return sum(self._lane_capacity(li) for li in range(self.lanes))

    def _lane_capacity(self, li: int) -> int:
        return self._slots * (self._sizes[li] + 1)

    @property
    def lanes(self) -> int:
        return len(self._sizes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray], to_lane: int | None = None) -> bool:
        """Micro-batch ``seq`` to the next lane with room (lanes in turn), or to ``to_lane`` only."""
        self._check_open()
        if to_lane is not None and not 0 <= to_lane < self.lanes:
            raise UsageError(f"lane {to_lane}: this pipeline has lanes 0 to {self.lanes - 1}")
        turn = [(self._next_lane + step) % self.lanes for step in range(self.lanes)]
        for li in turn if to_lane is None else [to_lane]:
            if self._offer(li, seq, feeds):
                self._next_lane = (li + 1) % self.lanes
                return True
        return False

    @abstractmethod
    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        """Hand ``seq`` to lane ``li`` if it has room; whether it went."""

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeStageError("the pipeline's workers were stopped; open the pipeline again")

    @abstractmethod
    def poll(self) -> Sequence[tuple[int, Delivery]]:
        """What came out since the last call; raises once a worker failed or died."""

    @abstractmethod
    def wait(self, timeout: float) -> None:
        """Block until :meth:`poll` may have something new, ``timeout`` seconds at most."""

    @abstractmethod
    def wake(self) -> None:
        """Make a concurrent :meth:`wait` return (a micro-batch was queued)."""

    @abstractmethod
    def stats(self) -> list[WorkerStats]:
        """Each stage's statistics, in lane and stage order."""

    @abstractmethod
    def reset_stats(self) -> None:
        """Start every stage's statistics afresh (a measured run after a warm-up)."""

    @abstractmethod
    def close(self, graceful: bool = True) -> None:
        """Stop every worker (letting each finish its run first when ``graceful``)."""

    def trips(self) -> list[Trip]:
        """None where a worker's hops are a queue's or shared memory's, timed in its records."""
        return []

    def worker_pids(self) -> list[int]:
        return []


class Inbox(Protocol):
    """Where a hosted stage's micro-batches come in: :meth:`take` gives the next one's number, its
    tensors and the slot they hold until :meth:`release` (a channel whose sender is gone raises
    :class:`EOFError`); :meth:`pending`: whether one (or the end) is waiting."""

    def pending(self) -> bool: ...

    def take(self) -> tuple[int, dict[str, np.ndarray], int]: ...

    def release(self, slot: int) -> None: ...


class Outbox(Protocol):
    """Where a hosted stage's results go."""

    def has_room(self) -> bool: ...

    def send(self, seq: int, tensors: Mapping[str, np.ndarray]) -> None: ...


In = TypeVar("In", bound=Inbox)
Out = TypeVar("Out", bound=Outbox)


class Hosted(Generic[In, Out]):
    """One stage inside a worker: its session, its two channels, and a result it could not send yet."""

    def __init__(self, runner: StageRunner, inbox: In, outbox: Out) -> None:
        self.runner = runner
        self.inbox = inbox
        self.outbox = outbox
        self.held: tuple[Record, int, dict[str, np.ndarray]] | None = None
        """A result computed and not sent yet (the downstream channel was full): its record so far, the
        input slot it still holds, its tensors."""
        self.busy: int | None = None
        """The micro-batch taken and not yet sent on (what a failure names)."""

    def run_next(self) -> None:
        """Take the next micro-batch, run it, and send the result if there is room (else hold it)."""
        received = time.perf_counter()
        taken = self.inbox.take()
        seq, views, slot = taken
        self.busy = seq
        run_start = time.perf_counter()
        sends = self.runner.run(seq, views)
        run_end = time.perf_counter()
        self.held = (Record(seq, received, run_start, run_end, run_end, run_end), slot, sends)
        del views, taken
        self.send_held()

    def send_held(self) -> bool:
        """Send the held result if the downstream channel has room; whether it went."""
        assert self.held is not None
        if not self.outbox.has_room():
            return False
        record, slot, sends = self.held
        out_ready = time.perf_counter()
        self.outbox.send(record.seq, sends)
        self.held = None
        self.busy = None
        del sends
        self.inbox.release(slot)
        self.runner.records.append(replace(record, out_ready=out_ready, done=time.perf_counter()))
        return True


class Host(Generic[In, Out]):
    """The stages one worker hosts (in stage order) and one pass of work over them."""

    def __init__(self, hosted: Sequence[Hosted[In, Out]]) -> None:
        self.hosted = list(hosted)
        self._deepest_first = self.hosted[::-1]
        self.current: Hosted[In, Out] | None = None
        """The stage at work (what a failure names)."""

    @property
    def label(self) -> str:
        return ", ".join(h.runner.spec.label for h in self.hosted)

    def one_pass(self) -> bool:
        """Send held results and run the deepest stage with work; whether any work was done."""
        worked = False
        for h in self._deepest_first:
            if h.held is not None:
                self.current = h
                worked = h.send_held() or worked
            if h.held is None and h.inbox.pending():
                self.current = h
                h.run_next()
                self.current = None
                return True
        self.current = None
        return worked

    def internal_error(self, e: BaseException) -> str:
        """A bug met while working, as the one line the caller raises: the stage and micro-batch at it."""
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        busy = self.current
        label = busy.runner.spec.label if busy is not None else self.label
        seq = busy.busy if busy is not None else None
        return f"{label}: internal error on micro-batch {seq}: {detail}"
