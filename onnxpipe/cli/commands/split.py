"""The work of ``onnxpipe split`` (parser: :mod:`onnxpipe.cli.split`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.calibrate.loop import CalibrationOptions
from onnxpipe.cli.commands.common import plan_request, profile_options
from onnxpipe.cli.commands.early import check_output_folder
from onnxpipe.cli.commands.jsonout import document, split_obj, verification_obj
from onnxpipe.cli.commands.preamble import BusyWatch, Say, plan_preamble
from onnxpipe.cli.tables import (
    format_decoder_stages,
    format_manifest_table,
    format_stage_counts,
    format_verify_report,
)
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.genai import read_source_config
from onnxpipe.export.outdir import check_target, normalized
from onnxpipe.export.stages import ExportOptions
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import parse_shape_overrides


def run(args: argparse.Namespace) -> int:
    say = Say(json_output=args.json)
    out = normalized(args.out)
    model_path = args.model.absolute()
    check_target(out, force=args.force, protected=(model_path, model_path.parent))
    check_output_folder(out)
    request = plan_request(args)
    parse_shape_overrides(args.shape)  # refused before the model is loaded
    genai = None if args.genai_config is None else read_source_config(args.genai_config)
    view = load_model(args.model)
    check_exportable(view, out, force=args.force)
    request.check()
    request.check_stage_count(len(view.compute_nodes), view.label)
    if genai is not None:
        api.check_genai_request(view, request, genai, out.absolute())
    measured = (args.profile is None and args.cost == "profile") or args.calibrate > 0
    plan_preamble(say, view, args, request)
    options = api.SplitOptions(
        profile=profile_options(args, saved=args.profile, progress=not args.quiet),
        calibration=CalibrationOptions(rounds=args.calibrate, mode=args.calibrate_in),
        export=ExportOptions(
            force=args.force, external_data=args.external_data, genai_config=args.genai_config
        ),
        verify=not args.no_verify,
        on_step=None if args.quiet else say.step,
        static=args.static,
    )
    step = "profiling and calibration" if args.calibrate else "profiling"
    watch = BusyWatch(say, step) if measured else None
    result = api.split(view, request, args.out, options)
    if watch is not None:
        watch.check()
    plan = result.plan
    code = 0 if result.report is None or result.report.ok else 1
    if args.json:
        verification = None if result.report is None else verification_obj(result.report)
        print(document("split", manifest=split_obj(result.manifest), verification=verification))
        say.done("split")
        return code
    tried = format_stage_counts(plan)
    if tried is not None:
        print(tried)
    print(format_manifest_table(result.manifest))
    if result.manifest.plan.decoder is not None:
        print(format_decoder_stages(result.manifest))
    print(
        f"wrote {plan.k} stages to {args.out}/ (bottleneck {plan.bottleneck_seconds * 1e3:.3f} ms, "
        f"{plan.ratio_to_lower_bound:.3f}x the lower bound)"
    )
    for note in result.manifest.plan.notes:
        print(f"  note: {note}")
    if result.report is not None:
        print(format_verify_report(result.report))
    say.done("split")
    return code
