"""``onnxpipe inspect DIR|MODEL``: a table of a split folder's stages, or of a model (the parser; the work
is :func:`onnxpipe.cli.commands.inspect`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import InspectOptions
from onnxpipe.cli.arguments import JSON
from onnxpipe.cli.flags import Table, negated

NAME = "inspect"
HELP = "print a table of a split folder's stages, or of a model"

TABLE = Table(
    InspectOptions,
    [
        negated(
            "--no-file-check",
            "check_files",
            "do not hash the stage files against the manifest (a large split, looked at quickly)",
        ),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", type=Path, help="a folder written by 'onnxpipe split', or an .onnx model")
    TABLE.add_to(p)
