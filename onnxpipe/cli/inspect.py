"""``onnxpipe inspect DIR|MODEL``: a table of a split folder's stages, or of a model (the parser; the work
is :mod:`onnxpipe.cli.commands.inspect`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.arguments import add_json_arg

NAME = "inspect"
HELP = "print a table of a split folder's stages, or of a model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", type=Path, help="a folder written by 'onnxpipe split', or an .onnx model")
    add_json_arg(p)
