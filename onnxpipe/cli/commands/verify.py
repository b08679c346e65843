"""The work of ``onnxpipe verify`` (parser: :mod:`onnxpipe.cli.verify`)."""

from __future__ import annotations

import argparse

from onnxpipe.cli.commands.jsonout import document, verification_obj
from onnxpipe.cli.commands.preamble import Say
from onnxpipe.cli.tables import (
    format_verify_report,
)
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.verification.record import record_verification
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
    say = Say(json_output=args.json)
    if args.json:
        print(document("verify", verification=verification_obj(report)))
    else:
        print(format_verify_report(report))
    try:
        record_verification(args.dir, report)
    except OSError as e:
        say.line(
            f"note: {args.dir}: the result could not be written into its manifest ({e.strerror or e}); "
            "the folder still reads as it did"
        )
    else:
        say.line(f"recorded in {args.dir}/manifest.json: verification {'passed' if report.ok else 'failed'}")
    say.done("verified")
    return 0 if report.ok else 1
