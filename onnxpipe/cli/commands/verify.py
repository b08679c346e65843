"""The work of ``onnxpipe verify`` (parser: :mod:`onnxpipe.cli.verify`)."""

from __future__ import annotations

import argparse

from onnxpipe.cli.commands.jsonout import document, verification_obj
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
        inputs=args.inputs,
        stacked=args.inputs_stacked,
        threads=args.threads,
        runtime=args.runtime,
    )
    if args.json:
        print(document("verify", verification=verification_obj(report)))
    else:
        print(format_verify_report(report))
    return 0 if report.ok else 1
