"""Decode throughput: a decoder's K-stage pipeline generating K and more sequences, against the unsplit model
and K replicas running the same sequences, side by side in one run.

Each model (``tools/export_decoders.py``'s ``*_small``: random-weight Llama with grouped-query attention,
Qwen2 and GPT-2, 8 layers, built in the cache; and ``llama_gqa_medium``, whose 250 MB of weights stay out
of the CPU's cache as a real LLM's do) is split into K stages (layer cuts, balanced for both
phases, onnxruntime's measured costs at one thread), then three generators run the same prompts, each
with one intra-op thread per worker, local threads:

* ``pipeline``: the split through :meth:`Pipeline.generate`, each worker keeping its layers' cache,
  ``in_flight`` sequences in the pipeline at once;
* ``unsplit``: one worker running the whole model with its whole cache (what one device does);
* ``replicas``: K workers each running the whole model, sequences spread over them (data parallelism:
  the ceiling of K devices when each can hold the whole model, which a split is for when none can).

Rounds alternate the three in a rotating order; the figure per case is the median tokens/s (new tokens
over wall time, prefill included) and its ratios: ``pipeline / unsplit`` (what splitting gains over one
device; at most K) and ``pipeline / replicas`` (what it costs against replicas, when they fit).  Every
generator must give the same tokens; a case where they differ fails the benchmark.  On a machine with
fewer cores than workers the ratios are bounded by the cores, not by the split: the machine is recorded.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import benchmark_parser, median, params_of, print_table, shown, write_result
from onnxpipe.api import SplitOptions, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generate import Generation
from onnxpipe.runtime.pipeline import Pipeline
from tools import export_decoders

NAME = "generate"
MODELS = ("llama_gqa_small", "qwen2_small", "gpt2_small", "llama_gqa_medium")
KINDS = ("pipeline", "unsplit", "replicas")


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(export_decoders.SPECS))
    parser.add_argument("--stages", nargs="+", type=int, default=[2])
    parser.add_argument(
        "--in-flight", nargs="+", type=int, default=None, help="sequences in flight (default: 1, K and 2K)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three generators")
    parser.add_argument("--local-mode", choices=("threads", "processes"), default="threads")
    args: argparse.Namespace = parser.parse_args(argv)
    config = LocalConfig(mode=args.local_mode)
    rows: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for model in args.models:
            path = export_decoders.decoder(model)
            vocab = export_decoders.SPECS[model].vocab
            for k in args.stages:
                folder = Path(tmp) / f"{model}-{k}"
                split(
                    path,
                    SplitOptions(out=folder, plan=PlanRequest(k), profile=ProfileOptions(runs=10, threads=1)),
                )
                for in_flight in args.in_flight or sorted({1, k, 2 * k}):
                    sequences = prompts(
                        max(in_flight, k), args.prompt_tokens, vocab, seed=k * 100 + in_flight
                    )
                    pipes = {
                        "pipeline": Pipeline.from_manifest(folder, config, threads=1, generation=True),
                        "unsplit": Pipeline.generating_replicas(folder, 1, config, threads=1),
                        "replicas": Pipeline.generating_replicas(folder, k, config, threads=1),
                    }
                    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
                    tokens: dict[str, Generation] = {}
                    try:
                        for pipe in pipes.values():  # warm-up: first runs allocate
                            pipe.generate(sequences[:1], 4)
                        for r in range(args.rounds):
                            for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
                                g = pipes[kind].generate(sequences, args.new_tokens, in_flight=in_flight)
                                rates[kind].append(g.tokens_per_second)
                                tokens[kind] = g
                    finally:
                        for pipe in pipes.values():
                            pipe.close()
                    same = len({g.tokens for g in tokens.values()}) == 1
                    failed |= not same
                    rate = {kind: median(v) for kind, v in rates.items()}
                    rows.append(
                        {
                            "model": model,
                            "k": k,
                            "in_flight": in_flight,
                            "sequences": len(sequences),
                            "same_tokens": same,
                            **{f"{kind}_tokens_per_s": round(rate[kind], 2) for kind in KINDS},
                            "pipeline_over_unsplit": rate["pipeline"] / rate["unsplit"],
                            "pipeline_over_replicas": rate["pipeline"] / rate["replicas"],
                            "replicas_over_unsplit": rate["replicas"] / rate["unsplit"],
                        }
                    )
                    print(
                        f"{model} K={k} in flight {in_flight}: pipeline/unsplit "
                        f"{rows[-1]['pipeline_over_unsplit']:.2f}, pipeline/replicas "
                        f"{rows[-1]['pipeline_over_replicas']:.2f}, same tokens {same}",
                        flush=True,
                    )
    print_table(
        "decode throughput ratios (median tokens/s of alternating rounds)",
        ["model", "K", "in flight", "pipeline/unsplit", "pipeline/replicas", "replicas/unsplit", "same"],
        [
            [
                r["model"],
                r["k"],
                r["in_flight"],
                f"{r['pipeline_over_unsplit']:.2f}",
                f"{r['pipeline_over_replicas']:.2f}",
                f"{r['replicas_over_unsplit']:.2f}",
                "yes" if r["same_tokens"] else "NO",
            ]
            for r in rows
        ],
    )
    summary = {
        "best_pipeline_over_unsplit": max(r["pipeline_over_unsplit"] for r in rows),
        "all_tokens_same": not failed,
    }
    written = write_result(NAME, params_of(args), rows, summary=summary, out=args.out)
    print(f"wrote {shown(written)}")
    return 1 if failed else 0
