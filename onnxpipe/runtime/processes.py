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
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from onnxpipe.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.session import (
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
    pin_failure,
)
from onnxpipe.runtime.shm import MAX_SLOTS, ItemMessage, Poller, SlotReader, SlotWriter, unlink_prefix
from onnxpipe.runtime.spec import WorkerSpec

DEFAULT_SLOTS = 2
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 2.0
STATS_TIMEOUT_S = 60.0
_WATCH_S = 1.0  # how often a waiting worker checks that its parent is alive
_SIGNAL_WAIT_S = 0.25  # how long a signalled worker waits to see whether its parent is dying too

_STOP = "stop"
_STATS = "stats"  # sent as (_STATS, request id); the reply is (request id, WorkerStats)
_RESET = "reset"


# --------------------------------------------------------------------------------------------------
# the worker process


def worker_main(
    spec: WorkerSpec,
    in_data: Connection,
    in_free: Connection,
    out_data: Connection,
    out_free: Connection,
    control: Connection,
    status: Connection,
    prefix: str,
    slots: int,
    parent_pid: int,
    pipeline_prefix: str,
) -> None:
    """Entry point of a worker process (module level, so that ``spawn`` can import it).

    A worker whose parent died removes every segment of the pipeline (the parent cannot any more).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, _leave)
    startup_rss = current_rss_bytes()
    try:
        pin_thread(spec.placement.cpus)
    except OSError as e:  # CPUs outside this process's allowed set (a changed cpuset)
        status.send(("failed", None, pin_failure(spec, e)))
        return
    try:
        runner = StageRunner(spec)
    except StageFailure as e:
        status.send(("failed", None, str(e)))
        return
    except _Leave:
        return
    status.send(("ready", os.getpid(), startup_rss))
    reader = SlotReader(in_data, in_free)
    writer = SlotWriter(prefix, slots, out_data, out_free)
    incoming = Poller(in_data, control)
    room = Poller(out_free, control)
    seq: int | None = None
    orphaned = False

    def control_says_go() -> bool:
        message = control.recv()
        if isinstance(message, tuple) and message[0] == _STATS:
            control.send((message[1], runner.stats(pid=os.getpid(), startup_rss=startup_rss)))
        elif message == _RESET:
            runner.recorder.reset()
        return bool(message != _STOP)

    try:
        while True:
            ready = incoming.ready(_WATCH_S)
            if not ready:
                if os.getppid() != parent_pid:
                    orphaned = True
                    return
                continue
            if control in ready and not control_says_go():
                return
            if in_data not in ready:
                continue
            message = reader.recv()
            if not isinstance(message, ItemMessage):
                return
            seq = message.seq
            received = time.perf_counter()
            views = reader.views(message)
            run_start = time.perf_counter()
            sends = runner.run(message.seq, views)
            run_end = time.perf_counter()
            while not writer.has_room():
                ready = room.ready(_WATCH_S)
                if control in ready and not control_says_go():
                    return
                if not ready and os.getppid() != parent_pid:
                    orphaned = True
                    return
            out_ready = time.perf_counter()
            writer.send(message.seq, sends)
            del views, sends
            reader.release(message.slot)
            runner.recorder.add(
                Record(message.seq, received, run_start, run_end, out_ready, time.perf_counter())
            )
            seq = None
    except StageFailure as e:
        _report(status, seq, str(e))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        # a neighbour or the caller went away: the caller cleans up after the first, nobody after the second
        orphaned = _parent_gone(parent_pid, within=_WATCH_S)
    except _Leave:
        # the caller's close, or a kill of the whole process group (then the caller is dying too)
        orphaned = _parent_gone(parent_pid, within=_SIGNAL_WAIT_S)
    except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        _report(status, seq, f"{spec.label}: internal error on micro-batch {seq}: {detail}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        writer.close()
        reader.close()
        if orphaned:
            unlink_prefix(pipeline_prefix)


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
    spec: WorkerSpec
    process: BaseProcess
    control: Connection
    status: Connection
    pid: int = 0
    startup_rss: int | None = None


@dataclass
class _Lane:
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
    ) -> None:
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
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
                self._start_lane(ctx, li, lane)
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

    def _start_lane(self, ctx: SpawnContext, li: int, lane: Sequence[WorkerSpec]) -> None:
        """Start lane ``li``'s workers and its channels, recording each part before it can fail."""
        k = len(lane)
        data = [ctx.Pipe(duplex=False) for _ in range(k + 1)]  # (reader, writer)
        free = [ctx.Pipe(duplex=False) for _ in range(k + 1)]  # (reader at the writer, writer)
        writer = SlotWriter(f"{self.prefix}-l{li}c0", self._slots, data[0][1], free[0][0])
        reader = SlotReader(data[k][0], free[k][1])
        started = _Lane([], writer, reader)
        self._lanes.append(started)
        try:
            for i, spec in enumerate(lane):
                control, control_child = ctx.Pipe()
                status, status_child = ctx.Pipe(duplex=False)
                process = ctx.Process(
                    target=worker_main,
                    name=f"onnxpipe {spec.label}",
                    args=(
                        spec,
                        data[i][0],
                        free[i][1],
                        data[i + 1][1],
                        free[i + 1][0],
                        control_child,
                        status_child,
                        f"{self.prefix}-l{li}c{i + 1}",
                        self._slots,
                        os.getpid(),
                        self.prefix,
                    ),
                    daemon=True,
                )
                worker = _Worker(spec, process, control, status)
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
                names = ", ".join(w.spec.label for w in waiting.values())
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
        return sum(self._slots * (len(lane.workers) + 1) for lane in self._lanes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        self._check_open()
        n = len(self._lanes)
        for step in range(n):
            li = (self._next_lane + step) % n
            lane = self._lanes[li]
            first = lane.workers[0].spec
            try:
                if not lane.writer.has_room():
                    continue
                lane.writer.send(seq, {name: feeds[name] for name in first.receives})
            except (OSError, EOFError) as e:
                self._check_workers()
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
            self._check_workers()
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

    def _check_workers(self) -> None:
        """Raise the first failure a worker reported, else the first worker that died."""
        for w in self._workers:
            if w.status.poll():
                try:
                    message = w.status.recv()
                except (EOFError, OSError):
                    continue
                self._failure = RuntimeStageError(str(message[2]))
                raise self._failure
        for w in self._workers:
            if w.process.exitcode is not None:
                self._failure = RuntimeStageError(_exit_text(w))
                raise self._failure

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        """Each worker's statistics.  Requests carry an id and a reply to another (one that timed out) is
        dropped; the lock keeps two callers from taking each other's replies."""
        self._check_open()
        with self._control_lock:
            self._last_request += 1
            request = self._last_request
            for w in self._workers:
                w.control.send((_STATS, request))
            return [self._stats_reply(w, request) for w in self._workers]

    def _stats_reply(self, w: _Worker, request: int) -> WorkerStats:
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while True:
            while not w.control.poll(_WATCH_S):
                if w.process.exitcode is not None:
                    raise RuntimeStageError(_exit_text(w))
                if time.monotonic() > deadline:
                    raise RuntimeStageError(f"{w.spec.label}: gave no statistics in {STATS_TIMEOUT_S:.0f} s")
            answered, stats = w.control.recv()
            if answered == request:
                assert isinstance(stats, WorkerStats)
                return stats

    def reset_stats(self) -> None:
        self._check_open()
        with self._control_lock:
            for w in self._workers:
                w.control.send(_RESET)

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

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
    return f"{w.spec.label}: worker process (pid {w.process.pid}) {how} without reporting an error"
