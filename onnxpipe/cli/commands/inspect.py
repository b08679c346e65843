"""The work of ``onnxpipe inspect`` (parser and table: :mod:`onnxpipe.cli.inspect`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.inspect import TABLE
from onnxpipe.cli.tables import (
    format_decoder,
    format_decoder_stages,
    format_manifest_table,
    format_model_table,
)


def run(args: argparse.Namespace) -> int:
    found = api.inspect(args.target, TABLE.options(args))
    if args.json:
        print(found.to_json())
    elif isinstance(found, api.FolderInspection):
        for problem in found.file_problems:  # first: what the table's verification line stands on
            print(f"error: {problem}: verify and run refuse this folder; re-run onnxpipe split")
        print(format_manifest_table(found.manifest, files_changed=bool(found.file_problems)))
        if found.manifest.plan.decoder is not None:
            print(format_decoder_stages(found.manifest))
        if found.checked and found.ok:
            print(f"files: the {found.manifest.k} stage file(s) are those the split wrote (sha256 checked)")
    else:
        print(format_model_table(found.view, found.summary))
        facts = found.facts.describe() if found.facts is not None else None
        decoder = format_decoder(found.view, found.decoder, facts)
        if decoder:
            print(decoder)
    return 0 if not isinstance(found, api.FolderInspection) or found.ok else 1
