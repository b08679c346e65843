"""A worker that hosts stages and takes turns of their micro-batches, whatever carries them: a thread of
:class:`~onnxpipe.runtime.backends.threads.ThreadBackend` (in-process channels) and a worker process of
:class:`~onnxpipe.runtime.backends.processes.ProcessBackend` (shared-memory channels) run this one loop.

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
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from onnxpipe.runtime.session import Record, StageRunner


class Inbox(Protocol):
    """Where a hosted stage's micro-batches come in: :meth:`take` gives the next one's number, its
    tensors and the slot they hold until :meth:`release`, or None once the channel closed (the caller's
    close); :meth:`pending`: whether one (or the end) is waiting."""

    def pending(self) -> bool: ...

    def take(self) -> tuple[int, dict[str, np.ndarray], int] | None: ...

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

    def run_next(self) -> bool:
        """Take the next micro-batch, run it, and send the result if there is room (else hold it).
        False when the channel was closed (the caller's close)."""
        received = time.perf_counter()
        taken = self.inbox.take()
        if taken is None:
            return False
        seq, views, slot = taken
        self.busy = seq
        run_start = time.perf_counter()
        sends = self.runner.run(seq, views)
        run_end = time.perf_counter()
        self.held = (Record(seq, received, run_start, run_end, run_end, run_end), slot, sends)
        del views, taken
        self.send_held()
        return True

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

    def one_pass(self) -> bool | None:
        """Send held results and run the deepest stage with work; whether any work was done, None when
        a channel closed (the caller's close)."""
        worked = False
        for h in self._deepest_first:
            if h.held is not None:
                self.current = h
                worked = h.send_held() or worked
            if h.held is None and h.inbox.pending():
                self.current = h
                if not h.run_next():
                    return None
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
