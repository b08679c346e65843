"""``onnxpipe split MODEL --stages K --out DIR``: partition, export and verify (the parser and its table;
the work is :func:`onnxpipe.cli.commands.split`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import DEFAULT_ROUNDS, CalibrationMode, ExternalData, SplitOptions
from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.arguments import JSON, QUIET, measure_flags, planning_flags, tolerance_flags
from onnxpipe.cli.flags import Table, flag, negated
from onnxpipe.core.choices import values

NAME = "split"
HELP = "partition the model into K balanced stages and export them"

TABLE = Table(
    SplitOptions,
    [
        flag("--out", "-o", type=Path, help="folder to write stages and manifest.json into"),
        *planning_flags(),
        flag(
            "--external-data",
            field="export.external_data",
            choices=values(ExternalData),
            help="store stage weights in separate files",
        ),
        flag("--force", field="export.force", action="store_true", help="replace a non-empty output folder"),
        flag(
            "--static",
            action="store_true",
            help="freeze the input shapes (--shape, else the defaults) and fold the shape arithmetic and the "
            "Ifs on shapes: every stage's inputs and outputs get fixed shapes (the plan's notes name any "
            "whose size follows data), for runtimes and NPUs that need them",
        ),
        flag(
            "--genai-config",
            field="export.genai_config",
            type=Path,
            metavar="FILE",
            help="the model's genai_config.json or Hugging Face config.json (default: the one beside the "
            "model): the genai_config.json written for a decoder (ONNX Runtime GenAI's decoder-pipeline) "
            "keeps its token ids and search options; without one they are derived from the graph and "
            "defaults",
        ),
        *tolerance_flags(),
        negated("--no-verify", "verify", "skip comparing the stages with the model"),
        flag(
            "--calibrate",
            field="calibration.rounds",
            type=positive_int,
            nargs="?",
            const=DEFAULT_ROUNDS,
            metavar="ROUNDS",
            help=f"time the stages, correct the costs and split again (default {DEFAULT_ROUNDS} rounds when "
            "given)",
        ),
        flag(
            "--calibrate-in",
            field="calibration.mode",
            choices=values(CalibrationMode),
            help="time each stage alone (default), or the stages running together as a pinned thread "
            "pipeline; auto: as a pipeline when there is a physical core for every stage thread; ray: as a "
            "pipeline on a Ray cluster, each stage on the node it will run on",
        ),
        flag(
            "--ray-address",
            field="calibration.ray_address",
            metavar="ADDR",
            help="with --calibrate-in ray: the Ray cluster (default: start a local one)",
        ),
        flag(
            "--ray-resources",
            field="calibration.ray_resources",
            type=Path,
            metavar="FILE",
            help="with --calibrate-in ray: JSON file of per-stage Ray actor resources, as run takes",
        ),
        QUIET,
        *measure_flags(),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    TABLE.add_to(p)
