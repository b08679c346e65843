"""``onnxpipe profile MODEL --out FILE``: measure every node's time with onnxruntime and save it (the
parser; the work is :mod:`onnxpipe.cli.commands.profile`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.arguments import add_measure_args, add_quiet_arg
from onnxpipe.core.choices import CostSource, Runtime, values
from onnxpipe.core.runtime_kinds import DEFAULT_OPENVINO_DEVICE

NAME = "profile"
HELP = "measure every node's time with onnxruntime and save it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    p.add_argument("--out", "-o", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--cost", choices=values(CostSource), default="profile", help="measure, or static FLOPs")
    p.add_argument("--force", action="store_true", help="overwrite an existing profile file")
    add_quiet_arg(p)
    p.add_argument(
        "--runtime",
        choices=values(Runtime),
        default="onnxruntime",
        help="measure on this runtime (default onnxruntime); openvino and tract: the whole model timed, "
        "their per-layer reports mapped back to nodes where they name them (docs/runtimes.md)",
    )
    p.add_argument(
        "--openvino-device",
        default=DEFAULT_OPENVINO_DEVICE,
        metavar="DEVICE",
        help=f"OpenVINO device for --runtime openvino (default {DEFAULT_OPENVINO_DEVICE})",
    )
    add_measure_args(p)
