"""Workers as Ray actors on the nodes of a cluster, each holding its stages' sessions.

**Placement.** Each actor asks the cluster for its resources: ``num_cpus`` (default: the stage's
threads), ``num_gpus`` (default: 1 for a GPU provider, else 0) and custom ``resources`` (e.g.
``{"stage0_host": 1}`` to pin a stage to the node started with ``ray start --resources='{"stage0_host":
1}'``), from a resources file (an actor hosting several stages asks for the most that any of them asks,
key by key)::

    {"default": {"num_cpus": 1},
     "stages": [{"resources": {"node_a": 1}}, {"num_gpus": 1, "resources": {"node_b": 1}}]}

The stages of one worker of an interleaved split (``workers``) share one actor, as they share one
process locally: one interpreter, one onnxruntime, and a session per stage.  Its calls run one at a time,
in the order their inputs become ready (``allow_out_of_order_execution``).

**Files.** Once an actor has started, the driver learns its node (:attr:`RayBackend.places`) and, with
``files="ship"`` (the default), ships it what its node's cache lacks of its stages' files, checked by
sha256 on arrival (:mod:`~onnxpipe.runtime.backends.stage_cache`); with ``files="shared"`` the actor reads
the split folder at the driver's path, which every node must then have.  Then the actor opens its stages.

**Hops.** Micro-batches do not travel in Ray's calls: once the actors' stages are open, each actor opens
its end of the data plane (:mod:`~onnxpipe.runtime.backends.ray_plane`, served by
:class:`~onnxpipe.runtime.backends.ray_actor.WorkerActor`), a listener on its node's address, and learns
where each of its stages' outputs go.  The driver sends a micro-batch's inputs to the first stage's actor over
a persistent connection; each actor sends its outputs straight to the next stage's, the last one back to the
driver.  A hop costs its bytes over the link and a frame's header, not a Ray call relayed by the driver (about
a millisecond each, every byte crossing the driver's machine: what the chain of calls this replaced cost).  At
most :attr:`RayBackend.capacity` micro-batches are in flight (backpressure); results are matched to
micro-batches by number, so the order is the pipeline's business.

**Failures.** A stage that raises fails its micro-batch and the pipeline (the caller sees the stage's
own :class:`RuntimeStageError`).  An actor that is *lost* (its process or node died) is another matter:
the data plane sees a connection break at once (the actors' :meth:`~.ray_actor.WorkerActor.watch`, the
driver's own end), Ray starts the actor again (``restarts``) on a node that has its resources once the
cluster declared it dead, the driver sets it up again (ships its files to the new node, opens its
stages), opens a new epoch of the plane on every actor (frames of the old one are dropped where they
arrive), and sends again every micro-batch that was in flight, so that every result comes exactly once
(:class:`~.ray_resources.Recovery` says what happened).  When no
node left can take it, or it does not come back within ``restart_timeout``, the run stops with one line
naming the stages, the lost node and what no node has (:mod:`~.ray_resources`); what was delivered stays
delivered.  A generating pipeline's actors keep KV caches that die with them: a lost actor is started
again the same way, but the steps in flight are not sent again (they would grow the caches of the stages
that survived twice): each fails alone with :class:`~onnxpipe.core.errors.CacheLost`, as does a later
step that reaches the new actor for a sequence it holds no cache of
(:attr:`~.ray_actor.FailureKind.CACHE_GONE`), and the generation loop rebuilds those sequences by a
prefill of their tokens so far (:mod:`onnxpipe.runtime.generation.scheduler`).

The connection to Ray (started unless the caller did, shared, shut down by the last backend) is
:mod:`~onnxpipe.runtime.backends.ray_connect`'s.  Ray is an optional dependency (``pip install
'onnxpipe[ray]'``); it is imported only there, lazily.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpipe.core.choices import RayFiles
from onnxpipe.core.errors import CacheLost, RuntimeStageError, UsageError, error_line
from onnxpipe.runtime.backends.lanes import Lanes
from onnxpipe.runtime.backends.ray_actor import WATCH_GROUP, Failed, FailureKind, Note, Route, WorkerActor
from onnxpipe.runtime.backends.ray_connect import OWNED_RAY, import_ray, ray_error_text
from onnxpipe.runtime.backends.ray_plane import Address, Endpoint, Frame, PlaneError
from onnxpipe.runtime.backends.ray_resources import (
    RESOURCE_KEYS,
    Recovery,
    actor_options,
    check_shared_pins,
    merged_options,
    missing_resources,
    no_node_text,
    node_alive,
    request_of,
    stages_text,
    timed_out_text,
)
from onnxpipe.runtime.backends.ray_ship import ship
from onnxpipe.runtime.base import Delivery, RayConfig, Tensors
from onnxpipe.runtime.session import MAX_RECORDS, WorkerStats
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import Leg, NodePlace, Trip
from onnxpipe.schedule.timeline import worker_groups

START_TIMEOUT_S = 300.0
PROBE_S = 0.5
"""How often a recovery looks at the cluster while a lost actor is away."""
WATCH_S = 0.1
"""How often a poll asks Ray whether an actor died (a broken connection is seen at once)."""
DEATH_S = 3.0
"""How long a run that may not restart waits, after a broken connection, for Ray to say which actor died."""


@dataclass
class _Flight:
    """A micro-batch in flight: its lane, its inputs (kept to send them again), when they were sent and
    their bytes on the wire."""

    seq: int
    lane: int
    tensors: dict[str, np.ndarray]
    submitted: float = 0.0
    nbytes: int = 0


class RayBackend(Lanes):
    """One Ray actor per worker: per stage, or per worker of an interleaved split; see the module
    docstring."""

    kind = "ray"

    def __init__(
        self,
        lanes: Sequence[Sequence[WorkerSpec]],
        config: RayConfig | None = None,
        *,
        workers: Sequence[int] | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        """``lanes``: chains of stages, one for a pipeline (K replicas: K chains of one stage), fed in
        turn.  ``config.resources``: actor options per stage of a single lane.  ``workers[i]``: the worker
        of stage ``i`` of a single lane in an interleaved split (None: one each), whose stages then share
        one actor."""
        cfg = config if config is not None else RayConfig()
        super().__init__(lanes, cfg.slots, workers)
        self.config = cfg
        self.specs = [spec for lane in lanes for spec in lane]
        """Every stage of every lane, lane after lane: positions index it."""
        self.groups = worker_groups(range(len(self.specs)) if workers is None else workers)
        """The stage positions each actor hosts: one group per worker, in order of its first stage."""
        if cfg.resources is not None:
            if len(lanes) != 1 or len(cfg.resources) != len(self.specs):
                raise UsageError(
                    f"{len(cfg.resources)} resource entries for the {len(self.specs)} stages of one lane"
                )
            check_shared_pins(self.specs, self.groups, cfg.resources)
        ray = import_ray()
        self._ray = ray
        positions = iter(range(len(self.specs)))
        self._lanes = [[next(positions) for _ in lane] for lane in lanes]
        self._group_of = {i: g for g, group in enumerate(self.groups) for i in group}
        self._lane_load = [0] * len(self._lanes)
        self._lock = threading.Lock()
        self._in_flight: dict[int, _Flight] = {}
        """What the driver keeps of each micro-batch in flight, by number."""
        self._epoch = 0
        """The data plane's set-up: a frame of another one is dropped."""
        self._endpoint: Endpoint | None = None
        self._addresses: list[Address] = []
        """Each actor's end of the plane (one per group), in this epoch."""
        self._watches: list[Any] = []
        self._watched = 0.0
        self._arrived: deque[Frame] = deque()
        self._broken: str | None = None
        """Why a connection of the driver's end broke in this epoch, until a poll takes it."""
        self._event = threading.Event()
        self._recovering = False
        self._replay: list[_Flight] = []
        """Micro-batches to send again once a recovery brought the lost actors back."""
        self._dropped: list[_Flight] = []
        """Generation steps a recovery dropped, to fail alone (:class:`CacheLost`) at the next poll."""
        self.generating = any(spec.generating for spec in self.specs)
        """Whether the actors keep KV caches: a loss drops the steps in flight instead of replaying them."""
        self._trips: deque[Trip] = deque(maxlen=MAX_RECORDS)
        self.recoveries: list[Recovery] = []
        """Every lost actor brought back, in order."""
        self.actors: list[Any] = []
        """One per group of :attr:`groups`."""
        self.places: list[NodePlace] = []
        """The node of each actor (one per group), as it was set up last."""
        self.shipped: list[int | None] = []
        """The bytes each actor's node was shipped when it was set up last (None: a shared folder)."""
        self._ray_generation = OWNED_RAY.acquire(ray, cfg.address)
        try:  # whatever fails from here on (Ctrl-C, bad options, no resources), close() undoes the rest
            self._start_actors(start_timeout)
        except BaseException:
            self.close(graceful=False)
            raise

    # ---------------------------------------------------------------------------------- starting

    def _start_actors(self, start_timeout: float) -> None:
        """Start an actor per group, learn their nodes, and set each up (files, sessions)."""
        ray = self._ray
        remote = ray.remote(concurrency_groups={WATCH_GROUP: 2})(WorkerActor)  # the watch apart
        for group in self.groups:  # one at a time: a Ctrl-C in between leaves only started actors
            actor = remote.options(**self._group_options(group)).remote([self.specs[i] for i in group])
            self.actors.append(actor)
        try:
            self.places = ray.get([a.node.remote() for a in self.actors], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeStageError(
                f"the stage actors did not start within {start_timeout:.0f} s: the cluster may lack "
                f"the resources they ask for ({self._describe_requests()})"
            ) from e
        except ray.exceptions.RayError as e:
            raise RuntimeStageError(ray_error_text(e, "a stage actor failed to start")) from e
        self.shipped = [None] * len(self.groups)
        for g in range(len(self.groups)):
            self._set_up(g)
        self._open_plane()

    def _open_plane(self) -> None:
        """A new epoch of the data plane: the driver's end and every actor's opened afresh (the last
        ones closed), each actor told where its stages' outputs go, its watch set."""
        ray = self._ray
        self._epoch += 1
        epoch = self._epoch
        if self._endpoint is not None:
            self._endpoint.close()
        host = ray.util.get_node_ip_address()
        self._endpoint = Endpoint(host, self._on_frame, lambda _peer, why: self._on_broken(epoch, why))
        try:
            self._addresses = ray.get([a.plane_open.remote(epoch) for a in self.actors])
            driver = self._endpoint.address
            ray.get([a.plane_route.remote(self._routes(g), driver) for g, a in enumerate(self.actors)])
        except ray.exceptions.RayError as e:
            raise RuntimeStageError(ray_error_text(e, "opening the data plane failed")) from e
        self._watches = [a.watch.options(concurrency_group=WATCH_GROUP).remote(epoch) for a in self.actors]

    def _routes(self, g: int) -> dict[int, Route]:
        """Where the outputs of each stage actor ``g`` hosts go: the next stage's actor, or the driver."""
        assert self._endpoint is not None
        routes = {}
        for lane in self._lanes:
            for k, pos in enumerate(lane):
                if self._group_of[pos] != g:
                    continue
                if k + 1 < len(lane):
                    after = lane[k + 1]
                    address = self._addresses[self._group_of[after]]
                    routes[self.specs[pos].index] = Route(address, self.specs[after].index)
                else:
                    routes[self.specs[pos].index] = Route(self._endpoint.address)
        return routes

    def _on_frame(self, frame: Frame) -> None:
        with self._lock:
            self._arrived.append(frame)
        self._event.set()

    def _on_broken(self, epoch: int, why: str) -> None:
        with self._lock:
            if epoch == self._epoch and self._broken is None:
                self._broken = why
        self._event.set()

    def _set_up(self, g: int) -> None:
        """Ship group ``g``'s files to its actor's node (unless shared) and open its stages there."""
        ray = self._ray
        actor = self.actors[g]
        specs = [self.specs[i] for i in self.groups[g]]
        try:
            files = None
            if self.config.files == RayFiles.SHIP:
                self.shipped[g], files = ship(ray, actor, specs)
            ray.get(actor.open.remote(files))
        except ray.exceptions.RayError as e:
            raise RuntimeStageError(ray_error_text(e, f"{stages_text(self._indexes(g))} did not open")) from e

    def _group_options(self, group: Sequence[int]) -> dict[str, Any]:
        """The actor options of the stages at positions ``group``."""
        resources = self.config.resources
        options = merged_options(
            [actor_options(self.specs[i], resources[i] if resources is not None else {}) for i in group]
        )
        options["max_restarts"] = self.config.restarts
        return options

    def _describe_requests(self) -> str:
        parts = []
        for g, group in enumerate(self.groups):
            shown = {k: v for k, v in self._group_options(group).items() if k in RESOURCE_KEYS}
            parts.append(f"{stages_text(self._indexes(g))}: {shown}")
        return "; ".join(parts)

    @property
    def placed(self) -> list[NodePlace]:
        """The node (and process) of each stage's actor, in stage-position order."""
        return [self.places[self._group_of[i]] for i in range(len(self.specs))]

    def shipped_to(self, position: int) -> int | None:
        """The bytes the node of the stage at ``position`` was shipped for its actor when it was set up last
        (None: a shared folder)."""
        return self.shipped[self._group_of[position]]

    def _actor_names(self) -> dict[int, str]:
        """Each actor's process id, and the stages it hosts in words (``the actor of stages 0, 2 (pid
        41 on node-a)``)."""
        return {
            place.pid: f"the actor of {stages_text(self._indexes(g))} (pid {place.pid} on {place.host})"
            for g, place in enumerate(self.places)
        }

    # ---------------------------------------------------------------------------------- running

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray], to_lane: int | None = None) -> bool:
        """As :meth:`Lanes.try_submit`, but nothing goes while a recovery brings lost actors back."""
        with self._lock:
            if self._recovering or not super().try_submit(seq, feeds, to_lane):
                return False
        self._event.set()
        return True

    def _offer(self, li: int, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        """Send ``seq`` to lane ``li``'s first stage if the lane has room (under the lock)."""
        if self._lane_load[li] >= self._lane_capacity(li):
            return False
        flight = _Flight(seq, li, {name: feeds[name] for name in self.specs[self._lanes[li][0]].receives})
        self._in_flight[seq] = flight
        self._lane_load[li] += 1
        self._send(flight)
        return True

    def _send(self, flight: _Flight) -> None:
        """Send ``flight``'s inputs to its lane's first stage (under the lock); a connection that cannot
        be made is a broken one (the actor is gone: the next poll recovers)."""
        assert self._endpoint is not None
        position = self._lanes[flight.lane][0]
        to, stage = self._addresses[self._group_of[position]], self.specs[position].index
        flight.submitted = time.time()  # the hop's measure starts: what it needs was looked up before
        try:
            wire = Note(self._epoch, flight.seq, stage, flight.submitted).wire()
            flight.nbytes = self._endpoint.send(to, wire, flight.tensors)
        except PlaneError as e:
            self._broken = self._broken or str(e)

    def poll(self) -> list[tuple[int, Delivery]]:
        self._check_open()
        with self._lock:
            frames = list(self._arrived)
            self._arrived.clear()
            done: list[tuple[int, Delivery]] = [self._cache_lost(f) for f in self._dropped]
            self._dropped = []
        for frame in frames:
            note = frame.meta if isinstance(frame.meta, Failed) else Note.read(frame.meta)
            if note is None or note.epoch != self._epoch:
                continue  # sent before a recovery: its micro-batch was sent again
            with self._lock:
                flight = self._in_flight.pop(note.seq, None)
            if flight is None:
                continue
            if isinstance(note, Failed):
                if note.kind is FailureKind.CACHE_GONE:  # a step that reached a restarted actor
                    with self._lock:
                        done.append(self._cache_lost(flight, note.text))
                    continue
                self._failure = RuntimeStageError(note.text)  # what came out is delivered; next poll raises
                break
            done.append((flight.seq, self._delivered(flight, note, frame)))
        if self._failure is None and not self._recovering and self._loss() is not None:
            self._begin_recovery()
        return done

    def _loss(self) -> str | None:
        """Why an actor or a connection of this epoch was lost (None: none was): a connection of the
        driver's end broke, or an actor's watch answered (its connection broke, or it died)."""
        with self._lock:
            why, self._broken = self._broken, None
        now = time.monotonic()
        if why is None and now - self._watched >= WATCH_S:
            self._watched = now
            why = next((text for text, _ in self._answers() if text), None)
        if why is not None and self.config.restarts == 0:
            why = self._death_behind(why)
            self._failure = RuntimeStageError(f"the pipeline lost a stage and may not restart it: {why}")
            return None
        return why

    def _answers(self) -> Iterator[tuple[str | None, bool]]:
        """What each actor's watch that answered says, and whether it is a death (naming the actor's
        stages) rather than a broken connection the actor saw."""
        ray = self._ray
        ready, _ = ray.wait(self._watches, num_returns=len(self._watches), timeout=0)
        for ref in ready:
            try:
                answer: str | None = ray.get(ref) or None
            except ray.exceptions.RayError as e:
                yield ray_error_text(e, "a stage actor was lost", self._actor_names()), True
            else:
                yield answer, False

    def _death_behind(self, why: str) -> str:
        """A connection that broke is most often a peer actor's death, which its neighbour sees before Ray
        reports it: a run that may not restart waits up to :data:`DEATH_S` for Ray to name the dead actor
        and its stages, and keeps ``why`` where no actor died."""
        deadline = time.monotonic() + DEATH_S
        while True:
            died = next((text for text, dead in self._answers() if dead), None)
            if died is not None or time.monotonic() >= deadline:
                return died or why
            time.sleep(WATCH_S)

    def _cache_lost(self, flight: _Flight, why: str | None = None) -> tuple[int, Delivery]:
        """A generation step whose sequences' caches died with an actor: it fails alone (under the
        lock)."""
        self._lane_load[flight.lane] -= 1
        reason = why or "its stages' actor was lost and started again, empty"
        return flight.seq, CacheLost(f"generation step {flight.seq} lost its sequences' caches: {reason}")

    def _delivered(self, flight: _Flight, note: Note, frame: Frame) -> Tensors:
        """The outputs of ``flight`` from its last frame; its trip kept."""
        with self._lock:
            self._lane_load[flight.lane] -= 1
        self._trips.append(
            Trip(
                seq=flight.seq,
                submitted=flight.submitted,
                delivered=frame.received,
                legs=tuple(Leg(*leg) for leg in note.legs),
                bytes_in=flight.nbytes,
                bytes_out=frame.nbytes,
            )
        )
        return frame.tensors

    def wait(self, timeout: float) -> None:
        """Until a frame arrives, a connection breaks, :meth:`wake`, or ``timeout``; while micro-batches
        are in flight, at most :data:`WATCH_S` (the watches are Ray's, not this event's)."""
        with self._lock:
            if self._arrived or self._dropped or self._broken is not None:
                return
            self._event.clear()
            busy = bool(self._in_flight) and not self._closed
        self._event.wait(min(timeout, WATCH_S) if busy else timeout)

    def wake(self) -> None:
        self._event.set()

    # ---------------------------------------------------------------------------------- recovery

    def _begin_recovery(self) -> None:
        """Hold back new work, take every micro-batch in flight to send again, and bring the lost actors
        back in a thread of their own (the driver goes on delivering nothing meanwhile)."""
        with self._lock:
            self._recovering = True
            self._replay = list(self._in_flight.values())
            self._in_flight.clear()
        thread = threading.Thread(
            target=self._recover, args=(time.monotonic(),), name="onnxpipe ray recovery", daemon=True
        )
        thread.start()

    def _recover(self, began: float) -> None:
        try:
            restored = self._await_actors(began)
            if self._closed:
                return
            self._open_plane()
            with self._lock:
                replay = sorted(self._replay, key=lambda f: f.seq)
                self._replay = []
                if self.generating:  # the caches died: the generation loop rebuilds its sequences
                    self._dropped.extend(replay)
                else:
                    self._in_flight.update((f.seq, f) for f in replay)
                    for flight in replay:
                        self._send(flight)
                self._recovering = False
            seconds = time.monotonic() - began
            self.recoveries.extend(
                Recovery(stages, lost, now, dead, len(replay), seconds)
                for stages, lost, now, dead in restored
            )
        except RuntimeStageError as e:
            self._failure = e
        except Exception as e:  # noqa: BLE001 - a recovery that breaks must fail the run, not hang it
            self._failure = RuntimeStageError(f"recovering a lost actor failed: {error_line(e)}")
        self._event.set()

    def _await_actors(self, began: float) -> list[tuple[tuple[int, ...], NodePlace, NodePlace, bool]]:
        """Wait until every actor answers; set up again each that Ray restarted (a new process).  Raises
        when one cannot come back: no node has its resources, or ``restart_timeout`` passed."""
        ray = self._ray
        probes = {g: a.node.remote() for g, a in enumerate(self.actors)}
        restored: list[tuple[tuple[int, ...], NodePlace, NodePlace, bool]] = []
        deadline = began + self.config.restart_timeout
        while probes and not self._closed:
            ready, _ = ray.wait(list(probes.values()), num_returns=len(probes), timeout=PROBE_S)
            for g in [g for g, ref in probes.items() if ref in ready]:
                place = self._probed(g, probes)
                if place is None:
                    continue
                del probes[g]
                old = self.places[g]
                if place.pid != old.pid or place.node_id != old.node_id:  # Ray started it again
                    dead = not node_alive(old.node_id, ray.nodes())
                    self.places[g] = place
                    self._set_up(g)
                    restored.append((self._indexes(g), old, place, dead))
            if probes:
                self._check_hosts(list(probes), began, deadline)
        return restored

    def _probed(self, g: int, probes: dict[int, Any]) -> NodePlace | None:
        """Group ``g``'s answer to its probe; None (and a new probe) when it was not there yet."""
        ray = self._ray
        try:
            place: NodePlace = ray.get(probes[g])
            return place
        except ray.exceptions.ActorUnavailableError:  # going away or coming back: ask again
            time.sleep(PROBE_S)
            probes[g] = self.actors[g].node.remote()
            return None
        except ray.exceptions.RayActorError as e:
            raise RuntimeStageError(
                ray_error_text(
                    e,
                    f"{stages_text(self._indexes(g))} was lost and will not run again",
                    self._actor_names(),
                )
            ) from e

    def _check_hosts(self, waiting: Sequence[int], began: float, deadline: float) -> None:
        """Stop when a lost actor whose node is dead fits no alive node, or the deadline passed."""
        nodes = self._ray.nodes()
        for g in waiting:
            old = self.places[g]
            dead = not node_alive(old.node_id, nodes)
            if dead:
                request = request_of(self._group_options(self.groups[g]))
                lacking = missing_resources(request, nodes)
                if lacking is not None:
                    raise RuntimeStageError(no_node_text(self._indexes(g), old, request, lacking))
            if time.monotonic() > deadline:
                raise RuntimeStageError(timed_out_text(self._indexes(g), old, time.monotonic() - began, dead))

    def _indexes(self, g: int) -> tuple[int, ...]:
        return tuple(self.specs[i].index for i in self.groups[g])

    # ---------------------------------------------------------------------------------- stats

    def stats(self) -> list[WorkerStats]:
        self._check_open()
        replies: list[list[WorkerStats]] = self._ray.get([a.stats.remote() for a in self.actors])
        by_position: dict[int, WorkerStats] = {}
        for group, reply in zip(self.groups, replies, strict=True):  # an actor answers in its group's order
            by_position.update(zip(group, reply, strict=True))
        return [by_position[i] for i in range(len(self.specs))]

    def time_windows(self, seconds: float, min_runs: int) -> list[float]:
        """Each stage's seconds per run over a window of back-to-back runs on its actor
        (:meth:`WorkerActor.window`, on what it ran on last), every actor's window at once, so that
        stages sharing a node's cores share them as they will when the pipeline streams."""
        self._check_open()
        calls = [
            self.actors[self._group_of[i]].window.remote(spec.index, seconds, min_runs)
            for i, spec in enumerate(self.specs)
        ]
        try:
            return list(self._ray.get(calls))
        except self._ray.exceptions.RayError as e:
            raise RuntimeStageError(ray_error_text(e, "timing the stages on their nodes failed")) from e

    def reset_stats(self) -> None:
        self._check_open()
        self._ray.get([a.reset.remote() for a in self.actors])
        self._trips.clear()

    def trips(self) -> list[Trip]:
        """The trips of the micro-batches delivered since the stats were last reset (the most recent
        :data:`~onnxpipe.runtime.session.MAX_RECORDS`)."""
        return list(self._trips)

    def close(self, graceful: bool = True) -> None:
        """Kill every stage actor (their in-flight calls fail); shut Ray down if this was the last backend
        using the Ray that a backend started."""
        if self._closed:
            return
        self._closed = True
        self._event.set()
        if self._endpoint is not None:
            self._endpoint.close()
        for actor in self.actors:
            with contextlib.suppress(Exception):  # an actor that is already gone is fine
                self._ray.kill(actor, no_restart=True)
        with self._lock:
            self._in_flight.clear()
            self._lane_load = [0] * len(self._lanes)
        OWNED_RAY.release(self._ray, self._ray_generation)
