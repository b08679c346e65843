"""Workers as Ray actors: one actor per stage holding its session, tensors passed as object references.

A micro-batch is a chain of actor calls, ``ref = actor_i.run.remote(seq, ref)``: Ray hands each stage's
output to the next stage through its object store (between machines when the actors are on different
nodes) without passing through the caller.  At most :attr:`RayBackend.capacity` micro-batches are in
flight (backpressure); results are matched to micro-batches by reference, so the order is the pipeline's
business, not Ray's.  A stage that raises fails its micro-batch and, through the dependency, every later
stage's call for it: the caller sees the stage's own :class:`RuntimeStageError`, then kills every actor.

Each actor asks the cluster for its resources: ``num_cpus`` (default: the stage's threads), ``num_gpus``
(default: 1 for a GPU provider, else 0) and custom ``resources`` (e.g. ``{"stage0_host": 1}`` to pin a
stage to the node started with ``ray start --resources='{"stage0_host": 1}'``), from a resources file::

    {"default": {"num_cpus": 1},
     "stages": [{"resources": {"node_a": 1}}, {"num_gpus": 1, "resources": {"node_b": 1}}]}

A backend connects to Ray unless the caller already did (``ray.init``).  The Ray a backend starts is
shared by every backend opened while it runs and shut down when the last of them closes; a Ray the caller
started is never shut down here.

Ray is an optional dependency (``pip install 'onnxpipe[ray]'``); it is imported only here, lazily.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.errors import RuntimeStageError, UsageError
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.processes import DEFAULT_SLOTS
from onnxpipe.runtime.session import (
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
    first_line,
)
from onnxpipe.runtime.spec import WorkerSpec

START_TIMEOUT_S = 300.0
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")


class StageActor:
    """The body of a stage's Ray actor (made remote by :class:`RayBackend`)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.startup_rss = current_rss_bytes()
        try:
            self.runner = StageRunner(spec)
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from None

    def ready(self) -> tuple[int, str]:
        return os.getpid(), socket.gethostname()

    def run(self, seq: int, received: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            sends = self.runner.run(seq, received)
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from None
        end = time.perf_counter()
        self.runner.recorder.add(Record(seq, start, start, end, end, end))
        return sends

    def stats(self) -> WorkerStats:
        return self.runner.stats(pid=os.getpid(), startup_rss=self.startup_rss)

    def reset(self) -> None:
        self.runner.recorder.reset()


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
                raise UsageError(f"cannot connect to Ray at {where}: {first_line(e)}") from e
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
    """One Ray actor per stage; see the module docstring."""

    kind = "ray"

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        address: str | None = None,
        resources: Sequence[Mapping[str, Any]] | None = None,
        slots: int = DEFAULT_SLOTS,
        start_timeout: float = START_TIMEOUT_S,
        workers: Sequence[int] | None = None,
    ) -> None:
        """``workers[i]``: the worker of stage ``i`` in an interleaved split (None: one each).  Without a
        resources file, a worker's stages then share one placement group (:meth:`_pack`)."""
        ray = _import_ray()
        self._ray = ray
        self.specs = list(specs)
        if resources is not None and len(resources) != len(self.specs):
            raise UsageError(f"{len(resources)} resource entries for {len(self.specs)} stages")
        self._capacity = slots * (len(self.specs) + 1)
        self._lock = threading.Lock()
        self._in_flight: dict[Any, int] = {}
        self._event = threading.Event()
        self._closed = False
        self._failure: RuntimeStageError | None = None
        self.actors: list[Any] = []
        self.placement_groups: list[Any] = []
        self._ray_generation = _OWNED_RAY.acquire(ray, address)
        try:  # whatever fails from here on (Ctrl-C, bad options, no resources), close() undoes the rest
            remote = ray.remote(StageActor)
            packed = None
            if workers is not None and resources is None:  # every stage's options first, to group them
                packed = self._pack([actor_options(spec, {}) for spec in self.specs], workers, start_timeout)
            for i, spec in enumerate(self.specs):
                if packed is not None:
                    opts = packed[i]
                else:  # one at a time: a Ctrl-C in between leaves only started actors, which close() kills
                    opts = actor_options(spec, resources[i] if resources is not None else {})
                self.actors.append(remote.options(**opts).remote(spec))
            try:
                placed = ray.get([a.ready.remote() for a in self.actors], timeout=start_timeout)
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
        self.placed: list[tuple[int, str]] = [(int(pid), str(host)) for pid, host in placed]

    def _pack(
        self, options: list[dict[str, Any]], workers: Sequence[int], timeout: float
    ) -> list[dict[str, Any]]:
        """Put the stages of each worker on one node, sharing the worker's CPUs (and GPU).

        A worker's stages take turns on its CPUs, so together they ask for what one of them would: each
        of its V stages asks for 1/V of the most CPUs (and GPUs) any of them wants, inside one
        ``STRICT_PACK`` placement group per worker.  Asking each stage's full share instead would need V
        times the worker's CPUs, which a cluster sized for the workers does not have.
        """
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if len(workers) != len(options):
            raise UsageError(f"{len(workers)} workers given for {len(options)} stages")
        out = [dict(o) for o in options]
        asked: list[str] = []
        for w in dict.fromkeys(workers):
            members = [i for i, x in enumerate(workers) if x == w]
            cpus = max(float(options[i]["num_cpus"]) for i in members) / len(members)
            gpus = max(float(options[i]["num_gpus"]) for i in members) / len(members)
            bundle = {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
            asked.append(f"worker {w}: {len(members)} x {bundle}")
            group = placement_group([dict(bundle) for _ in members], strategy="STRICT_PACK")
            self.placement_groups.append(group)
            for j, i in enumerate(members):
                out[i].update(
                    num_cpus=cpus,
                    num_gpus=gpus,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=j
                    ),
                )
        ready, _ = self._ray.wait(
            [g.ready() for g in self.placement_groups],
            num_returns=len(self.placement_groups),
            timeout=timeout,
        )
        if len(ready) < len(self.placement_groups):
            raise RuntimeStageError(
                f"the workers' placement groups were not granted within {timeout:.0f} s: the cluster lacks "
                f"a node with the CPUs of each worker ({'; '.join(asked)})"
            )
        return out

    def _describe_requests(self, resources: Sequence[Mapping[str, Any]] | None) -> str:
        parts = []
        for i, spec in enumerate(self.specs):
            options = actor_options(spec, resources[i] if resources is not None else {})
            parts.append(f"stage {spec.index}: {options}")
        return "; ".join(parts)

    @property
    def capacity(self) -> int:
        return self._capacity

    def try_submit(self, seq: int, feeds: Mapping[str, np.ndarray]) -> bool:
        self._check()
        with self._lock:
            if len(self._in_flight) >= self._capacity:
                return False
            ref: Any = {name: feeds[name] for name in self.specs[0].receives}
            for actor in self.actors:
                ref = actor.run.remote(seq, ref)
            self._in_flight[ref] = seq
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
                seq = self._in_flight.pop(ref)
            try:
                outputs = self._ray.get(ref)
            except self._ray.exceptions.RayError as e:
                self._failure = RuntimeStageError(_ray_error_text(e, f"micro-batch {seq} failed"))
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
        result: list[WorkerStats] = self._ray.get([a.stats.remote() for a in self.actors])
        return result

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
        if self.placement_groups:
            from ray.util.placement_group import remove_placement_group

            for group in self.placement_groups:
                with contextlib.suppress(Exception):  # already removed with its job
                    remove_placement_group(group)
        with self._lock:
            self._in_flight.clear()
        _OWNED_RAY.release(self._ray, self._ray_generation)


def actor_options(spec: WorkerSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """Ray actor options for ``spec``: its resources (``given`` first) and no restarts or retries."""
    options: dict[str, Any] = {
        "num_cpus": spec.placement.threads,
        "num_gpus": 1 if spec.placement.uses_gpu else 0,
    }
    for key in RESOURCE_KEYS:
        if key in given:
            options[key] = given[key]
    options["max_restarts"] = 0
    options["max_task_retries"] = 0
    options["max_concurrency"] = 1
    return options


def _ray_error_text(e: BaseException, fallback: str) -> str:
    cause = getattr(e, "cause", None)
    if isinstance(cause, RuntimeStageError):
        return str(cause)
    for line in str(e).splitlines():
        if "RuntimeStageError:" in line:
            return line.split("RuntimeStageError:", 1)[1].strip()
    kind = type(e).__name__
    if "ActorDied" in kind or "RayActorError" in kind:
        return f"{fallback}: a stage actor died ({first_line(e)})"
    return f"{fallback}: {first_line(e)}"


# --------------------------------------------------------------------------------------------------
# the resources file


def load_ray_resources(path: Path, k: int) -> list[dict[str, Any]]:
    """Per-stage actor resources from ``path`` (format in the module docstring); errors name the field."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such resources file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not a readable JSON resources file ({e})") from e
    if not isinstance(obj, dict):
        raise UsageError(f"{path}: expected an object with 'default' and/or 'stages'")
    unknown = sorted(set(obj) - {"default", "stages", "description"})
    if unknown:
        raise UsageError(f"{path}: unknown key {unknown[0]!r}; expected 'default', 'stages'")
    default = _entry(path, "default", obj.get("default", {}))
    stages_obj = obj.get("stages", [])
    if not isinstance(stages_obj, list):
        raise UsageError(f"{path}: stages: expected a list with one object per stage")
    if stages_obj and len(stages_obj) != k:
        raise UsageError(f"{path}: stages: lists {len(stages_obj)} entries for a pipeline of {k} stages")
    result = []
    for i in range(k):
        entry = dict(default)
        if stages_obj:
            entry.update(_entry(path, f"stages[{i}]", stages_obj[i]))
        result.append(entry)
    return result


def _entry(path: Path, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{path}: {where}: expected an object")
    unknown = sorted(set(value) - set(RESOURCE_KEYS))
    if unknown:
        raise UsageError(f"{path}: {where}.{unknown[0]}: unknown key; expected {', '.join(RESOURCE_KEYS)}")
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in value:
            v = value[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or not math.isfinite(v):
                raise UsageError(f"{path}: {where}.{key}: expected a number >= 0, got {v!r}")
    if "resources" in value:
        res = value["resources"]
        if not isinstance(res, dict) or not all(
            isinstance(n, str) and isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
            for n, v in res.items()
        ):
            raise UsageError(f"{path}: {where}.resources: expected an object of names to numbers >= 0")
    return dict(value)
