"""What each Ray actor asks of the cluster: the per-stage resources file (``onnxpipe run --ray-resources``),
the options an actor gets from its stage's placement, merged for an actor that hosts several stages; and,
once an actor is lost (told apart from a failed stage), what the cluster left can still host.

When a node dies, Ray restarts the actors it held (``max_restarts``) on another node that has the
resources they ask for, once the cluster has declared the node dead (its health checks failed: about
15-30 s with Ray's defaults, ``health_check_*`` in ``ray start --head --system-config``).  Until then, and
when no node can take them, the driver waits; :func:`missing_resources` says when waiting is in vain.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.core.options import opt
from onnxpipe.runtime.spec import WorkerSpec
from onnxpipe.runtime.trips import NodePlace

RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")


def actor_options(spec: WorkerSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """Ray actor options for ``spec``: its resources (``given`` first), no retries, one call at a time (the
    backend says how often the actor restarts)."""
    return {
        "num_cpus": spec.placement.threads,
        "num_gpus": 1 if spec.placement.uses_gpu else 0,
        **{key: given[key] for key in RESOURCE_KEYS if key in given},
        "max_task_retries": 0,
        "max_concurrency": 1,
    }


def merged_options(options: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The options of one actor hosting stages whose own options are ``options``: its stages take turns,
    so it asks for the most any of them asks, resource by resource."""
    merged = dict(options[0])
    for more in options[1:]:
        for key in ("num_cpus", "num_gpus", "memory"):
            if key in more:
                merged[key] = max(merged.get(key, 0), more[key])
        if "resources" in more:
            custom = dict(merged.get("resources", {}))
            for name, amount in more["resources"].items():
                custom[name] = max(custom.get(name, 0), amount)
            merged["resources"] = custom
    return merged


def check_shared_pins(
    specs: Sequence[WorkerSpec], groups: Sequence[Sequence[int]], resources: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse a worker whose stages ask for different custom resources: one actor hosts them, and it
    would wait for a node that has all of them (for ``host_a`` and ``host_b``: most likely none)."""
    for group in groups:
        asked = [(i, frozenset(resources[i].get("resources", {}))) for i in group]
        named = [(i, names) for i, names in asked if names]
        for i, names in named[1:]:
            first, first_names = named[0]
            if names != first_names:
                raise UsageError(
                    f"stages {specs[first].index} and {specs[i].index} share one worker (one Ray actor) but "
                    f"ask for different custom resources ({sorted(first_names)} and {sorted(names)}); give "
                    "a worker's stages the same ones"
                )


def load_ray_resources(path: Path, k: int) -> list[dict[str, Any]]:
    """Per-stage actor resources from ``path`` (format in the module docstring); errors name the field."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such resources file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not a readable JSON resources file ({e})") from e
    doc = Document(str(path), UsageError, f"write {', '.join(RESOURCE_KEYS)} per stage (see docs/runtime.md)")
    top = doc.read(obj).fields().only({"default", "stages", "description"})
    default = top.get("default", {}).object(_entry)
    stages = top.get("stages", [])
    entries = stages.objects(_entry)
    if entries and len(entries) != k:
        raise stages.fail(f"lists {len(entries)} entries for a pipeline of {k} stages")
    return [{**default, **(entries[i] if entries else {})} for i in range(k)]


def _entry(f: Fields) -> dict[str, Any]:
    """One stage's actor options: counts of CPUs, GPUs and bytes, and custom resources, all >= 0."""
    f.only(RESOURCE_KEYS)
    counts = ("num_cpus", "num_gpus", "memory")
    entry: dict[str, Any] = {key: _amount(f[key]) for key in counts if key in f.raw}
    if "resources" in f.raw:
        entry["resources"] = f["resources"].dict_of(_amount)
    return entry


def _amount(v: Value) -> int | float:
    """A finite number >= 0, as written (Ray takes ``1`` and ``0.5`` alike)."""
    if v.finite() < 0:
        raise v.fail(f"expected a number >= 0, got {v.raw!r}")
    amount: int | float = v.raw
    return amount


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
