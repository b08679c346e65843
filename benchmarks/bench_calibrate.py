"""Calibration's stage times: in turns against one after another; --devices: do plans for speeds hold?

How well ``split --calibrate`` (stages timed alone) holds the stages' relative times: the cut that calibration
sets depends on the stages' times relative to each other.  Timed one after the other, each stage's time is
that of its own stretch of minutes, so a machine that runs 10-20% slower for a while (a neighbour on a shared
host) moves the cut for nothing.  :func:`onnxpipe.core.runtimes.time_in_turns` lets the stages take turns a
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

With ``--devices FILE`` it asks another question: does a plan for devices of different speeds hold, on a
machine that can only time the stages here?  It splits each model (default ``minilm_l6``, the dynamo
export, at its guessed 1x16 tokens) for the devices uncalibrated and calibrated in ``--rounds N`` rounds, adds
the split folders ``--also`` names (made by another onnxpipe: an older commit, to compare before and
after a change), and times every stage of every folder alone in one session, all of them taking turns
``ALONE_BLOCK`` runs at a time (each turn after one untimed run), so that a drift of the machine reaches
every plan alike.  Each run is timed by the wall clock and by the thread's CPU time (one intra-op thread
runs in the caller's: that time leaves out what other processes took of the CPU).  For each plan it
prints the share of the work it planned for each stage on this machine (its estimate on the device times
the device's speed, over stage 0's) against the measured one (each stage alone, over stage 0), and the
calibration's note.  Results: ``benchmarks/results/calibrate_devices.json``::

    python -m benchmarks calibrate --devices examples/devices/speeds_1_3.json [--models minilm_l6]
        [--rounds 3] [--also DIR,DIR] [--repeats 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_pipeline import CpuWatch, model_table, run_models
from benchmarks.common import benchmark_parser
from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, SplitOptions
from onnxpipe.calibrate.timing import ready_engines, scratch_stages
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import ALONE_BLOCK, time_in_turns
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.workers import make_plan
from tools import export_transformers


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
        stages = list(ready_engines(view, profile, out, manifest))
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
    parser.add_argument("--models", default=None, help="comma-separated: " + ", ".join(devices_table()))
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each stage per timing")
    parser.add_argument(
        "--devices",
        type=Path,
        default=None,
        help="a devices file: planned against measured shares of the work of a plan for it",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="calibration rounds of the calibrated plan (--devices)"
    )
    parser.add_argument(
        "--also", default="", help="comma-separated split folders timed with them (--devices)"
    )
    args = parser.parse_args(argv)
    if args.devices is not None:
        args.models = args.models or "minilm_l6"
        return run_models(
            "calibrate_devices", parser, args, bench_devices, print_devices_summary, table=devices_table()
        )
    args.models = args.models or "resnet50,bert_mini"
    return run_models("calibrate", parser, args, bench_model, print_summary, table=table)


# --------------------------------------------------------------------------------------------------
# --devices: planned against measured shares of a plan for devices of different speeds


def devices_table() -> dict[str, tuple[Callable[[], Path], dict[str, tuple[int, ...]] | None]]:
    """The models of ``--devices``: the pipeline benchmark's, and MiniLM-L6 at its guessed sizes."""
    return {"minilm_l6": (lambda: export_transformers.minilm_l6(dynamo=True), None), **model_table()}


@dataclass(frozen=True)
class Variant:
    """One split folder to time: its name in the table and the folder."""

    name: str
    folder: Path


def bench_devices(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    profile = get_profile(load_model(path), ProfileOptions(shapes=shapes or {}))  # measured; both plans' own
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-devices-") as tmp:
        variants = [
            Variant("uncalibrated", _split(path, profile, args, Path(tmp) / "uncalibrated", 0)),
            Variant(
                f"calibrated {args.rounds}",
                _split(path, profile, args, Path(tmp) / "calibrated", args.rounds),
            ),
            *(Variant(f"--also {Path(f).name}", Path(f)) for f in args.also.split(",") if f),
        ]
        with CpuWatch(()) as watch:
            load_before = os.getloadavg()[0]
            times = _time_variants(load_model(path), variants, args)
        others = watch.others_cores()
        rows = [_plan_row(v, t) for v, t in zip(variants, times, strict=True)]
    return {
        "model": name,
        "variants": rows,
        "others_cores": others,
        "load_average": [load_before, os.getloadavg()[0]],
    }


def _split(path: Path, profile: Profile, args: argparse.Namespace, out: Path, rounds: int) -> Path:
    """``path`` split for the devices from ``profile``, calibrated in ``rounds`` rounds (0: not), into
    ``out``."""
    cluster = load_cluster(args.devices)
    api.split(
        path,
        SplitOptions(
            out=out,
            plan=PlanRequest(cluster.size, devices=cluster),
            profile=ProfileOptions(saved=profile),
            calibration=CalibrationOptions(rounds=rounds),
            verify=False,
        ),
    )
    return out


def _time_variants(
    view: ModelView, variants: Sequence[Variant], args: argparse.Namespace
) -> list[dict[str, list[float]]]:
    """Wall and CPU seconds of every run of every stage of every variant, all taking turns."""
    opened = [list(_sessions(view, v.folder)) for v in variants]
    flat = [(i, s, stage) for i, stages in enumerate(opened) for s, stage in enumerate(stages)]
    wall: list[list[float]] = [[] for _ in flat]
    cpu: list[list[float]] = [[] for _ in flat]
    for turn in range(args.repeats * args.runs // ALONE_BLOCK):
        order = range(len(flat)) if turn % 2 == 0 else range(len(flat) - 1, -1, -1)
        for j in order:
            session, names, feeds = flat[j][2]
            session.run(names, feeds)
            for _ in range(ALONE_BLOCK):
                start, started = time.perf_counter(), time.thread_time()
                session.run(names, feeds)
                cpu[j].append(time.thread_time() - started)
                wall[j].append(time.perf_counter() - start)
    out: list[dict[str, list[float]]] = [{"wall": [], "cpu": []} for _ in variants]
    for j, (i, _, _) in enumerate(flat):
        out[i]["wall"].append(statistics.median(wall[j]))
        out[i]["cpu"].append(statistics.median(cpu[j]))
    return out


def _sessions(view: ModelView, folder: Path) -> Iterator[tuple[Any, list[str], dict[str, np.ndarray]]]:
    """Each stage of the split in ``folder`` in onnxruntime with the plan's threads, fed what the
    earlier stages made of seeded random inputs at the profiled shapes."""
    manifest = load_manifest(folder)
    values: dict[str, np.ndarray] = dict(random_feeds(view, manifest.plan.profiled_input_shapes))
    options = session_options(threads=manifest.plan.threads)
    for st in manifest.stages:
        session = open_session(folder / st.file, options)
        feeds = {i.name: values[i.name] for i in session.get_inputs()}
        names = [o.name for o in session.get_outputs()]
        values.update(zip(names, session.run(names, feeds), strict=True))
        yield session, names, feeds


def _plan_row(variant: Variant, times: dict[str, list[float]]) -> dict[str, Any]:
    manifest = load_manifest(variant.folder)
    assert manifest.cluster is not None, f"{variant.folder} was not split for devices"
    speeds = {d.name: d.speed for d in manifest.cluster.devices}
    work = [st.estimated_compute_seconds * speeds[st.device] for st in manifest.stages]
    notes = [n for n in manifest.plan.notes if n.startswith("calibrated")]
    return {
        "variant": variant.name,
        "devices": [st.device for st in manifest.stages],
        "speeds": [speeds[st.device] for st in manifest.stages],
        "nodes": [st.node_count for st in manifest.stages],
        "planned_ratios": [w / work[0] for w in work],
        "measured_ratios_wall": [t / times["wall"][0] for t in times["wall"]],
        "measured_ratios_cpu": [t / times["cpu"][0] for t in times["cpu"]],
        "stage_seconds_wall": times["wall"],
        "stage_seconds_cpu": times["cpu"],
        "note": notes[0] if notes else "",
    }


def print_devices_summary(rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n{'model':10s} {'plan':22s} {'nodes':>11s} {'planned':>9s} {'measured wall':>14s} {'cpu':>6s}")
    print("-" * 78)
    for row in rows:
        for v in row["variants"]:
            nodes = "/".join(str(n) for n in v["nodes"])
            last = len(v["nodes"]) - 1
            print(
                f"{row['model']:10s} {v['variant'][:22]:22s} {nodes:>11s} {v['planned_ratios'][last]:8.2f}x "
                f"{v['measured_ratios_wall'][last]:13.2f}x {v['measured_ratios_cpu'][last]:5.2f}x"
            )
        for v in row["variants"]:
            if v["note"]:
                print(f"  {v['variant']}: {v['note']}")
        print(
            f"  machine: other processes used {row['others_cores']:.2f} cores meanwhile, load average "
            f"{row['load_average'][0]:.2f} before, {row['load_average'][1]:.2f} after"
        )
    print(
        "planned: the last stage's work on this machine over the first's, as the plan shares it out (its "
        "estimate times its device's speed); measured: the last stage alone over the first alone, by the "
        "wall clock and by the thread's CPU time"
    )
