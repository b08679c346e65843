"""``onnxpipe export-triton DIR --out REPO``: a Triton model repository from a split folder (the parser;
the work is :mod:`onnxpipe.cli.commands.export_triton`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.argtypes import positive_int
from onnxpipe.core.choices import TritonPlatform, values
from onnxpipe.export.options import DEFAULT_TRITON_MAX_BATCH

NAME = "export-triton"
HELP = "write a Triton model repository (a model per stage and an ensemble) from a split folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by onnxpipe split")
    p.add_argument("--out", type=Path, required=True, help="the repository folder to write")
    p.add_argument("--name", help="the ensemble's name (default: the source model's file stem)")
    p.add_argument(
        "--platform",
        choices=values(TritonPlatform),
        default="auto",
        help="what runs each stage: onnxruntime_onnx or the openvino backend; auto: each stage's "
        "runtime in the manifest (default)",
    )
    p.add_argument(
        "--max-batch-size",
        type=positive_int,
        default=DEFAULT_TRITON_MAX_BATCH,
        help="max_batch_size when every tensor has its batch at axis 0 "
        f"(default {DEFAULT_TRITON_MAX_BATCH}); else the configs say 0 and list full dims",
    )
    p.add_argument("--force", action="store_true", help="replace an earlier repository in --out")
