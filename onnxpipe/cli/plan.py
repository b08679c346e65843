"""``onnxpipe plan MODEL --stages K|auto``: plan stages (for a cluster) and print, and draw, the plan (the
parser; the work is :mod:`onnxpipe.cli.commands.plan`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.arguments import add_json_arg, add_measure_args, add_planning_args, add_quiet_arg

NAME = "plan"
HELP = "plan stages for a cluster and print (and draw) the plan"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    add_planning_args(p)
    p.add_argument("--plot", type=Path, help="draw the schedule and the stage loads (.png or .svg)")
    add_quiet_arg(p)
    add_measure_args(p)
    add_json_arg(p)
