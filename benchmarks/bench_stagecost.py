"""What a cut costs: K stages run one after the other against the whole model, on one CPU.

A pipeline of K stages can reach K times one session only if its stages add up to the whole model.
Each model is split once (measured costs, ``--k`` stages) and exported three ways from the same cut:

* ``before``: as onnxpipe exported before equal values were shared, every tensor a later stage reads
  sent under its own name, and the stage files declaring the symbolic dims shape inference made up
  (``unk__82``);
* ``unnamed dims``: the same tensors sent, and only the symbols the source names declared;
* ``onnxpipe``: today's export: also each value sent once and its repeats remade
  (:mod:`onnxpipe.samevalue`).

Then, pinned to one CPU with one intra-op thread, in rounds whose order is shuffled, the whole model's
session and each variant's stages one after the other on the same inputs, ``--seconds`` of each per
round.  Per round: each stage's median time, their sum and the slowest stage; the table gives the median
over rounds of each per-round ratio against the whole model (``stage sum x whole``; ``slowest x
whole/K``: what bounds the pipeline, 1.00 being a perfect cut), and whether a variant's outputs are
bit-equal to the whole model's.  Results go to ``benchmarks/results/stagecost.json``::

    python benchmarks/bench_stagecost.py [--models gpt2_tiny,bert_tiny] [--rounds 7] [--k 2]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import helper  # noqa: E402

from benchmarks.bench_pipeline import CpuWatch, model_table, run_models  # noqa: E402
from onnxpipe import api  # noqa: E402
from onnxpipe.boundary import clean  # noqa: E402
from onnxpipe.export import export_stages  # noqa: E402
from onnxpipe.manifest import load_manifest  # noqa: E402
from onnxpipe.model import ModelView, load_model  # noqa: E402
from onnxpipe.ortsession import session_options  # noqa: E402
from onnxpipe.plan import Plan, assign_stages, make_plan  # noqa: E402
from onnxpipe.runtime.affinity import cpu_sets, pinned  # noqa: E402
from onnxpipe.runtime.inputs import random_inputs  # noqa: E402

Feeds = Mapping[str, np.ndarray]
VARIANTS = ("before", "unnamed dims", "onnxpipe")


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
        share_equal_values=False,
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
    """Stage sessions run one after the other, each run timed."""

    def __init__(self, models: Sequence[bytes | str]) -> None:
        self.sessions = [
            ort.InferenceSession(m, session_options(threads=1), providers=["CPUExecutionProvider"])
            for m in models
        ]
        self.inputs = [[i.name for i in s.get_inputs()] for s in self.sessions]
        self.outputs = [[o.name for o in s.get_outputs()] for s in self.sessions]

    def run(self, feeds: Feeds, times: list[list[float]] | None = None) -> dict[str, Any]:
        tensors: dict[str, Any] = dict(feeds)
        for i, session in enumerate(self.sessions):
            ins = {n: tensors[n] for n in self.inputs[i]}
            start = time.perf_counter()
            results = session.run(self.outputs[i], ins)
            if times is not None:
                times[i].append(time.perf_counter() - start)
            tensors.update(zip(self.outputs[i], results, strict=True))
        return tensors


def bench_model(
    name: str, path: Path, shapes: dict[str, tuple[int, ...]] | None, args: argparse.Namespace
) -> dict[str, Any]:
    sets = cpu_sets([1])
    if sets is None:
        raise SystemExit("this process may use no CPU")
    cpu = sets[0]  # the first CPU this process may use, as the benchmarks that pin do
    view = load_model(path)
    profile = api.get_profile(view, cost="profile", shapes=shapes)
    plan = make_plan(view, profile, args.k)
    scratch = Path(tempfile.mkdtemp(prefix=f"stagecost-{name}-"))
    try:
        export_stages(view, plan, scratch / "shared")
        export_stages(view, unshared(view, plan), scratch / "unshared")
        files = {
            d: [scratch / d / st.file for st in load_manifest(scratch / d).stages]
            for d in ("shared", "unshared")
        }
        with pinned(cpu):
            whole = Chain([str(path)])
            chains = {
                "before": Chain([with_inferred_symbols(view, f) for f in files["unshared"]]),
                "unnamed dims": Chain([str(f) for f in files["unshared"]]),
                "onnxpipe": Chain([str(f) for f in files["shared"]]),
            }
            input_shapes = {n: tuple(v) for n, v in plan.input_shapes.items()}
            pool = random_inputs(path, input_shapes, 4, seed=0)
            outputs = [o.name for o in whole.sessions[0].get_outputs()]
            want = whole.run(pool[0])
            bit_equal = {}
            max_diff = {}
            for v, chain in chains.items():
                got = chain.run(pool[0])
                bit_equal[v] = all(np.array_equal(got[o], want[o]) for o in outputs)
                max_diff[v] = max(
                    float(np.max(np.abs(np.asarray(got[o], np.float64) - want[o]))) for o in outputs
                )
            for _ in range(3):  # warm-up
                for c in (whole, *chains.values()):
                    c.run(pool[0])
            start = time.perf_counter()
            whole.run(pool[0])
            n = max(8, round(args.seconds / (time.perf_counter() - start)))
            variants: dict[str, Chain] = {"whole": whole, **chains}
            per_round: dict[str, list[list[float]]] = {v: [] for v in variants}  # stage medians per round
            others: list[float] = []
            order = list(variants)
            rng = random.Random(0)
            for r in range(args.rounds):
                rng.shuffle(order)
                with CpuWatch(()) as watch:
                    for v in order:
                        chain = variants[v]
                        times: list[list[float]] = [[] for _ in chain.sessions]
                        for j in range(n):
                            chain.run(pool[j % len(pool)], times)
                        per_round[v].append([statistics.median(t) for t in times])
                others.append(watch.others_cores())
                done = ", ".join(f"{v} {1e3 * sum(per_round[v][-1]):.2f} ms" for v in variants)
                print(
                    f"  {name} round {r + 1}/{args.rounds}: {done}; others used {others[-1]:.2f} cores",
                    flush=True,
                )
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
        "runs_per_round": n,
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
        "max_abs_diff": max_diff,
        "remade": sum(len(s.aliases) for s in plan.stages),
        "skipped_nodes": sum(len(s.skipped_nodes) for s in plan.stages),
        "others_cores": others,
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
            f"{r['remade']}, {r['skipped_nodes']}",
            f"{max(r['others_cores']):.2f}",
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv: Sequence[str] | None = None) -> int:
    table = model_table()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", default=",".join(table), help="comma-separated: " + ", ".join(table))
    parser.add_argument("--k", type=int, default=2, help="stages (default 2)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of every variant (default 7)")
    parser.add_argument("--seconds", type=float, default=0.8, help="seconds of each variant per round")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stagecost.json")
    args = parser.parse_args(argv)
    return run_models(parser, args, bench_model, print_summary, table)


if __name__ == "__main__":
    raise SystemExit(main())
