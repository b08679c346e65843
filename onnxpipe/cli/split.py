"""``onnxpipe split MODEL --stages K --out DIR``: partition, export and verify (the parser; the work is
:mod:`onnxpipe.cli.commands.split`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.calibrate.modes import DEFAULT_CALIBRATION_MODE, DEFAULT_ROUNDS
from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.arguments import add_json_arg, add_measure_args, add_planning_args, add_quiet_arg
from onnxpipe.core.choices import CalibrationMode, ExternalData, values

NAME = "split"
HELP = "partition the model into K balanced stages and export them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    p.add_argument(
        "--out", "-o", type=Path, required=True, help="folder to write stages and manifest.json into"
    )
    add_planning_args(p)
    p.add_argument(
        "--external-data",
        choices=values(ExternalData),
        default="auto",
        help="store stage weights in separate files",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    p.add_argument(
        "--static",
        action="store_true",
        help="freeze the input shapes (--shape, else the defaults) and fold the shape arithmetic: every "
        "stage gets fixed shapes, for runtimes and NPUs that need them",
    )
    p.add_argument(
        "--genai-config",
        type=Path,
        metavar="FILE",
        help="the model's genai_config.json or Hugging Face config.json: the genai_config.json written for "
        "a decoder (ONNX Runtime GenAI's decoder-pipeline) keeps its token ids and search options; without "
        "it they are derived from the graph and defaults",
    )
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
        choices=values(CalibrationMode),
        default=DEFAULT_CALIBRATION_MODE,
        help="time each stage alone (default), or the stages running together as a pinned thread "
        "pipeline; auto: as a pipeline when there is a physical core for every stage thread",
    )
    add_quiet_arg(p)
    add_measure_args(p)
    add_json_arg(p)
