"""Each link of a cluster measured through the pipeline's own transport: latency and bandwidth between the
Ray nodes that host consecutive devices.

A probe actor lands on each device's node (the device's Ray resources pin it there, as they pin the
stage that runs on the device).  For each pair of consecutive devices and each size (the split's boundary
tensors, and a small one that shows the latency), the first probe returns a tensor of that size as a
stage returns its outputs (:mod:`~onnxpipe.runtime.backends.ray_wire`: inline pieces, or the object store
over :data:`~.ray_wire.INLINE_LIMIT`) and the second takes it as a stage takes its inputs; the hop's time
is from the first handing it over to the second starting on it, as a run's report times a hop
(:mod:`onnxpipe.runtime.trips`), its median over ``repeats`` transfers one at a time.  A straight line
through (bytes, seconds) gives the link: its intercept the latency, the inverse of its slope the
bandwidth (``None``, a free link, where more bytes took no longer).

Times are the machines' wall clocks: exact between nodes of one machine, as good as the machines' clocks
agree across several (NTP keeps them within a millisecond or so on a LAN; sizes of several megabytes make
the bandwidth's share dominate the error).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, error_line
from onnxpipe.runtime.backends.ray_actor import node_here
from onnxpipe.runtime.backends.ray_wire import Header, pack, slots_for, unpack
from onnxpipe.runtime.nodeplace import NodePlace

SMALL_BYTES = 1024
"""The smallest size every link is measured at: its time is nearly all latency."""
WARMUP = 3


class LinkProbe:
    """The body of a probe actor: it emits tensors of a size and takes them as stages do."""

    def node(self) -> NodePlace:
        return node_here()

    def emit(self, nbytes: int, slots: int) -> tuple[Any, ...]:
        tensors = {"x": np.zeros(nbytes, dtype=np.uint8)}
        return pack(tensors, slots, sent=time.time())

    def take(self, header: Header, *pieces: Any) -> float:
        """Seconds from the sender handing the message over to this call starting on it."""
        received = time.time()
        unpack(header, pieces)
        return received - header.sent


@dataclass(frozen=True)
class LinkMeasurement:
    """One link: the nodes at its ends, the median hop seconds at each size, and the fitted link."""

    source: NodePlace
    target: NodePlace
    seconds_by_size: Mapping[int, float]
    latency_s: float
    bandwidth_bytes_per_s: float | None
    """None: a free link (more bytes took no longer, within the measurement)."""


def fit_link(seconds_by_size: Mapping[int, float]) -> tuple[float, float | None]:
    """``(latency, bandwidth)`` of the least-squares line ``seconds = latency + bytes / bandwidth``;
    the latency at least 0, the bandwidth None where the slope is not positive."""
    sizes = np.array(list(seconds_by_size), dtype=np.float64)
    times = np.array(list(seconds_by_size.values()), dtype=np.float64)
    if len(sizes) < 2 or float(np.ptp(sizes)) == 0:
        return max(0.0, float(times.min())), None
    slope, intercept = np.polyfit(sizes, times, 1)
    if not slope > 0 or not math.isfinite(float(slope)):
        return max(0.0, float(np.median(times))), None
    return max(0.0, float(intercept)), 1.0 / float(slope)


def measure_links(
    ray: Any, options: Sequence[Mapping[str, Any]], sizes: Sequence[Sequence[int]], repeats: int
) -> list[LinkMeasurement]:
    """Start a probe per device (``options``: its actor options, in pipeline order) and measure each
    link ``i`` (device ``i`` to ``i + 1``) at ``sizes[i]`` and :data:`SMALL_BYTES`."""
    remote = ray.remote(LinkProbe)
    probes = [remote.options(**o).remote() for o in options]
    try:
        try:
            places: list[NodePlace] = ray.get([p.node.remote() for p in probes], timeout=300)
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeStageError(
                f"the link probes did not start within 300 s: the cluster may lack the resources they "
                f"ask for ({'; '.join(str(dict(o)) for o in options)})"
            ) from e
        out = []
        for i in range(len(probes) - 1):
            measured = {
                n: _hop_seconds(ray, probes[i], probes[i + 1], n, repeats)
                for n in sorted({SMALL_BYTES, *sizes[i]})
            }
            latency, bandwidth = fit_link(measured)
            out.append(LinkMeasurement(places[i], places[i + 1], measured, latency, bandwidth))
        return out
    except ray.exceptions.RayError as e:
        raise RuntimeStageError(f"measuring the links failed: {error_line(e)}") from e
    finally:
        for p in probes:
            ray.kill(p, no_restart=True)


def _hop_seconds(ray: Any, source: Any, target: Any, nbytes: int, repeats: int) -> float:
    """The median seconds of ``repeats`` hops of ``nbytes`` from ``source`` to ``target``, one at a
    time, after :data:`WARMUP`."""
    slots = slots_for({"x": np.zeros(nbytes, dtype=np.uint8)})
    emit = source.emit.options(num_returns=slots)
    times: list[float] = []
    for j in range(WARMUP + repeats):
        seconds = float(ray.get(target.take.remote(*emit.remote(nbytes, slots))))
        if j >= WARMUP:
            times.append(seconds)
    return statistics.median(times)
