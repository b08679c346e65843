"""``onnxpipe verify DIR``: check that the chained stages reproduce the model's outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.arguments import add_shape_arg
from onnxpipe.cli.tables import (
    format_verify_report,
)
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.verification.verify import verify

NAME = "verify"
HELP = "check that the chained stages reproduce the model's outputs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--model", type=Path, help="the source model (default: the path in the manifest)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    add_shape_arg(p)


def run(args: argparse.Namespace) -> int:
    report = verify(
        args.dir,
        model_path=args.model,
        shapes=parse_shape_overrides(args.shape),
        seed=args.seed,
        rtol=args.rtol,
        atol=args.atol,
    )
    print(format_verify_report(report))
    return 0 if report.ok else 1
