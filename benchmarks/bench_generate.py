"""Decode throughput with sequences batched: a decoder's K-stage pipeline, batched and unbatched, against
the unsplit model as a plain onnxruntime loop and against K replicas, each given the same sequences and
the same batching, side by side in one run.

Each model (``tools/export_decoders.py``: ``llama_gqa_medium`` by default, a random-weight Llama with
grouped-query attention whose 250 MB of weights stay out of the CPU's cache as a real LLM's do) is split
into K stages (layer cuts, balanced for both phases, onnxruntime's measured costs at one thread); then,
for each count of sequences, four generators make the same tokens, each worker with one intra-op thread:

* ``batched``: the split through :meth:`Generator.generate` with its default batching (the sequences
  dealt into K groups, a decode step carrying a group: each stage has a step);
* ``unbatched``: the same pipeline, a step per sequence (``batch=1``): what it did before batching;
* ``plain``: the unsplit model as a plain onnxruntime loop in the caller's thread, every sequence in one
  step (:class:`~onnxpipe.runtime.generation.generator.PlainLoop`): one device at its best;
* ``replicas``: K workers each running the whole model, the sequences dealt over them, each replica's
  in one step (data parallelism: the ceiling of K devices when each can hold the whole model).

Rounds rotate the order of the four; the figure per case is the median tokens/s (new tokens over wall
time, prefill included), with the batched pipeline's time to first token and time per token (p50, p90).
Every generator must give the same tokens; a case where they differ fails the benchmark.  On a machine
with fewer cores than workers the ratios are bounded by the cores, not by the split: the machine is
recorded with the result.

**The Whisper case** (``--whisper-stages``, default K=2; ``[]`` leaves it out): the Whisper-shaped folder of
``tools/export_seq2seq.py`` split as one encoder-decoder family into K stages, then ``generate --inputs``
of 1 and 4 inputs in flight (``--whisper-inputs``) through the split against the folder's unsplit files as
a plain onnxruntime greedy loop (``--compare``): the median tokens/s of each, both clocks started before
the first input's encoding (the encoder's time counts in both, opening the sessions in neither), and
whether their tokens are identical (a case where they differ fails the benchmark).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import benchmark_parser, median, params_of, print_table, shown, write_result
from onnxpipe.api import SplitOptions, generate, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.options import GenerateOptions
from tools import export_decoders, export_seq2seq

NAME = "generate"
MODELS = ("llama_gqa_medium",)
KINDS = ("batched", "unbatched", "plain", "replicas")
SEQUENCES = (1, 2, 4, 8, 16)


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=length).tolist() for _ in range(count)]


class _Generators:
    """The four generators of one split, open for all its cases."""

    def __init__(self, folder: Path, k: int, config: LocalConfig) -> None:
        self.pipeline = Generator.open(folder, config, threads=1)
        self.replicas = Generator.replicas(folder, k, config, threads=1)
        self.plain = Generator.plain(folder, threads=1)

    def run(self, kind: str, sequences: list[list[int]], new_tokens: int) -> Generation:
        options = GenerateOptions(
            prompt_ids=tuple(tuple(p) for p in sequences),
            max_new_tokens=new_tokens,
            ignore_eos=True,
            batch=1 if kind == "unbatched" else None,
        )
        if kind == "plain":
            return self.plain.generate_with(self.pipeline.prompting(options))
        pipe = self.replicas if kind == "replicas" else self.pipeline
        return pipe.generate_with(pipe.prompting(options))

    def close(self) -> None:
        self.pipeline.close()
        self.replicas.close()


def _case(gens: _Generators, sequences: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of the four generators in rotating order: median tokens/s of each, the batched
    pipeline's latencies, and whether every one made the same tokens."""
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    made: dict[str, Generation] = {}
    for r in range(args.rounds):
        for kind in KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]:
            g = gens.run(kind, sequences, args.new_tokens)
            rates[kind].append(g.tokens_per_second)
            made[kind] = g
    rate = {kind: median(v) for kind, v in rates.items()}
    batched = made["batched"]
    return {
        "same_tokens": len({g.tokens for g in made.values()}) == 1,
        "batch": batched.batch,
        **{f"{kind}_tokens_per_s": round(rate[kind], 2) for kind in KINDS},
        "batched_over_unbatched": rate["batched"] / rate["unbatched"],
        "batched_over_replicas": rate["batched"] / rate["replicas"],
        "batched_over_plain": rate["batched"] / rate["plain"],
        "replicas_over_plain": rate["replicas"] / rate["plain"],
        "time_to_first_token_s": batched.time_to_first_token(),
        "time_per_token_p50_s": batched.time_per_token(0.5),
        "time_per_token_p90_s": batched.time_per_token(0.9),
        "busy_shares": [round(b, 3) for b in batched.busy_shares],
    }


def _whisper_rows(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The Whisper case (see the module docstring): per K and count of inputs in flight, the split's and
    the unsplit loop's median tokens/s and whether their tokens are the same."""
    rows: list[dict[str, Any]] = []
    folder = export_seq2seq.cached_export()
    for k in args.whisper_stages:
        out = tmp / f"whisper-{k}"
        split(folder, SplitOptions(out=out, plan=PlanRequest(k), profile=ProfileOptions(runs=10, threads=1)))
        for count in args.whisper_inputs:
            file = tmp / f"features-{count}.npz"
            np.savez(file, input_features=export_seq2seq.features(count, seed=count))
            options = GenerateOptions(
                inputs=(file,), max_new_tokens=args.new_tokens, compare=True, threads=1, in_flight=count
            )
            runs = [generate(out, options) for _ in range(args.rounds)]
            split_rate = median([r.runs["pipeline"].tokens_per_second for r in runs])
            plain_rate = median([r.runs["unsplit"].tokens_per_second for r in runs])
            rows.append(
                {
                    "model": export_seq2seq.NAME,
                    "k": k,
                    "inputs": count,
                    "same_tokens": all(r.same for r in runs),
                    "split_tokens_per_s": round(split_rate, 2),
                    "plain_tokens_per_s": round(plain_rate, 2),
                    "split_over_plain": split_rate / plain_rate,
                }
            )
            print(
                f"{export_seq2seq.NAME} K={k} {count} input(s): split/plain {split_rate / plain_rate:.2f}, "
                f"same tokens {rows[-1]['same_tokens']}",
                flush=True,
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(export_decoders.SPECS))
    parser.add_argument("--stages", nargs="+", type=int, default=[2])
    parser.add_argument("--sequences", nargs="+", type=int, default=list(SEQUENCES))
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="rotating rounds of the four generators")
    parser.add_argument("--local-mode", choices=("threads", "processes"), default="threads")
    parser.add_argument("--whisper-stages", nargs="*", type=int, default=[2], help="K of the Whisper case")
    parser.add_argument("--whisper-inputs", nargs="+", type=int, default=[1, 4], help="its inputs in flight")
    args: argparse.Namespace = parser.parse_args(argv)
    config = LocalConfig(mode=args.local_mode)
    rows: list[dict[str, Any]] = []
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
                gens = _Generators(folder, k, config)
                try:
                    for kind in KINDS:  # warm-up: first runs allocate
                        gens.run(kind, prompts(2, 4, vocab, seed=1), 4)
                    for count in args.sequences:
                        sequences = prompts(count, args.prompt_tokens, vocab, seed=k * 100 + count)
                        row = {"model": model, "k": k, "sequences": count, **_case(gens, sequences, args)}
                        rows.append(row)
                        print(
                            f"{model} K={k} {count} sequence(s), batch {row['batch']}: batched/unbatched "
                            f"{row['batched_over_unbatched']:.2f}, batched/replicas "
                            f"{row['batched_over_replicas']:.2f}, batched/plain "
                            f"{row['batched_over_plain']:.2f}, same tokens {row['same_tokens']}",
                            flush=True,
                        )
                finally:
                    gens.close()
        whisper = _whisper_rows(args, Path(tmp))
    print_table(
        "decode throughput ratios (median tokens/s of rotating rounds)",
        ["model", "K", "seqs", "batch", "batched/unbatched", "batched/replicas", "batched/plain", "same"],
        [
            [
                r["model"],
                r["k"],
                r["sequences"],
                r["batch"],
                f"{r['batched_over_unbatched']:.2f}",
                f"{r['batched_over_replicas']:.2f}",
                f"{r['batched_over_plain']:.2f}",
                "yes" if r["same_tokens"] else "NO",
            ]
            for r in rows
        ],
    )
    if whisper:
        print_table(
            "Whisper-shaped encoder-decoder: the split against its unsplit files' plain loop (tokens/s)",
            ["model", "K", "inputs", "split tok/s", "plain tok/s", "split/plain", "same"],
            [
                [
                    r["model"],
                    r["k"],
                    r["inputs"],
                    r["split_tokens_per_s"],
                    r["plain_tokens_per_s"],
                    f"{r['split_over_plain']:.2f}",
                    "yes" if r["same_tokens"] else "NO",
                ]
                for r in whisper
            ],
        )
    rows += whisper
    failed = not all(r["same_tokens"] for r in rows)
    at8 = [r for r in rows if r.get("sequences") == 8 and r["k"] == 2]
    summary = {
        "all_tokens_same": not failed,
        "at_8_sequences_k2_batched_over_unbatched": [r["batched_over_unbatched"] for r in at8],
        "at_8_sequences_k2_batched_over_replicas": [r["batched_over_replicas"] for r in at8],
        "whisper_split_over_plain": [round(r["split_over_plain"], 3) for r in whisper],
        "goal": "at 8 sequences, K=2: batched >= 2x unbatched and >= 0.9x K batched replicas",
    }
    written = write_result(NAME, params_of(args), rows, summary=summary, out=args.out)
    print(f"wrote {shown(written)}")
    return 1 if failed else 0
