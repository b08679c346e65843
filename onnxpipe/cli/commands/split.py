"""The work of ``onnxpipe split`` (parser: :mod:`onnxpipe.cli.split`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.calibrate.loop import CalibrationOptions
from onnxpipe.cli.commands.common import plan_request, profile_options
from onnxpipe.cli.tables import (
    format_manifest_table,
    format_verify_report,
)
from onnxpipe.export.stages import ExportOptions


def run(args: argparse.Namespace) -> int:
    request = plan_request(args)
    options = api.SplitOptions(
        profile=profile_options(args, saved=args.profile, progress=not args.quiet and sys.stderr.isatty()),
        calibration=CalibrationOptions(rounds=args.calibrate, mode=args.calibrate_in),
        export=ExportOptions(force=args.force, external_data=args.external_data),
        verify=not args.no_verify,
        static=args.static,
    )
    result = api.split(args.model, request, args.out, options)
    plan = result.plan
    print(format_manifest_table(result.manifest))
    print(
        f"wrote {plan.k} stages to {args.out}/ (bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
        f"{plan.ratio_to_lower_bound:.3f}x the lower bound)"
    )
    for note in result.manifest.plan.notes:
        print(f"  note: {note}")
    if result.report is not None:
        print(format_verify_report(result.report))
        return 0 if result.report.ok else 1
    return 0
