"""A lost actor, told apart from a failed stage, and what the cluster left can still host.

When a node dies, Ray restarts the actors it held (``max_restarts``) on another node that has the
resources they ask for, once the cluster has declared the node dead (its health checks failed: about
15-30 s with Ray's defaults, ``health_check_*`` in ``ray start --head --system-config``).  Until then, and
when no node can take them, the driver waits; :func:`missing_resources` says when waiting is in vain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxpipe.core.options import opt
from onnxpipe.runtime.trips import NodePlace


@dataclass(frozen=True)
class Recovery:
    """One lost actor brought back: its stages, the node lost and the node it runs on now, the
    micro-batches sent again, and the seconds from the first failed micro-batch to the stages running
    again (the time the pipeline lost, replays aside)."""

    stages: tuple[int, ...]
    lost: NodePlace
    now: NodePlace
    node_lost: bool
    """Whether the node itself died (else only the actor's process did)."""
    replayed: int
    """Micro-batches sent again (``run``); generation steps dropped, their sequences rebuilt by the
    generation loop (``generate``)."""
    seconds: float


def request_of(options: Mapping[str, Any]) -> dict[str, float]:
    """What an actor's options ask of one node, in Ray's resource names (``CPU``, ``GPU``, ...)."""
    asked = {
        "CPU": float(options.get("num_cpus", 0) or 0),
        "GPU": float(options.get("num_gpus", 0) or 0),
        "memory": float(options.get("memory", 0) or 0),
    }
    for name, amount in (options.get("resources") or {}).items():
        asked[str(name)] = float(amount)
    return {k: v for k, v in asked.items() if v > 0}


def missing_resources(request: Mapping[str, float], nodes: Iterable[Mapping[str, Any]]) -> list[str] | None:
    """None when an alive node has every resource of ``request`` (``ray.nodes()``'s totals); else the
    resources no alive node has as much of, or, when each is somewhere but never all on one node, the
    words saying so."""
    alive = [dict(n.get("Resources", {})) for n in nodes if n.get("Alive")]
    if any(all(res.get(k, 0.0) >= v for k, v in request.items()) for res in alive):
        return None
    lacking = [f"{k} {v:g}" for k, v in request.items() if not any(res.get(k, 0.0) >= v for res in alive)]
    return lacking or ["all of them on one node"]


def node_alive(node_id: str, nodes: Iterable[Mapping[str, Any]]) -> bool:
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in nodes)


def stages_text(stages: Sequence[int]) -> str:
    return f"stage{'s' if len(stages) > 1 else ''} {', '.join(str(s) for s in stages)}"


def no_node_text(
    stages: Sequence[int], lost: NodePlace, request: Mapping[str, float], lacking: list[str]
) -> str:
    """The one line of a run that stops because no node left can host a lost actor."""
    asked = ", ".join(f"{k} {v:g}" for k, v in request.items()) or "nothing"
    return (
        f"{stages_text(stages)} lost its node {lost.short} and no node left can take it: it asks for "
        f"{asked}, and no alive node has {', '.join(lacking)}; add a node that has them to the cluster "
        "and run again"
    )


def timed_out_text(stages: Sequence[int], lost: NodePlace, seconds: float, node_dead: bool) -> str:
    """The one line of a run that stops because a lost actor did not come back in time."""
    why = (
        "its node is dead and the nodes that could take it are busy"
        if node_dead
        else "Ray has not declared its node dead yet (its health checks)"
    )
    return (
        f"{stages_text(stages)} lost its actor on {lost.short} and it did not run again within "
        f"{seconds:.0f} s: {why}; give it longer ({opt('ray_restart_timeout')}) or free a node"
    )
