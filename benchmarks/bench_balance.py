"""Are onnxpipe's stages balanced when they actually run?  Measured stage times of exported splits.

For each model with fine-grained nodes (tiny GPT-2, NudeNet's YOLOv8n, a torch BERT, the onnx light
DenseNet-121):

1. profile once at 1 intra-op thread, median of 30 runs (cached under ``benchmarks/results/profiles/``;
   ``--refresh`` re-profiles) at the input shapes below, and split at K = 3 with
   :func:`onnxpipe.planning.workers.make_plan` (``onnxpipe``);
2. make the same number of stages with the baselines, costed with the same profile and exported the
   same way: equal node counts (``equal``, DeepSpeed's uniform), torchgpipe's block partition
   (``torchgpipe``), and onnxpipe's own solver fed static FLOP/byte costs instead of measured ones
   (``static``), and fed the static costs of ONNX's shape inference alone (``static_onnx_shapes``: no
   symbolic second opinion, so the tensors of torch's shape arithmetic take guessed sizes);
3. time every exported stage *alone* (its own onnxruntime session, default optimisation level, the plan's
   1 intra-op thread) on the tensors it receives in the chained run, together with the whole model:
   every round runs all stages of all variants once, in a fresh random order (PROFILING.md: interleave
   and shuffle), and each stage's time is the median over the rounds.

Reported per variant: slowest / mean measured stage time (goal for ``onnxpipe``: at most 1.25), the
slowest stage against onnxpipe's slowest (the throughput ratio), the sum of the stages over the whole
model (the cost of cutting), and the predicted share of each stage (profile costs) against its measured
share.

Writes ``benchmarks/results/balance.json``: a row per model and split (``variant``), with the model's own
figures (the whole model's time, the profile's) in each of its rows.

    python -m benchmarks balance [--rounds N] [--models a,b,...] [--refresh] [--out DIR]
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import baselines
from benchmarks.common import (
    benchmark_parser,
    cached_profile,
    compute_costs,
    iqr_fraction,
    median,
    model_path,
    params_of,
    plan_from_bounds,
    print_table,
    session,
    shown,
    time_interleaved,
    write_result,
)
from onnxpipe import partition
from onnxpipe.cost.static import static_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import make_plan

K = 3
GOAL = 1.25
MODELS: dict[str, dict[str, tuple[int, ...]] | None] = {
    "gpt2_tiny": {"input_ids": (1, 64)},
    "nudenet": {"images": (1, 3, 320, 320)},
    "bert_tiny": {"input_ids": (4, 128), "attention_mask": (4, 128)},
    "light_densenet121": None,  # fixed 1x3x224x224
}
VARIANTS = ("onnxpipe", "static", "static_onnx_shapes", "equal", "torchgpipe")


def bounds_of(plan: Plan) -> tuple[int, ...]:
    b = [0]
    for s in plan.stages:
        b.append(b[-1] + len(s.node_names))
    return tuple(b)


def make_plans(
    view: ModelView, name: str, shapes: dict[str, tuple[int, ...]] | None, runs: int, refresh: bool
) -> tuple[Any, dict[str, Plan]]:
    profile, cached = cached_profile(name, view, threads=1, shapes=shapes, runs=runs, refresh=refresh)
    print(f"{name}: {'cached' if cached else 'new'} profile", file=sys.stderr)
    costs = compute_costs(view, profile)
    n = len(costs)
    static = make_plan(view, static_profile(view, shapes=profile.input_shapes), K)
    onnx_only = make_plan(view, static_profile(view, shapes=profile.input_shapes, symbolic=False), K)
    plans = {
        "onnxpipe": make_plan(view, profile, K),
        "static": plan_from_bounds(view, profile, bounds_of(static), "static-cost split"),
        "static_onnx_shapes": plan_from_bounds(
            view, profile, bounds_of(onnx_only), "static-cost split, ONNX shape inference only"
        ),
        "equal": plan_from_bounds(view, profile, baselines.equal_count(n, K), "equal count"),
        "torchgpipe": plan_from_bounds(view, profile, baselines.torchgpipe_block(costs, K), "torchgpipe"),
    }
    return profile, plans


def stage_inputs(
    manifest: Manifest, sessions: list[Any], feeds: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """The tensors each stage receives when the stages run chained on ``feeds``."""
    values: dict[str, Any] = dict(feeds)
    received = []
    for st, sess in zip(manifest.stages, sessions, strict=True):
        ins = {t.name: values[t.name] for t in st.inputs}
        received.append(ins)
        names = [t.name for t in st.outputs]
        values.update(zip(names, sess.run(names, ins), strict=True))
    return received


def bench_model(
    path: Path,
    name: str,
    shapes: dict[str, tuple[int, ...]] | None,
    rounds: int,
    tmp: Path,
    runs: int,
    refresh: bool,
) -> dict[str, Any]:
    view = load_model(path)
    profile, plans = make_plans(view, name, shapes, runs, refresh)
    threads = plans["onnxpipe"].threads
    feeds = random_feeds(view, dict(profile.input_shapes), 0)
    calls: dict[str, Callable[[], object]] = {}
    full = session(path, threads)
    calls["full"] = lambda: full.run(None, feeds)
    info: dict[str, dict[str, Any]] = {}
    for label, plan in plans.items():
        manifest = export_stages(view, plan, tmp / f"{name}-{label}")
        sessions = [session(tmp / f"{name}-{label}" / s.file, threads) for s in manifest.stages]
        received = stage_inputs(manifest, sessions, feeds)
        for i, (sess, ins, st) in enumerate(zip(sessions, received, manifest.stages, strict=True)):
            outs = [t.name for t in st.outputs]
            calls[f"{label}/{i}"] = partial(sess.run, outs, ins)
        info[label] = {"plan": plan, "manifest": manifest}
    print(f"{name}: timing {len(calls)} sessions x {rounds} rounds", file=sys.stderr)
    times = time_interleaved(calls, rounds=rounds, warmup=3, seed=1)

    full_s = median(times["full"])
    result: dict[str, Any] = {
        "model": name,
        "compute_nodes": len(view.compute_nodes),
        "input_shapes": {k: list(v) for k, v in profile.input_shapes.items()},
        "threads": threads,
        "rounds": rounds,
        "full_model_ms": full_s * 1e3,
        "full_model_iqr": iqr_fraction(times["full"]),
        "profile_total_ms": profile.total_seconds * 1e3,
        "profile_runs": profile.runs,
        "variants": {},
    }
    for label in plans:
        plan = info[label]["plan"]
        measured = [median(times[f"{label}/{i}"]) for i in range(K)]
        predicted = [s.compute_seconds for s in plan.stages]
        m_share = [x / sum(measured) for x in measured]
        p_share = [x / sum(predicted) for x in predicted]
        result["variants"][label] = {
            "bounds": bounds_of(plan),
            "node_counts": [len(s.node_names) for s in plan.stages],
            "predicted_ms": [x * 1e3 for x in predicted],
            "measured_ms": [x * 1e3 for x in measured],
            "iqr_fraction": [iqr_fraction(times[f"{label}/{i}"]) for i in range(K)],
            "predicted_share": p_share,
            "measured_share": m_share,
            "max_share_error": max(abs(a - b) for a, b in zip(p_share, m_share, strict=True)),
            "predicted_max_over_mean": max(predicted) / (sum(predicted) / K),
            "max_over_mean": max(measured) / (sum(measured) / K),
            "slowest_ms": max(measured) * 1e3,
            "sum_over_full": sum(measured) / full_s,
            "bottleneck_ratio_to_lower_bound": partition.evaluate(
                compute_costs(view, profile), bounds_of(plan)
            ).ratio,
        }
    base = result["variants"]["onnxpipe"]["slowest_ms"]
    for v in result["variants"].values():
        v["slowest_vs_onnxpipe"] = v["slowest_ms"] / base
    result["goal_met"] = result["variants"]["onnxpipe"]["max_over_mean"] <= GOAL
    return result


def result_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and variant: the variant's figures after the model's own (but its variants)."""
    return [
        {**{k: v for k, v in r.items() if k != "variants"}, "variant": label, **variant}
        for r in results
        for label, variant in r["variants"].items()
    ]


def _shares(xs: list[float]) -> str:
    return " / ".join(f"{x:.0%}" for x in xs)


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds (median over them)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--profile-runs", type=int, default=30, help="timed runs per profile (median)")
    parser.add_argument("--refresh", action="store_true", help="re-profile instead of using cached profiles")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_balance-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            try:
                path = model_path(name)
            except Exception as e:  # noqa: BLE001 - a missing optional model only shortens the table
                print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            shapes = MODELS.get(name)
            results.append(
                bench_model(path, name, shapes, args.rounds, Path(tmp), args.profile_runs, args.refresh)
            )
    rows = []
    for r in results:
        for label in VARIANTS:
            v = r["variants"][label]
            rows.append(
                [
                    r["model"],
                    label,
                    f"{v['max_over_mean']:.3f}",
                    f"{v['predicted_max_over_mean']:.3f}",
                    f"{v['slowest_ms']:.3f}",
                    f"{v['slowest_vs_onnxpipe']:.2f}x",
                    f"{v['sum_over_full']:.2f}",
                    _shares(v["predicted_share"]),
                    _shares(v["measured_share"]),
                    f"{max(v['iqr_fraction']):.0%}",
                ]
            )
    print_table(
        f"K={K}, each stage timed alone (1 thread, ORT_ENABLE_ALL), median of interleaved shuffled rounds",
        [
            "model",
            "split",
            "max/mean",
            "pred max/mean",
            "slowest ms",
            "vs onnxpipe",
            "sum/full",
            "predicted share",
            "measured share",
            "max IQR",
        ],
        rows,
    )
    for r in results:
        v = r["variants"]["onnxpipe"]
        verdict = "met" if r["goal_met"] else "MISSED"
        print(
            f"{r['model']}: onnxpipe max/mean {v['max_over_mean']:.3f} (goal <= {GOAL}: {verdict}); "
            f"largest share error {v['max_share_error']:.1%}; full model {r['full_model_ms']:.3f} ms"
        )
    summary = {
        "baselines": {
            "equal": "benchmarks.baselines.equal_count",
            "torchgpipe": "benchmarks.baselines.torchgpipe_block on the measured costs",
            "static": "onnxpipe's solver on onnxpipe.cost.static.static_profile costs",
            "static_onnx_shapes": "the same with static_profile(symbolic=False)",
        },
    }
    params = params_of(args, models=[m for m in args.models.split(",") if m], k=K, goal_max_over_mean=GOAL)
    out = write_result("balance", params, result_rows(results), summary=summary, out=args.out)
    print(f"\nwrote {shown(out)}")
    return 0
