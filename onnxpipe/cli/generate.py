"""``onnxpipe generate DIR``: generation through a decoder's split (greedy, or sampled with a seed), each
worker keeping its own layers' KV cache (the parser; the work is :mod:`onnxpipe.cli.commands.generate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.argtypes import count, positive_int, positive_number, probability, token_ids
from onnxpipe.cli.arguments import add_json_arg
from onnxpipe.core.choices import LocalMode
from onnxpipe.runtime.choices import DEFAULT_LOCAL_MODE

NAME = "generate"
HELP = "generate tokens through a decoder's split, each worker keeping its layers' KV cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by 'onnxpipe split' from a decoder LLM")
    p.add_argument(
        "--prompt-ids",
        type=token_ids,
        action="append",
        required=True,
        metavar="IDS",
        help="a prompt's token ids, comma-separated (repeat the option for several sequences in flight)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=32,
        metavar="N",
        help="new tokens per prompt (default 32)",
    )
    p.add_argument(
        "--eos-token-id",
        type=count,
        action="append",
        default=[],
        metavar="ID",
        help="stop a sequence at this token (repeatable; default: none, every sequence makes N tokens)",
    )
    p.add_argument(
        "--in-flight",
        type=positive_int,
        metavar="N",
        help="sequences in the pipeline at once (default: every prompt)",
    )
    p.add_argument(
        "--do-sample",
        action="store_true",
        help="draw each token from the softmax of the logits instead of taking the highest (greedy, the "
        "default), seeded per sequence: the same --seed gives the same tokens through the split and the "
        "unsplit model",
    )
    p.add_argument(
        "--temperature",
        type=positive_number,
        metavar="T",
        help="with --do-sample: logits over T (default 1.0)",
    )
    p.add_argument(
        "--top-k",
        type=count,
        metavar="K",
        help="with --do-sample: only the K most likely tokens (default 0: all)",
    )
    p.add_argument(
        "--top-p",
        type=probability,
        metavar="P",
        help="with --do-sample: only the most likely tokens whose probabilities reach P (default 1.0: all)",
    )
    p.add_argument(
        "--seed", type=count, metavar="S", help="with --do-sample: the generators' seed (default 0)"
    )
    p.add_argument(
        "--local-mode",
        choices=(LocalMode.PROCESSES.value, LocalMode.THREADS.value),
        default=DEFAULT_LOCAL_MODE,
        help=f"workers as processes (shared memory) or threads (default {DEFAULT_LOCAL_MODE})",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="intra-op threads per worker (default: the split's devices', else the plan's)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also generate the same prompts with the unsplit model and with K replicas of it, side by "
        "side: the tokens must be the same (exit 1 if not), and tokens/s of each are reported",
    )
    p.add_argument("--model", type=Path, help="the source model for --compare (default: the manifest's)")
    add_json_arg(p)
