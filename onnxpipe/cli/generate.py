"""``onnxpipe generate DIR``: generation through a decoder's split (greedy, or sampled with a seed), each
worker keeping its own layers' KV cache (the parser and its table; the work is
:func:`onnxpipe.cli.commands.generate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import Backend, GenerateOptions
from onnxpipe.cli.argtypes import count, positive_int, positive_number, probability, token_ids
from onnxpipe.cli.arguments import JSON, LOCAL_MODES, ray_flags
from onnxpipe.cli.flags import Table, flag
from onnxpipe.core.choices import values

NAME = "generate"
HELP = "generate tokens through a decoder's split, each worker keeping its layers' KV cache"

TABLE = Table(
    GenerateOptions,
    [
        flag(
            "--prompt",
            field="prompts",
            action="append",
            default=[],
            metavar="TEXT",
            to_field=tuple,
            help="a prompt as text, encoded by the model's tokenizer; its answer is printed as text as it is "
            "made (repeat the option for several sequences in flight)",
        ),
        flag(
            "--prompt-ids",
            type=token_ids,
            action="append",
            default=[],
            metavar="IDS",
            to_field=tuple,
            help="a prompt's token ids, comma-separated (repeatable), instead of --prompt",
        ),
        flag(
            "--chat",
            action="store_true",
            help="wrap each --prompt in the model's chat template as a user's message, the assistant's turn "
            "opened",
        ),
        flag("--system", metavar="TEXT", help="with --chat: a system message before each prompt"),
        flag(
            "--tokenizer",
            type=Path,
            metavar="DIR",
            help="the folder of the model's tokenizer files (tokenizer.json, tokenizer_config.json; default: "
            "the split's folder, else the source model's)",
        ),
        flag("--max-new-tokens", type=positive_int, metavar="N", help="new tokens per prompt"),
        flag(
            "--eos-token-id",
            field="eos_token_ids",
            type=count,
            action="append",
            metavar="ID",
            to_field=tuple,
            help="stop a sequence at this token (repeatable; default: the model's end ids, from the GenAI "
            "config its builder wrote, else its Hugging Face configs or tokenizer)",
        ),
        flag(
            "--ignore-eos",
            action="store_true",
            help="make every sequence --max-new-tokens long, whatever tokens come",
        ),
        flag(
            "--in-flight",
            type=positive_int,
            metavar="N",
            help="sequences in the pipeline at once (default: every prompt)",
        ),
        flag(
            "--batch",
            type=positive_int,
            metavar="N",
            help="sequences a decode step carries at most, their caches padded (default: those in flight "
            "over the stages, a step per stage; 1: a step per sequence)",
        ),
        flag(
            "--do-sample",
            action="store_true",
            help="draw each token from the softmax of the logits instead of taking the highest (greedy, the "
            "default), seeded per sequence: the same --seed gives the same tokens through the split and the "
            "unsplit model",
        ),
        flag(
            "--temperature",
            type=positive_number,
            metavar="T",
            help="with --do-sample: logits over T (default 1.0)",
        ),
        flag(
            "--top-k",
            type=count,
            metavar="K",
            help="with --do-sample: only the K most likely tokens (default 0: all)",
        ),
        flag(
            "--top-p",
            type=probability,
            metavar="P",
            help="with --do-sample: only the most likely tokens whose probabilities reach P (default 1.0: "
            "all)",
        ),
        flag("--seed", type=count, metavar="S", help="with --do-sample: the generators' seed (default 0)"),
        flag("--local-mode", choices=LOCAL_MODES, help="workers as processes (shared memory) or threads"),
        flag(
            "--threads",
            type=positive_int,
            metavar="N",
            help="intra-op threads per worker (default: the split's devices', else the plan's)",
        ),
        flag(
            "--backend",
            choices=values(Backend),
            help="local workers or Ray actors on a cluster, each keeping its stage's cache",
        ),
        *ray_flags("generation", "the sequences whose caches it held rebuilt there by a prefill"),
        flag(
            "--compare",
            action="store_true",
            help="also generate the same prompts with the unsplit model (a plain loop in this process) and "
            "with K replicas of it (on --backend: Ray places them itself), side by side: the tokens must be "
            "the same (exit 1 if not), and tokens/s of each are reported",
        ),
        flag("--model", type=Path, help="the source model for --compare (default: the manifest's)"),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by 'onnxpipe split' from a decoder LLM")
    TABLE.add_to(p)
