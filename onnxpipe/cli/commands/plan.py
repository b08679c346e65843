"""The work of ``onnxpipe plan`` (parser and table: :mod:`onnxpipe.cli.plan`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.plan import TABLE
from onnxpipe.cli.say import Say
from onnxpipe.cli.tables import format_plan_table, format_stage_counts


def run(args: argparse.Namespace) -> int:
    say = Say("plan", json_output=args.json, quiet=args.quiet)
    result = api.plan(args.model, TABLE.options(args), listener=say)
    plan = result.plan
    if args.json:
        print(result.to_json())
    else:
        tried = format_stage_counts(plan)
        if tried is not None:
            print(tried)
        print(format_plan_table(plan))
        for note in plan.notes:
            print(f"  note: {say.text(note)}")
    if result.drawn is not None:
        say.line(f"drew {result.drawn}")
    say.done("planned")
    return 0
