"""``onnxpipe export-triton DIR --out REPO``: a Triton model repository from a split folder (the parser and
its table; the work is :func:`onnxpipe.cli.commands.export_triton`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import TritonOptions, TritonPlatform
from onnxpipe.cli.argtypes import positive_int
from onnxpipe.cli.flags import Table, flag
from onnxpipe.core.choices import values

NAME = "export-triton"
HELP = "write a Triton model repository (a model per stage and an ensemble) from a split folder"

TABLE = Table(
    TritonOptions,
    [
        flag("--out", type=Path, help="the repository folder to write"),
        flag("--name", help="the ensemble's name (default: the source model's file stem)"),
        flag(
            "--platform",
            choices=values(TritonPlatform),
            help="what runs each stage: onnxruntime_onnx or the openvino backend; auto: each stage's "
            "runtime in the manifest (default)",
        ),
        flag(
            "--max-batch-size",
            type=positive_int,
            help="max_batch_size when every tensor has its batch at axis 0; else the configs say 0 and list "
            "full dims",
        ),
        flag("--force", action="store_true", help="replace an earlier repository in --out"),
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by onnxpipe split")
    TABLE.add_to(p)
