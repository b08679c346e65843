"""The work of ``onnxpipe inspect`` (parser: :mod:`onnxpipe.cli.inspect`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.commands.jsonout import document, model_obj, split_obj
from onnxpipe.cli.tables import (
    format_decoder,
    format_decoder_stages,
    format_manifest_table,
    format_model_table,
)
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.load import load_model
from onnxpipe.ir.summary import summarize
from onnxpipe.manifest import load_manifest


def run(args: argparse.Namespace) -> int:
    target: Path = args.target
    if target.is_dir():
        manifest = load_manifest(target, check_files=False)
        if args.json:
            print(document("inspect", manifest=split_obj(manifest)))
        else:
            print(format_manifest_table(manifest))
            if manifest.plan.decoder is not None:
                print(format_decoder_stages(manifest))
    else:
        view = load_model(target)
        if args.json:
            print(document("inspect", model=model_obj(summarize(view))))
        else:
            print(format_model_table(view))
            found = format_decoder(view, find_decoder(view))
            if found:
                print(found)
    return 0
