"""What measuring a cluster's links found (:func:`onnxpipe.links`): per link, the nodes at its ends, the
hop's time at each size, and the latency and bandwidth fitted to them, as data, JSON and a table."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.core.text import human_bytes, table
from onnxpipe.runtime.backends.ray_links import LinkMeasurement


@dataclass(frozen=True)
class LinkResult:
    """Link ``source`` -> ``target`` (device names) as measured between their nodes."""

    source: str
    target: str
    measured: LinkMeasurement

    def to_obj(self) -> dict[str, Any]:
        m = self.measured
        return {
            "source": self.source,
            "target": self.target,
            "source_node": {"node_id": m.source.node_id, "address": m.source.address, "host": m.source.host},
            "target_node": {"node_id": m.target.node_id, "address": m.target.address, "host": m.target.host},
            "seconds_by_bytes": {str(n): s for n, s in m.seconds_by_size.items()},
            "latency_s": m.latency_s,
            "bandwidth_bytes_per_s": m.bandwidth_bytes_per_s,
        }

    def link_obj(self) -> dict[str, Any]:
        """The link as a devices file writes it (``null`` bandwidth: free), with where it came from."""
        m = self.measured
        sizes = ", ".join(human_bytes(n) for n in m.seconds_by_size)
        return {
            "bandwidth_bytes_per_s": m.bandwidth_bytes_per_s,
            "latency_s": m.latency_s,
            "description": (
                f"measured over the data plane from {m.source.short} to {m.target.short} at {sizes}"
            ),
        }


@dataclass(frozen=True)
class LinkReport:
    links: tuple[LinkResult, ...]
    written: Path | None = None
    """The devices file written with these links, if one was."""

    def to_obj(self) -> dict[str, Any]:
        return {
            "links": [link.to_obj() for link in self.links],
            "written": str(self.written) if self.written is not None else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_obj(), indent=2, allow_nan=False) + "\n"


def format_links(report: LinkReport) -> str:
    """A row per link: its ends, the hop's time at each size, the latency and the bandwidth."""
    rows = []
    for link in report.links:
        m = link.measured
        times = ", ".join(f"{human_bytes(n)} {s * 1e3:.2f} ms" for n, s in m.seconds_by_size.items())
        bandwidth = m.bandwidth_bytes_per_s
        rows.append(
            [
                f"{link.source} -> {link.target}",
                f"{m.source.short} -> {m.target.short}",
                times,
                f"{m.latency_s * 1e3:.3f} ms",
                "free"
                if bandwidth is None or math.isinf(bandwidth)
                else f"{human_bytes(round(bandwidth))}/s",
            ]
        )
    return table(["link", "nodes", "hop time by size", "latency", "bandwidth"], rows)
