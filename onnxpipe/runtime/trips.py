"""A micro-batch's trip through a pipeline on a cluster: each hop's bytes, and when it left and arrived.

The Ray backend gets each stage's :class:`~onnxpipe.runtime.backends.ray_wire.Leg` back with the
micro-batch's outputs (:mod:`~onnxpipe.runtime.backends.ray_wire`), and adds the driver's own times: a
:class:`Trip`.  Its hops are the driver to the first stage, each stage to the next, and the last stage
back to the driver.  Times are wall clocks (``time.time()``) of the machines the stages ran on: exact on
one machine, as good as the machines' clocks agree across several.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.runtime.backends.ray_wire import Leg


@dataclass(frozen=True)
class Hop:
    """One hop of one trip: the tensors' bytes, whether they went inline (in the call itself, not
    through the object store), and the seconds from the sender handing them over to the receiver
    starting on them."""

    bytes: int
    inline: bool
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
    inline_in: bool
    bytes_out: int
    inline_out: bool

    @property
    def hops(self) -> tuple[Hop, ...]:
        """Driver to the first stage, stage to stage, the last stage to the driver."""
        if not self.legs:
            return ()
        hops = [Hop(self.bytes_in, self.inline_in, self.legs[0].received - self.submitted)]
        for before, leg in zip(self.legs, self.legs[1:], strict=False):
            hops.append(Hop(leg.bytes_in, leg.inline_in, leg.received - before.sent))
        hops.append(Hop(self.bytes_out, self.inline_out, self.delivered - self.legs[-1].sent))
        return tuple(hops)

    @property
    def overhead_seconds(self) -> float:
        """The trip's time beyond the stages' own work (their sessions' runs): every hop's and every
        stage's handling of its tensors together, by the driver's clock and the stages' own timers
        (no two machines' clocks compared)."""
        return (self.delivered - self.submitted) - sum(leg.run_seconds for leg in self.legs)
