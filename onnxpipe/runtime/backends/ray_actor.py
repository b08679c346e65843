"""The body of a worker's Ray actor: the stages it hosts, opened once their files are on its node.

An actor starts empty.  The driver asks where it landed (:meth:`WorkerActor.node`), ships it what its
node lacks (:meth:`WorkerActor.missing`, :meth:`WorkerActor.write`, :meth:`WorkerActor.seal`; see
:mod:`~onnxpipe.runtime.backends.ray_ship`) or leaves it to read a shared folder, and then opens its
stages (:meth:`WorkerActor.open`).  Ray restarts an actor whose node was lost on another node, empty
again: a call that reaches it before the driver opened it again fails with :class:`StageNotOpen`, which
the driver takes for a micro-batch to send again, not for a stage's failure; a generation step that
reaches it for a sequence whose cache died with the old one fails with :class:`CacheGone`, which the
driver hands the generation loop as that step's :class:`~onnxpipe.core.errors.CacheLost`.

Its calls (:meth:`WorkerActor.run`) take a message of :mod:`~onnxpipe.runtime.backends.ray_wire` (a
header and inline pieces) and return the next one, the stage's :class:`~.ray_wire.Leg` added to the trip.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from onnxpipe.core.errors import RuntimeStageError
from onnxpipe.core.options import opt
from onnxpipe.runtime.backends.process_worker import hosted_stats
from onnxpipe.runtime.backends.ray_wire import Header, Leg, pack, unpack
from onnxpipe.runtime.backends.stage_cache import ShipFailure, ShippedFile, StageCache
from onnxpipe.runtime.nodeplace import NodePlace
from onnxpipe.runtime.session import (
    CacheMissing,
    Record,
    StageFailure,
    StageRunner,
    WorkerStats,
    current_rss_bytes,
)
from onnxpipe.runtime.spec import WorkerSpec


class StageNotOpen(RuntimeError):
    """A call reached an actor whose stages are not open: Ray restarted it, and the driver has not set it
    up again yet.  Its micro-batch is sent again once it has."""


class CacheGone(RuntimeError):
    """A generation step reached an actor that holds no cache of one of its sequences: Ray started it
    again after its node died.  That step fails alone; its sequences are rebuilt by a prefill."""


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

    # ------------------------------------------------------------------------------ running

    def run(self, stage: int, seq: int, slots: int, header: Header, *pieces: Any) -> tuple[Any, ...]:
        """Stage ``stage`` on micro-batch ``seq``: the message ``header, *pieces`` in, the next one out,
        in ``slots`` values."""
        received_at = time.time()
        start = time.perf_counter()
        runner = self.runners.get(stage)
        if runner is None:
            raise StageNotOpen(f"stage {stage} is not open on {self.node().short}")
        received = unpack(header, pieces)
        run_start = time.perf_counter()
        try:
            sends = runner.run(seq, received)
        except CacheMissing as e:
            raise CacheGone(f"{e} (on {self.node().short})") from None
        except StageFailure as e:
            raise RuntimeStageError(str(e)) from None
        run_end = time.perf_counter()
        out = pack(sends, slots, sent=0.0)
        end = time.perf_counter()
        runner.recorder.add(Record(seq, start, run_start, run_end, end, end))
        leg = Leg(
            stage=stage,
            received=received_at,
            run_seconds=run_end - run_start,
            sent=received_at + (end - start),
            bytes_in=header.nbytes,
            inline_in=header.inline,
            pieces_in=header.pieces,
        )
        first: Header = out[0]
        return (replace(first, sent=leg.sent, legs=(*header.legs, leg)), *out[1:])

    def stats(self) -> list[WorkerStats]:
        """One entry per hosted stage (:func:`~.process_worker.hosted_stats`), with this actor's node."""
        stats = hosted_stats(list(self.runners.values()), self.startup_rss)
        return [replace(st, node=self.node()) for st in stats]

    def reset(self) -> None:
        for runner in self.runners.values():
            runner.recorder.reset()
