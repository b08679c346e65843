"""Helpers shared by the benchmarks: corpus models by name, cached profiles, interleaved timing, results.

* :func:`model_path` — a real model by short name (``light_resnet50``, ``nudenet``, ``gpt2_tiny``, ...).
* :func:`cached_profile` — profile a model once at the given threads and input shapes and keep the JSON
  under ``benchmarks/results/profiles/`` (keyed by the model's sha256, threads and shapes), so every
  benchmark partitions the same measured costs and re-running a benchmark does not re-profile.
* :func:`plan_from_bounds` — a :class:`~onnxpipe.plan.Plan` for any split (a baseline's bounds), costed
  exactly like onnxpipe's own plans, so it can be exported and timed side by side.
* :func:`time_interleaved` — medians of single runs, every round running all variants in a fresh random
  order (``/work/shared/design/PROFILING.md``: interleave and shuffle what you compare).
* :func:`write_results` — JSON with the machine and library versions, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from onnxpipe import partition  # noqa: E402
from onnxpipe.core.text import table  # noqa: E402
from onnxpipe.cost.measure import profile_model  # noqa: E402
from onnxpipe.cost.profile import Profile  # noqa: E402
from onnxpipe.ir.load import load_model  # noqa: E402
from onnxpipe.ir.model import ModelView  # noqa: E402
from onnxpipe.plan.sequences import tensor_sizes  # noqa: E402
from onnxpipe.plan.stages import assign_stages  # noqa: E402
from onnxpipe.plan.types import Plan  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROFILES = RESULTS / "profiles"

__all__ = [
    "PROFILES",
    "RESULTS",
    "ROOT",
    "cached_profile",
    "compute_costs",
    "machine",
    "median",
    "model_path",
    "plan_from_bounds",
    "print_table",
    "session",
    "table",
    "time_interleaved",
    "write_results",
]


# --------------------------------------------------------------------------------------------------
# models


def model_path(name: str) -> Path:
    """A corpus model by short name: ``light_<onnx light name>``, ``nudenet``, ``rapidocr_<det|rec|cls>``,
    ``iris``, ``<gpt2_tiny|bert_tiny>[_dynamo]`` (torch exports), or a ``sample_models`` stem."""
    from tools import corpus

    if name.startswith("light_"):
        return corpus.onnx_light(name.removeprefix("light_"))
    if name.startswith("rapidocr_"):
        return corpus.rapidocr(name.removeprefix("rapidocr_"))
    if name == "nudenet":
        return corpus.nudenet()
    if name == "iris":
        return corpus.iris()
    base = name.removesuffix("_dynamo")
    if base in ("gpt2_tiny", "bert_tiny"):
        from tools import export_transformers

        path: Path = getattr(export_transformers, base)(dynamo=name.endswith("_dynamo"))
        return path
    sample = ROOT / "sample_models" / f"{name}.onnx"
    if sample.is_file():
        return sample
    raise ValueError(f"unknown model {name!r}")


def _shapes_key(shapes: Mapping[str, Sequence[int]] | None) -> str:
    if not shapes:
        return "default"
    text = json.dumps({k: list(v) for k, v in sorted(shapes.items())})
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def cached_profile(
    name: str,
    view: ModelView,
    *,
    threads: int = 1,
    shapes: Mapping[str, Sequence[int]] | None = None,
    runs: int = 10,
    warmup: int = 3,
    refresh: bool = False,
) -> tuple[Profile, bool]:
    """``(profile, was_cached)``: the measured profile of ``view``, from the cache when there is one."""
    PROFILES.mkdir(parents=True, exist_ok=True)
    path = PROFILES / f"{name}-{view.sha256[:12]}-t{threads}-r{runs}-{_shapes_key(shapes)}.json"
    if path.is_file() and not refresh:
        prof = Profile.load(path)
        prof.check_matches(view)
        return prof, True
    prof = profile_model(view, threads=threads, runs=runs, warmup=warmup, shapes=shapes)
    tmp = path.with_name(path.name + ".tmp")
    prof.save(tmp)
    os.replace(tmp, path)
    return prof, False


def load(name: str) -> ModelView:
    return load_model(model_path(name))


def compute_costs(view: ModelView, profile: Profile) -> list[float]:
    """Seconds of every compute node, in the view's order (what the partitioner balances)."""
    return [max(0.0, float(profile.node_seconds.get(n.name, 0.0))) for n in view.compute_nodes]


def plan_from_bounds(view: ModelView, profile: Profile, bounds: Sequence[int], label: str) -> Plan:
    """A plan with the given bounds over the compute nodes, costed from ``profile`` like onnxpipe's."""
    costs = compute_costs(view, profile)
    scored = partition.evaluate(costs, bounds)
    sizes = tensor_sizes(view, profile)
    stages = assign_stages(view, bounds, sizes, scored.compute, scored.transfer)
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=scored.bottleneck,
        lower_bound_seconds=scored.lower_bound,
        cost_source=f"{profile.source} ({label})",
        threads=profile.threads,
        bandwidth_bytes_per_s=math.inf,
        input_shapes=profile.input_shapes,
        tensor_bytes=sizes,
    )


# --------------------------------------------------------------------------------------------------
# timing


def session(path: Path, threads: int) -> ort.InferenceSession:
    """A deployment session: CPU, default optimisation level (ALL), ``threads`` intra-op threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_interleaved(
    variants: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 3,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Seconds of ``rounds`` single calls of each variant; every round calls all of them in a new order."""
    names = list(variants)
    for _ in range(warmup):
        for n in names:
            variants[n]()
    rng = random.Random(seed)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        rng.shuffle(names)
        for n in names:
            fn = variants[n]
            t0 = time.perf_counter()
            fn()
            times[n].append(time.perf_counter() - t0)
    return times


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def iqr_fraction(xs: Sequence[float]) -> float:
    """Interquartile range over the median: the noise of one measurement."""
    q1, q3 = np.percentile(np.asarray(xs), [25, 75])
    med = median(xs)
    return float((q3 - q1) / med) if med > 0 else 0.0


# --------------------------------------------------------------------------------------------------
# output


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n{title}")
    print(table(list(headers), [[str(c) for c in r] for r in rows]))


def machine() -> dict[str, Any]:
    import onnx

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_1_5_15": list(os.getloadavg()),
    }


def write_results(name: str, payload: Mapping[str, Any]) -> Path:
    """``benchmarks/results/<name>.json`` with the machine description added, written atomically."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"machine": machine(), **payload}, indent=1, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def _json_default(x: object) -> object:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, tuple | set | frozenset):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


MEMORY_PRELUDE = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT)!r})

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
    except OSError:
        pass
"""
"""Source code a benchmark's child process starts with: ``status("VmRSS"|"VmHWM")`` in bytes and
``reset_peak()``, so each phase's peak memory can be measured on its own."""
