"""``onnxpipe verify DIR``: check that the chained stages reproduce the model's outputs (the parser; the
work is :mod:`onnxpipe.cli.commands.verify`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.arguments import add_inputs_args, add_json_arg, add_shape_arg
from onnxpipe.core.choices import VerifyRuntime, values

NAME = "verify"
HELP = "check that the chained stages reproduce the model's outputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--model", type=Path, help="the source model (default: the path in the manifest)")
    p.add_argument(
        "--rtol",
        type=float,
        default=1e-4,
        help="relative tolerance: an output matches when max|a-b| <= atol + rtol * max|a|",
    )
    p.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (see --rtol)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs both models are run on")
    p.add_argument(
        "--runtime",
        choices=values(VerifyRuntime),
        default=None,
        help="run every stage on this runtime, or 'devices': each on its device's runtime (a split made "
        "with --devices); default: onnxruntime on the CPU.  The original always runs in onnxruntime",
    )
    p.add_argument("--threads", type=positive_int, default=1, help="threads each stage runs with (default 1)")
    add_shape_arg(p)
    add_inputs_args(p)
    add_json_arg(p)
