"""The work of ``onnxpipe plan`` (parser: :mod:`onnxpipe.cli.plan`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.cli.commands.common import plan_request, profile_options
from onnxpipe.cli.tables import (
    format_plan_table,
)
from onnxpipe.ir.load import load_model
from onnxpipe.plan.draw import draw_plan


def run(args: argparse.Namespace) -> int:
    request = plan_request(args)
    view = load_model(args.model)
    prof = api.get_profile(view, profile_options(args, saved=args.profile, progress=sys.stderr.isatty()))
    plan = api.plan(view, prof, request)
    print(format_plan_table(plan))
    for note in plan.notes:
        print(f"  note: {note}")
    if args.plot is not None:
        path = draw_plan(plan, args.plot, title=args.model.name)
        print(f"drew {path}")
    return 0
