"""What a cut costs: K stages run one after the other against the whole model, on one CPU.

A pipeline of K stages can reach K times one session only if its stages add up to the whole model.
Each model is split once (measured costs, ``--k`` stages) and exported three ways from the same cut:

* ``before``: as onnxpipe exported before equal values were shared, every tensor a later stage reads
  sent under its own name, and the stage files declaring the symbolic dims shape inference made up
  (``unk__82``);
* ``unnamed dims``: the same tensors sent, and only the symbols the source names declared;
* ``onnxpipe``: today's export: also each value sent once and its repeats remade
  (:func:`onnxpipe.ir.shapevalues.value_classes`).

Then, pinned to one CPU with one intra-op thread, the whole model's session and each variant's stages
are timed, each stage looping alone on what it receives (as a pipeline runs it on a CPU of its own,
its caches its own), in short blocks of :data:`BLOCK` runs taken in turn in shuffled order, so that a
slow spell of this VM hits every variant alike; about ``--seconds`` of the whole model per round.
Sessions are made anew each round: where a session's memory lands can make one copy of a model run a
few percent faster than another for as long as it lives.  Per round: each stage's median time, their
sum and the slowest stage; the table gives the median over rounds of each per-round ratio against the
whole model (``stage sum x whole``; ``slowest x whole/K``: what bounds the pipeline, 1.00 being a
perfect cut), and whether a variant's outputs are bit-equal to the whole model's.
With ``--pipeline-rounds`` (default 6) it then runs what the stage files deliver in a pipeline: the
hand-built pipeline of the ``overhead`` benchmark (a pinned thread per stage, nothing of onnxpipe's runtime)
on the ``before`` files and on today's, and the one-thread session, in rounds of alternating order.
Results go to ``benchmarks/results/stagecost.json``::

    python -m benchmarks stagecost [--models gpt2_tiny,bert_tiny] [--rounds 9] [--k 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from benchmarks.bench_overhead import WARMUP, Stage, minimal_pipeline
from benchmarks.bench_pipeline import CpuWatch, alternating_rounds, model_table, run_models
from benchmarks.common import benchmark_parser
from onnxpipe.api import ProfileOptions
from onnxpipe.core.ortsession import session_options
from onnxpipe.cost.source import get_profile
from onnxpipe.export.boundary import clean
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.stages import StageOptions, assign_stages
from onnxpipe.planning.types import Plan
from onnxpipe.planning.workers import make_plan
from onnxpipe.runtime.affinity import cpu_sets, pinned
from onnxpipe.runtime.inputs import random_inputs
from onnxpipe.runtime.report.baselines import session_throughput
from onnxpipe.runtime.spec import Placement

Feeds = Mapping[str, np.ndarray]
VARIANTS = ("before", "unnamed dims", "onnxpipe")
BLOCK = 6
"""Runs of one session in a row, its caches warm after the first, as a pipeline stage runs."""


def unshared(view: ModelView, plan: Plan) -> Plan:
    """``plan``'s cut with every tensor a later stage reads sent under its own name."""
    bounds = [0]
    for st in plan.stages:
        bounds.append(bounds[-1] + len(st.node_names))
    stages = assign_stages(
        view,
        bounds,
        plan.tensor_bytes,
        [s.compute_seconds for s in plan.stages],
        [s.transfer_seconds for s in plan.stages],
        StageOptions(share_equal_values=False),
    )
    return replace(plan, stages=stages)


def with_inferred_symbols(view: ModelView, path: Path) -> bytes:
    """The stage file with its inputs and outputs declared as shape inference typed them (made-up
    symbols included), as onnxpipe wrote them before."""
    model = onnx.load(str(path))
    for vi in [*model.graph.input, *model.graph.output]:
        info = view.tensors.get(vi.name)
        if info is None or info.shape is None or not vi.type.HasField("tensor_type"):
            continue
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, info.elem_type, list(clean(info.shape) or ())))
    return bytes(model.SerializeToString())


class Chain:
    """Stage sessions, run one after the other (:meth:`run`) or each looping on its own inputs
    (:meth:`loop`), as a pipeline runs each stage on a CPU of its own."""

    def __init__(self, models: Sequence[bytes | str]) -> None:
        self.sessions = [
            ort.InferenceSession(m, session_options(threads=1), providers=["CPUExecutionProvider"])
            for m in models
        ]
        self.inputs = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self.outputs = [[o.name for o in s.get_outputs()] for s in self.sessions]

    def run(self, feeds: Feeds) -> dict[str, Any]:
        """Every tensor the stages make from ``feeds``, the model's outputs among them."""
        tensors: dict[str, Any] = dict(feeds)
        for i, session in enumerate(self.sessions):
            results = session.run(self.outputs[i], {n: tensors[n] for n in self.inputs[i]})
            tensors.update(zip(self.outputs[i], results, strict=True))
        return tensors

    def stage_feeds(self, pool: Sequence[Feeds]) -> list[list[dict[str, Any]]]:
        """For each stage, what it receives for each input of ``pool``."""
        per_stage: list[list[dict[str, Any]]] = [[] for _ in self.sessions]
        for feeds in pool:
            tensors = self.run(feeds)
            for i, names in enumerate(self.inputs):
                per_stage[i].append({n: tensors[n] for n in names})
        return per_stage

    def loop(self, i: int, feeds: Sequence[dict[str, Any]], count: int) -> float:
        """Median seconds of stage ``i`` run ``count`` times in a row on ``feeds`` (the first run, which
        finds its caches cold, left out)."""
        session, outputs = self.sessions[i], self.outputs[i]
        times = []
        for j in range(count + 1):
            start = time.perf_counter()
            session.run(outputs, feeds[j % len(feeds)])
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])


def optimized_nodes(models: Sequence[bytes | str], scratch: Path) -> int:
    """Nodes of the graphs onnxruntime runs for ``models`` (after its optimizations), added up: equal to the
    whole model's when the stages are optimized as it is."""
    count = 0
    for j, m in enumerate(models):
        saved = scratch / f"optimized_{j}.onnx"
        options = session_options(threads=1, optimized_path=saved)
        ort.InferenceSession(m, options, providers=["CPUExecutionProvider"])
        count += len(onnx.load(str(saved), load_external_data=False).graph.node)
        saved.unlink()
    return count


def pipeline_rates(
    name: str,
    path: Path,
    files: Mapping[str, Sequence[Path]],
    pool: Sequence[Feeds],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The hand-built pipeline of the ``overhead`` benchmark (a pinned thread per stage, ``queue.Queue(2)``
    between them) on the ``before`` and today's stage files, and the one-thread session, in rounds of
    alternating order; stages made anew each round."""
    sets = cpu_sets([1] * args.k)
    if sets is None:
        raise SystemExit(f"--pipeline-rounds: {args.k} stages need {args.k} CPUs this process may use")
    cpus = [c[0] for c in sets]
    whole = Placement(threads=1, cpus=(cpus[0],))
    first = session_throughput(path, list(pool) * 4, placement=whole, warmup=WARMUP)
    inputs = [pool[j % len(pool)] for j in range(max(32, round(args.pipeline_seconds * first)))]
    runs = {
        "session_1": lambda: session_throughput(path, inputs, placement=whole, warmup=WARMUP),
        "before": lambda: minimal_pipeline(
            [Stage(f, cpus[i]) for i, f in enumerate(files["before"])], inputs
        )[0],
        "onnxpipe": lambda: minimal_pipeline(
            [Stage(f, cpus[i]) for i, f in enumerate(files["shared"])], inputs
        )[0],
    }
    rates, others = alternating_rounds(f"{name} pipeline", runs, args.pipeline_rounds)

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    return {
        "microbatches": len(inputs),
        "throughput_per_s": {key: statistics.median(v) for key, v in rates.items()},
        "all_rounds": rates,
        "before_x_session_1": ratio("before", "session_1"),
        "onnxpipe_x_session_1": ratio("onnxpipe", "session_1"),
        "onnxpipe_x_before": ratio("onnxpipe", "before"),
        "others_cores": others,
    }


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    sets = cpu_sets([1])
    if sets is None:
        raise SystemExit("this process may use no CPU")
    cpu = sets[0]  # the first CPU this process may use, as the benchmarks that pin do
    view = load_model(path)
    profile = get_profile(view, ProfileOptions(cost="profile", shapes=shapes))
    plan = make_plan(view, profile, args.k)
    scratch = Path(tempfile.mkdtemp(prefix=f"stagecost-{name}-"))
    try:
        export_stages(view, plan, scratch / "shared")
        export_stages(view, unshared(view, plan), scratch / "unshared")
        files = {
            d: [scratch / d / st.file for st in load_manifest(scratch / d).stages]
            for d in ("shared", "unshared")
        }
        (scratch / "before").mkdir()
        files["before"] = []
        for f in files["unshared"]:
            files["before"].append(scratch / "before" / f.name)
            files["before"][-1].write_bytes(with_inferred_symbols(view, f))
        models: dict[str, list[bytes | str]] = {
            "whole": [str(path)],
            "before": [str(f) for f in files["before"]],
            "unnamed dims": [str(f) for f in files["unshared"]],
            "onnxpipe": [str(f) for f in files["shared"]],
        }
        nodes_run = {v: optimized_nodes(m, scratch) for v, m in models.items()}
        with pinned(cpu):
            input_shapes = {n: tuple(v) for n, v in plan.input_shapes.items()}
            pool = random_inputs(path, input_shapes, 4, seed=0)
            variants = {v: Chain(m) for v, m in models.items()}
            outputs = [o.name for o in variants["whole"].sessions[0].get_outputs()]
            want = variants["whole"].run(pool[0])
            bit_equal = {}
            max_diff = {}
            for v in VARIANTS:
                got = variants[v].run(pool[0])
                bit_equal[v] = all(np.array_equal(got[o], want[o]) for o in outputs)
                max_diff[v] = max(
                    float(np.max(np.abs(np.asarray(got[o], np.float64) - want[o]))) for o in outputs
                )
            start = time.perf_counter()
            variants["whole"].run(pool[0])
            blocks = max(2, round(args.seconds / (time.perf_counter() - start) / BLOCK))
            per_round: dict[str, list[list[float]]] = {v: [] for v in models}  # stage medians per round
            others: list[float] = []
            rng = random.Random(0)
            for r in range(args.rounds):
                # new sessions every round (see the module docstring)
                variants = {v: Chain(models[v]) for v in models}
                feeds = {v: c.stage_feeds(pool) for v, c in variants.items()}
                units = [(v, i) for v, c in variants.items() for i in range(len(c.sessions))]
                medians: dict[tuple[str, int], list[float]] = {u: [] for u in units}
                with CpuWatch(()) as watch:
                    for _ in range(blocks):  # short blocks in turn: a slow spell of the VM hits all alike
                        rng.shuffle(units)
                        for v, i in units:
                            medians[v, i].append(variants[v].loop(i, feeds[v][i], BLOCK))
                others.append(watch.others_cores())
                for v, c in variants.items():
                    per_round[v].append([statistics.median(medians[v, i]) for i in range(len(c.sessions))])
                done = ", ".join(f"{v} {1e3 * sum(per_round[v][-1]):.2f} ms" for v in models)
                print(
                    f"  {name} round {r + 1}/{args.rounds}: {done}; others used {others[-1]:.2f} cores",
                    flush=True,
                )
        pipeline = pipeline_rates(name, path, files, pool, args) if args.pipeline_rounds else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    whole_s = [row[0] for row in per_round["whole"]]

    def ratio(v: str, of: str) -> float:
        pick = sum if of == "sum" else max
        scale = 1.0 if of == "sum" else 1.0 / args.k
        return statistics.median(
            pick(row) / (w * scale) for row, w in zip(per_round[v], whole_s, strict=True)
        )

    def ms(v: str) -> list[float]:
        return [1e3 * statistics.median(col) for col in zip(*per_round[v], strict=True)]

    return {
        "model": name,
        "k": args.k,
        "runs_per_round": blocks * BLOCK,
        "rounds": args.rounds,
        "whole_ms": 1e3 * statistics.median(whole_s),
        "stage_ms": {v: ms(v) for v in VARIANTS},
        "sum_x_whole": {v: ratio(v, "sum") for v in VARIANTS},
        "slowest_x_whole_over_k": {v: ratio(v, "max") for v in VARIANTS},
        "onnxpipe_x_before": {
            "sum": statistics.median(
                sum(a) / sum(b) for a, b in zip(per_round["onnxpipe"], per_round["before"], strict=True)
            ),
            "slowest": statistics.median(
                max(a) / max(b) for a, b in zip(per_round["onnxpipe"], per_round["before"], strict=True)
            ),
        },
        "bit_equal_to_whole": bit_equal,
        "optimized_nodes": nodes_run,
        "max_abs_diff": max_diff,
        "remade": sum(len(s.aliases) for s in plan.stages),
        "skipped_nodes": sum(len(s.skipped_nodes) for s in plan.stages),
        "others_cores": others,
        "pipeline": pipeline,
    }


def print_summary(rows: Sequence[dict[str, Any]]) -> None:
    headers = [
        "model",
        "K",
        "whole",
        "stage sum x whole: before / unnamed dims / onnxpipe",
        "slowest x whole/K: before / onnxpipe",
        "onnxpipe x before (sum, slowest)",
        "bit-equal to whole: before / onnxpipe",
        "nodes run: whole / before / onnxpipe",
        "remade, left-out nodes",
        "others (max cores)",
    ]
    print("\n| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for r in rows:
        s, m, x = r["sum_x_whole"], r["slowest_x_whole_over_k"], r["onnxpipe_x_before"]
        eq = {v: "yes" if b else "no" for v, b in r["bit_equal_to_whole"].items()}
        cells = [
            r["model"],
            str(r["k"]),
            f"{r['whole_ms']:.2f} ms",
            " / ".join(f"{s[v]:.3f}" for v in VARIANTS),
            f"{m['before']:.3f} / {m['onnxpipe']:.3f}",
            f"{x['sum']:.3f}, {x['slowest']:.3f}",
            f"{eq['before']} / {eq['onnxpipe']}",
            " / ".join(str(r["optimized_nodes"][v]) for v in ("whole", "before", "onnxpipe")),
            f"{r['remade']}, {r['skipped_nodes']}",
            f"{max(r['others_cores']):.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    piped = [r for r in rows if r["pipeline"]]
    if piped:
        print(
            "\n| model | 1-thread session | hand-built pipeline x session: before / onnxpipe "
            "| onnxpipe x before |"
        )
        print("|---|---|---|---|")
        for r in piped:
            q = r["pipeline"]
            print(
                f"| {r['model']} | {q['throughput_per_s']['session_1']:.1f}/s | "
                f"{q['before_x_session_1']:.3f} / {q['onnxpipe_x_session_1']:.3f} | "
                f"{q['onnxpipe_x_before']:.3f} |"
            )


def main(argv: list[str]) -> int:
    table = model_table()
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", default=",".join(table), help="comma-separated: " + ", ".join(table))
    parser.add_argument("--k", type=int, default=2, help="stages (default 2)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of every variant (default 9)")
    parser.add_argument(
        "--seconds", type=float, default=0.8, help="seconds of the whole model per round (default 0.8)"
    )
    parser.add_argument(
        "--pipeline-rounds",
        type=int,
        default=6,
        help="rounds of the pipelines on K CPUs (default 6; 0: none)",
    )
    parser.add_argument(
        "--pipeline-seconds", type=float, default=2.5, help="about how long one pipeline run takes"
    )
    args = parser.parse_args(argv)
    return run_models("stagecost", parser, args, bench_model, print_summary, table)
