"""Where a worker runs on a cluster: the Ray node (its id, address and host name) and the process."""

from __future__ import annotations

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
