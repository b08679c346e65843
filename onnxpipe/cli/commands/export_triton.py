"""The work of ``onnxpipe export-triton`` (parser and table: :mod:`onnxpipe.cli.export_triton`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.export_triton import TABLE


def run(args: argparse.Namespace) -> int:
    repo = api.export_triton(args.dir, TABLE.options(args))
    stages = len(repo.models) - 1
    print(
        f"wrote a Triton repository to {repo.path}/: ensemble {repo.ensemble!r} over {stages} stage "
        f"model(s), max_batch_size {repo.models[0].max_batch_size}"
    )
    checked = (
        "parsed with tritonclient's ModelConfig and"
        if repo.parsed
        else "(tritonclient not installed: not parsed)"
    )
    print(f"  configs {checked} data flow checked; no server was started")
    for note in repo.notes:
        print(f"  note: {note}")
    return 0
