"""``onnxpipe plan MODEL --stages K|auto``: plan stages (for a cluster) and print, and draw, the plan (the
parser and its table; the work is :func:`onnxpipe.cli.commands.plan`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import PlanOptions
from onnxpipe.cli.arguments import JSON, QUIET, measure_flags, planning_flags
from onnxpipe.cli.flags import Table, flag

NAME = "plan"
HELP = "plan stages for a cluster and print (and draw) the plan"

TABLE = Table(
    PlanOptions,
    [
        *planning_flags(),
        flag("--plot", type=Path, help="draw the schedule and the stage loads (.png or .svg)"),
        QUIET,
        *measure_flags(),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    TABLE.add_to(p)
