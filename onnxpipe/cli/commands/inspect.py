"""The work of ``onnxpipe inspect`` (parser: :mod:`onnxpipe.cli.inspect`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.commands.jsonout import document, model_obj, split_obj
from onnxpipe.cli.tables import (
    format_manifest_table,
    format_model_table,
)
from onnxpipe.ir.load import load_model
from onnxpipe.ir.summary import summarize
from onnxpipe.manifest import load_manifest


def run(args: argparse.Namespace) -> int:
    target: Path = args.target
    if target.is_dir():
        manifest = load_manifest(target, check_files=False)
        print(
            document("inspect", manifest=split_obj(manifest))
            if args.json
            else format_manifest_table(manifest)
        )
    else:
        view = load_model(target)
        print(
            document("inspect", model=model_obj(summarize(view))) if args.json else format_model_table(view)
        )
    return 0
