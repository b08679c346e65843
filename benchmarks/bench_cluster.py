"""The Ray backend across machines: a hop's cost against the wire, the pipeline against replicas and
against the link's bound, generation's hops, a lost node.

The machines (``tools/hosts.py``, run as root): host ``d`` holds the head and the driver (this benchmark
runs its cases on it, as a user runs ``onnxpipe`` on a machine of the cluster), hosts ``a`` and ``b`` a
worker node each with a core of its own (``taskset``), every host on a link of a set rate (``tbf`` both
ways); the custom resources ``node_a``/``node_b`` pin stage 0 to ``a`` and stage 1 to ``b``.  Where the
machine cannot make hosts (not root), the nodes are loopback ones on this machine, and the result says
why (``summary.hosts``).  In one run:

* ``hops`` (at each rate): frames of a small size and of the recogniser's boundary from ``a`` to ``b``
  over the data plane, one at a time (``onnxpipe/runtime/backends/ray_links.py``'s probes): the median
  time per hop, against the bytes' time at the link's rate (``excess_ms``: what a hop costs beyond the
  wire), and half an empty Ray call's round trip (what each hop cost when the driver chained calls);
* ``throughput`` (1 Gbit): the 2-stage split of PP-OCRv4's recogniser as ``onnxpipe run`` runs it on
  the cluster (``ray_pipeline``), against two Ray replicas of the whole model on the same two nodes
  (``ray_replicas``), and against the local threads backend on the driver's host (``threads_pipeline``,
  ``threads_replicas``): steady micro-batches per second in rounds whose order alternates, the ratios of
  the rounds' medians;
* ``link_bound`` (100 Mbit): the same pipeline where the links bound it: its rate against the links'
  bound (the rate divided by the largest frame of a micro-batch's three hops, each on a link of its own
  each way: the recogniser's outputs, 6625 classes for each of 15 steps, are larger than its boundary);
* ``boundary`` (100 Mbit): ResNet-50 (the onnx package's ``light_resnet50``) in 2 stages, its boundary
  crossing the link as float32 and as float16 (``split --boundary-dtype``): each one's steady rate,
  rounds of alternating order, and the ratio;
* ``generate`` (1 Gbit): the medium decoder (``tools/export_decoders.py``'s ``llama_gqa_medium``) split
  in 2, a stage per node, against the unsplit model on one node and two replicas, one intra-op thread
  per actor: tokens/s at 1, 2 and 4 sequences in flight, identical tokens required; and the pipeline's
  hops per step with one sequence in flight (from its trips) against their bytes' time at the link's
  rate, and the middle hop against a bare socket's (``benchmarks/socket_floor.py``: the same bytes from
  host a to host b, each side computing a stage's time before it sends: this machine's floor of link
  and wake-ups, with no data plane);
* ``lost_node`` (1 Gbit): a spare node with stage 1's resources joins on a host of its own, the node
  holding stage 1 is killed (its whole process tree, SIGKILL) in the middle of a long stream; the stream
  completes, and the result holds the recovery's seconds (the data plane sees the break at once; Ray's
  health checks, ``tools/ray_cluster.py``'s ``QUICK_HEALTH_CHECKS``, declare the node dead), the
  micro-batches sent again, and the run's time against the same stream undisturbed.

Results: ``benchmarks/results/cluster.json``::

    python -m benchmarks cluster [--shape x=1,3,48,120] [--microbatches 300] [--rounds 3] [--out DIR]
        [--cases hops throughput link_bound boundary generate lost_node] [--sequences 1 2 4] [--new-tokens 32]

``--cases`` runs some of the cases alone: the result keeps the other cases' rows from the result already
there (``summary.merged_from`` names, per case kept, the commit and date of the run that measured it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import socket_floor
from benchmarks.bench_pipeline import CLOCK_TICKS, _busy_ticks
from benchmarks.bench_ray import TreeWatch
from benchmarks.common import RESULTS, benchmark_parser, params_of, shown, write_result
from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.ray_links import measure_links
from onnxpipe.runtime.backends.threads import ThreadBackend
from onnxpipe.runtime.base import LocalConfig, RayConfig
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.options import GenerateOptions
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.cluster import overhead_ms
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.spec import Placement, model_spec
from onnxpipe.runtime.trips import Trip
from tools import corpus, export_decoders
from tools.hosts import Hosts, HostSpec, cannot_make_hosts
from tools.ray_cluster import QUICK_HEALTH_CHECKS, LocalCluster, kill_session

PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]
"""Stage 0 on node ``a``, stage 1 on node ``b`` (the split's resources file, as ``run`` takes it)."""
DECODER = "llama_gqa_medium"
"""The decoder of the ``generate`` case, as ``benchmarks/bench_generate.py`` uses."""
CASES = ("hops", "throughput", "link_bound", "boundary", "generate", "lost_node")
FAST_MBIT = 1000.0
SLOW_MBIT = 100.0
SMALL = 4096
WARMUP = 8


def wire_ms(nbytes: int, rate_mbit: float | None) -> float | None:
    """The bytes' time at the link's rate (None: no set rate, loopback nodes)."""
    return None if rate_mbit is None else nbytes * 8 / (rate_mbit * 1e6) * 1e3


# --------------------------------------------------------------------------------------------------
# hops: the data plane against the wire, and against a Ray call


class Echo:
    """An actor whose empty call is half the round trip that a chained Ray call cost per hop."""

    def empty(self) -> None:
        return None


def _bare_call_ms(ray: Any, repeats: int) -> float:
    actor = ray.remote(Echo).options(num_cpus=0, resources={"node_a": 0.01}).remote()
    try:
        ray.get(actor.empty.remote())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            ray.get(actor.empty.remote())
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3 / 2
    finally:
        ray.kill(actor)


def hop_times(ray: Any, sizes: Sequence[int], repeats: int, rate_mbit: float | None) -> list[dict[str, Any]]:
    """Frames from node ``a`` to node ``b`` over the data plane at each size (and the link probe's own
    sizes), one at a time: the median per hop, the wire's time, the excess; the fitted link."""
    options = [{"num_cpus": 0, "resources": {"node_a": 0.01}}, {"num_cpus": 0, "resources": {"node_b": 0.01}}]
    (link,) = measure_links(ray, options, [list(sizes)], repeats)
    bare = _bare_call_ms(ray, repeats)
    rows = []
    for size, seconds in sorted(link.seconds_by_size.items()):
        wire = wire_ms(size, rate_mbit)
        rows.append(
            {
                "case": "hops",
                "rate_mbit": rate_mbit,
                "bytes": size,
                "plane_ms_per_hop": seconds * 1e3,
                "wire_ms": wire,
                "excess_ms": None if wire is None else seconds * 1e3 - wire,
                "ray_call_ms_per_hop": bare,
                "fitted_bandwidth_mbit": None
                if link.bandwidth_bytes_per_s is None
                else link.bandwidth_bytes_per_s * 8 / 1e6,
                "fitted_latency_ms": link.latency_s * 1e3,
            }
        )
        print(f"  hops at {rate_mbit} Mbit, {size} B: {rows[-1]['plane_ms_per_hop']:.3f} ms (wire {wire})")
    return rows


# --------------------------------------------------------------------------------------------------
# throughput: the pipeline against replicas, on Ray and on threads


def _replicas(model: Path, split: Path, config: RayConfig | LocalConfig) -> Pipeline:
    m = load_manifest(split)
    types = {t.name: t.dtype for t in m.model_inputs}
    outputs = [o.name for o in m.model_outputs]
    lanes = [[model_spec(model, list(types), outputs, Placement(threads=1), index=i)] for i in range(2)]
    backend = RayBackend(lanes, config) if isinstance(config, RayConfig) else ThreadBackend(lanes)
    return Pipeline(backend, input_types=types, output_names=outputs, lanes=lanes)


def throughput(model: Path, split: Path, inputs: Sequence[Any], rounds: int) -> dict[str, Any]:
    """Each variant's steady rate per round (order alternating), the medians, the pipeline's hop
    overhead from its own trips, and the machine's CPU time per micro-batch in each variant (all of
    its processes: the driver, the actors, Ray's own): where both Ray variants keep every core busy,
    their rates stand in the inverse ratio of those, and the hops' CPU, not their latency, sets it."""
    variants: dict[str, Callable[[], Pipeline]] = {
        "ray_pipeline": lambda: Pipeline.from_manifest(split, RayConfig(resources=PINNED)),
        "ray_replicas": lambda: _replicas(model, split, RayConfig()),
        "threads_pipeline": lambda: Pipeline.from_manifest(split, LocalConfig(mode="threads")),
        "threads_replicas": lambda: _replicas(model, split, LocalConfig(mode="threads")),
    }
    rates: dict[str, list[float]] = {k: [] for k in variants}
    cpu_ms: dict[str, list[float]] = {k: [] for k in variants}
    busy_cores: dict[str, list[float]] = {k: [] for k in variants}
    overheads: list[float] = []
    others: list[float] = []
    for r in range(rounds):
        with TreeWatch() as watch:
            for key in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                with variants[key]() as pipe:
                    measured = measure(pipe, inputs, warmup=WARMUP, single=16)
                    ticks, start = _busy_ticks(), time.perf_counter()
                    streamed = measure(pipe, inputs)  # warm: the machine's CPU over this stream alone
                    cores = (_busy_ticks() - ticks) / CLOCK_TICKS / (time.perf_counter() - start)
                rates[key].append(measured.steady_throughput_per_s or measured.throughput_per_s)
                busy_cores[key].append(cores)
                cpu_ms[key].append(cores / streamed.throughput_per_s * 1e3)
                if key == "ray_pipeline":
                    overhead = overhead_ms(measured.single_trips)
                    overheads.append((overhead or 0.0) / 3)
        others.append(watch.others_cores())
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in rates.items()))

    def ratio(x: str, y: str) -> float:
        return statistics.median(p / q for p, q in zip(rates[x], rates[y], strict=True))

    return {
        "throughput_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "all_rounds": rates,
        "ratios": {
            "ray_pipeline_x_ray_replicas": ratio("ray_pipeline", "ray_replicas"),
            "ray_pipeline_x_threads_pipeline": ratio("ray_pipeline", "threads_pipeline"),
            "threads_pipeline_x_threads_replicas": ratio("threads_pipeline", "threads_replicas"),
        },
        "pipeline_hop_overhead_ms": statistics.median(overheads),
        "machine_busy_cores": {k: statistics.median(v) for k, v in busy_cores.items()},
        "machine_cpu_ms_per_microbatch": {k: statistics.median(v) for k, v in cpu_ms.items()},
        "others_cores": others,
    }


# --------------------------------------------------------------------------------------------------
# a lost node


def lost_node(
    kill: Callable[[str], None], split: Path, inputs: Sequence[Any], count: int, spare: str | None
) -> dict[str, Any]:
    """Stream ``count`` micro-batches undisturbed, then again killing stage 1's node (``kill``, by its
    node id) a fifth of the way in, the spare node (``spare``, its id) waiting with its resources: the
    recovery and the time the run lost."""
    stream = [inputs[j % len(inputs)] for j in range(count)]
    with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
        pipe.run_many(stream[:WARMUP])
        start = time.perf_counter()
        pipe.run_many(stream)
        quiet = time.perf_counter() - start
    with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        victim = backend.placed[1].node_id
        pipe.run_many(stream[:WARMUP])
        start = time.perf_counter()
        for delivered, _ in enumerate(pipe.stream(stream), start=1):
            if delivered == count // 5:
                threading.Thread(target=kill, args=(victim,), daemon=True).start()
        disturbed = time.perf_counter() - start
    (recovery,) = backend.recoveries
    print(
        f"  lost node: recovered in {recovery.seconds:.1f} s, {recovery.replayed} micro-batches sent again; "
        f"{count} micro-batches took {disturbed:.1f} s against {quiet:.1f} s undisturbed"
    )
    return {
        "microbatches": count,
        "undisturbed_seconds": quiet,
        "disturbed_seconds": disturbed,
        "time_lost_seconds": disturbed - quiet,
        "recovery_seconds": recovery.seconds,
        "replayed": recovery.replayed,
        "node_died": recovery.node_lost,
        "moved_to_spare": recovery.now.node_id == spare,
    }


# --------------------------------------------------------------------------------------------------
# the pipeline where the link bounds it


def link_bound(split: Path, inputs: Sequence[Any], rounds: int, rate_mbit: float | None) -> dict[str, Any]:
    """The pipeline's steady rate, rounds' median, against the links' bound: the rate at which the
    largest frame of a micro-batch's hops fills its link (each hop has a link of its own each way:
    driver -> stage 0, stage 0 -> stage 1, stage 1 -> driver), None on loopback nodes, which have no
    set rate."""
    rates: list[float] = []
    frames: list[list[int]] = [[], [], []]
    for r in range(rounds):
        with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
            measured = measure(pipe, inputs, warmup=WARMUP)
            rates.append(measured.steady_throughput_per_s or measured.throughput_per_s)
            for t in pipe.trips():
                for h, hop in enumerate(t.hops if len(t.hops) == 3 else ()):
                    frames[h].append(hop.bytes)
        print(f"  link bound round {r + 1}/{rounds}: {rates[-1]:.1f}/s")
    sizes = [round(statistics.median(f)) for f in frames]
    bound = None if rate_mbit is None else rate_mbit * 1e6 / 8 / max(sizes)
    rate = statistics.median(rates)
    return {
        "rate_mbit": rate_mbit,
        "frame_bytes": sizes,
        "pipeline_per_s": rate,
        "link_bound_per_s": bound,
        "pipeline_x_link_bound": None if bound is None else rate / bound,
        "all_rounds": rates,
    }


# --------------------------------------------------------------------------------------------------
# a boundary compressed where the link bounds the pipeline


def boundary(args: argparse.Namespace, base: Path, rate_mbit: float | None) -> dict[str, Any]:
    """ResNet-50's 2-stage split with float32 and float16 boundaries on the cluster: steady rates in
    rounds of alternating order, each split's boundary bytes, the ratio of the medians."""
    model = corpus.onnx_light("resnet50")
    splits = {}
    for dtype in ("float32", "float16"):
        splits[dtype] = base / f"resnet50-{dtype}"
        request = PlanRequest(2, boundary_dtype=dtype)
        options = SplitOptions(out=splits[dtype], plan=request, profile=ProfileOptions(cost="static"))
        api.split(model, replace(options, verify=False))
    (data,) = load_manifest(splits["float32"]).model_inputs  # gpu_0/data_0: one image, 3x224x224
    inputs = random_inputs(model, {data.name: (1, 3, 224, 224)}, 4, seed=0)
    stream = [inputs[j % len(inputs)] for j in range(max(16, args.microbatches // 8))]
    rates: dict[str, list[float]] = {d: [] for d in splits}
    for r in range(args.rounds):
        for dtype in list(splits) if r % 2 == 0 else list(splits)[::-1]:
            with Pipeline.from_manifest(splits[dtype], RayConfig(resources=PINNED)) as pipe:
                measured = measure(pipe, stream, warmup=4)
            rates[dtype].append(measured.steady_throughput_per_s or measured.throughput_per_s)
        shown_rates = ", ".join(f"{d} {v[-1]:.2f}/s" for d, v in rates.items())
        print(f"  boundary round {r + 1}/{args.rounds}: {shown_rates}")
    crossing = {d: load_manifest(p).stages[1].link_bytes_in for d, p in splits.items()}
    rate = {d: statistics.median(v) for d, v in rates.items()}
    return {
        "rate_mbit": rate_mbit,
        "boundary_bytes": crossing,
        "per_s": rate,
        "float16_x_float32": rate["float16"] / rate["float32"],
        "all_rounds": rates,
    }


# --------------------------------------------------------------------------------------------------
# generation across nodes


GENERATORS = ("ray_pipeline", "ray_unsplit", "ray_replicas")


def _generator(kind: str, folder: Path) -> Generator:
    """One generator on the cluster, one intra-op thread per actor: the 2-stage split (a stage per
    node), the unsplit model on node ``a``, or two replicas of it where Ray puts them (one per node)."""
    if kind == "ray_pipeline":
        return Generator.open(folder, RayConfig(resources=PINNED), threads=1)
    if kind == "ray_unsplit":
        return Generator.replicas(folder, 1, RayConfig(resources=PINNED[:1]), threads=1)
    return Generator.replicas(folder, 2, RayConfig(), threads=1)


def _generate_round(
    kind: str, folder: Path, cases: dict[int, list[list[int]]], new_tokens: int
) -> tuple[dict[int, Generation], list[Trip]]:
    """``kind`` opened (a node takes one actor at a time: each generator has the cluster to itself),
    warmed up, and run on each count's prompts; the pipeline's steps' trips with the fewest sequences in
    flight (with more, a step's frame also waits for a stage busy with another step: not the hop's)."""
    with _generator(kind, folder) as pipe:
        warm = GenerateOptions(prompt_ids=((1, 2, 3, 4),) * 2, max_new_tokens=4, ignore_eos=True)
        pipe.generate_with(pipe.prompting(warm))
        made, trips = {}, []
        for count, prompts in cases.items():
            options = GenerateOptions(
                prompt_ids=tuple(tuple(p) for p in prompts), max_new_tokens=new_tokens, ignore_eos=True
            )
            made[count] = pipe.generate_with(pipe.prompting(options))
            if count == min(cases) and isinstance(pipe.steps, Pipeline):
                trips = pipe.steps.trips()
    return made, trips


def step_hops(trips: Sequence[Trip], rate_mbit: float | None) -> list[dict[str, Any]]:
    """Each hop of a generation step (driver -> stage 0 -> stage 1 -> driver), one at a time: its median
    bytes and milliseconds, against the bytes' time at the link's rate."""
    rows = []
    steps = [t for t in trips if len(t.hops) == 3]
    for h, name in enumerate(("driver -> stage 0", "stage 0 -> stage 1", "stage 1 -> driver")):
        nbytes = round(statistics.median(t.hops[h].bytes for t in steps))
        ms = statistics.median(t.hops[h].seconds for t in steps) * 1e3
        wire = wire_ms(nbytes, rate_mbit)
        excess = None if wire is None else ms - wire
        rows.append({"hop": name, "bytes": nbytes, "ms": ms, "wire_ms": wire, "excess_ms": excess})
    return rows


def generation(args: argparse.Namespace, base: Path, rate_mbit: float | None) -> dict[str, Any]:
    """Tokens/s of the medium decoder's 2-stage split on the two nodes, against the unsplit model on
    one node and two replicas of it, at each count of sequences in flight: medians of rounds whose
    order rotates, the ratios, and whether every generator made the same tokens; the pipeline's hops
    per step against the wire."""
    counts, rounds, new_tokens = args.sequences, args.rounds, args.new_tokens
    folder = base / "decoder"
    api.split(
        export_decoders.decoder(DECODER),
        SplitOptions(out=folder, plan=PlanRequest(2), profile=ProfileOptions(runs=10, threads=1)),
    )
    vocab = export_decoders.SPECS[DECODER].vocab
    rng = np.random.default_rng(0)
    cases = {n: [rng.integers(0, vocab, size=args.prompt_tokens).tolist() for _ in range(n)] for n in counts}
    rates: dict[tuple[str, int], list[float]] = {(k, n): [] for k in GENERATORS for n in counts}
    tokens: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {}
    trips: list[Trip] = []
    for r in range(rounds):
        for kind in GENERATORS[r % 3 :] + GENERATORS[: r % 3]:
            made, kind_trips = _generate_round(kind, folder, cases, new_tokens)
            for n, g in made.items():
                rates[kind, n].append(g.tokens_per_second)
                tokens[kind, n] = g.tokens
            trips += kind_trips if kind == "ray_pipeline" else []
        print(f"  generate round {r + 1}/{rounds}: " + _rates_text(rates, counts))
    steps = [t for t in trips if len(t.legs) == 2]
    return {
        "rows": [_generation_row(n, rates, tokens) for n in counts],
        "step_hops": step_hops(trips, rate_mbit),
        "stage_run_ms": statistics.median(t.legs[0].run_seconds for t in steps) * 1e3 if steps else None,
    }


def _rates_text(rates: dict[tuple[str, int], list[float]], counts: Sequence[int]) -> str:
    return "; ".join(
        f"{n} seq: " + ", ".join(f"{k} {rates[k, n][-1]:.1f} tok/s" for k in GENERATORS) for n in counts
    )


def _generation_row(
    n: int, rates: dict[tuple[str, int], list[float]], tokens: dict[tuple[str, int], Any]
) -> dict[str, Any]:
    rate = {k: statistics.median(rates[k, n]) for k in GENERATORS}
    return {
        "case": "generate",
        "sequences": n,
        **{f"{k}_tokens_per_s": rate[k] for k in GENERATORS},
        "pipeline_x_unsplit": rate["ray_pipeline"] / rate["ray_unsplit"],
        "pipeline_x_replicas": rate["ray_pipeline"] / rate["ray_replicas"],
        "same_tokens": len({tokens[k, n] for k in GENERATORS}) == 1,
    }


# --------------------------------------------------------------------------------------------------


def _split(model: Path, shape: tuple[int, ...], base: Path) -> Path:
    out = base / "split"
    api.split(
        model,
        SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(shapes={"x": shape}), verify=False),
    )
    return out


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--shape", default="1,3,48,120", help="the recogniser's input x (default 1,3,48,120)")
    parser.add_argument("--microbatches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50, help="frames per size in the hops case")
    parser.add_argument("--lost", type=int, default=1500, help="micro-batches of the lost-node stream")
    parser.add_argument(
        "--cases",
        nargs="+",
        choices=CASES,
        default=list(CASES),
        help="the cases to run (default: all); a partial run keeps the other cases' rows of the result",
    )
    parser.add_argument("--sequences", nargs="+", type=int, default=[1, 2, 4], help="generate: in flight")
    parser.add_argument("--new-tokens", type=int, default=32, help="generate: new tokens per sequence")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="generate: tokens per prompt")
    parser.add_argument("--inside", metavar="ADDR", help=argparse.SUPPRESS)  # the driver's part, on host d
    parser.add_argument("--inside-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rate-mbit", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--sessions", default="{}", help=argparse.SUPPRESS)  # node id -> its session's pid
    parser.add_argument("--spare", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _run_cases(args: argparse.Namespace, cases: Sequence[str], kill: Callable[[str], None]) -> dict[str, Any]:
    """``cases`` on the cluster this process is connected to, the links at ``args.rate_mbit``."""
    import ray

    base = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    done: dict[str, Any] = {}
    if "generate" in cases:
        done["generate"] = generation(args, base, args.rate_mbit)
    if "boundary" in cases:
        done["boundary"] = boundary(args, base, args.rate_mbit)
    if set(cases) - {"generate", "boundary"}:
        done.update(_recogniser_cases(args, cases, ray, base, kill))
    return done


def _recogniser_cases(
    args: argparse.Namespace, cases: Sequence[str], ray: Any, base: Path, kill: Callable[[str], None]
) -> dict[str, Any]:
    """The hops, throughput, link-bound and lost-node cases, on the recogniser's 2-stage split."""
    shape = tuple(int(d) for d in args.shape.split(","))
    model = corpus.rapidocr("rec")
    split = _split(model, shape, base)
    m = load_manifest(split)
    boundary = m.stages[1].link_bytes_in
    inputs = random_inputs(model, {"x": shape}, 8, seed=0)
    stream = [inputs[j % len(inputs)] for j in range(args.microbatches)]
    print(
        f"stages estimated at {[round(s.estimated_compute_seconds * 1e3, 2) for s in m.stages]} ms, "
        f"{boundary} B across the cut, links at {args.rate_mbit} Mbit/s"
    )
    done: dict[str, Any] = {
        "stage_estimated_ms": [s.estimated_compute_seconds * 1e3 for s in m.stages],
        "boundary_bytes": boundary,
    }
    if "hops" in cases:
        done["hops"] = hop_times(ray, [SMALL, boundary], args.repeats, args.rate_mbit)
    if "throughput" in cases:
        done.update(throughput(model, split, stream, args.rounds))
    if "link_bound" in cases:
        done["link_bound"] = link_bound(split, stream, args.rounds, args.rate_mbit)
    if "lost_node" in cases:
        done["lost_node"] = lost_node(kill, split, inputs, args.lost, args.spare)
    return done


def _inside(args: argparse.Namespace) -> int:
    """The driver's part on host d: connect to the cluster at ``--inside``, run ``--cases``, write what
    they found to ``--inside-out``."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "token"
    ray.init(address=args.inside, logging_level="WARNING", log_to_driver=False)
    sessions: dict[str, int] = json.loads(args.sessions)

    def kill(node_id: str) -> None:
        kill_session(sessions[node_id], signal.SIGKILL)

    try:
        done = _run_cases(args, args.cases, kill)
    finally:
        ray.shutdown()
    args.inside_out.write_text(json.dumps(done, default=float))
    return 0


def _drive(
    cluster: LocalCluster, args: argparse.Namespace, cases: Sequence[str], rate: float
) -> dict[str, Any]:
    """Run ``cases`` on host d (a driver of its own, as users run one) with the links at ``rate``."""
    assert cluster.hosts is not None
    for name in cluster.hosts.hosts:
        cluster.hosts.set_rate(name, rate)
    out = cluster.base / f"inside-{len(os.listdir(cluster.base))}.json"
    sessions = {n.node_id: n.process.pid for n in cluster.nodes if n.node_id is not None}
    spare = [n.node_id for n in cluster.nodes if n.spec.name == "spare"]
    argv = [sys.executable, "-m", "benchmarks", "cluster", *_passed(args), "--cases", *cases]
    argv += ["--inside", cluster.address, "--inside-out", str(out), "--rate-mbit", str(rate)]
    argv += ["--sessions", json.dumps(sessions), *(["--spare", str(spare[0])] if spare else [])]
    done = subprocess_on(cluster, argv)
    if done != 0 or not out.is_file():
        raise RuntimeError(f"the cases {list(cases)} failed on host d (exit {done})")
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def subprocess_on(cluster: LocalCluster, argv: list[str]) -> int:
    """Run ``argv`` on host d with the cluster's environment, its output shown as it comes."""
    assert cluster.hosts is not None
    prefix = cluster.hosts.hosts["d"].prefix()
    return subprocess.run([*prefix, *argv], env=cluster.env, check=False).returncode


def _passed(args: argparse.Namespace) -> list[str]:
    """The options the driver's part needs, as given here."""
    out = ["--shape", args.shape, "--microbatches", str(args.microbatches), "--rounds", str(args.rounds)]
    out += ["--repeats", str(args.repeats), "--lost", str(args.lost), "--new-tokens", str(args.new_tokens)]
    out += ["--prompt-tokens", str(args.prompt_tokens), "--sequences", *map(str, args.sequences)]
    return out


def _on_hosts(args: argparse.Namespace) -> dict[str, Any]:
    """Every case on namespaced hosts: d (head, driver), a and b (a core each), c (the spare)."""
    if set(args.cases) - {"generate", "boundary"}:
        corpus.rapidocr("rec")  # cached here, where the registry is reachable; the hosts have no route out
    with Hosts() as hosts:
        for name, cpus in (("d", None), ("a", (0,)), ("b", (1,)), ("c", (1,))):
            hosts.add(HostSpec(name, cpus=cpus, rate_mbit=FAST_MBIT))
        cluster = LocalCluster(system_config=QUICK_HEALTH_CHECKS, hosts=hosts, head_host="d", hide=False)
        try:
            cluster.add("a", 1, {"node_a": 1}, host="a")
            cluster.add("b", 1, {"node_b": 1}, host="b")
            cluster.wait()
            done: dict[str, Any] = {"hops": []}
            fast = [c for c in ("hops", "throughput", "generate") if c in args.cases]
            if fast:
                found = _drive(cluster, args, fast, FAST_MBIT)
                done["hops"] += found.pop("hops", [])
                done.update(found)
                if "generate" in found:
                    found["generate"]["socket_floor"] = _floor(hosts, found["generate"])
            slow = [c for c in ("hops", "link_bound", "boundary") if c in args.cases]
            if slow:
                found = _drive(cluster, args, slow, SLOW_MBIT)
                done["hops"] += found.pop("hops", [])
                done.update({k: v for k, v in found.items() if k not in done})
            if "lost_node" in args.cases:
                cluster.add("spare", 1, {"node_b": 1}, host="c")
                cluster.wait()
                done["lost_node"] = _drive(cluster, args, ["lost_node"], FAST_MBIT)["lost_node"]
        finally:
            cluster.stop()
    return {**done, "hosts": "namespaced hosts: d (head and driver), a (core 0), b (core 1), c (spare)"}


def _floor(hosts: Hosts, generate: dict[str, Any]) -> dict[str, Any] | None:
    """The bare socket's floor under the step's middle hop (:mod:`benchmarks.socket_floor`): its bytes
    from host a to host b, each side computing a stage's time before it sends; and what the data plane's
    hop costs beyond it."""
    hops, run_ms = generate.get("step_hops", []), generate.get("stage_run_ms")
    if len(hops) != 3 or not run_ms:
        return None
    found = socket_floor.floor(hosts, hops[1]["bytes"], run_ms / 1e3)
    return {**found, "plane_beyond_floor_ms": hops[1]["ms"] - found["a_to_b_ms"]}


def _on_loopback(args: argparse.Namespace, why: str) -> dict[str, Any]:
    """Every case on loopback nodes of this machine (no set rate), this process the driver."""
    cluster = LocalCluster(system_config=QUICK_HEALTH_CHECKS, hide=False)
    try:
        cluster.add("a", 1, {"node_a": 1})
        cluster.add("b", 1, {"node_b": 1})
        ray = cluster.connect()
        cluster.wait()

        def kill(node_id: str) -> None:
            cluster.kill(cluster.node(node_id))

        done = _run_cases(args, [c for c in args.cases if c != "lost_node"], kill)
        if "lost_node" in args.cases:
            cluster.add("spare", 1, {"node_b": 1})
            cluster.wait()
            args.spare = cluster.nodes[-1].node_id
            done.update(_run_cases(args, ["lost_node"], kill))
        ray.shutdown()
    finally:
        cluster.stop()
    return {**done, "hosts": f"loopback nodes on this machine ({why})"}


def _rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = list(summary.get("hops", []))
    if "throughput_per_s" in summary:
        rows.append({"case": "throughput", **summary["throughput_per_s"], **summary["ratios"]})
    if "link_bound" in summary:
        rows.append({"case": "link_bound", **summary["link_bound"]})
    if "boundary" in summary:
        rows.append({"case": "boundary", **summary["boundary"]})
    rows += summary.get("generate", {}).get("rows", [])
    if "lost_node" in summary:
        rows.append({"case": "lost_node", **summary["lost_node"]})
    return rows


def _cases_of(rows: list[dict[str, Any]]) -> set[str]:
    return {r["case"] for r in rows}


def _merged(
    path: Path, cases: Sequence[str], rows: list[dict[str, Any]], summary: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A partial run's rows and summary with the other cases' from the result at ``path``;
    ``merged_from`` names, for each case kept, the commit and date of the run that measured it."""
    if set(cases) == set(CASES) or not path.is_file():
        return rows, summary
    before = json.loads(path.read_text())
    kept = [r for r in before["rows"] if r["case"] not in cases]
    old = {k: v for k, v in before.get("summary", {}).items() if k not in summary and k != "merged_from"}
    source = {"git_sha": before.get("git_sha"), "date": before.get("machine", {}).get("date")}
    earlier = before.get("summary", {}).get("merged_from", {})
    merged = {
        **old,
        **summary,
        "merged_from": {c: earlier.get(c, source) for c in CASES if c not in cases and c in _cases_of(kept)},
    }
    order = {c: i for i, c in enumerate(CASES)}
    return sorted(kept + rows, key=lambda r: order.get(r["case"], len(order))), merged


def _print_ratios(summary: dict[str, Any]) -> None:
    print(summary["hosts"])
    for row in summary.get("hops", []):
        wire = (
            ""
            if row["wire_ms"] is None
            else f", wire {row['wire_ms']:.3f} ms, excess {row['excess_ms']:.3f} ms"
        )
        print(
            f"hop at {row['rate_mbit']} Mbit, {row['bytes']} B: {row['plane_ms_per_hop']:.3f} ms{wire} "
            f"(a Ray call: {row['ray_call_ms_per_hop']:.3f} ms)"
        )
    if "throughput_per_s" in summary:
        t = summary["throughput_per_s"]
        print(", ".join(f"{k} {v:.1f}/s" for k, v in t.items()))
        print(", ".join(f"{k} {v:.2f}x" for k, v in summary["ratios"].items()))
    if "link_bound" in summary:
        b = summary["link_bound"]
        if b["link_bound_per_s"] is not None:
            print(
                f"at {b['rate_mbit']} Mbit: {b['pipeline_per_s']:.1f}/s against the link's bound "
                f"{b['link_bound_per_s']:.1f}/s ({b['pipeline_x_link_bound']:.2f}x)"
            )
    if "boundary" in summary:
        b = summary["boundary"]
        print(
            f"ResNet-50 at {b['rate_mbit']} Mbit: float16 boundary {b['per_s']['float16']:.2f}/s, float32 "
            f"{b['per_s']['float32']:.2f}/s ({b['float16_x_float32']:.2f}x; {b['boundary_bytes']} B)"
        )
    generate = summary.get("generate", {})
    for row in generate.get("rows", []):
        print(
            f"generate, {row['sequences']} in flight: pipeline {row['ray_pipeline_tokens_per_s']:.1f} tok/s, "
            f"{row['pipeline_x_unsplit']:.2f}x the unsplit model on one node, "
            f"{row['pipeline_x_replicas']:.2f}x two replicas; same tokens {row['same_tokens']}"
        )
    for hop in generate.get("step_hops", []):
        print(
            f"generate step hop {hop['hop']}: {hop['bytes']} B in {hop['ms']:.3f} ms (wire {hop['wire_ms']}, "
            f"excess {hop['excess_ms']})"
        )
    floor = generate.get("socket_floor")
    if floor:
        print(
            f"socket floor a -> b: {floor['bytes']} B in {floor['a_to_b_ms']:.3f} ms on a bare socket after "
            f"{floor['gap_ms']:.1f} ms of compute each side (b -> a {floor['b_to_a_ms']:.3f} ms); the step's "
            f"stage 0 -> stage 1 hop costs {floor['plane_beyond_floor_ms']:.3f} ms beyond it"
        )
    if "lost_node" in summary:
        lost = summary["lost_node"]
        print(f"lost node: recovered in {lost['recovery_seconds']:.2f} s, {lost['replayed']} sent again")


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.inside:
        return _inside(args)
    load_before = os.getloadavg()
    why = cannot_make_hosts()
    done = _on_hosts(args) if why is None else _on_loopback(args, why)
    summary = {**done, "load_before_1_5_15": list(load_before)}
    print()
    _print_ratios(summary)
    if any(not row["same_tokens"] for row in summary.get("generate", {}).get("rows", [])):
        print("generate: the generators made DIFFERENT tokens")
        return 1
    target = (args.out or RESULTS) / "cluster.json"
    rows, summary = _merged(target, args.cases, _rows(summary), summary)
    params = params_of(args, model="rapidocr rec (PP-OCRv4)", decoder=DECODER)
    path = write_result("cluster", params, rows, summary=summary, out=args.out)
    print(f"wrote {shown(path)}")
    return 0
