"""Calibration's stage times on a machine whose speed drifts: stages in turns against one after another.

How well ``split --calibrate`` (stages timed alone) holds the stages' relative times: the cut that calibration
sets depends on the stages' times relative to each other.  Timed one after the other, each stage's time is
that of its own stretch of minutes, so a machine that runs 10-20% slower for a while (a neighbour on a shared
host) moves the cut for nothing.  :func:`onnxpipe.calibrate.timing.time_in_turns` lets the stages take turns a
few runs at a time.  For each model this benchmark makes one 2-stage plan of its measured profile, then times
the same stage sessions ``--repeats`` times each way, alternating:

* ``blocked``: every stage's ``--runs`` runs in a row, one stage after the other (the baseline, what
  calibration did before: ``time_in_turns(..., block=runs)``);
* ``turns``: the stages taking turns, ``ALONE_BLOCK`` timed runs at a time (what it does now).

For each way it reports the spread over the repeats of the first stage's share of the two stages' time
(``t0 / (t0 + t1)``, what the cut follows): its range in percentage points and its standard deviation,
and the spread of the total ``t0 + t1`` (how much the machine itself drifted meanwhile).  Results:
``benchmarks/results/calibrate.json``::

    python -m benchmarks calibrate [--models resnet50,bert_mini] [--repeats 8] [--runs 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_pipeline import CpuWatch, model_table, run_models
from benchmarks.common import benchmark_parser
from onnxpipe.calibrate.timing import ALONE_BLOCK, ready_stages, scratch_stages, time_in_turns
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.load import load_model
from onnxpipe.planning.workers import make_plan


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    view = load_model(path)
    profile = get_profile(view, ProfileOptions(cost="profile", shapes=shapes))
    plan = make_plan(view, profile, 2)
    blocks = {"blocked": args.runs, "turns": ALONE_BLOCK}
    times: dict[str, list[list[float]]] = {k: [] for k in blocks}
    others: list[float] = []
    with scratch_stages(view, plan) as (out, manifest):
        stages = list(ready_stages(view, profile, out, manifest))
        for r in range(args.repeats):
            with CpuWatch(()) as watch:
                for way in list(blocks) if r % 2 == 0 else list(blocks)[::-1]:
                    times[way].append(time_in_turns(stages, runs=args.runs, block=blocks[way]))
            others.append(watch.others_cores())
            line = ", ".join(
                f"{k} {' / '.join(f'{t * 1e3:.2f}' for t in v[-1])} ms" for k, v in times.items()
            )
            print(
                f"  {name} repeat {r + 1}/{args.repeats}: {line}; others {others[-1]:.2f} cores", flush=True
            )

    def spread(way: str) -> dict[str, float]:
        shares = [t[0] / (t[0] + t[1]) for t in times[way]]
        totals = [t[0] + t[1] for t in times[way]]
        return {
            "share_range_points": (max(shares) - min(shares)) * 100,
            "share_stdev_points": statistics.stdev(shares) * 100 if len(shares) > 1 else 0.0,
            "total_range": max(totals) / min(totals) - 1,
        }

    result = {way: spread(way) for way in blocks}
    return {
        "model": name,
        "repeats": args.repeats,
        "runs": args.runs,
        "block": ALONE_BLOCK,
        "stage_seconds": times,
        "spread": result,
        "turns_x_blocked_share_stdev": result["turns"]["share_stdev_points"]
        / max(result["blocked"]["share_stdev_points"], 1e-12),
        "others_cores": others,
    }


def print_summary(rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n{'model':10s} {'way':8s} {'share range':>12s} {'share sd':>9s} {'total range':>12s}")
    print("-" * 56)
    for row in rows:
        for way, s in row["spread"].items():
            share = f"{s['share_range_points']:10.2f}pp {s['share_stdev_points']:7.2f}pp"
            print(f"{row['model']:10s} {way:8s} {share} {s['total_range'] * 100:11.1f}%")
        print(f"{row['model']:10s} turns x blocked, share sd: {row['turns_x_blocked_share_stdev']:.2f}")
    print("share: the first stage's part of the two stages' time, over the repeats (pp: percentage points)")
    busiest = max(max(row["others_cores"]) for row in rows)
    print(f"other processes used at most {busiest:.2f} cores in any repeat")


def main(argv: list[str]) -> int:
    table = model_table()
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default="resnet50,bert_mini", help="comma-separated: " + ", ".join(table))
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each stage per timing")
    args = parser.parse_args(argv)
    return run_models("calibrate", parser, args, bench_model, print_summary)
