"""onnxpipe's thread pipeline against the simplest pipeline one could write by hand, on this machine.

It also asks where the rest of the way to K times one session goes.  The ``pipeline`` benchmark shows the
pipeline short of K x the one-thread session on the small models; this asks whether onnxpipe's machinery
(checked and copied inputs, futures, a driver thread, records, bounded channels) costs that, or the split
itself does on this machine.  For each model, split into K stages (measured costs), in rounds whose order
alternates, all pinned to the same CPUs (:func:`onnxpipe.runtime.affinity.cpu_sets`):

* ``session_1``: the whole model, one session, one intra-op thread
  (:func:`onnxpipe.runtime.report.baselines.session_throughput`, as ``onnxpipe run --compare`` measures
  it);
* ``minimal``: K threads, each running one stage's session, joined by ``queue.Queue(2)``, fed by a
  thread of its own: no input checks or copies, no futures, no driver, no records;
* ``onnxpipe``: ``Pipeline.from_manifest(..., pin=True)`` timed by ``onnxpipe.runtime.report.measure``,
  its steady rate (the pipeline's fill left out, as ``minimal`` starts its clock once full).

Both pipelines' CPU time per micro-batch (every thread of this process) is recorded too.  ``--models
mlp`` splits the bundled ``sample_models/mlp.onnx`` at batch 1, whose stages take microseconds: its rate
is what the machinery alone costs per micro-batch.

Then each stage's session time (median over the run) three ways: ``alone`` (its CPU busy, the others
idle), ``together`` (every stage looping on its own CPU at once, nothing handed over: what sharing the
machine's caches and memory costs) and ``piped`` (inside ``minimal``).  Results go to
``benchmarks/results/overhead.json``, with the CPU other processes used in each round (``/proc/stat``
minus this process), so that a disturbed round can be told from a slow one::

    python -m benchmarks overhead [--models gpt2_tiny,bert_tiny] [--rounds 8] [--k 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import queue
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.bench_pipeline import CpuWatch, model_table, run_models
from benchmarks.common import ROOT, benchmark_parser
from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.core.ortsession import session_options
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.affinity import cpu_sets, pin_thread, pinned
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.baselines import session_throughput
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.spec import Placement

Feeds = Mapping[str, np.ndarray]
TARGET_SECONDS = 2.5  # one timing of the one-thread session takes about this long
WARMUP = 16


class Stage:
    """One stage's session, created pinned to its CPU so that onnxruntime's threads stay there."""

    def __init__(self, path: Path, cpu: int) -> None:
        self.cpu = cpu
        with pinned((cpu,)):
            self.session = ort.InferenceSession(
                str(path), session_options(threads=1), providers=["CPUExecutionProvider"]
            )
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, tensors: dict[str, Any]) -> float:
        """Run on ``tensors`` (adding this stage's outputs to them); the seconds the session took."""
        feeds = {n: tensors[n] for n in self.inputs}
        start = time.perf_counter()
        results = self.session.run(self.outputs, feeds)
        took = time.perf_counter() - start
        tensors.update(zip(self.outputs, results, strict=True))
        return took


def minimal_pipeline(stages: Sequence[Stage], inputs: Sequence[Feeds]) -> tuple[float, list[float]]:
    """Outputs per second of the hand-built pipeline over ``inputs`` (after a warm-up) and each stage's
    median session time in it."""
    channels: list[queue.Queue[dict[str, Any] | None]] = [queue.Queue(2) for _ in range(len(stages) + 1)]
    times: list[list[float]] = [[] for _ in stages]

    def work(i: int) -> None:
        pin_thread((stages[i].cpu,))
        while (item := channels[i].get()) is not None:
            times[i].append(stages[i].run(item))
            channels[i + 1].put(item)
        channels[i + 1].put(None)

    def feed() -> None:
        for feeds in [*inputs[:WARMUP], *inputs]:
            channels[0].put(dict(feeds))
        channels[0].put(None)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stages))]
    threads.append(threading.Thread(target=feed))
    for t in threads:
        t.start()
    for _ in range(WARMUP):
        channels[-1].get()
    start = time.perf_counter()
    count = 0
    while channels[-1].get() is not None:
        count += 1
    elapsed = time.perf_counter() - start
    for t in threads:
        t.join()
    return count / elapsed, [statistics.median(ts[WARMUP:]) for ts in times]


def stage_feeds(stages: Sequence[Stage], pool: Sequence[Feeds]) -> list[list[dict[str, Any]]]:
    """For each input of ``pool``, what each stage receives."""
    rows = []
    for feeds in pool:
        tensors: dict[str, Any] = dict(feeds)
        row = []
        for stage in stages:
            row.append({n: tensors[n] for n in stage.inputs})
            stage.run(tensors)
        rows.append(row)
    return rows


def stage_loop(stage: Stage, feeds: Sequence[dict[str, Any]], n: int) -> float:
    """Median seconds of ``n`` runs of ``stage`` on its CPU, cycling through ``feeds``."""
    with pinned((stage.cpu,)):  # the caller's mask back after: later pipelines pin from it
        return statistics.median(stage.run(dict(feeds[j % len(feeds)])) for j in range(n))


def stages_together(
    stages: Sequence[Stage], feeds: Sequence[Sequence[dict[str, Any]]], n: int
) -> list[float]:
    """:func:`stage_loop` of every stage at once, each on its own CPU."""
    medians = [0.0] * len(stages)

    def loop(i: int) -> None:
        medians[i] = stage_loop(stages[i], [row[i] for row in feeds], n)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(stages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return medians


def onnxpipe_rate(directory: Path, inputs: Sequence[Feeds]) -> float:
    """Steady outputs per second of onnxpipe's thread pipeline over ``inputs`` (after a warm-up)."""
    with Pipeline.from_manifest(directory, LocalConfig(mode="threads", pin=True)) as pipe:
        measured = measure(pipe, inputs, warmup=WARMUP)
    return measured.steady_throughput_per_s or measured.throughput_per_s


def cpu_seconds() -> float:
    """CPU seconds every thread of this process has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def trivial_model() -> Path:
    return ROOT / "sample_models" / "mlp.onnx"


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"overhead-{name}-")) / "split"
    profile = get_profile(load_model(path), ProfileOptions(cost="profile", shapes=shapes))
    api.split(
        path,
        SplitOptions(out=out, plan=PlanRequest(args.k), profile=ProfileOptions(saved=profile), verify=False),
    )
    manifest: Manifest = load_manifest(out)
    sets = cpu_sets([1] * args.k)
    if sets is None:
        raise SystemExit(f"{args.k} stages need {args.k} CPUs this process may use")
    cpus = [s[0] for s in sets]
    stages = [Stage(out / st.file, cpus[i]) for i, st in enumerate(manifest.stages)]
    whole = Placement(threads=1, cpus=(cpus[0],))
    input_shapes = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    pool = random_inputs(path, input_shapes, 8, seed=0)
    per_stage = stage_feeds(stages, pool)
    first = session_throughput(path, pool * 2, placement=whole, warmup=WARMUP)
    n = max(32, min(args.max_microbatches, round(TARGET_SECONDS * first)))
    inputs = [pool[j % len(pool)] for j in range(n)]
    alone: list[list[float]] = []
    together: list[list[float]] = []
    piped: list[list[float]] = []
    others: list[float] = []  # cores other processes used during each round: a disturbed round shows

    def minimal() -> float:
        rate, medians = minimal_pipeline(stages, inputs)
        piped.append(medians)
        return rate

    runs: dict[str, Callable[[], float]] = {
        "session_1": lambda: session_throughput(path, inputs, placement=whole, warmup=WARMUP),
        "minimal": minimal,
        "onnxpipe": lambda: onnxpipe_rate(out, inputs),
    }
    rates: dict[str, list[float]] = {k: [] for k in runs}
    cpu_us: dict[str, list[float]] = {"minimal": [], "onnxpipe": []}
    for r in range(args.rounds):
        with CpuWatch(()) as watch:
            for key in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                used = cpu_seconds()
                rates[key].append(runs[key]())
                if key in cpu_us:  # includes the warm-up, which both pipelines run alike
                    cpu_us[key].append(1e6 * (cpu_seconds() - used) / (n + WARMUP))
            alone.append([stage_loop(s, [row[i] for row in per_stage], n // 2) for i, s in enumerate(stages)])
            together.append(stages_together(stages, per_stage, n // 2))
        others.append(watch.others_cores())
        done = ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rates.items())
        print(f"  {name} round {r + 1}/{args.rounds}: {done}; others used {others[-1]:.2f} cores", flush=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    def ms(rows: list[list[float]]) -> list[float]:
        return [1e3 * statistics.median(col) for col in zip(*rows, strict=True)]

    return {
        "model": name,
        "k": args.k,
        "microbatches": n,
        "rounds": args.rounds,
        "cpus": cpus,
        "throughput_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "all_rounds": rates,
        "ratios": {
            "minimal_x_session_1": ratio("minimal", "session_1"),
            "onnxpipe_x_session_1": ratio("onnxpipe", "session_1"),
            "onnxpipe_x_minimal": ratio("onnxpipe", "minimal"),
        },
        "session_1_ms": 1e3 / statistics.median(rates["session_1"]),
        "cpu_us_per_microbatch": {k: statistics.median(v) for k, v in cpu_us.items()},
        "stage_ms": {"alone": ms(alone), "together": ms(together), "piped": ms(piped)},
        "others_cores": others,
    }


def print_summary(rows: Sequence[dict[str, Any]]) -> None:
    head = ("model", "1-thr/s", "minimal/s", "x1-thr", "onnxpipe/s", "x1-thr", "x minimal")
    print(f"\n{head[0]:10s} " + " ".join(f"{h:>10s}" for h in head[1:]))
    print("-" * 76)
    for row in rows:
        t, r = row["throughput_per_s"], row["ratios"]
        cells = (
            t["session_1"],
            t["minimal"],
            r["minimal_x_session_1"],
            t["onnxpipe"],
            r["onnxpipe_x_session_1"],
            r["onnxpipe_x_minimal"],
        )
        print(f"{row['model']:10s} " + " ".join(f"{c:10.3f}" if c < 10 else f"{c:10.1f}" for c in cells))
    print("ratios are medians of per-round ratios; rounds alternate their order\n")
    print("CPU microseconds per micro-batch, all threads (medians): minimal | onnxpipe")
    for row in rows:
        c = row["cpu_us_per_microbatch"]
        print(f"  {row['model']:10s} {c['minimal']:10.0f} | {c['onnxpipe']:.0f}")
    print("stage session ms (medians): alone | every stage looping at once | in the minimal pipeline")
    for row in rows:
        s = row["stage_ms"]
        parts = [" / ".join(f"{x:.2f}" for x in s[key]) for key in ("alone", "together", "piped")]
        print(
            f"  {row['model']:10s} "
            + " | ".join(parts)
            + f"   (one session / K: {row['session_1_ms'] / row['k']:.2f})"
        )
    busiest = max(max(row["others_cores"]) for row in rows)
    print(f"other processes used at most {busiest:.2f} cores in any round")


def main(argv: list[str]) -> int:
    mlp_shapes: dict[str, tuple[int, ...]] = {"x": (1, 64)}
    table = {**model_table(), "mlp": (trivial_model, mlp_shapes)}
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument(
        "--models", default="gpt2_tiny,bert_tiny", help="comma-separated: " + ", ".join(table)
    )
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-microbatches", type=int, default=300)
    args = parser.parse_args(argv)
    return run_models("overhead", parser, args, bench_model, print_summary, table)
