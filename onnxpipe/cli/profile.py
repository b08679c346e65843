"""``onnxpipe profile MODEL --out FILE``: measure every node's time and save it (the parser and its table;
the work is :func:`onnxpipe.cli.commands.profile`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import CostSource, ProfileOptions, Runtime
from onnxpipe.cli.arguments import QUIET, measure_flags
from onnxpipe.cli.flags import Table, flag
from onnxpipe.core.choices import values

NAME = "profile"
HELP = "measure every node's time with onnxruntime and save it"

TABLE = Table(
    ProfileOptions,
    [
        flag("--out", "-o", type=Path, required=True, help="profile JSON to write"),
        flag("--cost", choices=values(CostSource), help="measure, or static FLOPs"),
        flag("--force", action="store_true", help="overwrite an existing profile file"),
        QUIET,
        flag(
            "--runtime",
            choices=values(Runtime),
            help="measure on this runtime (default onnxruntime); openvino and tract: the whole model timed, "
            "their per-layer reports mapped back to nodes where they name them (docs/runtimes.md)",
        ),
        flag("--openvino-device", metavar="DEVICE", help="OpenVINO device for --runtime openvino"),
        *measure_flags(prefix="", devices=False),
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    TABLE.add_to(p)
