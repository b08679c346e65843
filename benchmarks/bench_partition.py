"""How close to perfect each partitioner gets on real measured costs, and how fast onnxpipe's solver is.

Part 1, quality.  Every model is profiled once (1 intra-op thread, median of 30 runs, cached under
``benchmarks/results/profiles/``); then for K = 2, 4, 8 each partitioner splits the same per-node costs and
its bottleneck (slowest stage, compute only: the baselines know nothing of transfers) is divided by the
lower bound ``max(total / K, largest node)``:

* ``onnxpipe``   — :func:`onnxpipe.planning.workers.make_plan` (exact, and it keeps onnxruntime's fused groups
  whole);
* ``exact``      — :func:`onnxpipe.partition.solve` on the same costs without the fused-group constraint
  (the true optimum for the objective the baselines are scored with);
* ``equal``      — the same node count per stage (DeepSpeed ``partition_method="uniform"``);
* ``params``     — parameter-balanced (DeepSpeed's default ``partition_method="parameters"``);
* ``torchgpipe`` — torchgpipe's ``balance_by_time`` block-partition heuristic;
* ``node_split`` — :func:`onnxpipe.planning.nodesplit.plan.plan_splitting_nodes`: one node may be cut
  into parts over consecutive stages (parts costed by their share of the node here, so that the figures stay
  deterministic; ``python -m benchmarks nodesplit`` measures them).  Only it can pass the largest-node
  term, so every row also gives each bottleneck over ``total / K`` (``bottleneck_over_average``).

The baselines are :mod:`benchmarks.baselines`; every split is scored with
:func:`onnxpipe.partition.evaluate`, the solver's own cost formula.

Part 2, speed.  Solve time against graph size: ``tools/make_large_graph.make_many_nodes(n)`` graphs up to
100,000 nodes with static costs (load, static costs, ``make_plan`` and the bare ``solve`` timed apart), and
random log-normal costs up to 1,000,000 items; the ``O(K n^2)`` reference DP
(:func:`onnxpipe.reference_dp.reference_solve`) is timed alongside where it finishes in seconds.

Writes ``benchmarks/results/partition.json``: one row per case, ``kind`` telling which part (``quality``,
``make_many_nodes``, ``random``); the geometric means of the quality ratios are its ``summary``.

    python -m benchmarks partition [--models a,b,...] [--max-nodes N] [--max-items N] [--refresh]
        [--out DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks import baselines, reference_dp
from benchmarks.common import (
    benchmark_parser,
    cached_profile,
    compute_costs,
    model_path,
    params_of,
    print_table,
    shown,
    write_result,
)
from onnxpipe import partition
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import load_model
from onnxpipe.planning.nodesplit.plan import plan_splitting_nodes
from onnxpipe.planning.workers import make_plan
from tools.make_large_graph import make_many_nodes

MODELS = (
    "light_resnet50",
    "light_inception_v2",
    "light_densenet121",
    "nudenet",
    "rapidocr_det",
    "rapidocr_rec",
    "gpt2_tiny",
    "bert_tiny",
    "gpt2_small",
)
KS = (2, 4, 8)
METHODS = ("onnxpipe", "exact", "node_split", "equal", "params", "torchgpipe")
GRAPH_SIZES = (1_000, 3_000, 10_000, 30_000, 100_000)
RANDOM_SIZES = (1_000, 10_000, 100_000, 1_000_000)
REFERENCE_MAX_N = 3_500  # the O(K n^2) DP beyond this takes minutes


def best_of(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def quality(models: list[str], refresh: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in models:
        try:
            path = model_path(name)
        except Exception as e:  # noqa: BLE001 - a missing optional model only shortens the table
            print(f"skipped {name}: {e}", file=sys.stderr)
            continue
        view = load_model(path)
        t0 = time.perf_counter()
        profile, cached = cached_profile(name, view, threads=1, runs=30, refresh=refresh)
        took = time.perf_counter() - t0
        print(f"{name}: {'cached profile' if cached else f'profiled in {took:.1f} s'}", file=sys.stderr)
        costs = compute_costs(view, profile)
        params = [float(n.param_bytes) for n in view.compute_nodes]
        n = len(costs)
        for k in KS:
            if k > n:
                continue
            plan = make_plan(view, profile, k)
            exact = partition.solve(costs, k)
            lower = exact.lower_bound
            splits = {
                "equal": baselines.equal_count(n, k),
                "params": baselines.parameter_balanced(params, k),
                "torchgpipe": baselines.torchgpipe_block(costs, k),
            }
            cut = plan_splitting_nodes(view, profile, k, measure=False)
            bottleneck = {
                "onnxpipe": plan.bottleneck_seconds,
                "exact": exact.bottleneck,
                "node_split": cut.plan.bottleneck_seconds,
            }
            for label, bounds in splits.items():
                bottleneck[label] = partition.evaluate(costs, bounds).bottleneck
            ratio = {m: (bottleneck[m] / lower if lower > 0 else 1.0) for m in METHODS}
            rows.append(
                {
                    "kind": "quality",
                    "model": name,
                    "nodes": n,
                    "k": k,
                    "total_ms": sum(costs) * 1e3,
                    "largest_node_share": max(costs) / sum(costs) if sum(costs) else 0.0,
                    "lower_bound_ms": lower * 1e3,
                    "bottleneck_ms": {m: v * 1e3 for m, v in bottleneck.items()},
                    "ratio_to_lower_bound": ratio,
                    "bottleneck_over_average": {m: v / (sum(costs) / k) for m, v in bottleneck.items()},
                    "node_splits": [
                        {"node": s.node, "kind": s.kind, "parts": s.parts, "stages": list(s.stages)}
                        for s in cut.plan.node_splits
                    ],
                    "fused_groups_cut": bool(plan.notes),
                    "profile_exact_fraction": profile.exact_fraction,
                }
            )
    return rows


def _mean_ratio(rows: list[dict[str, Any]], method: str, k: int | None = None) -> float:
    vals = [r["ratio_to_lower_bound"][method] for r in rows if k is None or r["k"] == k]
    return float(np.exp(np.mean(np.log(vals)))) if vals else float("nan")


def speed_graphs(max_nodes: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (s for s in GRAPH_SIZES if s <= max_nodes):
            path = Path(tmp) / f"many_{size}.onnx"
            onnx.save(make_many_nodes(size), str(path))
            t0 = time.perf_counter()
            view = load_model(path)
            t_load = time.perf_counter() - t0
            t0 = time.perf_counter()
            prof = static_profile(view)
            t_static = time.perf_counter() - t0
            costs = compute_costs(view, prof)
            for k in (8, 64):
                t_plan, _ = best_of(partial(make_plan, view, prof, k), repeats=1 if size > 30_000 else 3)
                t_solve, part = best_of(partial(partition.solve, costs, k))
                t_ref = None
                if len(costs) <= REFERENCE_MAX_N and k == 8:
                    t_ref, ref = best_of(partial(reference_dp.reference_solve, costs, k), repeats=1)
                    assert ref.bottleneck == part.bottleneck
                rows.append(
                    {
                        "kind": "make_many_nodes",
                        "n": len(costs),
                        "k": k,
                        "load_s": t_load,
                        "static_costs_s": t_static,
                        "make_plan_s": t_plan,
                        "solve_s": t_solve,
                        "reference_dp_s": t_ref,
                        "ratio": part.ratio,
                    }
                )
    return rows


def speed_random(max_items: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for n in (s for s in RANDOM_SIZES if s <= max_items):
        costs: list[float] = rng.lognormal(0.0, 1.5, n).tolist()
        cut: list[float] = rng.integers(0, 1 << 20, n + 1).astype(np.float64).tolist()
        for k in (8, 64):
            t_solve, part = best_of(partial(partition.solve, costs, k))
            t_bw, _ = best_of(partial(partition.solve, costs, k, cut_bytes=cut, bandwidth=1e9 / n))
            t_tg = None
            if n <= 10_000:
                t_tg, _ = best_of(partial(baselines.torchgpipe_block, costs, k), repeats=1)
            t_ref = None
            if n <= REFERENCE_MAX_N and k == 8:
                t_ref, ref = best_of(partial(reference_dp.reference_solve, costs, k), repeats=1)
                assert ref.bottleneck == part.bottleneck
            rows.append(
                {
                    "kind": "random",
                    "n": n,
                    "k": k,
                    "solve_s": t_solve,
                    "solve_with_transfers_s": t_bw,
                    "torchgpipe_s": t_tg,
                    "reference_dp_s": t_ref,
                    "ratio": part.ratio,
                }
            )
    return rows


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: corpus or sample models")
    parser.add_argument("--max-nodes", type=int, default=max(GRAPH_SIZES), help="largest generated graph")
    parser.add_argument(
        "--max-items", type=int, default=max(RANDOM_SIZES), help="largest random cost sequence"
    )
    parser.add_argument("--refresh", action="store_true", help="re-profile instead of using cached profiles")
    args = parser.parse_args(argv)

    rows = quality([m for m in args.models.split(",") if m], args.refresh)
    print_table(
        "bottleneck / lower bound (1.000 = perfect; compute only; same measured costs for every method)",
        ["model", "nodes", "K", *METHODS, "equal/onnxpipe", "torchgpipe/onnxpipe"],
        [
            [
                r["model"],
                r["nodes"],
                r["k"],
                *(f"{r['ratio_to_lower_bound'][m]:.3f}" for m in METHODS),
                f"{r['bottleneck_ms']['equal'] / r['bottleneck_ms']['onnxpipe']:.2f}x",
                f"{r['bottleneck_ms']['torchgpipe'] / r['bottleneck_ms']['onnxpipe']:.2f}x",
            ]
            for r in rows
        ],
    )
    geomean = {str(k): {m: _mean_ratio(rows, m, k) for m in METHODS} for k in KS} | {
        "all": {m: _mean_ratio(rows, m) for m in METHODS}
    }
    print_table(
        "geometric mean of bottleneck / lower bound over the models",
        ["K", *METHODS],
        [[k, *(f"{v[m]:.3f}" for m in METHODS)] for k, v in geomean.items()],
    )

    graphs = speed_graphs(args.max_nodes)
    print_table(
        "solve time against graph size (make_many_nodes, static costs; best of 3, the largest once)",
        ["nodes", "K", "load", "static costs", "make_plan", "solve", "reference DP", "DP/solve"],
        [
            [
                r["n"],
                r["k"],
                _s(r["load_s"]),
                _s(r["static_costs_s"]),
                _s(r["make_plan_s"]),
                _s(r["solve_s"]),
                _s(r["reference_dp_s"]),
                f"{r['reference_dp_s'] / r['solve_s']:.0f}x" if r["reference_dp_s"] else "-",
            ]
            for r in graphs
        ],
    )
    rand = speed_random(args.max_items)
    print_table(
        "solve time, random log-normal costs (best of 3)",
        ["items", "K", "solve", "with transfers", "torchgpipe", "reference DP", "DP/solve"],
        [
            [
                r["n"],
                r["k"],
                _s(r["solve_s"]),
                _s(r["solve_with_transfers_s"]),
                _s(r["torchgpipe_s"]),
                _s(r["reference_dp_s"]),
                f"{r['reference_dp_s'] / r['solve_s']:.0f}x" if r["reference_dp_s"] else "-",
            ]
            for r in rand
        ],
    )
    summary = {
        "baselines": {
            "equal": "benchmarks.baselines.equal_count (DeepSpeed uniform)",
            "params": "benchmarks.baselines.parameter_balanced (DeepSpeed default)",
            "torchgpipe": "benchmarks.baselines.torchgpipe_block (torchgpipe balance_by_time)",
            "exact": "onnxpipe.partition.solve without the fused-group constraint",
        },
        "objective": "max stage compute seconds / max(total / K, largest node)",
        "quality_geomean": geomean,
    }
    params = params_of(
        args,
        models=[m for m in args.models.split(",") if m],
        ks=list(KS),
        graph_sizes=list(GRAPH_SIZES),
        random_sizes=list(RANDOM_SIZES),
        reference_max_n=REFERENCE_MAX_N,
    )
    out = write_result("partition", params, [*rows, *graphs, *rand], summary=summary, out=args.out)
    print(f"\nwrote {shown(out)}")
    return 0
