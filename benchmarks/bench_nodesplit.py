"""Past the contiguous bound: plans that cut one dominating node, against the best contiguous split.

For GPT-2 small (torch export, random weights; exported into the corpus cache on first use, about
500 MB, never committed) and the onnx light Inception v2, at K = 4 and 8:

1. profile once (1 intra-op thread, median of 30 runs, default input shapes: GPT-2 at batch 1 and 16
   tokens; cached under ``benchmarks/results/profiles/``, shared with the partition benchmark) and plan
   two ways on the same costs: the exact contiguous split (:func:`onnxpipe.planning.workers.make_plan`)
   and the plan that may cut one node into parts over consecutive stages
   (:func:`onnxpipe.planning.nodesplit.plan.plan_splitting_nodes`, the parts' costs measured); each bottleneck
   is divided by ``total / K`` (the bound without the largest-node term, which only a cut node passes);
2. export both plans and time every stage *alone* (its own onnxruntime session, default optimisation
   level, 1 intra-op thread) on the tensors it receives in the chained run; every round runs all stages
   of both plans once, in a fresh random order, and a stage's time is its median over the rounds.
   Reported: the slowest measured stage of the node-split plan over the slowest of the contiguous one.

Writes ``benchmarks/results/nodesplit.json``: one row per model and K.

    python -m benchmarks nodesplit [--models a,b] [--ks 4,8] [--rounds N] [--seq N] [--refresh] [--out DIR]
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.common import (
    benchmark_parser,
    cached_profile,
    compute_costs,
    median,
    model_path,
    params_of,
    print_table,
    session,
    shown,
    time_interleaved,
    write_result,
)
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest
from onnxpipe.planning.nodesplit.plan import plan_splitting_nodes
from onnxpipe.planning.workers import make_plan

MODELS = ("gpt2_small", "light_inception_v2")
KS = (4, 8)


def shapes_of(name: str, seq: int | None) -> dict[str, tuple[int, ...]] | None:
    """GPT-2 at ``seq`` tokens when given; else the default shapes (batch 1, 16 tokens), the partition
    benchmark's, so that both read one cached profile."""
    return {"input_ids": (1, seq)} if seq is not None and name.startswith("gpt2") else None


def _nothing() -> None:
    return None


def stage_inputs(manifest: Manifest, sessions: list[Any], feeds: dict[str, Any]) -> list[dict[str, Any]]:
    """The tensors each stage receives when the stages run chained on ``feeds`` (a stage that sends
    nothing is not run)."""
    values: dict[str, Any] = dict(feeds)
    received = []
    for st, sess in zip(manifest.stages, sessions, strict=True):
        ins = {t.name: values[t.name] for t in st.inputs}
        received.append(ins)
        names = [t.name for t in st.outputs]
        if names:
            values.update(zip(names, sess.run(names, ins), strict=True))
    return received


def bench(
    name: str, ks: list[int], seq: int | None, rounds: int, refresh: bool, tmp: Path
) -> list[dict[str, Any]]:
    path = model_path(name)
    view = load_model(path)
    profile, cached = cached_profile(
        name, view, threads=1, shapes=shapes_of(name, seq), runs=30, refresh=refresh
    )
    print(f"{name}: {'cached' if cached else 'new'} profile", file=sys.stderr)
    costs = compute_costs(view, profile)
    total = math.fsum(costs)
    rows = []
    feeds = random_feeds(view, dict(profile.input_shapes), 0)
    for k in ks:
        contiguous = make_plan(view, profile, k)
        t0 = time.perf_counter()
        cut = plan_splitting_nodes(view, profile, k)
        planning_s = time.perf_counter() - t0
        average = total / k
        row: dict[str, Any] = {
            "model": name,
            "k": k,
            "input_shapes": {n: list(v) for n, v in profile.input_shapes.items()},
            "total_ms": total * 1e3,
            "largest_node_share": max(costs) / total,
            "contiguous_bottleneck_over_average": contiguous.bottleneck_seconds / average,
            "node_split_bottleneck_over_average": cut.plan.bottleneck_seconds / average,
            "node_split_planning_s": planning_s,
            "node_splits": [
                {
                    "node": s.node,
                    "kind": s.kind,
                    "parts": s.parts,
                    "stages": list(s.stages),
                    "measured": s.measured,
                }
                for s in cut.plan.node_splits
            ],
        }
        calls: dict[str, Callable[[], object]] = {}
        for label, (v, plan) in {
            "contiguous": (view, contiguous),
            "node_split": (cut.view, cut.plan),
        }.items():
            out = tmp / f"{name}-{k}-{label}"
            manifest = export_stages(v, plan, out)
            sessions = [session(out / s.file, 1) for s in manifest.stages]
            received = stage_inputs(manifest, sessions, feeds)
            for i, (sess, ins, st) in enumerate(zip(sessions, received, manifest.stages, strict=True)):
                outs = [t.name for t in st.outputs]
                # a stage whose values all stay behind (shapes and constants are remade where read)
                # sends nothing: nothing to time
                calls[f"{label}/{i}"] = partial(sess.run, outs, ins) if outs else _nothing
        print(f"{name} K={k}: timing {len(calls)} stages x {rounds} rounds", file=sys.stderr)
        times = time_interleaved(calls, rounds=rounds, warmup=2, seed=1)
        slowest = {}
        for label in ("contiguous", "node_split"):
            measured = [median(times[f"{label}/{i}"]) for i in range(k)]
            row[f"{label}_stage_ms"] = [t * 1e3 for t in measured]
            slowest[label] = max(measured)
        row["slowest_stage_node_split_over_contiguous"] = slowest["node_split"] / slowest["contiguous"]
        rows.append(row)
        del calls, times
    return rows


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ks", default=",".join(map(str, KS)))
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of stage timing")
    parser.add_argument("--seq", type=int, help="GPT-2's sequence length, batch 1 (default 16)")
    parser.add_argument("--refresh", action="store_true", help="re-profile instead of using cached profiles")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_nodesplit-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            rows += bench(name, ks, args.seq, args.rounds, args.refresh, Path(tmp))
    print_table(
        "bottleneck / (total / K): the best contiguous split against one node cut into parts; "
        "slowest stage timed alone, node-split over contiguous",
        ["model", "K", "largest node", "contiguous", "node split", "cut", "slowest stage"],
        [
            [
                r["model"],
                r["k"],
                f"{r['largest_node_share']:.1%}",
                f"{r['contiguous_bottleneck_over_average']:.3f}",
                f"{r['node_split_bottleneck_over_average']:.3f}",
                ", ".join(f"{s['node']} x{s['parts']}" for s in r["node_splits"]) or "-",
                f"{r['slowest_stage_node_split_over_contiguous']:.3f}x",
            ]
            for r in rows
        ],
    )
    path = write_result(
        "nodesplit",
        params_of(args, ks=ks),
        rows,
        summary={
            "definition": "bottleneck_over_average = plan bottleneck / (sum of node costs / K); "
            "slowest_stage_node_split_over_contiguous = slowest exported stage timed alone, node-split "
            "plan over contiguous plan, same rounds",
        },
        out=args.out,
    )
    print(f"wrote {shown(path)}")
    return 0
