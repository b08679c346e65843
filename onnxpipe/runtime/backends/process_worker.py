"""What runs inside one worker process of :class:`~onnxpipe.runtime.backends.processes.ProcessBackend`: its
stages' sessions, the loop that reads a micro-batch from shared memory, runs it and writes it on, and the
control messages (stats, reset, stop) it answers between micro-batches.  It leaves when its parent dies."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import numpy as np

from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.backends.shm import ItemMessage, Poller, SlotReader, SlotWriter, unlink_prefix
from onnxpipe.runtime.session import (
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
    memory_snapshot,
    pin_failure,
)
from onnxpipe.runtime.spec import WorkerSpec

WATCH_S = 1.0  # how often a waiting worker checks that its parent is alive


SIGNAL_WAIT_S = 0.25  # how long a signalled worker waits to see whether its parent is dying too


STOP = "stop"


STATS = "stats"  # sent as (STATS, request id); the reply is (request id, WorkerStats)


RESET = "reset"


@dataclass(frozen=True)
class StageEnds:
    """The channel ends of one stage hosted by a worker process: where its micro-batches come in, where
    its results go, and the name prefix of the segments it writes."""

    in_data: Connection
    in_free: Connection
    out_data: Connection
    out_free: Connection
    prefix: str


class Hosted:
    """One stage inside a worker process: its session, its two channels, and a result it computed but
    could not send yet (the downstream channel was full), with its input slot still held."""

    def __init__(self, runner: StageRunner, ends: StageEnds, slots: int) -> None:
        self.runner = runner
        self.reader = SlotReader(ends.in_data, ends.in_free)
        self.writer = SlotWriter(ends.prefix, slots, ends.out_data, ends.out_free)
        self.held: tuple[ItemMessage, dict[str, np.ndarray], float, float, float] | None = None
        self.busy: int | None = None
        """The micro-batch taken and not yet sent on (what a failure names)."""

    def run_next(self) -> int | None:
        """Take the next micro-batch, run it, and send the result if there is room (else hold it).
        Returns the micro-batch's number, or None when the channel was closed (the caller's close)."""
        message = self.reader.recv()
        if not isinstance(message, ItemMessage):
            return None
        self.busy = message.seq
        received = time.perf_counter()
        views = self.reader.views(message)
        run_start = time.perf_counter()
        sends = self.runner.run(message.seq, views)
        self.held = (message, sends, received, run_start, time.perf_counter())
        del views
        self.send_held()
        return message.seq

    def send_held(self) -> bool:
        """Send the held result if the downstream channel has room; whether it went."""
        assert self.held is not None
        if not self.writer.has_room():
            return False
        message, sends, received, run_start, run_end = self.held
        out_ready = time.perf_counter()
        self.writer.send(message.seq, sends)
        self.held = None
        self.busy = None
        del sends
        self.reader.release(message.slot)
        self.runner.recorder.add(
            Record(message.seq, received, run_start, run_end, out_ready, time.perf_counter())
        )
        return True

    def close(self) -> None:
        self.writer.close()
        self.reader.close()


def worker_main(
    specs: tuple[WorkerSpec, ...],
    ends: tuple[StageEnds, ...],
    control: Connection,
    status: Connection,
    slots: int,
    parent_pid: int,
    pipeline_prefix: str,
) -> None:
    """Entry point of a worker process (module level, so that ``spawn`` can import it).

    The process hosts one stage, or all the stages of one worker of an interleaved split (``specs``, in
    stage order, ``ends[i]`` the channels of ``specs[i]``), each with its own session: one process per
    worker pays for one interpreter and one onnxruntime instead of one per stage.  It never waits on one
    stage while another could work: it runs the deepest stage that has a micro-batch and no result
    waiting for room (a stage holds at most one result that its full downstream channel cannot take
    yet), so no cycle of full channels between two workers can stall it.

    A worker whose parent died removes every segment of the pipeline (the parent cannot any more).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, leave)
    startup_rss = current_rss_bytes()
    hosted = _start(specs, ends, status, slots)
    if hosted is None:
        return
    status.send(("ready", os.getpid()))
    loop = _Loop(hosted, control, parent_pid, startup_rss)
    orphaned = False
    try:
        orphaned = loop.run()
    except StageFailure as e:
        report(status, str(e))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        # a neighbour or the caller went away: the caller cleans up after the first, nobody after the second
        orphaned = parent_gone(parent_pid, within=WATCH_S)
    except Leave:
        # the caller's close, or a kill of the whole process group (then the caller is dying too)
        orphaned = parent_gone(parent_pid, within=SIGNAL_WAIT_S)
    except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        busy = loop.current
        label = busy.runner.spec.label if busy is not None else ", ".join(s.label for s in specs)
        seq = busy.busy if busy is not None else None
        report(status, f"{label}: internal error on micro-batch {seq}: {detail}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for h in hosted:
            h.close()
        if orphaned:
            unlink_prefix(pipeline_prefix)


def _start(
    specs: tuple[WorkerSpec, ...], ends: tuple[StageEnds, ...], status: Connection, slots: int
) -> list[Hosted] | None:
    """The worker pinned to its stages' CPUs and their sessions open; None (the failure reported) when
    it cannot be, or when it was told to leave while opening them."""
    cpus = tuple(sorted({c for spec in specs for c in spec.placement.cpus}))
    try:
        pin_thread(cpus)
    except OSError as e:  # CPUs outside this process's allowed set (a changed cpuset)
        label = ", ".join(spec.label for spec in specs)
        whole = replace(specs[0], label=label, placement=replace(specs[0].placement, cpus=cpus))
        report(status, pin_failure(whole, e))
        return None
    hosted: list[Hosted] = []
    try:
        for spec, channels in zip(specs, ends, strict=True):
            hosted.append(Hosted(StageRunner(spec), channels, slots))
    except StageFailure as e:
        report(status, str(e))
        return None
    except Leave:
        return None
    return hosted


class _Loop:
    """A worker's loop over its hosted stages: work while any stage can, wait on what could let one
    work again, and answer the caller's control messages (stats, reset, stop) between micro-batches."""

    def __init__(
        self, hosted: list[Hosted], control: Connection, parent_pid: int, startup_rss: int | None
    ) -> None:
        self.hosted = hosted
        self.deepest_first = hosted[::-1]
        self.control = control
        self.parent_pid = parent_pid
        self.startup_rss = startup_rss
        self.asked = Poller(control)  # a persistent poll: Connection.poll() builds a selector per call
        self.waits: dict[tuple[bool, ...], Poller] = {}
        """What to wait on, by which stages hold a result: their room, else their input (and control)."""
        self.current: Hosted | None = None
        """The stage at work (what a failure names)."""

    def run(self) -> bool:
        """Work until told to stop (False) or the parent is gone (True: the worker is orphaned)."""
        while True:
            # the caller's stats, reset and stop come first, also while every pass finds work
            if self.asked.any() and not self._control_says_go():
                return False
            worked = self._one_pass()
            if worked is None:
                return False
            if worked:
                continue
            ready = self._poller().ready(WATCH_S)
            if not ready:
                if os.getppid() != self.parent_pid:
                    return True
                continue
            if self.control in ready and not self._control_says_go():
                return False

    def _one_pass(self) -> bool | None:
        """Send held results and run the deepest stage with work; whether any work was done, None when
        a channel closed (the caller's close)."""
        worked = False
        for h in self.deepest_first:
            if h.held is not None:
                self.current = h
                worked = h.send_held() or worked
            if h.held is None and h.reader.pending():
                self.current = h
                if h.run_next() is None:
                    return None
                self.current = None
                return True
        self.current = None
        return worked

    def _poller(self) -> Poller:
        key = tuple(h.held is not None for h in self.hosted)
        poller = self.waits.get(key)
        if poller is None:
            objects = [
                h.writer.free if held else h.reader.data for h, held in zip(self.hosted, key, strict=True)
            ]
            poller = self.waits[key] = Poller(*objects, self.control)
        return poller

    def _control_says_go(self) -> bool:
        message = self.control.recv()
        if isinstance(message, tuple) and message[0] == STATS:
            self.control.send((message[1], hosted_stats([h.runner for h in self.hosted], self.startup_rss)))
        elif message == RESET:
            for h in self.hosted:
                h.runner.recorder.reset()
        return bool(message != STOP)


def hosted_stats(runners: Sequence[StageRunner], startup_rss: int | None) -> list[WorkerStats]:
    """One entry per stage a worker hosts; ``hosted_with`` names them all when there are several, whose
    memory, read once, is then the worker's: the same figures for each."""
    together = tuple(r.spec.index for r in runners) if len(runners) > 1 else ()
    memory = memory_snapshot()
    return [
        r.stats(pid=os.getpid(), startup_rss=startup_rss, hosted_with=together, memory=memory)
        for r in runners
    ]


class Leave(BaseException):
    """Raised by the SIGTERM/SIGHUP handler so that a worker unlinks its segments on the way out."""


def leave(signum: int, frame: object) -> None:
    raise Leave(signum)


def parent_gone(parent_pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while os.getppid() == parent_pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def report(status: Connection, text: str) -> None:
    with contextlib.suppress(OSError):
        status.send(("failed", text))
