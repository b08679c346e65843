"""Workers as Ray actors holding their stages' sessions, tensors passed as object references.

A micro-batch is a chain of actor calls, ``ref = actor_i.run.remote(stage_i, seq, ref)``: Ray hands each
stage's output to the next stage through its object store (between machines when the actors are on
different nodes) without passing through the caller.  At most :attr:`RayBackend.capacity` micro-batches
are in flight (backpressure); results are matched to micro-batches by reference, so the order is the
pipeline's business, not Ray's.  A stage that raises fails its micro-batch and, through the dependency,
every later stage's call for it: the caller sees the stage's own :class:`RuntimeStageError`, then kills
every actor.

The stages of one worker of an interleaved split (``workers``) share one actor, as they share one
process locally (:mod:`~onnxpipe.runtime.backends.processes`): one interpreter, one onnxruntime, and a
session per stage, so that the worker holds about its stages' weights and not V processes' worth of
overhead.  Its calls run one at a time, in the order their inputs become ready
(``allow_out_of_order_execution``): a stage's call waiting for its input from another worker never holds
up the call of a sibling stage whose input is there, and the stages take turns on the worker's CPUs as
the plan assumes.

Each actor asks the cluster for its resources: ``num_cpus`` (default: the stage's threads), ``num_gpus``
(default: 1 for a GPU provider, else 0) and custom ``resources`` (e.g. ``{"stage0_host": 1}`` to pin a
stage to the node started with ``ray start --resources='{"stage0_host": 1}'``), from a resources file
(an actor hosting several stages asks for the most that any of them asks, key by key)::

    {"default": {"num_cpus": 1},
     "stages": [{"resources": {"node_a": 1}}, {"num_gpus": 1, "resources": {"node_b": 1}}]}

A backend connects to Ray unless the caller already did (``ray.init``).  The Ray a backend starts is
shared by every backend opened while it runs and shut down when the last of them closes; a Ray the caller
started is never shut down here.

Ray is an optional dependency (``pip install 'onnxpipe[ray]'``); it is imported only here, lazily.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError, error_line
from onnxpipe.runtime.backends.ray_resources import (
    RESOURCE_KEYS,
    actor_options,
    check_shared_pins,
    merged_options,
)
from onnxpipe.runtime.base import Tensors, lane_order
from onnxpipe.runtime.choices import DEFAULT_SLOTS
from onnxpipe.runtime.session import (
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
    memory_snapshot,
)
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.schedule.timeline import worker_groups

START_TIMEOUT_S = 300.0


class WorkerActor:
    """The body of a worker's Ray actor (made remote by :class:`RayBackend`): the session of each stage
    it hosts, one for a plain split, a worker's stages for an interleaved one."""

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.startup_rss = current_rss_bytes()
        self.runners: dict[int, StageRunner] = {}
        try:
            for spec in specs:
                self.runners[spec.index] = StageRunner(spec)
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from None

    def ready(self) -> tuple[int, str]:
        return os.getpid(), socket.gethostname()

    def run(self, stage: int, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        runner = self.runners[stage]
        start = time.perf_counter()
        try:
            sends = runner.run(seq, received)
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from None
        end = time.perf_counter()
        runner.recorder.add(Record(seq, start, start, end, end, end))
        return sends

    def stats(self) -> list[WorkerStats]:
        """One entry per hosted stage; ``hosted_with`` names them all when there are several, whose
        memory figures are then the actor's, the same for each."""
        hosted = tuple(self.runners) if len(self.runners) > 1 else ()
        pid = os.getpid()
        memory = memory_snapshot()  # read once: the same figures for every stage the actor hosts
        return [
            r.stats(pid=pid, startup_rss=self.startup_rss, hosted_with=hosted, memory=memory)
            for r in self.runners.values()
        ]

    def reset(self) -> None:
        for runner in self.runners.values():
            runner.recorder.reset()


class _OwnedRay:
    """How many open backends use the Ray this module started: the last one to close shuts it down.

    ``generation`` tells the Rays this module started apart: a backend that outlived its Ray (the caller
    shut it down, and a later backend started another) does not count against the new one.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.generation = 0

    def acquire(self, ray: Any, address: str | None) -> int | None:
        """Start Ray unless it runs; the generation to :meth:`release` at close, ``None`` for the caller's."""
        with self.lock:
            if ray.is_initialized():
                if self.users == 0:
                    return None
                self.users += 1
                return self.generation
            try:
                ray.init(address=address, include_dashboard=False, logging_level="WARNING")
            except (ConnectionError, RuntimeError, ValueError) as e:
                _shutdown_quietly(ray)
                where = address or "a new local cluster"
                raise UsageError(f"cannot connect to Ray at {where}: {error_line(e)}") from e
            except BaseException:  # Ctrl-C half-way through: leave nothing of it running
                _shutdown_quietly(ray)
                raise
            self.generation += 1
            self.users = 1
            return self.generation

    def release(self, ray: Any, generation: int | None) -> None:
        if generation is None:
            return
        with self.lock:
            if generation != self.generation or self.users == 0:
                return
            self.users -= 1
            if self.users == 0:
                ray.shutdown()


_OWNED_RAY = _OwnedRay()


def _shutdown_quietly(ray: Any) -> None:
    with contextlib.suppress(Exception):
        ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise UsageError(
            "the ray backend needs Ray, which is not installed; pip install 'onnxpipe[ray]'"
        ) from e
    return ray


class RayBackend:
    """One Ray actor per worker: per stage, or per worker of an interleaved split; see the module
    docstring."""

    kind = "ray"

    def __init__(
        self,
        lanes: Sequence[Sequence[WorkerSpec]],
        *,
        address: str | None = None,
        resources: Sequence[Mapping[str, Any]] | None = None,
        slots: int = DEFAULT_SLOTS,
        start_timeout: float = START_TIMEOUT_S,
        workers: Sequence[int] | None = None,
    ) -> None:
        """``lanes``: chains of stages, one for a pipeline (K replicas: K chains of one stage), fed in
        turn.  ``resources``: actor options per stage of a single lane.  ``workers[i]``: the worker of
        stage ``i`` of a single lane in an interleaved split (None: one each), whose stages then share
        one actor."""
        if not lanes or any(not lane for lane in lanes):
            raise ValueError("a backend needs at least one lane of at least one worker")
        if len(lanes) != 1 and (resources is not None or workers is not None):
            raise UsageError("resources and workers are given for the stages of one lane")
        ray = _import_ray()
        self._ray = ray
        self.specs = [spec for lane in lanes for spec in lane]
        """Every stage of every lane, lane after lane: positions index it."""
        if resources is not None and len(resources) != len(self.specs):
            raise UsageError(f"{len(resources)} resource entries for {len(self.specs)} stages")
        if workers is not None and len(workers) != len(self.specs):
            raise UsageError(f"{len(workers)} workers given for {len(self.specs)} stages")
        starts = [sum(len(lane) for lane in lanes[:n]) for n in range(len(lanes))]
        self._lanes = [
            list(range(start, start + len(lane))) for start, lane in zip(starts, lanes, strict=True)
        ]
        self.groups = worker_groups(range(len(self.specs)) if workers is None else workers)
        """The stage positions each actor hosts: one group per worker, in order of its first stage."""
        if resources is not None:
            check_shared_pins(self.specs, self.groups, resources)
        self._lane_capacity = [slots * (len(lane) + 1) for lane in self._lanes]
        self._lane_load = [0] * len(self._lanes)
        self._next_lane = 0
        self._lock = threading.Lock()
        self._in_flight: dict[Any, tuple[int, int]] = {}
        """Each micro-batch's last reference: its sequence number and lane."""
        self._event = threading.Event()
        self._closed = False
        self._failure: RuntimeStageError | None = None
        self.actors: list[Any] = []
        """One per group of :attr:`groups`."""
        self._stage_actor: list[Any] = [None] * len(self.specs)
        self._ray_generation = _OWNED_RAY.acquire(ray, address)
        try:  # whatever fails from here on (Ctrl-C, bad options, no resources), close() undoes the rest
            remote = ray.remote(WorkerActor)
            for group in self.groups:  # one at a time: a Ctrl-C in between leaves only started actors
                opts = self._group_options(group, resources)
                actor = remote.options(**opts).remote([self.specs[i] for i in group])
                self.actors.append(actor)
                for i in group:
                    self._stage_actor[i] = actor
            try:
                started = ray.get([a.ready.remote() for a in self.actors], timeout=start_timeout)
            except ray.exceptions.GetTimeoutError as e:
                raise RuntimeStageError(
                    f"the stage actors did not start within {start_timeout:.0f} s: the cluster may lack "
                    f"the resources they ask for ({self._describe_requests(resources)})"
                ) from e
            except ray.exceptions.RayError as e:
                raise RuntimeStageError(_ray_error_text(e, "a stage actor failed to start")) from e
        except BaseException:
            self.close(graceful=False)
            raise
        placed: list[tuple[int, str]] = [(0, "")] * len(self.specs)
        for group, (pid, host) in zip(self.groups, started, strict=True):
            for i in group:
                placed[i] = (int(pid), str(host))
        self.placed = placed
        """The process id and host of each stage's actor, in stage order."""

    def _group_options(
        self, group: Sequence[int], resources: Sequence[Mapping[str, Any]] | None
    ) -> dict[str, Any]:
        """The actor options of the stages at positions ``group``, with ``resources`` per stage."""
        options = merged_options(
            [actor_options(self.specs[i], resources[i] if resources is not None else {}) for i in group]
        )
        if len(group) > 1:  # a call waiting for its input must not hold up a sibling stage's
            options["allow_out_of_order_execution"] = True
        return options

    def _describe_requests(self, resources: Sequence[Mapping[str, Any]] | None) -> str:
        parts = []
        for group in self.groups:
            options = self._group_options(group, resources)
            shown = {k: v for k, v in options.items() if k in RESOURCE_KEYS}
            parts.append(f"{self._stages_text(group)}: {shown}")
        return "; ".join(parts)

    def _actor_names(self) -> dict[int, str]:
        """Each actor's process id, and the stages it hosts in words (``the actor of stages 0, 2 (pid
        41 on node-a)``)."""
        names: dict[int, str] = {}
        for group in self.groups:
            pid, host = self.placed[group[0]]
            names[pid] = f"the actor of {self._stages_text(group)} (pid {pid} on {host})"
        return names

    def _stages_text(self, group: Sequence[int]) -> str:
        """``stage 1`` or ``stages 0, 2``: the stages at positions ``group``."""
        numbers = ", ".join(str(self.specs[i].index) for i in group)
        return f"stage{'s' if len(group) > 1 else ''} {numbers}"

    @property
    def capacity(self) -> int:
        """``slots`` per channel, ``k + 1`` per lane of ``k`` stages, as the local backends hold."""
        return sum(self._lane_capacity)

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray], to_lane: int | None = None) -> bool:
        """Chain micro-batch ``seq`` through the next lane with room (lanes in turn), or ``to_lane``."""
        self._check()
        with self._lock:
            n = len(self._lanes)
            for li in lane_order(self._next_lane, n, to_lane):
                if self._lane_load[li] >= self._lane_capacity[li]:
                    continue
                lane = self._lanes[li]
                ref: Any = {name: feeds[name] for name in self.specs[lane[0]].receives}
                for i in lane:
                    ref = self._stage_actor[i].run.remote(self.specs[i].index, seq, ref)
                self._in_flight[ref] = (seq, li)
                self._lane_load[li] += 1
                self._next_lane = (li + 1) % n
                break
            else:
                return False
        self._event.set()
        return True

    def poll(self) -> list[tuple[int, Tensors]]:
        self._check()
        with self._lock:
            refs = list(self._in_flight)
        if not refs:
            return []
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        done: list[tuple[int, Tensors]] = []
        for ref in ready:
            with self._lock:
                seq, lane = self._in_flight.pop(ref)
                self._lane_load[lane] -= 1
            try:
                outputs = self._ray.get(ref)
            except self._ray.exceptions.RayError as e:
                text = _ray_error_text(e, f"micro-batch {seq} failed", self._actor_names())
                self._failure = RuntimeStageError(text)
                raise self._failure from e
            done.append((seq, {n: np.array(v, copy=True) for n, v in outputs.items()}))
        return done

    def wait(self, timeout: float) -> None:
        with self._lock:
            refs = list(self._in_flight)
        if not refs or self._closed:
            self._event.wait(timeout)
            self._event.clear()
            return
        self._ray.wait(refs, num_returns=1, timeout=timeout)

    def wake(self) -> None:
        self._event.set()

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RuntimeStageError("the pipeline's actors were stopped; open the pipeline again")

    def stats(self) -> list[WorkerStats]:
        self._check()
        replies: list[list[WorkerStats]] = self._ray.get([a.stats.remote() for a in self.actors])
        by_position: dict[int, WorkerStats] = {}
        for group, reply in zip(self.groups, replies, strict=True):  # an actor answers in its group's order
            by_position.update(zip(group, reply, strict=True))
        return [by_position[i] for i in range(len(self.specs))]

    def reset_stats(self) -> None:
        self._check()
        self._ray.get([a.reset.remote() for a in self.actors])

    def worker_pids(self) -> list[int]:
        return []

    def close(self, graceful: bool = True) -> None:
        """Kill every stage actor (their in-flight calls fail); shut Ray down if this was the last backend
        using the Ray that a backend started."""
        if self._closed:
            return
        self._closed = True
        self._event.set()
        for actor in self.actors:
            with contextlib.suppress(Exception):  # an actor that is already gone is fine
                self._ray.kill(actor, no_restart=True)
        with self._lock:
            self._in_flight.clear()
            self._lane_load = [0] * len(self._lanes)
        _OWNED_RAY.release(self._ray, self._ray_generation)


_DEAD_PID = re.compile(r"\bpid: (\d+)")


def _ray_error_text(e: BaseException, fallback: str, actors: Mapping[int, str] | None = None) -> str:
    """One line for a Ray error: the stage's own message when a stage raised, else ``fallback`` and
    Ray's first line, naming the stages of a dead actor where ``actors`` (process id to the stages it
    hosted) knows its process."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, RuntimeStageError):
        return str(cause)
    for line in str(e).splitlines():
        if "RuntimeStageError:" in line:
            return line.split("RuntimeStageError:", 1)[1].strip()
    kind = type(e).__name__
    if "ActorDied" in kind or "RayActorError" in kind:
        m = _DEAD_PID.search(str(e))
        who = actors.get(int(m.group(1))) if m and actors else None
        return f"{fallback}: {who or 'a stage actor'} died ({error_line(e)})"
    return f"{fallback}: {error_line(e)}"
