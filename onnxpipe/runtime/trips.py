"""A pipeline on a cluster: where each worker runs (:class:`NodePlace`), and a micro-batch's trip through it,
each hop's bytes, and when it left and arrived.

Each stage adds its :class:`Leg` to the micro-batch's frame on the data plane
(:class:`~onnxpipe.runtime.backends.ray_actor.WorkerActor`), and the driver adds its own times to the legs it
gets back with the outputs: a :class:`Trip`.  Its hops are the driver to the first stage, each stage to the
next, and the last stage back to the driver.  Times are wall clocks (``time.time()``) of the machines the
stages ran on: exact on one machine, as good as the machines' clocks agree across several.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class NodePlace:
    """A worker's node: Ray's node id, the node's IP address, its host name, and the worker's process."""

    node_id: str
    address: str
    host: str
    pid: int

    @property
    def short(self) -> str:
        """``host (address, node 1a2b3c4d)``: enough to tell two nodes of one machine apart."""
        return f"{self.host} ({self.address}, node {self.node_id[:8]})"


def node_here() -> NodePlace:
    """The node and process of the Ray worker that calls it."""
    import ray

    return NodePlace(
        node_id=ray.get_runtime_context().get_node_id(),
        address=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        host=socket.gethostname(),
        pid=os.getpid(),
    )


@dataclass(frozen=True)
class Leg:
    """One stage's part of a micro-batch's trip: wall-clock times (``time.time()``, the one clock
    machines share, to within their clocks' agreement) and its own durations."""

    stage: int
    received: float
    """When its inputs' last byte arrived."""
    run_seconds: float
    """The stage's own work: its session's run."""
    sent: float
    """When its outputs were handed to the plane."""
    bytes_in: int
    """Its inputs' frame on the wire."""


LegValues = tuple[int, float, float, float, int]
"""A :class:`Leg`'s fields in order, as a frame carries them between stages."""


@dataclass(frozen=True)
class Hop:
    """One hop of one trip: the frame's bytes, and the seconds from the sender handing it over to its
    last byte's arrival."""

    bytes: int
    seconds: float


@dataclass(frozen=True)
class Trip:
    seq: int
    submitted: float
    """When the driver handed the micro-batch to the first stage (wall clock)."""
    delivered: float
    """When the driver had its outputs (wall clock)."""
    legs: tuple[Leg, ...]
    bytes_in: int
    bytes_out: int

    @property
    def hops(self) -> tuple[Hop, ...]:
        """Driver to the first stage, stage to stage, the last stage to the driver."""
        if not self.legs:
            return ()
        hops = [Hop(self.bytes_in, self.legs[0].received - self.submitted)]
        for before, leg in zip(self.legs, self.legs[1:], strict=False):
            hops.append(Hop(leg.bytes_in, leg.received - before.sent))
        hops.append(Hop(self.bytes_out, self.delivered - self.legs[-1].sent))
        return tuple(hops)

    @property
    def overhead_seconds(self) -> float:
        """The trip's time beyond the stages' own work (their sessions' runs): every hop's and every
        stage's handling of its tensors together, by the driver's clock and the stages' own timers
        (no two machines' clocks compared)."""
        return (self.delivered - self.submitted) - sum(leg.run_seconds for leg in self.legs)
