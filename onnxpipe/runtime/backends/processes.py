"""Workers as processes (``spawn``), tensors through shared memory, bounded channels between them.

Each worker process holds one onnxruntime session.  Channel ``c`` of a lane joins worker ``c-1`` to
worker ``c`` (channel 0 starts at the caller, the last one ends there), each with a few shared-memory
slots (:mod:`onnxpipe.runtime.shm`).  Besides its two channels a worker has a control pipe (stats,
reset, stop) and a status pipe (ready, failed).

Nothing is left behind: workers are daemonic; a worker ignores Ctrl-C (the caller decides) and leaves
when its parent is gone or a pipe closes; on failure, Ctrl-C or close every worker is stopped, then
terminated, then killed, and joined; every shared-memory segment carries the pipeline's name prefix and
is unlinked at close even when its creator was killed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import secrets
import signal
import threading
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.backends.shm import (
    MAX_SLOTS,
    ItemMessage,
    Poller,
    SlotReader,
    SlotWriter,
    unlink_prefix,
)
from onnxpipe.runtime.base import DEFAULT_SLOTS, Tensors
from onnxpipe.runtime.session import (
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
    pin_failure,
)
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.schedule.timeline import worker_groups

START_TIMEOUT_S = 600.0
STOP_GRACE_S = 2.0
STATS_TIMEOUT_S = 60.0
_WATCH_S = 1.0  # how often a waiting worker checks that its parent is alive
_REAP_GRACE_S = 2.0  # how long a closed channel waits for the death of the worker that closed it
_SIGNAL_WAIT_S = 0.25  # how long a signalled worker waits to see whether its parent is dying too

_STOP = "stop"
_STATS = "stats"  # sent as (_STATS, request id); the reply is (request id, WorkerStats)
_RESET = "reset"


# --------------------------------------------------------------------------------------------------
# the worker process


@dataclass(frozen=True)
class StageEnds:
    """The channel ends of one stage hosted by a worker process: where its micro-batches come in, where
    its results go, and the name prefix of the segments it writes."""

    in_data: Connection
    in_free: Connection
    out_data: Connection
    out_free: Connection
    prefix: str


class _Hosted:
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
        signal.signal(ending, _leave)
    startup_rss = current_rss_bytes()
    cpus = tuple(sorted({c for spec in specs for c in spec.placement.cpus}))
    try:
        pin_thread(cpus)
    except OSError as e:  # CPUs outside this process's allowed set (a changed cpuset)
        label = ", ".join(spec.label for spec in specs)
        whole = replace(specs[0], label=label, placement=replace(specs[0].placement, cpus=cpus))
        status.send(("failed", None, pin_failure(whole, e)))
        return
    hosted: list[_Hosted] = []
    try:
        for spec, channels in zip(specs, ends, strict=True):
            hosted.append(_Hosted(StageRunner(spec), channels, slots))
    except StageFailure as e:
        status.send(("failed", None, str(e)))
        return
    except _Leave:
        return
    status.send(("ready", os.getpid(), startup_rss))
    deepest_first = hosted[::-1]
    together = tuple(spec.index for spec in specs) if len(specs) > 1 else ()
    pid = os.getpid()
    # what to wait on, by which stages hold a result: their room, else their input (and the control pipe)
    waits: dict[tuple[bool, ...], Poller] = {}
    asked = Poller(control)  # a persistent poll: Connection.poll() builds a selector per call
    current: _Hosted | None = None
    orphaned = False

    def control_says_go() -> bool:
        message = control.recv()
        if isinstance(message, tuple) and message[0] == _STATS:
            control.send(
                (
                    message[1],
                    [h.runner.stats(pid=pid, startup_rss=startup_rss, hosted_with=together) for h in hosted],
                )
            )
        elif message == _RESET:
            for h in hosted:
                h.runner.recorder.reset()
        return bool(message != _STOP)

    try:
        while True:
            # the caller's stats, reset and stop come first, also while every pass finds work
            if asked.any() and not control_says_go():
                return
            worked = False
            for h in deepest_first:
                if h.held is not None:
                    current = h
                    worked = h.send_held() or worked
                if h.held is None and h.reader.pending():
                    current = h
                    if h.run_next() is None:
                        return
                    worked = True
                    break
            current = None
            if worked:
                continue
            key = tuple(h.held is not None for h in hosted)
            poller = waits.get(key)
            if poller is None:
                objects = [
                    h.writer.free if held else h.reader.data for h, held in zip(hosted, key, strict=True)
                ]
                poller = waits[key] = Poller(*objects, control)
            ready = poller.ready(_WATCH_S)
            if not ready:
                if os.getppid() != parent_pid:
                    orphaned = True
                    return
                continue
            if control in ready and not control_says_go():
                return
    except StageFailure as e:
        _report(status, _seq(current), str(e))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        # a neighbour or the caller went away: the caller cleans up after the first, nobody after the second
        orphaned = _parent_gone(parent_pid, within=_WATCH_S)
    except _Leave:
        # the caller's close, or a kill of the whole process group (then the caller is dying too)
        orphaned = _parent_gone(parent_pid, within=_SIGNAL_WAIT_S)
    except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        label = current.runner.spec.label if current is not None else ", ".join(s.label for s in specs)
        _report(status, _seq(current), f"{label}: internal error on micro-batch {_seq(current)}: {detail}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for h in hosted:
            h.close()
        if orphaned:
            unlink_prefix(pipeline_prefix)


def _seq(hosted: _Hosted | None) -> int | None:
    """The micro-batch ``hosted`` was busy with (None: no stage was)."""
    return hosted.busy if hosted is not None else None


class _Leave(BaseException):
    """Raised by the SIGTERM/SIGHUP handler so that a worker unlinks its segments on the way out."""


def _leave(signum: int, frame: object) -> None:
    raise _Leave(signum)


def _parent_gone(parent_pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while os.getppid() == parent_pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _report(status: Connection, seq: int | None, text: str) -> None:
    with contextlib.suppress(OSError):
        status.send(("failed", seq, text))


# --------------------------------------------------------------------------------------------------
# the caller's side


@dataclass
class _Worker:
    specs: tuple[WorkerSpec, ...]
    """The stages the process hosts, in stage order (one, or an interleaved split's worker's)."""
    process: BaseProcess
    control: Connection
    status: Connection
    pid: int = 0
    startup_rss: int | None = None

    @property
    def label(self) -> str:
        return ", ".join(spec.label for spec in self.specs)


@dataclass
class _Lane:
    specs: tuple[WorkerSpec, ...]
    workers: list[_Worker]
    writer: SlotWriter
    reader: SlotReader


class ProcessBackend:
    """Lanes of worker processes joined by shared-memory channels; see the module docstring."""

    kind = "processes"

    def __init__(
        self,
        lanes: Sequence[Sequence[WorkerSpec]],
        *,
        slots: int = DEFAULT_SLOTS,
        start_timeout: float = START_TIMEOUT_S,
        workers: Sequence[int] | None = None,
    ) -> None:
        """``workers``: the worker of each stage of a single lane (an interleaved split's
        ``manifest.worker_of``); the stages of one worker share its process.  None: a process per stage."""
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
        if workers is not None and (len(lanes) != 1 or len(workers) != len(lanes[0])):
            raise ValueError("workers gives the worker of each stage of one lane")
        if not 1 <= slots <= MAX_SLOTS:
            raise UsageError(f"slots {slots}: a link between two worker processes has 1 to {MAX_SLOTS}")
        ctx = mp.get_context("spawn")
        self.prefix = f"onnxpipe-{os.getpid()}-{secrets.token_hex(4)}"
        self._slots = slots
        self._lanes: list[_Lane] = []
        self._workers: list[_Worker] = []  # in lane order, each recorded before it starts: close() finds it
        self._next_lane = 0
        self._closed = False
        self._failure: RuntimeStageError | None = None
        self._control_lock = threading.Lock()
        self._last_request = 0
        self._wake_lock = threading.Lock()
        self._wake_read, self._wake_write = os.pipe()  # wake() writes a byte that wait() sees
        self._close_wake_pipe = weakref.finalize(self, _close_fds, self._wake_read, self._wake_write)
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._finalizer = weakref.finalize(self, unlink_prefix, self.prefix)
        try:
            for li, lane in enumerate(lanes):
                self._start_lane(
                    ctx, li, lane, worker_groups(range(len(lane)) if workers is None else workers)
                )
            self._await_ready(start_timeout)
            everything: list[Connection | int] = [self._wake_read]
            health: list[Connection | int] = []
            for started in self._lanes:
                everything += [started.reader.data, started.writer.free]
                for w in started.workers:
                    health += [w.status, w.process.sentinel]
            self._health = Poller(*health)
            self._events = Poller(*everything, *health)
        except BaseException:
            self.close(graceful=False)
            raise

    # ---------------------------------------------------------------------------------- start-up

    def _start_lane(
        self, ctx: SpawnContext, li: int, lane: Sequence[WorkerSpec], hosts: Sequence[Sequence[int]]
    ) -> None:
        """Start lane ``li``'s worker processes (``hosts``: the positions of the stages each one hosts)
        and its channels (channel ``c`` into stage ``c``), recording each part before it can fail."""
        k = len(lane)
        data = [ctx.Pipe(duplex=False) for _ in range(k + 1)]  # (reader, writer)
        free = [ctx.Pipe(duplex=False) for _ in range(k + 1)]  # (reader at the writer, writer)
        writer = SlotWriter(f"{self.prefix}-l{li}c0", self._slots, data[0][1], free[0][0])
        reader = SlotReader(data[k][0], free[k][1])
        started = _Lane(tuple(lane), [], writer, reader)
        self._lanes.append(started)
        try:
            for positions in hosts:
                specs = tuple(lane[i] for i in positions)
                ends = tuple(
                    StageEnds(
                        data[i][0], free[i][1], data[i + 1][1], free[i + 1][0], f"{self.prefix}-l{li}c{i + 1}"
                    )
                    for i in positions
                )
                control, control_child = ctx.Pipe()
                status, status_child = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=worker_main,
                    name=f"onnxpipe {', '.join(spec.label for spec in specs)}",
                    args=(specs, ends, control_child, status_child, self._slots, os.getpid(), self.prefix),
                    daemon=True,
                )
                worker = _Worker(specs, process, control, status)
                started.workers.append(worker)
                self._workers.append(worker)
                try:
                    process.start()
                finally:
                    control_child.close()
                    status_child.close()
        finally:
            # keep only the caller's ends here, so that a dead process closes its pipes for good
            mine = {id(data[0][1]), id(free[0][0]), id(data[k][0]), id(free[k][1])}
            for pair in (*data, *free):
                for end in pair:
                    if id(end) not in mine:
                        end.close()

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = {id(w.status): w for w in self._workers}
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(w.label for w in waiting.values())
                raise RuntimeStageError(f"{names}: did not start within {timeout:.0f} s")
            objects: list[Any] = [w.status for w in waiting.values()]
            objects += [w.process.sentinel for w in waiting.values()]
            wait(objects, timeout=min(left, _WATCH_S))
            for key, w in list(waiting.items()):
                if w.status.poll():
                    message = w.status.recv()
                    if message[0] == "ready":
                        w.pid, w.startup_rss = int(message[1]), message[2]
                        del waiting[key]
                    else:
                        raise RuntimeStageError(str(message[2]))
                elif w.process.exitcode is not None:
                    raise RuntimeStageError(_exit_text(w))

    # ------------------------------------------------------------------------------------ running

    @property
    def capacity(self) -> int:
        return sum(self._slots * (len(lane.specs) + 1) for lane in self._lanes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        self._check_open()
        n = len(self._lanes)
        for step in range(n):
            li = (self._next_lane + step) % n
            lane = self._lanes[li]
            first = lane.specs[0]
            try:
                if not lane.writer.has_room():
                    continue
                lane.writer.send(seq, {name: feeds[name] for name in first.receives})
            except (OSError, EOFError) as e:
                self._check_workers(grace=_REAP_GRACE_S)
                raise RuntimeStageError(f"{first.label}: cannot be reached ({e})") from e
            self._next_lane = (li + 1) % n
            return True
        return False

    def poll(self) -> list[tuple[int, Tensors]]:
        self._check_open()
        done: list[tuple[int, Tensors]] = []
        try:
            for lane in self._lanes:
                lane.writer.collect_freed()
                while lane.reader.pending():
                    message = lane.reader.recv()
                    if isinstance(message, ItemMessage):
                        done.append((message.seq, lane.reader.copies(message)))
                        lane.reader.release(message.slot)
        except (OSError, EOFError) as e:
            self._check_workers(grace=_REAP_GRACE_S)
            self._failure = RuntimeStageError(f"a worker's channel closed unexpectedly ({e!r})")
            raise self._failure from e
        if self._health.any():
            self._check_workers()
        return done

    def wait(self, timeout: float) -> None:
        if self._closed:
            return
        if self._wake_read in self._events.ready(timeout):
            with self._wake_lock, contextlib.suppress(OSError):  # OSError: closed meanwhile
                while os.read(self._wake_read, 4096):  # BlockingIOError (an OSError) once empty
                    pass

    def wake(self) -> None:
        """Make the driver's :meth:`wait` return now (it would otherwise sleep up to its timeout, e.g. in a
        close); a wake-up before the wait counts too.  Never blocks: a full pipe has one pending anyway."""
        with self._wake_lock:
            if self._wake_write >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_write, b"w")

    def _check_open(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeStageError("the pipeline's workers were stopped; open the pipeline again")

    def _check_workers(self, grace: float = 0.0) -> None:
        """Raise the first failure a worker reported, else the first worker that died.

        A killed process's pipes (its sentinel too) close a moment before it can be reaped: the kernel
        closes its files, then marks it exited.  So a caller that saw a channel close passes a ``grace``,
        the time to wait for the death to show before it reports the bare closed channel."""
        deadline = time.monotonic() + grace
        while True:
            self._raise_reported_or_dead()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    def _raise_reported_or_dead(self) -> None:
        for w in self._workers:
            if w.status.poll():
                try:
                    message = w.status.recv()
                except (EOFError, OSError):
                    continue
                self._failure = RuntimeStageError(str(message[2]))
                raise self._failure
        # a neighbour of a killed worker leaves quietly (code 0) when its channel closes: blame the kill
        dead = [w for w in self._workers if w.process.exitcode is not None]
        if dead:
            first = min(dead, key=lambda w: w.process.exitcode == 0)
            self._failure = RuntimeStageError(_exit_text(first))
            raise self._failure

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        """Each stage's statistics, in lane and stage order.  Requests carry an id and a reply to another
        (one that timed out) is dropped; the lock keeps two callers from taking each other's replies."""
        self._check_open()
        with self._control_lock:
            self._last_request += 1
            request = self._last_request
            for w in self._workers:
                w.control.send((_STATS, request))
            replies = {id(w): self._stats_reply(w, request) for w in self._workers}
        ordered: list[WorkerStats] = []
        for lane in self._lanes:  # a lane's processes may interleave its stages: put them back in order
            of_lane = {st.index: st for w in lane.workers for st in replies[id(w)]}
            ordered += [of_lane[spec.index] for spec in lane.specs]
        return ordered

    def _stats_reply(self, w: _Worker, request: int) -> list[WorkerStats]:
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while True:
            while not w.control.poll(_WATCH_S):
                if w.process.exitcode is not None:
                    raise RuntimeStageError(_exit_text(w))
                if time.monotonic() > deadline:
                    raise RuntimeStageError(f"{w.label}: gave no statistics in {STATS_TIMEOUT_S:.0f} s")
            answered, stats = w.control.recv()
            if answered == request:
                assert isinstance(stats, list) and all(isinstance(st, WorkerStats) for st in stats)
                return stats

    def reset_stats(self) -> None:
        self._check_open()
        with self._control_lock:
            for w in self._workers:
                w.control.send(_RESET)

    def worker_pids(self) -> list[int]:
        """The pid of each stage's process, in lane and stage order (stages hosted together repeat it)."""
        host = {
            (li, spec.index): w.pid
            for li, lane in enumerate(self._lanes)
            for w in lane.workers
            for spec in w.specs
        }
        return [host[li, spec.index] for li, lane in enumerate(self._lanes) for spec in lane.specs]

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True) -> None:
        """Stop every worker (asking first when ``graceful``), join them, unlink every segment."""
        if self._closed:
            return
        self._closed = True
        workers = self._workers
        if graceful:
            for w in workers:
                with contextlib.suppress(OSError):
                    w.control.send(_STOP)
            deadline = time.monotonic() + STOP_GRACE_S
            for w in workers:
                if w.process.pid is not None:
                    w.process.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.process.pid is not None and w.process.exitcode is None:
                w.process.terminate()
        for w in workers:
            if w.process.pid is None:
                continue
            w.process.join(STOP_GRACE_S)
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
        for lane in self._lanes:
            lane.writer.close()
            lane.reader.close()
            for conn in (lane.writer.data, lane.writer.free, lane.reader.data, lane.reader.free):
                conn.close()
        for w in workers:
            w.control.close()
            w.status.close()
        with self._wake_lock:  # wake() and wait() never touch a closed (or reused) descriptor
            self._close_wake_pipe()
            self._wake_read = self._wake_write = -1
        unlink_prefix(self.prefix)
        self._finalizer.detach()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _exit_text(w: _Worker) -> str:
    code = w.process.exitcode
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return f"{w.label}: worker process (pid {w.process.pid}) {how} without reporting an error"
