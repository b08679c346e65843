"""``onnxpipe plan MODEL --stages K|auto``: plan stages (for a cluster) and print, and draw, the plan."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxpipe import api
from onnxpipe.cli.arguments import add_measure_args, add_planning_args, plan_request, profile_options
from onnxpipe.cli.tables import (
    format_plan_table,
)
from onnxpipe.ir.load import load_model
from onnxpipe.plan.draw import draw_plan

NAME = "plan"
HELP = "plan stages for a cluster and print (and draw) the plan"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    add_planning_args(p)
    p.add_argument("--plot", type=Path, help="draw the schedule and the stage loads (.png or .svg)")
    add_measure_args(p)


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
