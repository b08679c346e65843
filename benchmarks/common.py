"""Helpers shared by the benchmarks: corpus models by name, cached profiles, interleaved timing, results.

* :func:`model_path` — a real model by short name (``light_resnet50``, ``nudenet``, ``gpt2_tiny``, ...).
* :func:`cached_profile` — profile a model once at the given threads and input shapes and keep the JSON
  under ``benchmarks/results/profiles/`` (keyed by the model's sha256, threads and shapes), so every
  benchmark partitions the same measured costs and re-running a benchmark does not re-profile;
  ``$ONNXPIPE_BENCH_PROFILES`` names another folder (the tests keep theirs under ``.cache/``).
* :func:`plan_from_bounds` — a :class:`~onnxpipe.planning.types.Plan` for any split (a baseline's bounds),
  costed exactly like onnxpipe's own plans, so it can be exported and timed side by side.
* :func:`time_interleaved` — medians of single runs, every round running all variants in a fresh random
  order (``/work/shared/design/PROFILING.md``: interleave and shuffle what you compare).
* :func:`benchmark_parser` and :func:`write_result` — every benchmark's command line (with ``--out DIR``)
  and its one result schema (:func:`result_document`, checked by :func:`schema_problems`), written
  atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import onnx
import onnxruntime as ort

from onnxpipe import partition
from onnxpipe.core.choices import Phase
from onnxpipe.core.text import table
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder_kinds import PhaseShape, phase_shape
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.sequences import tensor_sizes
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan
from tools import corpus, export_transformers

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PROFILES = Path(os.environ.get("ONNXPIPE_BENCH_PROFILES") or RESULTS / "profiles")

__all__ = [
    "MEMORY_PRELUDE",
    "PROFILES",
    "RESULTS",
    "ROOT",
    "SCHEMA",
    "benchmark_parser",
    "cached_profile",
    "compute_costs",
    "git_state",
    "iqr_fraction",
    "machine",
    "median",
    "model_path",
    "params_of",
    "plan_from_bounds",
    "print_table",
    "result_document",
    "run_child",
    "schema_problems",
    "session",
    "shown",
    "table",
    "time_interleaved",
    "write_result",
]


# --------------------------------------------------------------------------------------------------
# models


def model_path(name: str) -> Path:
    """A corpus model by short name: ``light_<onnx light name>``, ``nudenet``, ``rapidocr_<det|rec|cls>``,
    ``iris``, ``silero_vad``, ``<gpt2_tiny|gpt2_tiny_mask|gpt2_small|bert_tiny|minilm_l6>[_dynamo]`` (torch
    exports; ``gpt2_small`` is about 500 MB, exported into the corpus cache on first use), or a
    ``sample_models`` stem."""
    if name.startswith("light_"):
        return corpus.onnx_light(name.removeprefix("light_"))
    if name.startswith("rapidocr_"):
        return corpus.rapidocr(name.removeprefix("rapidocr_"))
    if name == "nudenet":
        return corpus.nudenet()
    if name == "iris":
        return corpus.iris()
    if name == "silero_vad":
        return corpus.silero_vad()
    base = name.removesuffix("_dynamo")
    if base in ("gpt2_tiny", "gpt2_tiny_mask", "gpt2_small", "bert_tiny", "minilm_l6"):
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
    """Where a result was measured: the machine, the libraries, when, and how busy the machine was."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "networkx": nx.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "loadavg_1_5_15": list(os.getloadavg()),
        "autogroup": _autogroup(),
    }


def _autogroup() -> str | None:
    """This process's scheduler autogroup and its nice value (``/proc/self/autogroup``), where Linux has
    one: a benchmark run in a raised group (``bench_pipeline``'s docstring) says so in its result."""
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return None


# --------------------------------------------------------------------------------------------------
# the result schema

SCHEMA = 1
"""Version of the result document below; raise it when a key changes meaning."""


def benchmark_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of benchmark ``module`` (its ``__name__``): named as ``python -m benchmarks``
    runs it, described by its docstring's first line, with the ``--out DIR`` every benchmark takes."""
    name = module.rsplit(".", 1)[-1].removeprefix("bench_")
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks {name}", description=doc.splitlines()[0] if doc else None
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder to write the result to (default: benchmarks/results, where the committed ones are)",
    )
    return parser


def params_of(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """A benchmark's parameters: its arguments but ``--out`` (where it writes is not what it measured),
    and ``extra`` (fixed settings it reports alongside, the models a default stands for...)."""
    return {key: value for key, value in vars(args).items() if key != "out"} | extra


def git_state() -> tuple[str | None, bool | None]:
    """``(HEAD's commit, whether the tree differs from it)``, results left out; ``(None, None)`` outside
    a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", f":(exclude){RESULTS.relative_to(ROOT)}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return sha, bool(status.strip())


def result_document(
    name: str,
    params: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The one shape of every benchmark result.

    ``schema`` (:data:`SCHEMA`); ``name`` (the benchmark, and its variant where it has several, e.g.
    ``pipeline_pinned``); ``git_sha`` of the code measured and ``dirty`` (uncommitted changes besides
    results), so that a figure can be traced to its commit; ``machine`` (:func:`machine`); ``params``,
    the arguments it ran with; ``rows``, one flat-ish dict per measured case; ``summary``, present only
    where the benchmark has figures over all rows (aggregates, the definitions its columns refer to).
    """
    sha, dirty = git_state()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "name": name,
        "git_sha": sha,
        "dirty": dirty,
        "machine": machine(),
        "params": dict(params),
        "rows": [dict(r) for r in rows],
    }
    if summary is not None:
        doc["summary"] = dict(summary)
    return doc


def schema_problems(doc: object) -> list[str]:
    """What makes ``doc`` not a result document (empty when it is one); ``rows`` may not be empty."""
    if not isinstance(doc, dict):
        return [f"a result is a JSON object, not {type(doc).__name__}"]
    problems = []
    expected: dict[str, type | tuple[type, ...]] = {
        "schema": int,
        "name": str,
        "git_sha": (str, type(None)),
        "dirty": (bool, type(None)),
        "machine": dict,
        "params": dict,
        "rows": list,
    }
    for key, kind in expected.items():
        if key not in doc:
            problems.append(f"no {key!r}")
        elif not isinstance(doc[key], kind):
            problems.append(f"{key!r} is a {type(doc[key]).__name__}")
    if doc.get("schema") not in (None, SCHEMA):
        problems.append(f"schema {doc['schema']!r}, expected {SCHEMA}")
    rows = doc.get("rows")
    if isinstance(rows, list):
        if not rows:
            problems.append("no rows")
        problems.extend(f"row {i} is not an object" for i, r in enumerate(rows) if not isinstance(r, dict))
    if "summary" in doc and not isinstance(doc["summary"], dict):
        problems.append("'summary' is not an object")
    unknown = set(doc) - set(expected) - {"summary"}
    if unknown:
        problems.append(f"unknown keys {sorted(unknown)}")
    return problems


def write_result(
    name: str,
    params: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    summary: Mapping[str, Any] | None = None,
    out: Path | None = None,
) -> Path:
    """Write :func:`result_document` to ``<out>/<name>.json`` (default ``benchmarks/results``),
    atomically, and return the path."""
    folder = RESULTS if out is None else out
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_name(path.name + ".tmp")
    doc = result_document(name, params, rows, summary)
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def shown(path: Path) -> str:
    """``path`` relative to the repository where it lies inside it, for the line that says where a
    result went."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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


MEMORY_PRELUDE = """
import json, sys, time

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
``reset_peak()``, so each phase's peak memory can be measured on its own.  Run it with :func:`run_child`,
which starts it in the repository root, so that it imports this checkout's ``onnxpipe``."""


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` in a fresh interpreter started in the repository root (``-c`` puts the
    working folder first on ``sys.path``, so ``onnxpipe`` is this checkout's), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


def add_phase_arguments(parser: argparse.ArgumentParser) -> None:
    """``--prefill-tokens`` and ``--decode-past``: the two shapes the decoder benchmarks profile at."""
    parser.add_argument("--prefill-tokens", type=int, default=64)
    parser.add_argument("--decode-past", type=int, default=255)


def phase_shapes(args: argparse.Namespace) -> dict[Phase, PhaseShape]:
    """The prompt's shape and a generation step's, as :func:`add_phase_arguments` read them."""
    return {
        Phase.PREFILL: phase_shape(Phase.PREFILL, prefill_tokens=args.prefill_tokens),
        Phase.DECODE: phase_shape(Phase.DECODE, decode_past=args.decode_past),
    }
