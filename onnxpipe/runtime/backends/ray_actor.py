"""The body of a worker's Ray actor: the stages it hosts, opened once their files are on its node.

An actor starts empty.  The driver asks where it landed (:meth:`WorkerActor.node`), ships it what its
node lacks (:meth:`WorkerActor.missing`, :meth:`WorkerActor.write`, :meth:`WorkerActor.seal`; see
:mod:`~onnxpipe.runtime.backends.stage_cache`) or leaves it to read a shared folder, and then opens its
stages (:meth:`WorkerActor.open`).  Ray restarts an actor whose node was lost on another node, empty
again, and the driver sets it up again (files, stages, the data plane) before it sends it anything.

Micro-batches do not come as calls: once its stages are open, the driver opens the actor's end of the
data plane (:meth:`WorkerActor.plane_open`, :meth:`WorkerActor.plane_route`; see
:mod:`~onnxpipe.runtime.backends.ray_serve`), and frames flow from actor to actor.  The driver calls
:meth:`WorkerActor.watch`, which waits for a connection of the plane to break, in a concurrency group
of its own (:data:`WATCH_GROUP`), so that it does not hold up the actor's other calls, which run one at
a time in the order they were made (the chunks of a shipped file among them).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.core.options import opt
from onnxpipe.runtime.backends.process_worker import hosted_stats
from onnxpipe.runtime.backends.ray_plane import Address
from onnxpipe.runtime.backends.ray_serve import Route, StageServer
from onnxpipe.runtime.backends.stage_cache import ShipFailure, ShippedFile, StageCache
from onnxpipe.runtime.nodeplace import NodePlace
from onnxpipe.runtime.session import (
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
)
from onnxpipe.runtime.spec import WorkerSpec

WATCH_GROUP = "watch"
"""The concurrency group of :meth:`WorkerActor.watch` calls: each epoch's waits beside the calls in
flight."""


def node_here() -> NodePlace:
    """The node and process of the Ray worker that calls it."""
    import ray

    return NodePlace(
        node_id=ray.get_runtime_context().get_node_id(),
        address=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        host=socket.gethostname(),
        pid=os.getpid(),
    )


class WorkerActor:
    """A worker's stages (one for a plain split, a worker's for an interleaved one) on one Ray node."""

    def __init__(self, specs: Sequence[WorkerSpec]) -> None:
        self.startup_rss = current_rss_bytes()
        self.specs = {spec.index: spec for spec in specs}
        self.runners: dict[int, StageRunner] = {}
        self.cache = StageCache()
        self.place: NodePlace | None = None
        self.server: StageServer | None = None

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
        """Open this actor's end of the data plane for ``epoch`` (the last one's closed): its address."""
        if self.server is None:
            place = self.node()
            self.server = StageServer(self.runners, place.address, place.short)
        return self.server.open(epoch)

    def plane_route(self, routes: Mapping[int, Route], driver: Address) -> None:
        """Where each hosted stage's outputs go, and where failures go: the driver."""
        assert self.server is not None, "plane_open comes first"
        self.server.route(routes, driver)

    def watch(self, epoch: int) -> str:
        """Wait until a connection of this actor's plane breaks in ``epoch``: why (the driver sets the
        pipeline up again)."""
        assert self.server is not None, "plane_open comes first"
        return self.server.watch(epoch)

    def window(self, stage: int, seconds: float, min_runs: int) -> float:
        """Seconds per run of hosted stage ``stage`` run back to back on what it ran on last, over at
        least ``seconds`` and ``min_runs`` runs: what the node sustains (calibration on a cluster).

        Why a window and not a run's median: a node held to a CPU quota (a container's, a burstable
        instance's) runs a run shorter than the quota's period at full speed and is throttled between
        runs, and a core shared with another stage's actor is shared over time; only a window of
        back-to-back runs longer than the period shows either."""
        received = self.server.received.get(stage) if self.server is not None else None
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
