"""The work of ``onnxpipe split`` (parser and table: :mod:`onnxpipe.cli.split`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.say import Say
from onnxpipe.cli.split import TABLE
from onnxpipe.cli.tables import (
    format_decoder_stages,
    format_manifest_table,
    format_stage_counts,
    format_verify_report,
)


def run(args: argparse.Namespace) -> int:
    say = Say("split", json_output=args.json, quiet=args.quiet)
    result = api.split(args.model, TABLE.options(args), listener=say)
    code = 0 if result.ok else 1
    if args.json:
        print(result.to_json())
        say.done("split")
        return code
    plan = result.plan
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
        print(f"  note: {say.text(note)}")
    if result.report is not None:
        print(format_verify_report(result.report))
    say.done("split")
    return code
