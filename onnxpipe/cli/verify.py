"""``onnxpipe verify DIR``: check that the chained stages reproduce the model's outputs (the parser; the
work is :mod:`onnxpipe.cli.commands.verify`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.arguments import add_shape_arg

NAME = "verify"
HELP = "check that the chained stages reproduce the model's outputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--model", type=Path, help="the source model (default: the path in the manifest)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    add_shape_arg(p)
