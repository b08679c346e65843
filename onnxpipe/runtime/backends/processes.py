"""Workers as processes (``spawn``, never importing the caller's ``__main__``), tensors through shared
memory, bounded channels between them.

Each worker process holds one onnxruntime session.  Channel ``c`` of a lane joins worker ``c-1`` to
worker ``c`` (channel 0 starts at the caller, the last one ends there), each with a few shared-memory
slots (:mod:`onnxpipe.runtime.backends.shm`).  Besides its two channels a worker has a control pipe (stats,
reset, stop) and a status pipe (ready, failed).

Nothing is left behind: workers are daemonic; a worker ignores Ctrl-C (the caller decides) and leaves
when its parent is gone or a pipe closes; on failure, Ctrl-C or close every worker is stopped, then
terminated, then killed, and joined; every shared-memory segment carries the pipeline's name prefix and
is unlinked at close even when its creator was killed.

Workers are started as ``spawn`` starts them, except that they never import the caller's ``__main__``
(:data:`WORKERS`).  multiprocessing's ``spawn`` (and ``forkserver``) make each child run the parent's main
script again (as ``__mp_main__``) before it unpickles its target, so that functions defined there can be
found.  A worker of ours needs nothing from it (its target and arguments live in onnxpipe), and running it
again breaks the ways people run examples: a script without ``if __name__ == "__main__":`` starts the
pipeline again in every child (multiprocessing's bootstrapping ``RuntimeError``, then an ``EOFError`` in
the parent), and ``python -`` gives the child a main file named ``<stdin>`` that does not exist.  So our
children are launched exactly as ``spawn`` launches them, with the two keys that name the main module left
out of the preparation data they read first (:func:`multiprocessing.spawn.prepare` then leaves
``__main__`` alone).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import signal
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import context, popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.backends.process_worker import RESET, STATS, STOP, WATCH_S, StageEnds, worker_main
from onnxpipe.runtime.backends.shm import (
    MAX_SLOTS,
    Poller,
    SlotReader,
    SlotWriter,
    unlink_prefix,
)
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.options import DEFAULT_SLOTS
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.schedule.timeline import worker_groups

START_TIMEOUT_S = 600.0
STOP_GRACE_S = 2.0
STATS_TIMEOUT_S = 60.0
_REAP_GRACE_S = 2.0  # how long a closed channel waits for the death of the worker that closed it


@dataclass
class _Worker:
    specs: tuple[WorkerSpec, ...]
    """The stages the process hosts, in stage order (one, or an interleaved split's worker's)."""
    process: BaseProcess
    control: Connection
    status: Connection
    pid: int = 0

    @property
    def label(self) -> str:
        return ", ".join(spec.label for spec in self.specs)


@dataclass
class _Lane:
    specs: tuple[WorkerSpec, ...]
    workers: list[_Worker]
    writer: SlotWriter
    reader: SlotReader


class ProcessBackend(Lanes):
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
        super().__init__(lanes, slots, workers)
        if not 1 <= slots <= MAX_SLOTS:
            raise UsageError(f"slots {slots}: a link between two worker processes has 1 to {MAX_SLOTS}")
        self.prefix = f"onnxpipe-{os.getpid()}-{secrets.token_hex(4)}"
        self._lanes: list[_Lane] = []
        self._workers: list[_Worker] = []  # in lane order, each recorded before it starts: close() finds it
        self._control_lock = threading.Lock()
        self._last_request = 0
        # wake() sends a byte that wait() sees; a closed socket refuses both (never a reused descriptor)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._wake_fd = self._wake_read.fileno()
        self._finalizer = weakref.finalize(self, unlink_prefix, self.prefix)
        try:
            for li, lane in enumerate(lanes):
                self._start_lane(li, lane, worker_groups(range(len(lane)) if workers is None else workers))
            self._await_ready(start_timeout)
            health: list[Connection | int] = [
                x for w in self._workers for x in (w.status, w.process.sentinel)
            ]
            channels = [x for lane in self._lanes for x in (lane.reader.data, lane.writer.free)]
            self._health = Poller(*health)
            self._events = Poller(self._wake_fd, *channels, *health)
        except BaseException:
            self.close(graceful=False)
            raise

    # ---------------------------------------------------------------------------------- start-up

    def _start_lane(self, li: int, lane: Sequence[WorkerSpec], hosts: Sequence[Sequence[int]]) -> None:
        """Start lane ``li``'s worker processes (``hosts``: the positions of the stages each one hosts)
        and its channels (channel ``c`` into stage ``c``), recording each part before it can fail."""
        k, ctx = len(lane), WORKERS
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
        while waiting := [w for w in self._workers if not w.pid]:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(w.label for w in waiting)
                raise RuntimeStageError(f"{names}: did not start within {timeout:.0f} s")
            wait([x for w in waiting for x in (w.status, w.process.sentinel)], timeout=min(left, WATCH_S))
            for w in waiting:  # what any worker reported comes before a death (as in _check_workers)
                if w.status.poll():
                    message = w.status.recv()
                    if message[0] != "ready":
                        raise RuntimeStageError(str(message[1]))
                    w.pid = int(message[1])
            for w in waiting:
                if not w.pid and w.process.exitcode is not None:
                    raise RuntimeStageError(_exit_text(w))

    # ------------------------------------------------------------------------------------ running

    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        lane = self._lanes[li]
        first = lane.specs[0]
        try:
            if not lane.writer.has_room():
                return False
            lane.writer.send(seq, {name: feeds[name] for name in first.receives})
        except (OSError, EOFError) as e:
            self._check_workers(grace=_REAP_GRACE_S)
            raise RuntimeStageError(f"{first.label}: cannot be reached ({e})") from e
        return True

    def poll(self) -> list[tuple[int, Tensors]]:
        self._check_open()
        done: list[tuple[int, Tensors]] = []
        try:
            for lane in self._lanes:
                lane.writer.collect_freed()
                while lane.reader.pending():
                    message = lane.reader.recv()
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
        if self._wake_fd in self._events.ready(timeout):
            with contextlib.suppress(OSError):  # BlockingIOError once empty, or closed meanwhile
                while self._wake_read.recv(4096):
                    pass

    def wake(self) -> None:
        """Make the driver's :meth:`wait` return now (it would otherwise sleep up to its timeout, e.g. in a
        close); a wake-up before the wait counts too.  Never blocks: a full socket has one pending anyway."""
        with contextlib.suppress(OSError):  # full, or closed: nobody waits any more
            self._wake_write.send(b"w")

    def _check_workers(self, grace: float = 0.0) -> None:
        """Raise the first failure a worker reported, else the first worker that died.

        A killed process's pipes (its sentinel too) close a moment before it can be reaped: the kernel
        closes its files, then marks it exited.  So a caller that saw a channel close passes a ``grace``,
        the time to wait for the death to show before it reports the bare closed channel."""
        deadline = time.monotonic() + grace
        while True:
            for w in self._workers:
                if w.status.poll():
                    try:
                        message = w.status.recv()
                    except (EOFError, OSError):
                        continue
                    self._failure = RuntimeStageError(str(message[1]))
                    raise self._failure
            # a neighbour of a killed worker leaves quietly (code 0) when its channel closes: blame the kill
            dead = [w for w in self._workers if w.process.exitcode is not None]
            if dead:
                first = min(dead, key=lambda w: w.process.exitcode == 0)
                self._failure = RuntimeStageError(_exit_text(first))
                raise self._failure
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        """Each stage's statistics, in lane and stage order.  Requests carry an id and a reply to another
        (one that timed out) is dropped; the lock keeps two callers from taking each other's replies."""
        self._check_open()
        with self._control_lock:
            self._last_request += 1
            request = self._last_request
            for w in self._workers:
                w.control.send((STATS, request))
            replies = {id(w): self._stats_reply(w, request) for w in self._workers}
        ordered: list[WorkerStats] = []
        for lane in self._lanes:  # a lane's processes may interleave its stages: put them back in order
            of_lane = {st.index: st for w in lane.workers for st in replies[id(w)]}
            ordered += [of_lane[spec.index] for spec in lane.specs]
        return ordered

    def _stats_reply(self, w: _Worker, request: int) -> list[WorkerStats]:
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while True:
            while not w.control.poll(WATCH_S):
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
                w.control.send(RESET)

    def worker_pids(self) -> list[int]:
        """The pid of each stage's process, in lane and stage order (stages hosted together repeat it)."""
        return [w.pid for lane in self._lanes for spec in lane.specs for w in lane.workers if spec in w.specs]

    # ---------------------------------------------------------------------------------- closing

    def close(self, graceful: bool = True) -> None:
        """Stop every worker (asking first when ``graceful``), join them, unlink every segment."""
        if self._closed:
            return
        self._closed = True
        started = [w.process for w in self._workers if w.process.pid is not None]
        if graceful:
            for w in self._workers:
                with contextlib.suppress(OSError):
                    w.control.send(STOP)
            deadline = time.monotonic() + STOP_GRACE_S
            for process in started:
                process.join(max(0.0, deadline - time.monotonic()))
        for process in started:
            if process.exitcode is None:
                process.terminate()
        for process in started:
            process.join(STOP_GRACE_S)
            if process.exitcode is None:
                process.kill()
                process.join()
        for lane in self._lanes:
            lane.writer.close()
            lane.reader.close()
        for w in self._workers:
            w.control.close()
            w.status.close()
        self._wake_read.close()
        self._wake_write.close()
        unlink_prefix(self.prefix)
        self._finalizer.detach()


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


MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
"""The preparation data's keys that make a spawned child import the parent's main module."""


def preparation_data(name: str) -> dict[str, Any]:
    """What ``spawn`` sends a child before its process object (paths, working folder, authkey, ...), less
    the caller's main module."""
    data: dict[str, Any] = spawn.get_preparation_data(name)
    for key in MAIN_KEYS:
        data.pop(key, None)
    return data


class _WorkerPopen(popen_spawn_posix.Popen):
    """:meth:`_launch` is the standard library's ``popen_spawn_posix.Popen._launch`` (the same in Python
    3.11 to 3.13) with one change, the preparation data less the caller's main module; it is copied, not
    wrapped, because the preparation data is made and written inside it."""

    def _launch(self, process_obj: Any) -> None:
        fds: list[int] = self._fds  # type: ignore[attr-defined]  # set by Popen; typeshed omits it
        tracker_fd = resource_tracker.getfd()
        assert tracker_fd is not None  # getfd() starts the tracker first
        fds.append(tracker_fd)
        prep_data = preparation_data(process_obj._name)
        fp = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            fds.extend([child_r, child_w])
            self.pid = util.spawnv_passfds(os.fsencode(spawn.get_executable()), cmd, fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            mine = tuple(fd for fd in (parent_r, parent_w) if fd is not None)
            self.finalizer = util.Finalize(self, util.close_fds, mine)  # type: ignore[attr-defined]  # typeshed omits it
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)


class WorkerProcess(context.SpawnProcess):
    """A ``spawn`` process that does not run the caller's main module again (see the module docstring)."""

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _WorkerPopen:
        return _WorkerPopen(process_obj)


class WorkerContext(context.SpawnContext):
    """The context of :class:`WorkerProcess`: its ``Process``, and the rest (``Pipe``, ...) as ``spawn``'s."""

    Process = WorkerProcess


WORKERS = WorkerContext()
"""The context worker processes are started from."""
