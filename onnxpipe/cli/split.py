"""``onnxpipe split MODEL --stages K --out DIR``: partition, export and verify."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxpipe import api
from onnxpipe.calibrate.loop import DEFAULT_ROUNDS, CalibrationOptions
from onnxpipe.calibrate.timing import CALIBRATION_MODES, DEFAULT_CALIBRATION_MODE
from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.arguments import add_measure_args, add_planning_args, plan_request, profile_options
from onnxpipe.cli.tables import (
    format_manifest_table,
    format_verify_report,
)
from onnxpipe.export.stages import ExportOptions

NAME = "split"
HELP = "partition the model into K balanced stages and export them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, required=True, help="folder to write stages and manifest.json into")
    add_planning_args(p)
    p.add_argument(
        "--external-data",
        choices=("auto", "always", "never"),  # the help lists them in this order: EXTERNAL_DATA_MODES
        default="auto",
        help="store stage weights in separate files",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.add_argument("--no-verify", action="store_true", help="skip comparing the stages with the model")
    p.add_argument(
        "--calibrate",
        type=positive_int,
        nargs="?",
        const=DEFAULT_ROUNDS,
        default=0,
        metavar="ROUNDS",
        help="time the stages, correct the costs and split again (default 2 rounds when given)",
    )
    p.add_argument(
        "--calibrate-in",
        choices=CALIBRATION_MODES,
        default=DEFAULT_CALIBRATION_MODE,
        help="time each stage alone (default), or the stages running together as a pinned thread "
        "pipeline; auto: as a pipeline when there is a physical core for every stage thread",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_measure_args(p)


def run(args: argparse.Namespace) -> int:
    request = plan_request(args)
    options = api.SplitOptions(
        profile=profile_options(args, saved=args.profile, progress=not args.quiet and sys.stderr.isatty()),
        calibration=CalibrationOptions(rounds=args.calibrate, mode=args.calibrate_in),
        export=ExportOptions(force=args.force, external_data=args.external_data),
        verify=not args.no_verify,
    )
    result = api.split(args.model, request, args.out, options)
    plan = result.plan
    print(format_manifest_table(result.manifest))
    print(
        f"wrote {plan.k} stages to {args.out}/ (bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
        f"{plan.ratio_to_lower_bound:.3f}x the lower bound)"
    )
    for note in plan.notes:
        print(f"  note: {note}")
    if result.report is not None:
        print(format_verify_report(result.report))
        return 0 if result.report.ok else 1
    return 0
