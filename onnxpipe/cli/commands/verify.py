"""The work of ``onnxpipe verify`` (parser: :mod:`onnxpipe.cli.verify`)."""

from __future__ import annotations

import argparse

from onnxpipe.cli.tables import (
    format_verify_report,
)
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.verification.verify import verify


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
