"""The body of a worker's Ray actor: the stages it hosts, opened once their files are on its node.

An actor starts empty.  The driver asks where it landed (:meth:`WorkerActor.node`), ships it what its
node lacks (:meth:`WorkerActor.missing`, :meth:`WorkerActor.write`, :meth:`WorkerActor.seal`; see
:mod:`~onnxpipe.runtime.backends.stage_cache`) or leaves it to read a shared folder, and then opens its
stages (:meth:`WorkerActor.open`).  Ray restarts an actor whose node was lost on another node, empty
again, and the driver sets it up again (files, stages, the data plane) before it sends it anything.

Micro-batches do not come as calls: once its stages are open, the driver opens the actor's end of the
data plane (:mod:`~onnxpipe.runtime.backends.ray_plane`; :meth:`WorkerActor.plane_open`,
:meth:`WorkerActor.plane_route`), and frames flow from actor to actor: in from the stage before it (or
the driver), each run by its stage, its outputs out to the stage after it (or the driver), with no call
from the driver per micro-batch.  The driver calls :meth:`WorkerActor.watch`, which waits for a
connection of the plane to break (a peer's process or node died), in a concurrency group of its own
(:data:`WATCH_GROUP`), so that it does not hold up the actor's other calls, which run one at a time in
the order they were made (the chunks of a shipped file among them).

The driver sets the plane up per *epoch*: every actor opens a fresh endpoint with the routes of its
stages (where each one's outputs go).  After a lost actor was started again the driver opens a new epoch
on every actor: frames of an older epoch still on their way are dropped where they arrive, so a
micro-batch sent again is delivered once.

A frame is run by the thread that read it off its connection, and its outputs written by that thread
(:class:`~onnxpipe.runtime.backends.ray_plane.Endpoint`'s ``send``), one frame at a time (an actor's
stages share its interpreter and its cores, as a Ray call at a time did).  Why not a queue to a serving
thread: each handover between threads cost a hop a thread switch, which on a node's busy core waited
for the scheduler (milliseconds a hop of a generation step, measured on namespaced hosts with a core
each).  A stage's failure does not stop the actor serving: a :class:`Failed` goes to the driver, which
fails the run (or, for a generation step whose cache is gone, that step).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.core.options import opt
from onnxpipe.runtime.backends.process_worker import hosted_stats
from onnxpipe.runtime.backends.ray_plane import Address, Endpoint, Frame, PlaneError
from onnxpipe.runtime.backends.stage_cache import ShipFailure, ShippedFile, StageCache
from onnxpipe.runtime.session import (
    CacheMissing,
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
)
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import LegValues, NodePlace, node_here

ROUTE_TIMEOUT_S = 60.0
"""How long a frame that came before its actor learned the routes waits for them (the driver routes
every actor before it sends anything: in practice, not at all)."""
CLOSE_WAIT_S = 30.0
"""How long closing waits for the frame running to finish (a hung stage must not hold the recovery)."""
TO_DRIVER = -1
"""The stage a note names when its tensors are the outputs, for the driver."""
WATCH_GROUP = "watch"
"""The concurrency group of :meth:`WorkerActor.watch` calls: each epoch's waits beside the calls in
flight."""


class Note(NamedTuple):
    """What travels with a micro-batch's tensors: its epoch and number, the stage they are for, when the
    sender handed them over (wall clock), and the legs of the stages it went through.  A tuple: made
    and read on every hop, it costs a hop less than a dataclass does."""

    epoch: int
    seq: int
    stage: int
    sent: float
    legs: tuple[LegValues, ...] = ()
    """Each one a :class:`~onnxpipe.runtime.trips.Leg`'s fields in order: see :meth:`wire`."""

    def wire(self) -> tuple[int, int, int, float, tuple[LegValues, ...]]:
        """The note as a frame carries it: a plain tuple, not this class (nor its legs as
        :class:`~onnxpipe.runtime.trips.Leg`).  Why: a frame's meta is pickled and unpickled on every
        hop, and a class is pickled by name: a dataclass's pickling (its class, its fields as a dict)
        cost a generation step's hop 0.13-0.15 ms on namespaced hosts (the two sides together, run cold
        after a stage's session), a plain tuple's 0.05-0.06 ms."""
        return (self.epoch, self.seq, self.stage, self.sent, self.legs)

    @classmethod
    def read(cls, meta: Any) -> Note | None:
        """The note a frame's meta is (:meth:`wire`), or None for another message."""
        return cls(*meta) if isinstance(meta, tuple) and len(meta) == 5 else None


class FailureKind(Enum):
    STAGE = "stage"
    """The stage raised: the run fails with its text."""
    CACHE_GONE = "cache_gone"
    """A generation step reached an actor holding no cache of its sequences (started again)."""


@dataclass(frozen=True)
class Failed:
    """A micro-batch that did not come through a stage, sent to the driver in place of its outputs."""

    epoch: int
    seq: int
    kind: FailureKind
    text: str


@dataclass(frozen=True)
class Route:
    """Where a stage's outputs go: the next stage's index and its actor's address, or the driver."""

    address: Address
    stage: int = TO_DRIVER


class WorkerActor:
    """A worker's stages (one for a plain split, a worker's for an interleaved one) on one Ray node."""

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.startup_rss = current_rss_bytes()
        self.specs = {spec.index: spec for spec in specs}
        self.runners: dict[int, StageRunner] = {}
        self.cache = StageCache()
        self.place: NodePlace | None = None
        self._epoch = -1
        self._routes: dict[int, Route] = {}
        self._driver: Address | None = None
        self._endpoint: Endpoint | None = None
        self._routed = threading.Event()
        self._running = threading.Lock()
        """Held while a frame runs: one at a time, and :meth:`plane_close` waits for the one running."""
        self._changed = threading.Condition()
        self._breaks: dict[int, str] = {}
        """Why a connection broke, by the epoch it broke in."""
        self.received: dict[int, dict[str, np.ndarray]] = {}
        """What each stage ran on last: :meth:`window` times the stage on it again."""

    # ------------------------------------------------------------------------------ setting up

    def node(self) -> NodePlace:
        """Where this actor runs."""
        if self.place is None:
            self.place = node_here()
        return self.place

    def missing(self, files: Sequence[ShippedFile]) -> list[str]:
        return self.cache.missing(files)

    def write(self, sha256: str, offset: int, data: bytes) -> None:
        try:
            self.cache.write(sha256, offset, data)
        except ShipFailure as e:
            raise RuntimeStageError(f"{e} (on {self.node().short})") from None

    def seal(self, file: ShippedFile, label: str) -> None:
        try:
            self.cache.seal(file, label)
        except ShipFailure as e:
            raise RuntimeStageError(f"{e} (on {self.node().short})") from None

    def open(self, files: Mapping[int, Sequence[ShippedFile]] | None) -> None:
        """Open every hosted stage: from the node's cache (``files``: each stage's, shipped), or from
        the path its spec names (``None``: a folder every node shares)."""
        try:
            for index, spec in self.specs.items():
                if files is not None:
                    spec = replace(spec, path=str(self.cache.stage_path(files[index])))
                elif not os.path.isfile(spec.path):
                    raise StageFailure(
                        f"{spec.label}: {spec.path} is not on this node; with {opt('ray_files', 'shared')} "
                        f"every node needs the split folder at the driver's path: ship the files instead "
                        f"({opt('ray_files', 'ship')})"
                    )
                self.runners[index] = StageRunner(spec)
        except StageFailure as e:
            self.runners.clear()
            raise RuntimeStageError(f"{e} (on {self.node().short})") from None

    # ------------------------------------------------------------------------------ the data plane

    def plane_open(self, epoch: int) -> Address:
        """Serve epoch ``epoch`` on a fresh endpoint of this actor's node (the last one closed, its frames
        dropped): its address.  Frames are taken once :meth:`plane_route` said where they go."""
        self.plane_close()
        with self._changed:
            self._epoch = epoch
            self._changed.notify_all()  # a watch of the epoch before ends
        self._routes, self._driver = {}, None
        self._routed = threading.Event()
        self._endpoint = Endpoint(
            self.node().address, self._arrived, lambda _peer, why: self._broke(epoch, why)
        )
        return self._endpoint.address

    def plane_route(self, routes: Mapping[int, Route], driver: Address) -> None:
        """Where each hosted stage's outputs go (and failures: the driver); serving starts."""
        self._routes, self._driver = dict(routes), driver
        self._routed.set()

    def watch(self, epoch: int) -> str:
        """Block until a connection of this actor's plane breaks in ``epoch`` (why: the driver sets the
        pipeline up again), or a newer epoch begins (an empty text)."""
        with self._changed:
            self._changed.wait_for(lambda: epoch in self._breaks or self._epoch != epoch)
            return self._breaks.get(epoch, "")

    def plane_close(self) -> None:
        """Stop serving: the frame running is finished, the rest dropped; the endpoint closed."""
        endpoint, self._endpoint = self._endpoint, None
        self._routed.set()  # a frame waiting for its route is dropped
        if self._running.acquire(timeout=CLOSE_WAIT_S):  # a hung stage run must not hold the recovery
            self._running.release()
        if endpoint is not None:
            endpoint.close()

    def window(self, stage: int, seconds: float, min_runs: int) -> float:
        """Seconds per run of hosted stage ``stage`` run back to back on what it ran on last, over at
        least ``seconds`` and ``min_runs`` runs: what the node sustains (calibration on a cluster).

        Why a window and not a run's median: a node held to a CPU quota (a container's, a burstable
        instance's) runs a run shorter than the quota's period at full speed and is throttled between
        runs, and a core shared with another stage's actor is shared over time; only a window of
        back-to-back runs longer than the period shows either."""
        received = self.received.get(stage)
        if received is None:
            raise RuntimeStageError(f"stage {stage} has run nothing on {self.node().short} to time again")
        runner, runs, start = self.runners[stage], 0, time.perf_counter()
        try:
            while runs < min_runs or time.perf_counter() - start < seconds:
                runner.run(runs, received)
                runs += 1
        except StageFailure as e:
            raise RuntimeStageError(f"{e} (on {self.node().short})") from None
        return (time.perf_counter() - start) / runs

    def stats(self) -> list[WorkerStats]:
        """One entry per hosted stage (:func:`~.process_worker.hosted_stats`), with this actor's node."""
        stats = hosted_stats(list(self.runners.values()), self.startup_rss)
        return [replace(st, node=self.node()) for st in stats]

    def reset(self) -> None:
        for runner in self.runners.values():
            runner.records.clear()

    # ------------------------------------------------------------------------------ serving frames

    def _arrived(self, frame: Frame) -> None:
        """Run ``frame`` (in the thread that read it) if it is of this epoch and the plane still open."""
        note = Note.read(frame.meta)
        endpoint = self._endpoint
        if note is None or note.epoch != self._epoch or endpoint is None:
            return
        if not self._routed.is_set():
            self._routed.wait(ROUTE_TIMEOUT_S)
        with self._running:
            if self._endpoint is not endpoint:  # closed meanwhile: a newer epoch sends it again
                return
            try:
                self._run(note, frame, endpoint)
            except PlaneError as e:  # the next stage is gone: the driver learns it from the watch
                self._broke(note.epoch, str(e))
            except Exception as e:  # noqa: BLE001 - fail the micro-batch, or the driver waits forever
                self._fail(
                    note,
                    FailureKind.STAGE,
                    f"stage {note.stage}: {type(e).__name__}: {e} (on {self.node().short})",
                )

    def _broke(self, epoch: int, why: str) -> None:
        """A connection of ``epoch`` broke; not one that this actor's own close ended."""
        with self._changed:
            if epoch == self._epoch and self._endpoint is not None:
                self._breaks.setdefault(epoch, f"{why} (seen on {self.node().short})")
                self._changed.notify_all()

    def _run(self, note: Note, frame: Frame, endpoint: Endpoint) -> None:
        start = time.perf_counter()
        runner = self.runners.get(note.stage)
        if runner is None:
            self._fail(note, FailureKind.STAGE, f"stage {note.stage} is not open on {self.node().short}")
            return
        run_start = time.perf_counter()
        try:
            sends = runner.run(note.seq, frame.tensors)
        except CacheMissing as e:
            self._fail(note, FailureKind.CACHE_GONE, f"{e} (on {self.node().short})")
            return
        except StageFailure as e:
            self._fail(note, FailureKind.STAGE, str(e))
            return
        run_end = time.perf_counter()
        self.received[note.stage] = frame.tensors
        route = self._routes[note.stage]
        end = time.perf_counter()  # recorded before the outputs go: the driver may ask for it once they came
        runner.records.append(Record(note.seq, start, run_start, run_end, end, end))
        sent = time.time()
        leg = (note.stage, frame.received, run_end - run_start, sent, frame.nbytes)
        wire = (note.epoch, note.seq, route.stage, sent, (*note.legs, leg))  # a Note's wire(), made at once
        endpoint.send(route.address, wire, sends)

    def _fail(self, note: Note, kind: FailureKind, text: str) -> None:
        endpoint = self._endpoint
        if endpoint is not None and self._driver is not None:
            endpoint.send(self._driver, Failed(note.epoch, note.seq, kind, text), {})
