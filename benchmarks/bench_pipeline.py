"""A K-stage pipeline (one thread per stage) against the model run without one, on this machine.

For each model the benchmark splits it with ``onnxpipe.api.split`` (measured costs by default), then
measures, in rounds whose order is shuffled:

* ``pipeline_processes``: the split run by ``onnxpipe.runtime`` with worker processes (shared memory);
* ``pipeline_threads``: the same with worker threads;
* ``session_1``: the original model, one onnxruntime session, one intra-op thread, in this process;
* ``session_K``: the same with K threads;
* ``replicas``: K copies of the whole model, one worker thread each (one intra-op thread), fed in
  turn: data parallelism in the thread pipeline's own mode, so neither pays for copies the other is
  spared (``onnxpipe run --compare`` measures them the same way);
* ``replicas_processes``: the same with one worker process each, the baseline of the process pipeline
  and where a replica's memory is measured;
* ``pipeline_weights``: a second split of the same profile with the least weight memory per worker
  (``--devices`` of K one-thread CPUs whose ``memory_bytes`` is the smallest that any split fits, as
  the planner's memory error reports it), run with worker threads: what holding about 1/K of the weights
  per worker costs in throughput when the time-balanced split does not.

Throughput is steady-state: outputs per second between the first and the last output of a run of
micro-batches (a pipeline's fill, one pass through all stages, excluded; the JSON also has the
throughput over the whole run).  It prints the median throughput of each and the median per-round ratios
of the pipeline to each, the
measured time of every stage against the manifest's estimate, and the peak memory of every worker: a
stage worker against a replica, both as peak RSS and as "model memory" (peak minus the worker's memory
before it loaded its model).  Results go to ``benchmarks/results/pipeline.json``, named after the
variant: ``pipeline_pinned`` with ``--pin``, ``..._calibrated`` with ``--calibrate``, ``..._in_pipeline``
(or ``_in_auto``) with ``--calibrate-in``; a row per model.

Against the replicas it also gives a ceiling (:func:`onnxpipe.runtime.report.ceiling.balanced_ceiling`): from
the replicas' own records, how fast each of their CPUs ran over short windows, and so how close to them
a perfectly balanced pipeline on those CPUs could have come.  On a virtual machine whose vCPUs' speeds
wander apart, that is below 1 whatever the split, and ``x_replicas_over_ceiling`` tells what the
pipeline itself loses from what the machine does.

The estimates were made while the split was calibrated (or profiled), and the machine's speed may have
changed since: the one-thread session is timed right after the split as well as in the rounds, and
``estimate_error_at_machine_speed`` scales each estimate by that change (``machine_speed.slowdown``)
before comparing, which separates what the estimates got wrong from how fast the machine ran meanwhile.

The machine may be shared: every measurement records how much CPU *other* processes used meanwhile
(``/proc/stat`` minus our own processes), in cores, and the summary gives the medians over all rounds
and over the quiet ones (others below ``--quiet`` cores) separately.  ``--wait-quiet S`` waits up to S
seconds before each round for the others to go quiet.  Where that never happens (several people's jobs
on two cores) and Linux's autogroup scheduling is on, running the benchmark as its own session with a
raised group priority keeps other sessions from skewing the comparison (root; tell the others)::

    setsid sh -c 'echo -10 > /proc/self/autogroup; exec python -m benchmarks pipeline'

    python -m benchmarks pipeline [--models gpt2_tiny,bert_tiny,bert_mini,yolov8n,resnet50]
        [--rounds 5] [--pin] [--calibrate ROUNDS [--calibrate-in alone|pipeline|auto]] [--out DIR]

``--pin`` pins every variant alike (``onnxpipe run --pin``): each pipeline worker and each replica to a
CPU of its own, each session to the first CPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.common import benchmark_parser, params_of, shown, write_result
from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import CalibrationMode, values
from onnxpipe.core.errors import MemoryFitError
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.affinity import assign_cpus, cpu_sets, pinned
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.pipeline import Pipeline, make_backend
from onnxpipe.runtime.report.ceiling import WINDOW_RUNS, balanced_ceiling
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement, model_spec
from tools import corpus, export_transformers

Feeds = Mapping[str, np.ndarray]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET_SECONDS = 3.0  # one measurement of the one-thread session takes about this long
MIN_MICROBATCHES = 32
REFERENCE_PASSES = 3  # passes over the 8 distinct inputs that time the session right after the split


def model_table() -> dict[str, tuple[Callable[[], Path], dict[str, tuple[int, ...]] | None]]:
    return {
        "gpt2_tiny": (lambda: export_transformers.gpt2_tiny(dynamo=False), {"input_ids": (4, 128)}),
        "bert_tiny": (
            lambda: export_transformers.bert_tiny(dynamo=False),
            {"input_ids": (4, 128), "attention_mask": (4, 128)},
        ),
        "bert_mini": (
            lambda: export_transformers.bert_mini(dynamo=False),
            {"input_ids": (4, 128), "attention_mask": (4, 128)},
        ),
        "yolov8n": (corpus.nudenet, {"images": (1, 3, 320, 320)}),
        "resnet50": (lambda: corpus.onnx_light("resnet50"), None),
    }


# --------------------------------------------------------------------------------------------------
# CPU used by other processes


def _busy_ticks() -> int:
    with open("/proc/stat", encoding="ascii") as f:
        parts = f.readline().split()[1:]
    values = [int(v) for v in parts]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values[:8]) - idle


def _process_ticks(pid: int | str) -> int:
    """CPU ticks of ``pid``; for ``"self"`` those of its children that ended and were joined meanwhile
    too (worker processes a variant started and stopped inside the watch)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        own = int(fields[11]) + int(fields[12])  # utime + stime
        return own + (int(fields[13]) + int(fields[14]) if pid == "self" else 0)  # + cutime + cstime
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class CpuWatch:
    """CPU that processes other than this one, its joined children and ``pids`` (a process hosting
    several stages appears once per stage there) used while the watch ran."""

    pids: Sequence[int]
    start: float = 0.0
    busy: int = 0
    ours: int = 0

    def __enter__(self) -> CpuWatch:
        self.start = time.perf_counter()
        self.busy = _busy_ticks()
        self.ours = _process_ticks("self") + sum(_process_ticks(p) for p in set(self.pids))
        return self

    def others_cores(self) -> float:
        wall = time.perf_counter() - self.start
        busy = _busy_ticks() - self.busy
        ours = _process_ticks("self") + sum(_process_ticks(p) for p in set(self.pids)) - self.ours
        return max(0.0, (busy - ours) / CLOCK_TICKS / wall) if wall > 0 else 0.0

    def __exit__(self, *exc: object) -> None:
        return None


def alternating_rounds(
    label: str, runs: Mapping[str, Callable[[], float]], rounds: int
) -> tuple[dict[str, list[float]], list[float]]:
    """``(rates, others)``: each of ``runs`` (a rate per call) once per round, in their order on even
    rounds and reversed on odd ones, so that neither side always goes first; and the cores other
    processes used in each round.  Prints a line per round."""
    rates: dict[str, list[float]] = {key: [] for key in runs}
    others: list[float] = []
    for r in range(rounds):
        with CpuWatch(()) as watch:
            for key in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                rates[key].append(runs[key]())
        others.append(watch.others_cores())
        done = ", ".join(f"{key} {v[-1]:.1f}/s" for key, v in rates.items())
        print(f"  {label} round {r + 1}/{rounds}: {done}; others used {others[-1]:.2f} cores", flush=True)
    return rates, others


def wait_for_quiet(threshold: float, patience: float, window: float = 2.0) -> float:
    """Wait (at most ``patience`` s) until other processes use under ``threshold`` cores; their last load."""
    deadline = time.monotonic() + patience
    while True:
        with CpuWatch(()) as watch:
            time.sleep(window)
        others = watch.others_cores()
        if others < threshold or time.monotonic() > deadline:
            return others
        time.sleep(5.0)


# --------------------------------------------------------------------------------------------------
# variants


@dataclass
class Variant:
    """``run`` returns (throughput over the whole run, steady throughput between first and last output)."""

    name: str
    run: Callable[[Sequence[Feeds]], tuple[float, float]]
    pids: Callable[[], list[int]] = list
    throughputs: list[float] = field(default_factory=list)
    overall: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)


def session_variant(name: str, model: Path, threads: int, pin: bool = False) -> Variant:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    sets = cpu_sets([threads]) if pin else None
    cpus = sets[0] if sets else ()
    with pinned(cpus):  # its intra-op threads, made now, keep these CPUs
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: Sequence[Feeds]) -> tuple[float, float]:
        start = time.perf_counter()
        done = []
        with pinned(cpus):  # the calling thread runs the first of them
            for feeds in inputs:
                session.run(names, dict(feeds))
                done.append(time.perf_counter())
        steady = (len(done) - 1) / (done[-1] - done[0]) if len(done) > 1 else math.nan
        return len(inputs) / (done[-1] - start), steady

    return Variant(name, run)


def pipeline_variant(name: str, pipe: Pipeline, runs: list[list[WorkerStats]]) -> Variant:
    def run(inputs: Sequence[Feeds]) -> tuple[float, float]:
        m = measure(pipe, inputs)
        runs.append(list(m.stats))
        steady = m.steady_throughput_per_s  # None only for the short warm-up runs
        return m.throughput_per_s, math.nan if steady is None else steady

    return Variant(name, run, pipe.worker_pids)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


# --------------------------------------------------------------------------------------------------
# the weight-balanced split


def _cpus(k: int, memory_bytes: int) -> Cluster:
    devices = tuple(
        Device(name=f"cpu{i}", memory_bytes=memory_bytes, engine=EngineConfig(threads=1)) for i in range(k)
    )
    return Cluster(devices=devices, links=tuple(Link() for _ in range(k - 1)), source="bench_pipeline")


def weight_balanced_split(path: Path, k: int, profile: Profile, out: Path) -> api.SplitResult:
    """The split of ``profile`` whose largest worker memory (weights + buffered inputs) is least.

    The planner's memory error names the smallest per-device memory any split fits; splitting again at
    exactly that memory gives the fastest of the splits that fit it.
    """
    need = 1
    for attempt in range(4):
        try:
            return api.split(
                path,
                SplitOptions(
                    out=out / f"weights{attempt}",
                    plan=PlanRequest(k, devices=_cpus(k, need)),
                    profile=ProfileOptions(saved=profile),
                    verify=False,
                ),
            )
        except MemoryFitError as e:  # the partitioner's bound, then the final check with shared weights
            need = max(need + 1, math.ceil(e.smallest_fit_bytes * (1 + 1e-9)) + 1)
    raise RuntimeError(f"{path.name}: no split fits {need} bytes per worker after four tries")


# --------------------------------------------------------------------------------------------------
# one model


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    k = args.k
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    out = work / "split"
    start = time.perf_counter()
    profile = get_profile(load_model(path), ProfileOptions(cost=args.cost, shapes=shapes))
    options = SplitOptions(
        profile=ProfileOptions(saved=profile),
        calibration=CalibrationOptions(rounds=args.calibrate, mode=args.calibrate_in),
        verify=False,
    )
    result = api.split(path, dataclasses.replace(options, out=out, plan=PlanRequest(k)))
    split_s = time.perf_counter() - start
    manifest = load_manifest(out)
    input_shapes = {n: tuple(v) for n, v in manifest.plan.profiled_input_shapes.items()}
    pool = random_inputs(path, input_shapes, 8, seed=0)

    single = session_variant("session_1", path, 1, args.pin)
    per_item = 1.0 / single.run(pool)[0]
    # the machine's speed when the estimates were made: the one-thread session right after the split
    reference_ms = median([1e3 / single.run(pool)[1] for _ in range(REFERENCE_PASSES)])
    balanced = weight_balanced_split(path, k, profile, work)
    count = int(min(args.max_microbatches, max(MIN_MICROBATCHES, math.ceil(TARGET_SECONDS / per_item))))
    inputs = [pool[j % len(pool)] for j in range(count)]

    stage_runs: list[list[WorkerStats]] = []
    thread_runs: list[list[WorkerStats]] = []
    replica_runs: list[list[WorkerStats]] = []
    replica_thread_runs: list[list[WorkerStats]] = []
    pipe_p = Pipeline.from_manifest(out, LocalConfig(mode="processes", pin=args.pin), threads=1)
    pipe_t = Pipeline.from_manifest(out, LocalConfig(mode="threads", pin=args.pin), threads=1)
    pipe_w = Pipeline.from_manifest(balanced.out_dir, LocalConfig(mode="threads", pin=args.pin), threads=1)
    names = [t.name for t in manifest.model_inputs]
    outs = [o.name for o in manifest.model_outputs]
    lanes = [[model_spec(path, names, outs, Placement(threads=1), index=i)] for i in range(k)]
    if args.pin:
        lanes, _ = assign_cpus(lanes)
    replicas, replicas_p = (
        Pipeline(
            make_backend(lanes, LocalConfig(mode=mode)),
            input_types={t.name: t.dtype for t in manifest.model_inputs},
            output_names=outs,
            lanes=lanes,
        )
        for mode in ("threads", "processes")
    )
    variants = [
        pipeline_variant("pipeline_processes", pipe_p, stage_runs),
        pipeline_variant("pipeline_threads", pipe_t, thread_runs),
        single,
        session_variant(f"session_{k}", path, k, args.pin),
        pipeline_variant("replicas", replicas, replica_thread_runs),
        pipeline_variant("replicas_processes", replicas_p, replica_runs),
        pipeline_variant("pipeline_weights", pipe_w, []),
    ]
    try:
        for v in variants:  # warm-up
            v.run(inputs[: max(4, 2 * k)])
        stage_runs.clear()
        thread_runs.clear()
        replica_runs.clear()
        replica_thread_runs.clear()
        rng = random.Random(0)
        for r in range(args.rounds):
            if args.wait_quiet > 0:
                wait_for_quiet(args.quiet, args.wait_quiet)
            order = list(variants)
            rng.shuffle(order)
            for v in order:
                with CpuWatch(v.pids()) as watch:
                    overall, steady = v.run(inputs)
                v.throughputs.append(steady)
                v.overall.append(overall)
                v.others.append(watch.others_cores())
            print(
                f"  {name} round {r + 1}/{args.rounds}: "
                + ", ".join(f"{v.name} {v.throughputs[-1]:.1f}/s ({v.others[-1]:.2f})" for v in variants),
                flush=True,
            )
    finally:
        for p in (pipe_p, pipe_t, replicas, replicas_p, pipe_w):
            p.close()

    by = {v.name: v for v in variants}

    cpus = os.cpu_count() or k
    # a variant on fewer cores than the machine has leaves the rest to others: not a disturbance
    spare = {v.name: max(0, cpus - (1 if v.name == "session_1" else k)) for v in variants}

    def ratio(numerator: str, base: str, quiet_only: bool) -> float:
        num, den = by[numerator], by[base]
        rs = [
            a / b
            for a, b, oa, ob in zip(num.throughputs, den.throughputs, num.others, den.others, strict=True)
            if not quiet_only or (oa < args.quiet + spare[numerator] and ob < args.quiet + spare[base])
        ]
        return median(rs)

    def own_mode(pipe: str, base: str) -> str:
        """Each pipeline is compared with the replicas run in its own local mode."""
        return "replicas_processes" if pipe == "pipeline_processes" and base == "replicas" else base

    # the one-thread session's time now against right after the split: the machine's own drift, which
    # no estimate made then can foresee (a shared VM's speed can change within minutes: docs/runtime.md)
    session_now_ms = median([1e3 / x for x in by["session_1"].throughputs])
    slowdown = session_now_ms / reference_ms
    stages: list[dict[str, Any]] = []
    for i, st in enumerate(manifest.stages):
        estimated = st.estimated_compute_seconds * 1e3
        measured = {
            mode: median([r.run_seconds * 1e3 for stats in runs for r in stats[i].records])
            for mode, runs in (("threads", thread_runs), ("processes", stage_runs))
        }
        last = stage_runs[-1][i]
        stages.append(
            {
                "index": i,
                "estimated_ms": estimated,
                "measured_ms": measured,
                "estimate_error": {m: (estimated - v) / v for m, v in measured.items()},
                "estimate_error_at_machine_speed": {
                    m: (estimated * slowdown - v) / v for m, v in measured.items()
                },
                "peak_rss_bytes": last.peak_rss_bytes,
                "model_rss_bytes": last.model_rss_bytes,
                "param_bytes": st.param_bytes,
            }
        )
    replica_last = replica_runs[-1][0]
    ceilings = {
        "threads": [balanced_ceiling(stats) for stats in replica_thread_runs],
        "processes": [balanced_ceiling(stats) for stats in replica_runs],
    }
    # the one-thread session runs pinned to the first CPU, where the first replica runs
    session_ceilings = [balanced_ceiling(stats, versus=0) for stats in replica_thread_runs]
    against_ceiling = {
        pipe: median(
            [
                p / b / c
                for p, b, c in zip(by[pipe].throughputs, by[base].throughputs, ceilings[mode], strict=True)
                if math.isfinite(c)
            ]
        )
        for pipe, base, mode in (
            ("pipeline_threads", "replicas", "threads"),
            ("pipeline_processes", "replicas_processes", "processes"),
        )
    }
    bases = ("session_1", f"session_{k}", "replicas")
    return {
        "model": name,
        "path": str(path),
        "k": k,
        "cost": args.cost,
        "split_seconds": split_s,
        "input_shapes": {n: list(v) for n, v in input_shapes.items()},
        "microbatches": count,
        "rounds": args.rounds,
        "plan_bottleneck_ms": result.plan.bottleneck_seconds * 1e3,
        "plan_notes": list(result.plan.notes),
        "plan_lower_bound_ms": result.plan.lower_bound_seconds * 1e3,
        "throughput_per_s": {v.name: median(v.throughputs) for v in variants},
        "overall_throughput_per_s": {v.name: median(v.overall) for v in variants},
        "others_cores": {v.name: median(v.others) for v in variants},
        "all_rounds": {v.name: v.throughputs for v in variants},
        "others_all_rounds": {v.name: v.others for v in variants},
        "ratios": {
            pipe: {
                base: {
                    "all": ratio(pipe, own_mode(pipe, base), False),
                    "quiet": ratio(pipe, own_mode(pipe, base), True),
                }
                for base in bases
            }
            for pipe in ("pipeline_threads", "pipeline_processes", "pipeline_weights")
        },
        "replicas_threads_over_processes": ratio("replicas", "replicas_processes", False),
        "threads_over_processes": ratio("pipeline_threads", "pipeline_processes", False),
        "replica_speed_ceiling": {
            "window_runs": WINDOW_RUNS,
            "all_rounds": ceilings,
            "median": {mode: median([c for c in cs if math.isfinite(c)]) for mode, cs in ceilings.items()},
        },
        "x_replicas_over_ceiling": against_ceiling,
        "session_speed_ceiling": {
            "all_rounds": session_ceilings,
            "median": median([c for c in session_ceilings if math.isfinite(c)]),
        },
        "stages": stages,
        "replica_peak_rss_bytes": replica_last.peak_rss_bytes,
        "replica_model_rss_bytes": replica_last.model_rss_bytes,
        "model_param_bytes": sum(st.param_bytes for st in manifest.stages),
        "weight_balanced": {
            "param_bytes": [st.param_bytes for st in balanced.manifest.stages],
            "plan_bottleneck_ms": balanced.plan.bottleneck_seconds * 1e3,
            "memory_bytes_per_worker": balanced.plan.cluster.devices[0].memory_bytes
            if balanced.plan.cluster
            else None,
        },
        "estimate_max_error": {
            m: max(abs(s["estimate_error"][m]) for s in stages) for m in ("threads", "processes")
        },
        "machine_speed": {
            "manifest_reference_ms": None
            if manifest.plan.reference_seconds is None
            else manifest.plan.reference_seconds * 1e3,
            "session_1_ms_after_split": reference_ms,
            "session_1_ms_in_rounds": session_now_ms,
            "slowdown": slowdown,
        },
        "estimate_max_error_at_machine_speed": {
            m: max(abs(s["estimate_error_at_machine_speed"][m]) for s in stages)
            for m in ("threads", "processes")
        },
    }


# --------------------------------------------------------------------------------------------------
# output


def t_all(row: dict[str, Any], pipe: str) -> float:
    value: float = row["ratios"][pipe]["session_1"]["all"]
    return value


def print_summary(rows: Sequence[dict[str, Any]], k: int) -> None:
    mib = 1024 * 1024
    print()
    header = (
        f"{'model':10} {'input':12} {'1-thr/s':>8} {'pipe/s':>7} {'x1-thr':>13} {f'x{k}-thr':>11} "
        f"{'x repl':>11} {'thr/proc':>8} {'est err':>7} {'weights':>9} {'stage MiB':>9} {'repl MiB':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        t, p = r["ratios"]["pipeline_threads"], r["ratios"]["pipeline_processes"]
        shape = "x".join(str(d) for d in next(iter(r["input_shapes"].values())))
        stage_mem = "/".join(f"{(s['model_rss_bytes'] or 0) / mib:.0f}" for s in r["stages"])
        total = max(1, r["model_param_bytes"])
        weights = "/".join(f"{s['param_bytes'] / total * 100:.0f}%" for s in r["stages"])

        def pair(base: str, t: dict[str, Any] = t, p: dict[str, Any] = p) -> str:
            return f"{t[base]['all']:.2f} ({p[base]['all']:.2f})"

        print(
            f"{r['model']:10} {shape:12} {r['throughput_per_s']['session_1']:8.2f} "
            f"{r['throughput_per_s']['pipeline_threads']:7.2f} {pair('session_1'):>13} "
            f"{pair(f'session_{k}'):>11} {pair('replicas'):>11} {r['threads_over_processes']:8.2f} "
            f"{r['estimate_max_error']['threads'] * 100:6.1f}% {weights:>9} {stage_mem:>9} "
            f"{(r['replica_model_rss_bytes'] or 0) / mib:8.0f}"
        )
    print(
        "pipe/s and the ratios: the pipeline with worker threads (the default), in brackets with worker "
        "processes;\nratios are medians of per-round ratios; thr/proc the thread pipeline over the process "
        "one; est err the largest |estimated - measured| / measured\nstage time (threads); weights: "
        "each stage's share of the parameters;\nMiB: model memory of a process worker (peak minus its "
        "memory before loading its model)"
    )
    print(
        "\nweights per worker (share of the model's parameters), the time-balanced split against the split"
        " with the\nleast memory per worker (weights + buffered inputs, as the planner counts it), and what"
        " the latter keeps\nof the one-thread session's throughput and of the replicas':"
    )
    for r in rows:
        total = max(1, r["model_param_bytes"])
        timed = [s["param_bytes"] / total for s in r["stages"]]
        light = [b / total for b in r["weight_balanced"]["param_bytes"]]
        w = r["ratios"]["pipeline_weights"]
        print(
            f"  {r['model']:10} time-balanced max {max(timed) * 100:3.0f}% (mean {sum(timed) / k * 100:.0f}%)"
            f" x1-thr {t_all(r, 'pipeline_threads'):.2f} | least-memory max {max(light) * 100:3.0f}% "
            f"x1-thr {w['session_1']['all']:.2f}, x repl {w['replicas']['all']:.2f}"
        )
    print(
        "\nthe replicas' own CPUs, moment by moment (balanced_ceiling): how close to the replicas a perfectly"
        "\nbalanced pipeline could come on them, and the pipeline's x repl over that (threads, processes);"
        "\nand what it could reach against one session on the first of them:"
    )
    for r in rows:
        c, over = r["replica_speed_ceiling"]["median"], r["x_replicas_over_ceiling"]
        print(
            f"  {r['model']:10} ceiling {c['threads']:.3f} ({c['processes']:.3f}); x repl / ceiling "
            f"{over['pipeline_threads']:.3f} ({over['pipeline_processes']:.3f}); x1-thr ceiling "
            f"{r['session_speed_ceiling']['median']:.2f}"
        )
    print(
        "\nthe machine's drift: the one-thread session right after the split (when the estimates were made)"
        "\nand in the rounds, and the estimates' largest error once scaled by that (threads, processes):"
    )
    for r in rows:
        m, e = r["machine_speed"], r["estimate_max_error_at_machine_speed"]
        print(
            f"  {r['model']:10} session {m['session_1_ms_after_split']:.2f} ms after the split, "
            f"{m['session_1_ms_in_rounds']:.2f} ms in the rounds ({m['slowdown']:.2f}x); est err "
            f"{r['estimate_max_error']['threads'] * 100:.1f}% -> {e['threads'] * 100:.1f}% "
            f"({r['estimate_max_error']['processes'] * 100:.1f}% -> {e['processes'] * 100:.1f}%)"
        )
    for r in rows:
        print(
            f"  {r['model']}: others used {r['others_cores']['pipeline_threads']:.2f} cores (median, threads "
            f"pipeline); stages measured/estimated "
            + ", ".join(f"{s['measured_ms']['threads']:.2f}/{s['estimated_ms']:.2f} ms" for s in r["stages"])
            + f"; plan {r['plan_bottleneck_ms']:.2f} ms vs bound {r['plan_lower_bound_ms']:.2f} ms; "
            "quiet rounds only: "
            + ", ".join(
                f"x {base} {r['ratios']['pipeline_threads'][base]['quiet']:.2f}"
                for base in r["ratios"]["pipeline_threads"]
            )
        )


def model_names(parser: argparse.ArgumentParser, table: Mapping[str, object], text: str) -> list[str]:
    """The comma-separated model names of ``text``; an unknown one ends the run with the known ones."""
    names = text.split(",")
    for name in names:
        if name not in table:
            parser.error(f"unknown model {name!r}; choose from {', '.join(table)}")
    return names


def result_name(base: str, args: argparse.Namespace) -> str:
    """The name of a run's result: ``base``, then ``_pinned`` (``--pin``), ``_calibrated`` (``--calibrate``)
    and, for a calibration not timed the default way, ``_in_<mode>`` (``--calibrate-in``): every variant
    keeps its latest result apart."""
    name = base
    if getattr(args, "pin", False):
        name += "_pinned"
    if getattr(args, "calibrate", 0):
        name += "_calibrated"
        mode = getattr(args, "calibrate_in", CalibrationOptions().mode)
        if mode != CalibrationOptions().mode:
            name += f"_in_{mode}"
    return name


def write_rows(base: str, args: argparse.Namespace, rows: Sequence[dict[str, Any]]) -> Path:
    """The rows measured so far, as the result of this run (:func:`result_name`)."""
    params = params_of(args, models=args.models.split(","))
    return write_result(result_name(base, args), params, rows, out=args.out)


def run_models(
    name: str,
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    bench: Callable[[str, Path, dict[str, tuple[int, ...]] | None, argparse.Namespace], dict[str, Any]],
    summary: Callable[[Sequence[dict[str, Any]]], None],
    table: Mapping[str, tuple[Callable[[], Path], dict[str, tuple[int, ...]] | None]] | None = None,
) -> int:
    """Bench each model of ``args.models``, print the summary, write the rows as the result ``name``
    (:func:`write_rows`): the main loop of the benchmarks that follow this one's model table (or
    ``table``)."""
    table = model_table() if table is None else table
    rows = []
    for model in model_names(parser, table, args.models):
        get, shapes = table[model]
        rows.append(bench(model, get(), shapes, args))
    summary(rows)
    print(f"wrote {shown(write_rows(name, args, rows))}")
    return 0


def main(argv: list[str]) -> int:
    table = model_table()
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default=",".join(table), help="comma-separated: " + ", ".join(table))
    parser.add_argument("--k", type=int, default=2, help="stages (and replicas, and session threads)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="split with `onnxpipe split --calibrate ROUNDS` (the time-balanced split only)",
    )
    parser.add_argument(
        "--calibrate-in",
        choices=values(CalibrationMode),
        default=CalibrationOptions().mode,
        help="how --calibrate times the stages (`onnxpipe split --calibrate-in`)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin every variant alike: pipeline workers and replicas to CPUs of their own, sessions too",
    )
    parser.add_argument("--cost", choices=("profile", "static"), default="profile")
    parser.add_argument("--max-microbatches", type=int, default=200)
    parser.add_argument(
        "--quiet", type=float, default=0.15, help="cores used by others below which a round counts as quiet"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each round, wait up to this long for other processes to go quiet",
    )
    args = parser.parse_args(argv)
    rows = []
    out = None
    for name in model_names(parser, table, args.models):
        get, shapes = table[name]
        path = get()
        print(f"{name}: {path}", flush=True)
        rows.append(bench_model(name, path, shapes, args))
        out = write_rows("pipeline", args, rows)  # after every model: a later failure keeps what was measured
    print_summary(rows, args.k)
    if out is not None:
        print(f"wrote {shown(out)}")
    return 0
