"""``onnxpipe verify DIR``: check that the chained stages reproduce the model's outputs (the parser and its
table; the work is :func:`onnxpipe.cli.commands.verify`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import VerifyOptions, VerifyRuntime
from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.arguments import JSON, input_flags, shape_flag, tolerance_flags
from onnxpipe.cli.flags import Table, flag
from onnxpipe.core.choices import values

NAME = "verify"
HELP = "check that the chained stages reproduce the model's outputs"

TABLE = Table(
    VerifyOptions,
    [
        flag("--model", type=Path, help="the source model (default: the path in the manifest)"),
        *tolerance_flags(),
        flag("--seed", type=int, help="seed of the random inputs both models are run on"),
        flag(
            "--runtime",
            choices=values(VerifyRuntime),
            help="run every stage on this runtime, or 'devices': each on its device's runtime (a split made "
            "with --devices); default: onnxruntime on the CPU.  The original always runs in onnxruntime",
        ),
        flag("--threads", type=positive_int, help="threads each stage runs with (default 1)"),
        shape_flag(),
        *input_flags(),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    TABLE.add_to(p)
