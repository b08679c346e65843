"""The cluster's part of a run report (each hop's bytes and time, the lost actors brought back) and of a
generation's (each stage's node, each hop's share of a step's time: :class:`GenerationCluster`).

A hop is the driver to the first stage, a stage to the next, or the last stage back to the driver
(:mod:`onnxpipe.runtime.trips`).  Its time is taken from micro-batches run one at a time, where it is
the hop's own cost (the frame's transfer over the data plane, the receiver's reading it); in the stream it is
mostly the wait behind other micro-batches, and is shown apart.  ``overhead_ms`` is a micro-batch's
time beyond its stages' own work, one at a time: every hop's and every stage's handling of its tensors,
measured with the driver's clock and each stage's timer, no two machines' clocks compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onnxpipe.runtime.backends.ray_resources import Recovery
from onnxpipe.runtime.trips import NodePlace, Trip


@dataclass(frozen=True)
class HopReport:
    """One hop: from and to (``driver`` or a stage number), the bytes of a micro-batch's frame on it,
    and its time."""

    source: str
    target: str
    bytes_per_microbatch: int
    single_ms: float | None
    """Median over the micro-batches run one at a time; None when none was."""
    stream_ms: float | None
    """Median over the measured stream (queueing behind other micro-batches included)."""


def recovery_obj(r: Recovery) -> dict[str, Any]:
    """A lost actor brought back, as the reports' JSON has it: its stages, the node lost and the node it
    runs on now (``host (address, node id)``, and the id), whether the node itself died, the
    micro-batches sent again, and the seconds lost."""
    return {
        "stages": list(r.stages),
        "lost_node": r.lost.short,
        "lost_node_id": r.lost.node_id,
        "new_node": r.now.short,
        "new_node_id": r.now.node_id,
        "node_died": r.node_lost,
        "replayed": r.replayed,
        "seconds_lost": r.seconds,
    }


def hop_reports(
    stream: Sequence[Trip], single: Sequence[Trip], stages: Sequence[int]
) -> tuple[HopReport, ...]:
    """Each hop of a pipeline of ``stages`` (their indexes, in order), from the trips of the stream and
    of the micro-batches run one at a time."""
    trips = [t for t in stream if len(t.legs) == len(stages)]
    if not trips:
        return ()
    ends = ["driver", *(f"stage {s}" for s in stages), "driver"]
    alone = [t for t in single if len(t.legs) == len(stages)]
    return tuple(
        HopReport(
            source=ends[h],
            target=ends[h + 1],
            bytes_per_microbatch=round(statistics.median(t.hops[h].bytes for t in trips)),
            single_ms=statistics.median(t.hops[h].seconds for t in alone) * 1e3 if alone else None,
            stream_ms=statistics.median(t.hops[h].seconds for t in trips) * 1e3,
        )
        for h in range(len(stages) + 1)
    )


def overhead_ms(single: Sequence[Trip]) -> float | None:
    """A micro-batch's median time beyond its stages' own work, one at a time (None: none was run)."""
    values = [t.overhead_seconds for t in single if t.legs]
    return statistics.median(values) * 1e3 if values else None


@dataclass(frozen=True)
class HopShare:
    """One hop of a generation step (as :class:`HopReport`'s ends): its median time per step and its
    share of the steps' time (every step's hop time over every step's time, driver to driver)."""

    source: str
    target: str
    median_ms: float
    share: float


@dataclass(frozen=True)
class GenerationCluster:
    """Where a generation ran on a Ray cluster: each stage's node, each hop's share of a step's time and
    each stage's own (``stage_shares``: its session's runs over the steps' time), and each lost actor
    brought back (the sequences it held rebuilt:
    :attr:`~onnxpipe.runtime.generation.result.Generation.rebuilt`)."""

    stages: tuple[int, ...]
    nodes: tuple[NodePlace, ...]
    """The node of each of :attr:`stages`' actors (Ray's node id, the node's address and host name)."""
    hops: tuple[HopShare, ...]
    stage_shares: tuple[float, ...]
    recoveries: tuple[Recovery, ...]


def hop_shares(
    trips: Sequence[Trip], stages: Sequence[int]
) -> tuple[tuple[HopShare, ...], tuple[float, ...]]:
    """Each hop's share of the steps' time and each stage's, from the steps' trips through the pipeline
    of ``stages`` (empty where no step went through every stage)."""
    whole = [t for t in trips if len(t.legs) == len(stages)]
    total = sum(t.delivered - t.submitted for t in whole)
    if not whole or total <= 0:
        return (), ()
    ends = ["driver", *(f"stage {s}" for s in stages), "driver"]
    hops = []
    for h in range(len(stages) + 1):
        seconds = [t.hops[h].seconds for t in whole]
        hops.append(HopShare(ends[h], ends[h + 1], statistics.median(seconds) * 1e3, sum(seconds) / total))
    shares = tuple(sum(t.legs[i].run_seconds for t in whole) / total for i in range(len(stages)))
    return tuple(hops), shares
