"""What each Ray actor asks of the cluster: the per-stage resources file (``onnxpipe run --ray-resources``),
the options an actor gets from its stage's placement, merged for an actor that hosts several stages."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxpipe.core.errors import UsageError
from onnxpipe.core.jsonread import Document, Fields, Value
from onnxpipe.runtime.spec import WorkerSpec

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
