"""What runs inside one worker process of :class:`~onnxpipe.runtime.backends.processes.ProcessBackend`: its
stages' sessions, the loop that reads a micro-batch from shared memory, runs it and writes it on, and the
control messages (stats, reset, stop) it answers between micro-batches.  It leaves when its parent dies."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

from onnxpipe.runtime.affinity import pin_thread
from onnxpipe.runtime.backends.lanes import Host, Hosted
from onnxpipe.runtime.backends.shm import Poller, SlotReader, SlotWriter, unlink_prefix
from onnxpipe.runtime.session import (
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
    stage order, ``ends[i]`` the channels of ``specs[i]``), each with its own session, and takes turns
    of them (:class:`~.lanes.Host`): one process per worker pays for one interpreter and one onnxruntime
    instead of one per stage.

    A worker whose parent died removes every segment of the pipeline (the parent cannot any more).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for ending in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(ending, leave)
    startup_rss = current_rss_bytes()
    host = _start(specs, ends, status, slots)
    if host is None:
        return
    status.send(("ready", os.getpid()))
    orphaned = False
    try:
        orphaned = _serve(host, control, parent_pid, startup_rss)
    except StageFailure as e:
        report(status, str(e))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        # a neighbour or the caller went away: the caller cleans up after the first, nobody after the second
        orphaned = parent_gone(parent_pid, within=WATCH_S)
    except Leave:
        # the caller's close, or a kill of the whole process group (then the caller is dying too)
        orphaned = parent_gone(parent_pid, within=SIGNAL_WAIT_S)
    except BaseException as e:  # noqa: BLE001 - a bug here must reach the caller, not vanish
        report(status, host.internal_error(e))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for h in host.hosted:
            h.outbox.close()
            h.inbox.close()
        if orphaned:
            unlink_prefix(pipeline_prefix)


def _start(
    specs: tuple[WorkerSpec, ...], ends: tuple[StageEnds, ...], status: Connection, slots: int
) -> Host[SlotReader, SlotWriter] | None:
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
    hosted: list[Hosted[SlotReader, SlotWriter]] = []
    try:
        for spec, end in zip(specs, ends, strict=True):
            reader = SlotReader(end.in_data, end.in_free)
            writer = SlotWriter(end.prefix, slots, end.out_data, end.out_free)
            hosted.append(Hosted(StageRunner(spec), reader, writer))
    except StageFailure as e:
        report(status, str(e))
        return None
    except Leave:
        return None
    return Host(hosted)


def _serve(
    host: Host[SlotReader, SlotWriter], control: Connection, parent_pid: int, startup_rss: int | None
) -> bool:
    """A worker process's loop over its :class:`~.lanes.Host`: work while any stage can, wait on what
    could let one work again, and answer the caller's control messages (stats, reset, stop) between
    micro-batches.  Works until told to stop (False) or the parent is gone (True: the worker is
    orphaned)."""
    asked = Poller(control)  # a persistent poll: Connection.poll() builds a selector per call
    # what to wait on, by which stages hold a result: their room, else their input (and control)
    waits: dict[tuple[bool, ...], Poller] = {}
    while True:
        # the caller's stats, reset and stop come first, also while every pass finds work
        if asked.any() and not _control_says_go(host, control, startup_rss):
            return False
        if host.one_pass():
            continue
        key = tuple(h.held is not None for h in host.hosted)
        if key not in waits:
            objects = [
                h.outbox.free if held else h.inbox.data for h, held in zip(host.hosted, key, strict=True)
            ]
            waits[key] = Poller(*objects, control)
        ready = waits[key].ready(WATCH_S)
        if not ready:
            if os.getppid() != parent_pid:
                return True
            continue
        if control in ready and not _control_says_go(host, control, startup_rss):
            return False


def _control_says_go(
    host: Host[SlotReader, SlotWriter], control: Connection, startup_rss: int | None
) -> bool:
    message = control.recv()
    runners = [h.runner for h in host.hosted]
    if isinstance(message, tuple) and message[0] == STATS:
        control.send((message[1], hosted_stats(runners, startup_rss)))
    elif message == RESET:
        for r in runners:
            r.records.clear()
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
