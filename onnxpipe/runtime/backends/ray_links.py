"""Each link of a cluster measured through the pipeline's own transport, the data plane
(:mod:`~onnxpipe.runtime.backends.ray_plane`): latency and bandwidth between the Ray nodes that host
consecutive devices.

A probe actor lands on each device's node (the device's Ray resources pin it there, as they pin the
stage that runs on the device) and opens an endpoint there.  For each pair of consecutive devices and
each size (the split's boundary tensors, and a small one that shows the latency), the first probe sends
frames of that size to the second, one at a time, as a stage sends its outputs; a frame's time is from
its sender handing it over to its last byte's arrival, as a run's report times a hop
(:mod:`onnxpipe.runtime.trips`), its median over ``repeats``.  A straight line through (bytes, seconds)
gives the link: its intercept the latency, the inverse of its slope the bandwidth (``None``, a free link,
where more bytes took no longer).  The sizes go up to a few megabytes at least, so that the bandwidth
is the wire's, not one TCP window's.

Times are the machines' wall clocks: exact between nodes of one machine, as good as the machines' clocks
agree across several (NTP keeps them within a millisecond or so on a LAN; sizes of several megabytes make
the bandwidth's share dominate the error).
"""

from __future__ import annotations

import contextlib
import math
import queue
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, error_line
from onnxpipe.runtime.backends.ray_plane import Address, Endpoint, Frame
from onnxpipe.runtime.trips import NodePlace, node_here

SMALL_BYTES = 1024
"""The smallest size every link is measured at: its time is nearly all latency."""
WARMUP = 3


LARGEST_BYTES = 4 * 1024 * 1024
"""Every link is also measured at this size: large enough that its time is the wire's bandwidth."""
TAKE_TIMEOUT_S = 60.0


class LinkProbe:
    """The body of a probe actor: an endpoint on its node that sends frames of a size and takes them as
    stages do."""

    def __init__(self) -> None:
        self._frames: queue.SimpleQueue[Frame] = queue.SimpleQueue()
        self._endpoint: Endpoint | None = None

    def node(self) -> NodePlace:
        return node_here()

    def open(self) -> Address:
        """Open this probe's endpoint on its node's address: where the probe before it sends."""
        self._endpoint = Endpoint(self.node().address, self._frames.put)
        return self._endpoint.address

    def emit(self, to: Address, nbytes: int) -> None:
        """Send a frame of ``nbytes`` to ``to``, stamped with the time it was handed over."""
        assert self._endpoint is not None, "open comes first"
        payload = {"x": np.zeros(nbytes, dtype=np.uint8)}
        self._endpoint.send(to, time.time(), payload)

    def take(self) -> float:
        """Seconds from the sender handing the next frame over to its last byte's arrival here."""
        frame = self._frames.get(timeout=TAKE_TIMEOUT_S)
        return frame.received - float(frame.meta)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()


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
    """``(latency, bandwidth)`` of a link from its hops' times: the bandwidth the inverse slope of the
    least-squares line through (bytes, seconds) (None where the slope is not positive: a free link),
    the latency the smallest frame's time less its bytes' time at that bandwidth.  Not the line's
    intercept: a rate limiter's bucket lets a small frame through above the link's rate, which pulls
    the intercept below zero; where the smallest frame's time is all the bandwidth's by the line, the
    whole of it is taken for latency."""
    sizes = np.array(list(seconds_by_size), dtype=np.float64)
    times = np.array(list(seconds_by_size.values()), dtype=np.float64)
    small = float(times[int(np.argmin(sizes))])
    if len(sizes) < 2 or float(np.ptp(sizes)) == 0:
        return small, None
    slope, _ = np.polyfit(sizes, times, 1)
    if not slope > 0 or not math.isfinite(float(slope)):
        return small, None
    bandwidth = 1.0 / float(slope)
    latency = small - float(sizes.min()) / bandwidth
    return (latency if latency > 0 else small), bandwidth


def measure_links(
    ray: Any, options: Sequence[Mapping[str, Any]], sizes: Sequence[Sequence[int]], repeats: int
) -> list[LinkMeasurement]:
    """Start a probe per device (``options``: its actor options, in pipeline order) and measure each
    link ``i`` (device ``i`` to ``i + 1``) at ``sizes[i]`` and :data:`SMALL_BYTES`."""
    remote = ray.remote(LinkProbe)
    probes = [remote.options(**o, max_concurrency=2).remote() for o in options]
    try:
        try:
            places: list[NodePlace] = ray.get([p.node.remote() for p in probes], timeout=300)
        except ray.exceptions.GetTimeoutError as e:
            raise RuntimeStageError(
                f"the link probes did not start within 300 s: the cluster may lack the resources they "
                f"ask for ({'; '.join(str(dict(o)) for o in options)})"
            ) from e
        addresses: list[Address] = ray.get([p.open.remote() for p in probes])
        out = []
        for i in range(len(probes) - 1):
            measured = {
                n: _hop_seconds(ray, probes[i], probes[i + 1], addresses[i + 1], n, repeats)
                for n in sorted({SMALL_BYTES, LARGEST_BYTES, *sizes[i]})
            }
            latency, bandwidth = fit_link(measured)
            out.append(LinkMeasurement(places[i], places[i + 1], measured, latency, bandwidth))
        return out
    except ray.exceptions.RayError as e:
        raise RuntimeStageError(f"measuring the links failed: {error_line(e)}") from e
    finally:
        for p in probes:
            with contextlib.suppress(Exception):  # a probe that failed to start has nothing to close
                ray.get(p.close.remote(), timeout=10)
            ray.kill(p, no_restart=True)


def _hop_seconds(ray: Any, source: Any, target: Any, to: Address, nbytes: int, repeats: int) -> float:
    """The median seconds of ``repeats`` frames of ``nbytes`` from ``source`` to ``target``, one at a
    time, after :data:`WARMUP`."""
    times: list[float] = []
    for j in range(WARMUP + repeats):
        source.emit.remote(to, nbytes)
        seconds = float(ray.get(target.take.remote()))
        if j >= WARMUP:
            times.append(seconds)
    return statistics.median(times)
