"""The Ray backend across nodes: a hop's overhead per transport, the pipeline against replicas, a lost node.

On a Ray cluster of nodes started on this machine as users start them on several
(``tools/ray_cluster.py``: ``ray start --head`` without CPUs, two worker nodes of 1 CPU each, with the
custom resources that pin stage 0 to one and stage 1 to the other), in one run:

* ``hops``: a micro-batch through two actors and back (driver -> a -> b -> driver, three hops), one at a
  time, the actors doing no work, at a small size and at the split's boundary size: the median time per
  hop of each transport: ``object_store`` (each actor returns its tensor as one value and the next call
  takes the reference: what the Ray backend did before, every tensor over 100 KiB through Ray's object
  store), ``inline`` (the backend's transport: a header and pieces under 100 KiB in the calls,
  ``onnxpipe/runtime/backends/ray_wire.py``, the driver passing each call's references to the next),
  ``push`` (the same pieces, each actor calling the next itself and the last one answering the driver:
  no hop through the driver) and ``compiled_graph`` (Ray's compiled graphs, where the installed Ray has
  them); and ``bare_call``, half an empty call's round trip to one actor: the least a hop costs in Ray
  here;
* ``throughput``: the 2-stage split of a model whose stages take a few milliseconds each, as
  ``onnxpipe run`` runs it on the cluster (``ray_pipeline``), against two Ray replicas of the whole model
  on the same two nodes (``ray_replicas``), and against the local threads backend in this process
  (``threads_pipeline``, ``threads_replicas``): each one's steady micro-batches per second, in rounds
  whose order alternates, and the ratios of the rounds' medians; with the pipeline's own report of a
  hop's overhead (``overhead_ms`` of ``run --report``: a micro-batch's time beyond its stages' work, one
  at a time, shared among its hops);
* ``generate``: the medium decoder (``tools/export_decoders.py``'s ``llama_gqa_medium``, as
  ``benchmarks/bench_generate.py`` uses) split in 2 stages, a stage per node, each actor keeping its
  layers' KV cache (``ray_pipeline``), against the unsplit model on one node (``ray_unsplit``) and two
  replicas of it, one per node (``ray_replicas``), one intra-op thread per actor: tokens/s (new tokens
  over wall time, prefill included) at 1, 2 and 4 sequences in flight, medians of rounds whose order
  rotates, the ratios; every generator must make the same tokens (else the benchmark fails);
* ``lost_node``: a spare node with stage 1's resources joins, the node holding stage 1 is killed (its
  whole process tree, SIGKILL) in the middle of a long stream; the stream completes, and the result
  holds the time the recovery took (Ray's health checks declaring the node dead with its default
  settings, the actor started again on the spare, the stage shipped there and opened), the micro-batches
  sent again, and the run's time against the same stream undisturbed.

The machine is shared: the load average and the CPU that other processes used are recorded with the
result.  Results: ``benchmarks/results/cluster.json``::

    python -m benchmarks cluster [--shape x=1,3,48,120] [--microbatches 300] [--rounds 3] [--out DIR]
        [--cases hops throughput generate lost_node] [--sequences 1 2 4] [--new-tokens 32]

``--cases`` runs some of the cases alone: the result keeps the other cases' rows from the result already
there (``summary.merged_from`` names, per case kept, the commit and date of the run that measured it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_pipeline import CLOCK_TICKS, _busy_ticks
from benchmarks.bench_ray import TreeWatch
from benchmarks.common import RESULTS, benchmark_parser, params_of, shown, write_result
from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.backends.ray_backend import RayBackend
from onnxpipe.runtime.backends.ray_wire import pack, slots_for, unpack
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
from tools import corpus, export_decoders
from tools.ray_cluster import LocalCluster

PINNED = [{"resources": {"node_a": 1}}, {"resources": {"node_b": 1}}]
DECODER = "llama_gqa_medium"
"""The decoder of the ``generate`` case, as ``benchmarks/bench_generate.py`` uses."""
CASES = ("hops", "throughput", "generate", "lost_node")
SMALL = 4096
WARMUP = 8


# --------------------------------------------------------------------------------------------------
# hops: the transports side by side


class Relay:
    """An actor that passes what it gets on, by each transport."""

    def __init__(self) -> None:
        self.next: Any = None
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.done: dict[int, Any] = {}

    def link(self, following: Any) -> None:
        self.next = following

    def plain(self, x: np.ndarray) -> np.ndarray:
        return x

    def inline(self, slots: int, header: Any, *pieces: Any) -> tuple[Any, ...]:
        return pack(unpack(header, pieces), slots, sent=time.time())

    def empty(self) -> None:
        return None

    async def push(self, seq: int, slots: int, header: Any, *pieces: Any) -> None:
        message = pack(unpack(header, pieces), slots, sent=time.time())
        if self.next is not None:
            self.next.push.remote(seq, slots, *message)
        elif seq in self.waiting:
            self.waiting.pop(seq).set_result(message)
        else:
            self.done[seq] = message

    async def result(self, seq: int) -> Any:
        if seq in self.done:
            return self.done.pop(seq)
        future = asyncio.get_running_loop().create_future()
        self.waiting[seq] = future
        return await future


def _median_ms(call: Callable[[int], object], repeats: int) -> float:
    for j in range(WARMUP):
        call(-1 - j)
    times = []
    for j in range(repeats):
        start = time.perf_counter()
        call(j)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def hop_times(ray: Any, sizes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Each transport's median time per hop at each size (three hops a trip)."""
    relay = ray.remote(Relay)
    a = relay.options(num_cpus=0, resources={"node_a": 0.01}).remote()
    b = relay.options(num_cpus=0, resources={"node_b": 0.01}).remote()
    ray.get(a.link.remote(b))
    rows = [_hops_at(ray, a, b, size, repeats, 10**9 * (i + 1)) for i, size in enumerate(sizes)]
    for actor in (a, b):
        ray.kill(actor)
    return rows


def _hops_at(ray: Any, a: Any, b: Any, size: int, repeats: int, first_seq: int) -> dict[str, Any]:
    x = np.ones(size, dtype=np.uint8)
    n = slots_for({"x": x})
    message = pack({"x": x}, n, sent=0.0)
    seq = [first_seq]

    def pushed(_: int) -> object:
        seq[0] += 1
        a.push.remote(seq[0], n, *message)
        return ray.get(list(b.result.options(num_returns=n).remote(seq[0])))

    def inline(_: int) -> object:
        first = a.inline.options(num_returns=n).remote(n, *message)
        return ray.get(list(b.inline.options(num_returns=n).remote(n, *first)))

    transports: dict[str, Callable[[int], object]] = {
        "object_store": lambda _: ray.get(b.plain.remote(a.plain.remote(x))),
        "inline": inline,
        "push": pushed,
    }
    row: dict[str, Any] = {
        "bytes": size,
        "bare_call_ms_per_hop": _median_ms(lambda _: ray.get(a.empty.remote()), repeats) / 2,
    }
    for name, call in transports.items():
        row[f"{name}_ms_per_hop"] = _median_ms(call, repeats) / 3
    row["compiled_graph_ms_per_hop"] = _compiled(ray, a, b, x, repeats)
    shown_ms = ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "bytes" and v is not None)
    print(f"  hops at {size} B: {shown_ms}")
    return row


def _compiled(ray: Any, a: Any, b: Any, x: np.ndarray, repeats: int) -> float | None:
    """The compiled graph's time per hop, or None where the installed Ray cannot compile it."""
    try:
        from ray.dag import InputNode

        with InputNode() as given:
            dag = b.plain.bind(a.plain.bind(given))
        graph = dag.experimental_compile()
    except Exception as e:  # noqa: BLE001 - a Ray without compiled graphs: the figure is absent
        print(f"  compiled graphs unavailable: {type(e).__name__}: {e}")
        return None
    try:
        return _median_ms(lambda _: ray.get(graph.execute(x)), repeats) / 3
    finally:
        graph.teardown()


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


def lost_node(cluster: LocalCluster, split: Path, inputs: Sequence[Any], count: int) -> dict[str, Any]:
    """Stream ``count`` micro-batches undisturbed, then again killing stage 1's node a fifth of the way
    in, a spare with its resources waiting: the recovery and the time the run lost."""
    stream = [inputs[j % len(inputs)] for j in range(count)]
    with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
        pipe.run_many(stream[:WARMUP])
        start = time.perf_counter()
        pipe.run_many(stream)
        quiet = time.perf_counter() - start
    cluster.add("spare", 1, {"node_b": 1})
    cluster.wait()
    with Pipeline.from_manifest(split, RayConfig(resources=PINNED)) as pipe:
        backend = pipe.backend
        assert isinstance(backend, RayBackend)
        victim = cluster.node(backend.placed[1].node_id)
        pipe.run_many(stream[:WARMUP])
        start = time.perf_counter()
        for delivered, _ in enumerate(pipe.stream(stream), start=1):
            if delivered == count // 5:
                threading.Thread(target=cluster.kill, args=(victim,), daemon=True).start()
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
        "moved_to_spare": recovery.now.node_id == cluster.nodes[-1].node_id,
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
) -> dict[int, Generation]:
    """``kind`` opened (a node takes one actor at a time: each generator has the cluster to itself),
    warmed up, and run on each count's prompts."""
    with _generator(kind, folder) as pipe:
        warm = GenerateOptions(prompt_ids=((1, 2, 3, 4),) * 2, max_new_tokens=4, ignore_eos=True)
        pipe.generate_with(pipe.prompting(warm))
        made = {}
        for count, prompts in cases.items():
            options = GenerateOptions(
                prompt_ids=tuple(tuple(p) for p in prompts), max_new_tokens=new_tokens, ignore_eos=True
            )
            made[count] = pipe.generate_with(pipe.prompting(options))
    return made


def generation(
    counts: Sequence[int], rounds: int, new_tokens: int, prompt_tokens: int, base: Path
) -> list[dict[str, Any]]:
    """Tokens/s of the medium decoder's 2-stage split on the two nodes, against the unsplit model on
    one node and two replicas of it, at each count of sequences in flight: medians of rounds whose
    order rotates, the ratios, and whether every generator made the same tokens."""
    folder = base / "decoder"
    api.split(
        export_decoders.decoder(DECODER),
        SplitOptions(out=folder, plan=PlanRequest(2), profile=ProfileOptions(runs=10, threads=1)),
    )
    vocab = export_decoders.SPECS[DECODER].vocab
    rng = np.random.default_rng(0)
    cases = {n: [rng.integers(0, vocab, size=prompt_tokens).tolist() for _ in range(n)] for n in counts}
    rates: dict[tuple[str, int], list[float]] = {(k, n): [] for k in GENERATORS for n in counts}
    tokens: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {}
    for r in range(rounds):
        for kind in GENERATORS[r % 3 :] + GENERATORS[: r % 3]:
            for n, g in _generate_round(kind, folder, cases, new_tokens).items():
                rates[kind, n].append(g.tokens_per_second)
                tokens[kind, n] = g.tokens
        print(f"  generate round {r + 1}/{rounds}: " + _rates_text(rates, counts))
    return [_generation_row(n, rates, tokens) for n in counts]


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
    parser.add_argument("--repeats", type=int, default=200, help="trips per transport and size")
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
    return parser.parse_args(argv)


def _run_cases(args: argparse.Namespace, cluster: LocalCluster, ray: Any, base: Path) -> dict[str, Any]:
    """Each case of ``args.cases``: ``generate`` first, then the recogniser's (the lost node last: it
    kills one)."""
    done: dict[str, Any] = {}
    if "generate" in args.cases:
        done["generate"] = generation(args.sequences, args.rounds, args.new_tokens, args.prompt_tokens, base)
    if set(args.cases) - {"generate"}:
        done.update(_recogniser_cases(args, cluster, ray, base))
    return done


def _recogniser_cases(
    args: argparse.Namespace, cluster: LocalCluster, ray: Any, base: Path
) -> dict[str, Any]:
    """The hops, throughput and lost-node cases, on the recogniser's 2-stage split."""
    shape = tuple(int(d) for d in args.shape.split(","))
    model = corpus.rapidocr("rec")
    split = _split(model, shape, base)
    m = load_manifest(split)
    boundary = m.stages[1].link_bytes_in
    inputs = random_inputs(model, {"x": shape}, 8, seed=0)
    stream = [inputs[j % len(inputs)] for j in range(args.microbatches)]
    print(
        f"stages estimated at {[round(s.estimated_compute_seconds * 1e3, 2) for s in m.stages]} ms, "
        f"{boundary} B across the cut"
    )
    done: dict[str, Any] = {
        "stage_estimated_ms": [s.estimated_compute_seconds * 1e3 for s in m.stages],
        "boundary_bytes": boundary,
    }
    if "hops" in args.cases:
        done["hops"] = hop_times(ray, [SMALL, boundary], args.repeats)
    if "throughput" in args.cases:
        done.update(throughput(model, split, stream, args.rounds))
    if "lost_node" in args.cases:
        done["lost_node"] = lost_node(cluster, split, inputs, args.lost)
    return done


def _rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"case": "hops", **h} for h in summary.get("hops", [])]
    if "throughput_per_s" in summary:
        rows.append({"case": "throughput", **summary["throughput_per_s"], **summary["ratios"]})
    rows += summary.get("generate", [])
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
    return sorted(kept + rows, key=lambda r: order[r["case"]]), merged


def _print_ratios(summary: dict[str, Any]) -> None:
    if "throughput_per_s" in summary:
        t = summary["throughput_per_s"]
        print(", ".join(f"{k} {v:.1f}/s" for k, v in t.items()))
        print(", ".join(f"{k} {v:.2f}x" for k, v in summary["ratios"].items()))
        print(f"pipeline hop overhead {summary['pipeline_hop_overhead_ms']:.3f} ms (median, one at a time)")
        cpu, cores = summary["machine_cpu_ms_per_microbatch"], summary["machine_busy_cores"]
        print(", ".join(f"{k} {cpu[k]:.2f} ms CPU per micro-batch on {cores[k]:.2f} cores" for k in cpu))
    for row in summary.get("generate", []):
        print(
            f"generate, {row['sequences']} in flight: pipeline {row['ray_pipeline_tokens_per_s']:.1f} tok/s, "
            f"{row['pipeline_x_unsplit']:.2f}x the unsplit model on one node, "
            f"{row['pipeline_x_replicas']:.2f}x two replicas; same tokens {row['same_tokens']}"
        )


def main(argv: list[str]) -> int:
    args = _parse(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    load_before = os.getloadavg()
    cluster = LocalCluster(hide=False)
    try:
        cluster.add("a", 1, {"node_a": 1})
        cluster.add("b", 1, {"node_b": 1})
        ray = cluster.connect()
        cluster.wait()
        summary = {**_run_cases(args, cluster, ray, base), "load_before_1_5_15": list(load_before)}
    finally:
        import ray as ray_module

        ray_module.shutdown()
        cluster.stop()
    print()
    _print_ratios(summary)
    if any(not row["same_tokens"] for row in summary.get("generate", [])):
        print("generate: the generators made DIFFERENT tokens")
        return 1
    target = (args.out or RESULTS) / "cluster.json"
    rows, summary = _merged(target, args.cases, _rows(summary), summary)
    params = params_of(args, model="rapidocr rec (PP-OCRv4)", decoder=DECODER)
    path = write_result("cluster", params, rows, summary=summary, out=args.out)
    print(f"wrote {shown(path)}")
    return 0
