"""The Ray backend on this machine: an interleaved split, one actor per worker against one per stage.

It is set against a contiguous split and one actor holding the whole model too.
``onnxpipe run --backend ray`` starts one actor per stage, except for an interleaved split
(``split --stages K*V --workers K``), where one actor per worker hosts its V stages.  On Ray every actor
is a Ray worker process of its own, with its interpreter, Ray's client and onnxruntime: V actors per
worker pay that V times.  This measures what hosting saves, and what it costs in throughput.  For each
model, split once each way from one profile (measured costs), on a local Ray (``ray.init(num_cpus=K)``),
in rounds whose order alternates, one intra-op thread per stage, actors opened afresh each round:

* ``replica``: one actor with the whole model (a 1-stage chain): what one data-parallel replica holds
  and delivers on Ray; ``replicas``: K such actors fed in turn (data parallel, what ``onnxpipe run
  --compare`` sets a Ray pipeline against);
* ``contiguous``: the K-stage split, an actor per stage;
* ``interleaved``: the K*V-stage split, an actor per worker hosting its V stages (what ``onnxpipe run``
  does);
* ``interleaved_apart``: the same stages, an actor per stage (each asking 1/V CPU so that they fit).

Memory per worker, a worker's actors summed, as ratios against the replica's actor: from the actors' own
statistics, model memory (an actor's peak less its memory before loading) and peak RSS; after the
stream, PSS and private memory (``/proc/PID/smaps_rollup``), which count the pages that actors share
(Ray's and onnxruntime's libraries) once, where summed RSS counts them once per actor.  Throughput: the
steady rate of each, as ratios (interleaved against ``interleaved_apart``, the contiguous split and the
replicas; the contiguous split against the replicas).  Results:
``benchmarks/results/ray.json``::

    python -m benchmarks ray [--models resnet50,yolov8n] [--rounds 3] [--k 2] [--v 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_pipeline import CLOCK_TICKS, _busy_ticks, model_table, run_models
from benchmarks.common import benchmark_parser
from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.base import RayConfig
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement, manifest_placements, model_spec, stage_specs

Feeds = Mapping[str, np.ndarray]
WARMUP = 8


@dataclass(frozen=True)
class Variant:
    """How to open one variant's Ray pipeline, and which stages make up each of its workers.

    ``directory`` None: ``replicas`` actors of the whole model; else the split there, its worker's
    stages in one actor each (``hosted``) or an actor per stage asking ``apart_share`` of a CPU."""

    manifest: Manifest
    directory: Path | None
    model: Path
    hosted: bool
    apart_share: float = 1.0
    replicas: int = 1

    def open(self) -> Pipeline:
        m = self.manifest
        names = {t.name: t.dtype for t in m.model_inputs}
        outputs = [o.name for o in m.model_outputs]
        if self.directory is None:  # the whole model in one actor per replica, fed in turn
            one = Placement(threads=1)
            lanes = [
                [model_spec(self.model, list(names), outputs, one, index=i)] for i in range(self.replicas)
            ]
            return Pipeline(RayBackend(lanes), input_types=names, output_names=outputs, lanes=lanes)
        specs = stage_specs(self.directory, m, manifest_placements(m, 1))
        workers = [m.worker_of(i) for i in range(m.k)] if self.hosted else None
        resources = [{"num_cpus": self.apart_share}] * m.k if self.apart_share != 1.0 else None
        backend = RayBackend([specs], RayConfig(resources=resources), workers=workers)
        return Pipeline(backend, input_types=names, output_names=outputs, lanes=[specs])

    def workers(self) -> list[tuple[int, ...]]:
        if self.directory is None:
            return [(i,) for i in range(self.replicas)]
        m = self.manifest
        if m.plan.workers is None:
            return [(i,) for i in range(m.k)]
        return [m.stages_of(w) for w in range(m.workers)]


def _tree_ticks() -> dict[int, int]:
    """CPU ticks of this process and of each process below it (Ray's own processes and its actors are
    this process's descendants: ``ray.init`` started them), by process id."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    me = os.getpid()
    mine: dict[int, int] = {}
    for pid, t in ticks.items():
        p = pid
        while p not in (0, 1, me):
            p = parent.get(p, 0)
        if p == me:
            mine[pid] = t
    return mine


class TreeWatch:
    """CPU that processes outside this one's tree used while the watch ran, in cores.

    The tree's processes are sampled every :attr:`every` seconds, since Ray's raylet does not collect
    its ended actors' CPU times (they never reach its ``cutime``): an actor's last figure is the one
    seen last before it ended, short of at most one sampling interval.
    """

    every = 0.25

    def __enter__(self) -> TreeWatch:
        self.start = time.perf_counter()
        self.busy = _busy_ticks()
        self.first = _tree_ticks()
        self.last = dict(self.first)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self.last.update(_tree_ticks())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self.last.update(_tree_ticks())
        self.wall = time.perf_counter() - self.start
        self.busy = _busy_ticks() - self.busy

    def others_cores(self) -> float:
        """After the watch: the cores that processes outside the tree kept busy on average."""
        ours = sum(t - self.first.get(pid, 0) for pid, t in self.last.items())
        return max(0.0, (self.busy - ours) / CLOCK_TICKS / self.wall) if self.wall > 0 else 0.0


def smaps_bytes(pid: int) -> dict[str, int]:
    """``Pss`` and private memory (``Private_Clean`` + ``Private_Dirty``) of process ``pid`` now, from
    ``/proc/PID/smaps_rollup``: what the process costs the machine with the pages it shares with others
    (Ray's and onnxruntime's libraries) counted once in all, not once per process as RSS counts them."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return {"pss": values["Pss"], "private": values["Private_Clean"] + values["Private_Dirty"]}


def run_variant(
    variant: Variant, inputs: Sequence[Feeds]
) -> tuple[float, list[WorkerStats], dict[int, dict[str, int]]]:
    """The steady rate, the workers' stats and each actor's :func:`smaps_bytes` after the stream."""
    with variant.open() as pipe:
        measured = measure(pipe, inputs, warmup=WARMUP)
        smaps = {pid: smaps_bytes(pid) for pid in {st.pid for st in measured.stats if st.pid is not None}}
        return measured.steady_throughput_per_s or measured.throughput_per_s, list(measured.stats), smaps


KINDS = ("model_rss", "peak_rss", "pss", "private")


def per_worker(
    stats: Sequence[WorkerStats], smaps: Mapping[int, Mapping[str, int]], groups: Sequence[tuple[int, ...]]
) -> dict[str, list[int]]:
    """Each worker's model memory, peak RSS, PSS and private memory: its actors' (one figure per
    process) summed."""
    by_pid: dict[int, WorkerStats] = {}
    stage_pid: dict[int, int] = {}
    for st in stats:
        assert st.pid is not None
        by_pid.setdefault(st.pid, st)
        stage_pid[st.index] = st.pid
    out: dict[str, list[int]] = {k: [] for k in KINDS}
    for group in groups:
        pids = {stage_pid[i] for i in group}
        out["model_rss"].append(sum(by_pid[p].model_rss_bytes or 0 for p in pids))
        out["peak_rss"].append(sum(by_pid[p].peak_rss_bytes or 0 for p in pids))
        out["pss"].append(sum(smaps[p]["pss"] for p in pids))
        out["private"].append(sum(smaps[p]["private"] for p in pids))
    return out


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"ray-{name}-"))
    profile = get_profile(load_model(path), ProfileOptions(cost="profile", shapes=shapes))
    contiguous, interleaved = base / "contiguous", base / "interleaved"
    api.split(
        path,
        SplitOptions(
            out=contiguous, plan=PlanRequest(args.k), profile=ProfileOptions(saved=profile), verify=False
        ),
    )
    api.split(
        path,
        SplitOptions(
            out=interleaved,
            plan=PlanRequest(args.k * args.v, workers=args.k),
            profile=ProfileOptions(saved=profile),
            verify=False,
        ),
    )
    plain, dealt = load_manifest(contiguous), load_manifest(interleaved)
    variants = {
        "replica": Variant(plain, None, path, hosted=False),
        "replicas": Variant(plain, None, path, hosted=False, replicas=args.k),
        "contiguous": Variant(plain, contiguous, path, hosted=False),
        "interleaved": Variant(dealt, interleaved, path, hosted=True),
        "interleaved_apart": Variant(dealt, interleaved, path, hosted=False, apart_share=1.0 / args.v),
    }
    input_shapes = {n: tuple(v) for n, v in plain.plan.profiled_input_shapes.items()}
    pool = random_inputs(path, input_shapes, 8, seed=0)
    inputs = [pool[j % len(pool)] for j in range(args.microbatches)]
    rates: dict[str, list[float]] = {k: [] for k in variants}
    memory: dict[str, list[dict[str, list[int]]]] = {k: [] for k in variants}
    others: list[float] = []
    for r in range(args.rounds):
        with TreeWatch() as watch:
            for key in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                rate, stats, smaps = run_variant(variants[key], inputs)
                rates[key].append(rate)
                memory[key].append(per_worker(stats, smaps, variants[key].workers()))
        others.append(watch.others_cores())
        done = ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rates.items())
        print(f"  {name} round {r + 1}/{args.rounds}: {done}; others used {others[-1]:.2f} cores", flush=True)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    def medians(key: str, what: str) -> list[int]:
        return [round(statistics.median(col)) for col in zip(*(m[what] for m in memory[key]), strict=True)]

    mem = {k: {w: medians(k, w) for w in KINDS} for k in variants}
    replica = {w: mem["replica"][w][0] for w in KINDS}
    return {
        "model": name,
        "k": args.k,
        "v": args.v,
        "microbatches": args.microbatches,
        "rounds": args.rounds,
        "throughput_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "all_rounds": rates,
        "ratios": {
            "interleaved_x_interleaved_apart": ratio("interleaved", "interleaved_apart"),
            "interleaved_x_contiguous": ratio("interleaved", "contiguous"),
            "interleaved_x_replicas": ratio("interleaved", "replicas"),
            "contiguous_x_replicas": ratio("contiguous", "replicas"),
            "replicas_x_replica": ratio("replicas", "replica"),
        },
        "weights_per_worker": [
            sum(dealt.stages[s].param_bytes for s in g) for g in variants["interleaved"].workers()
        ],
        "memory_bytes": mem,
        "memory_x_replica": {k: {w: [x / replica[w] for x in v[w]] for w in KINDS} for k, v in mem.items()},
        "others_cores": others,
    }


def print_summary(rows: Sequence[dict[str, Any]]) -> None:
    head = ("model", "replica/s", "replicas/s", "contig/s", "interl/s", "apart/s", "x apart", "x contig")
    head += ("x replicas", "contig x rep")
    print(f"\n{head[0]:10s} " + " ".join(f"{h:>12s}" for h in head[1:]))
    print("-" * 115)
    for row in rows:
        t, r = row["throughput_per_s"], row["ratios"]
        cells = (
            t["replica"],
            t["replicas"],
            t["contiguous"],
            t["interleaved"],
            t["interleaved_apart"],
            r["interleaved_x_interleaved_apart"],
            r["interleaved_x_contiguous"],
            r["interleaved_x_replicas"],
            r["contiguous_x_replicas"],
        )
        print(f"{row['model']:10s} " + " ".join(f"{c:12.2f}" for c in cells))
    print("ratios are medians of per-round ratios; rounds alternate their order\n")
    print("memory per worker x the replica's actor, medians over the rounds:")
    print("  model memory / peak RSS / PSS / private, each worker's")
    for row in rows:
        x = row["memory_x_replica"]
        replica = row["memory_bytes"]["replica"]
        mib = " / ".join(f"{replica[w][0] / 2**20:.0f}" for w in KINDS)
        print(f"  {row['model']}: replica {mib} MiB")
        for key in ("contiguous", "interleaved", "interleaved_apart"):
            cells = " / ".join(", ".join(f"{v:.2f}" for v in x[key][w]) for w in KINDS)
            print(f"    {key:18s} {cells}")
    print("per-round throughput ratios, interleaved x interleaved_apart:")
    for row in rows:
        a, b = row["all_rounds"]["interleaved"], row["all_rounds"]["interleaved_apart"]
        print(f"  {row['model']:10s} " + ", ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True)))
    busiest = max(max(row["others_cores"]) for row in rows)
    print(f"other processes used at most {busiest:.2f} cores in any round")


def main(argv: list[str]) -> int:
    table = model_table()
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default="resnet50,yolov8n", help="comma-separated: " + ", ".join(table))
    parser.add_argument("--k", type=int, default=2, help="workers (and the local Ray's CPUs)")
    parser.add_argument("--v", type=int, default=2, help="stages per worker in the interleaved split")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=48)
    args = parser.parse_args(argv)
    try:
        import ray
    except ImportError:
        parser.error("this benchmark needs Ray: pip install -e '.[ray]'")
    ray.init(num_cpus=args.k, include_dashboard=False, logging_level="WARNING")
    try:
        return run_models("ray", parser, args, bench_model, print_summary)
    finally:
        ray.shutdown()
