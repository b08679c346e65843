"""The work of ``onnxpipe inspect`` (parser: :mod:`onnxpipe.cli.inspect`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.tables import (
    format_manifest_table,
    format_model_table,
)
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest


def run(args: argparse.Namespace) -> int:
    target: Path = args.target
    if target.is_dir():
        print(format_manifest_table(load_manifest(target, check_files=False)))
    else:
        print(format_model_table(load_model(target)))
    return 0
