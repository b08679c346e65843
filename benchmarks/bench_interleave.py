"""Interleaved stages against a contiguous split: throughput, and the weights each worker must hold.

A contiguous split into K stages balances time, but not weights: a CNN's late layers hold most of its
weights, so its time-balanced last stage holds most of them too (ResNet-50's
``weights_share_per_worker`` in ``benchmarks/results/interleave.json``).
``onnxpipe split --stages K*V --workers K`` deals K*V stages out to K workers in turn, so a worker can
take a light slice from the front and a heavy one from the back.  This benchmark asks what that costs in
throughput and buys in memory.  For each model, with measured costs (one profile for both splits), in
rounds whose order alternates, everything pinned alike (:mod:`onnxpipe.runtime.affinity`), one intra-op
thread per worker:

* ``session_1``: the whole model, one session, one thread (``onnxpipe run --compare``'s measurement);
* ``replicas``: K copies of the whole model in K pinned threads, fed in turn (data parallel);
* ``contiguous``: the K-stage split, a pinned thread per stage;
* ``interleaved``: the K*V-stage split on K workers, the V stages of a worker pinned to its CPU;
* ``replicas_processes`` and ``interleaved_processes``: the same two in worker processes (tensors in
  shared memory), a worker's V stages hosted by one process.

Memory per worker: the weights the manifest gives each worker (its stages' ``param_bytes``) as a share
of the model's, and the memory each worker holds against a replica's, measured like ``onnxpipe run
--compare`` does: model memory (a process's peak less its memory before loading) and whole peak RSS
(what the machine pays, the interpreter and onnxruntime included), for a worker's stages hosted by one
process and, for the interleaved split, also with each stage in a process of its own (summed).  The
plan's throughput (one over its bottleneck) is set against the measured one.  Results:
``benchmarks/results/interleave.json`` (``interleave_calibrated.json`` with ``--calibrate``)::

    python -m benchmarks interleave [--models resnet50,yolov8n] [--rounds 6] [--k 2] [--v 2]
        [--calibrate ROUNDS] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_pipeline import alternating_rounds, model_table, run_models
from benchmarks.common import benchmark_parser
from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.choices import LocalMode
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.affinity import cpu_sets
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.pipeline import Pipeline, make_backend
from onnxpipe.runtime.report.baselines import (
    MEMORY_MICROBATCHES,
    replica_memory,
    replicas_measurement,
    session_throughput,
    stage_worker_memory,
)
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement

Feeds = Mapping[str, np.ndarray]
TARGET_SECONDS = 2.5  # one timing of the one-thread session takes about this long
WARMUP = 16


def pipeline_rate(directory: Path, inputs: Sequence[Feeds], mode: LocalMode = "threads") -> float:
    with Pipeline.from_manifest(directory, LocalConfig(mode=mode, pin=True)) as pipe:
        if pipe.pin_note is not None:
            raise SystemExit(pipe.pin_note)
        return measure(pipe, inputs, warmup=WARMUP).throughput_per_s


def replicas_rate(
    directory: Path, model: Path, inputs: Sequence[Feeds], k: int, mode: LocalMode = "threads"
) -> float:
    with Pipeline.from_manifest(
        directory, LocalConfig(mode="threads", pin=True)
    ) as pipe:  # names and pinning only
        return replicas_measurement(
            model,
            inputs,
            pipeline=pipe,
            placement=Placement(threads=1),
            threads=[1] * k,
            mode=mode,
            warmup=WARMUP,
        ).throughput_per_s


def _per_process(stats: Sequence[WorkerStats], value: Callable[[WorkerStats], int | None]) -> dict[int, int]:
    """``value`` of each process, keyed by the first stage it hosts (a stage alone: its own index)."""
    return {min(st.hosted_with or (st.index,)): value(st) or 0 for st in stats}


def worker_memory(
    directory: Path, manifest: Manifest, inputs: Sequence[Feeds], *, apart: bool = False
) -> dict[str, list[int]]:
    """Per worker: its stages' weights (manifest), model memory and peak RSS of its processes (one per
    worker as ``onnxpipe run --compare`` measures it; ``apart``: one per stage, summed over a worker's)."""
    with Pipeline.from_manifest(directory, LocalConfig(mode="threads")) as pipe:
        if apart:
            backend = make_backend(
                pipe.lanes, LocalConfig(mode="processes")
            )  # no workers given: a process per stage
            with Pipeline(
                backend, input_types=pipe.input_types, output_names=pipe.output_names, lanes=pipe.lanes
            ) as alone:
                alone.run_many([inputs[j % len(inputs)] for j in range(MEMORY_MICROBATCHES)])
                stats: Sequence[WorkerStats] | None = alone.stats()
        else:
            stats = stage_worker_memory(pipe, inputs)
    assert stats is not None
    model = _per_process(stats, lambda st: st.model_rss_bytes)
    peak = _per_process(stats, lambda st: st.peak_rss_bytes)
    groups = [manifest.stages_of(w) for w in range(manifest.workers)]
    return {
        "weights": [sum(manifest.stages[s].param_bytes for s in g) for g in groups],
        "model_rss": [sum(m for first, m in model.items() if first in g) for g in groups],
        "peak_rss": [sum(p for first, p in peak.items() if first in g) for g in groups],
    }


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"interleave-{name}-"))
    profile = get_profile(load_model(path), ProfileOptions(cost="profile", shapes=shapes))
    splits = {"contiguous": base / "contiguous", "interleaved": base / "interleaved"}
    api.split(
        path,
        SplitOptions(
            out=splits["contiguous"],
            plan=PlanRequest(args.k),
            profile=ProfileOptions(saved=profile),
            calibration=CalibrationOptions(rounds=args.calibrate),
            verify=False,
        ),
    )
    api.split(
        path,
        SplitOptions(
            out=splits["interleaved"],
            plan=PlanRequest(args.k * args.v, workers=args.k),
            profile=ProfileOptions(saved=profile),
            calibration=CalibrationOptions(rounds=args.calibrate),
            verify=False,
        ),
    )
    manifests = {key: load_manifest(d) for key, d in splits.items()}
    if cpu_sets([1] * args.k) is None:
        raise SystemExit(f"{args.k} workers need {args.k} CPUs this process may use")
    input_shapes = {n: tuple(v) for n, v in manifests["contiguous"].plan.profiled_input_shapes.items()}
    pool = random_inputs(path, input_shapes, 8, seed=0)
    first_cpu = cpu_sets([1])
    assert first_cpu is not None
    whole = Placement(threads=1, cpus=first_cpu[0])
    first = session_throughput(path, pool * 2, placement=whole, warmup=WARMUP)
    n = max(32, min(args.max_microbatches, round(TARGET_SECONDS * first)))
    inputs = [pool[j % len(pool)] for j in range(n)]
    runs: dict[str, Callable[[], float]] = {
        "session_1": lambda: session_throughput(path, inputs, placement=whole, warmup=WARMUP),
        "replicas": lambda: replicas_rate(splits["contiguous"], path, inputs, args.k),
        "contiguous": lambda: pipeline_rate(splits["contiguous"], inputs),
        "interleaved": lambda: pipeline_rate(splits["interleaved"], inputs),
        "replicas_processes": lambda: replicas_rate(splits["contiguous"], path, inputs, args.k, "processes"),
        "interleaved_processes": lambda: pipeline_rate(splits["interleaved"], inputs, "processes"),
    }
    rates, others = alternating_rounds(name, runs, args.rounds)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    memory = {key: worker_memory(d, manifests[key], pool) for key, d in splits.items()}
    memory["interleaved_apart"] = worker_memory(
        splits["interleaved"], manifests["interleaved"], pool, apart=True
    )
    with Pipeline.from_manifest(splits["contiguous"], LocalConfig(mode="threads")) as pipe:
        replica = replica_memory(path, pool, pipeline=pipe, placement=Placement(threads=1))
    total_weights = sum(memory["contiguous"]["weights"])
    return {
        "model": name,
        "k": args.k,
        "v": args.v,
        "microbatches": n,
        "rounds": args.rounds,
        "calibrate_rounds": args.calibrate,
        "nodes_per_stage": {key: [st.node_count for st in m.stages] for key, m in manifests.items()},
        "throughput_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "all_rounds": rates,
        "ratios": {
            "contiguous_x_session_1": ratio("contiguous", "session_1"),
            "interleaved_x_session_1": ratio("interleaved", "session_1"),
            "interleaved_x_contiguous": ratio("interleaved", "contiguous"),
            "contiguous_x_replicas": ratio("contiguous", "replicas"),
            "interleaved_x_replicas": ratio("interleaved", "replicas"),
            "interleaved_processes_x_session_1": ratio("interleaved_processes", "session_1"),
            "interleaved_processes_x_replicas_processes": ratio(
                "interleaved_processes", "replicas_processes"
            ),
            "interleaved_processes_x_interleaved": ratio("interleaved_processes", "interleaved"),
        },
        "planned_throughput_per_s": {key: 1.0 / m.plan.bottleneck_seconds for key, m in manifests.items()},
        "weights_share_per_worker": {
            key: [w / total_weights for w in mem["weights"]] for key, mem in memory.items()
        },
        "model_rss_per_worker": {key: mem["model_rss"] for key, mem in memory.items()},
        "peak_rss_per_worker": {key: mem["peak_rss"] for key, mem in memory.items()},
        "replica_model_rss": replica.model_rss_bytes,
        "replica_peak_rss": replica.peak_rss_bytes,
        "time_slack": manifests["interleaved"].plan.time_slack,
        "notes": list(manifests["interleaved"].plan.notes),
        "others_cores": others,
    }


def print_summary(rows: Sequence[dict[str, Any]]) -> None:
    head = (
        "model",
        "1-thr/s",
        "contig x1",
        "inter x1",
        "inter/cont",
        "cont/repl",
        "inter/repl",
        "proc x1",
        "proc/repl",
    )
    print(f"\n{head[0]:10s} " + " ".join(f"{h:>10s}" for h in head[1:]))
    print("-" * 100)
    for row in rows:
        r = row["ratios"]
        cells = (
            row["throughput_per_s"]["session_1"],
            r["contiguous_x_session_1"],
            r["interleaved_x_session_1"],
            r["interleaved_x_contiguous"],
            r["contiguous_x_replicas"],
            r["interleaved_x_replicas"],
            r["interleaved_processes_x_session_1"],
            r["interleaved_processes_x_replicas_processes"],
        )
        print(f"{row['model']:10s} " + " ".join(f"{c:10.3f}" if c < 10 else f"{c:10.1f}" for c in cells))
    print("ratios are medians of per-round ratios; rounds alternate their order; proc: the interleaved")
    print("split in worker processes (a process per worker) against replicas in processes\n")
    print("per worker: weights (share of the model) | model memory, peak RSS x a replica's | plan x measured")
    for row in rows:
        rep = row["replica_model_rss"] or 0
        rep_peak = row["replica_peak_rss"] or 0
        for key in ("contiguous", "interleaved", "interleaved_apart"):
            shares = " / ".join(f"{s:.0%}" for s in row["weights_share_per_worker"][key])
            rss = " / ".join(f"{m / rep:.2f}" if rep else "-" for m in row["model_rss_per_worker"][key])
            peak = " / ".join(
                f"{m / rep_peak:.2f}" if rep_peak else "-" for m in row["peak_rss_per_worker"][key]
            )
            measured = row["throughput_per_s"].get(key)
            plan = f"{row['planned_throughput_per_s'][key] / measured:.3f}" if measured else "-"
            print(f"  {row['model']:10s} {key:17s} {shares:>12s} | {rss:>12s}, {peak:>12s} | {plan}")
    print("interleaved_apart: the same stages, each in a process of its own (a worker's processes summed)")
    busiest = max(max(row["others_cores"]) for row in rows)
    print(f"other processes used at most {busiest:.2f} cores in any round")


def main(argv: list[str]) -> int:
    table = model_table()
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default="resnet50,yolov8n", help="comma-separated: " + ", ".join(table))
    parser.add_argument("--k", type=int, default=2, help="workers")
    parser.add_argument("--v", type=int, default=2, help="stages per worker in the interleaved split")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-microbatches", type=int, default=300)
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="split both ways with `onnxpipe split --calibrate ROUNDS` (each stage timed alone)",
    )
    args = parser.parse_args(argv)
    return run_models("interleave", parser, args, bench_model, print_summary)
