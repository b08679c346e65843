"""``onnxpipe profile MODEL --out FILE``: measure every node's time with onnxruntime and save it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxpipe import api
from onnxpipe.cli.arguments import add_measure_args, profile_options
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.profile import COST_SOURCES
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.load import load_model

NAME = "profile"
HELP = "measure every node's time with onnxruntime and save it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--cost", choices=COST_SOURCES, default="profile", help="measure, or static FLOPs")
    p.add_argument("--force", action="store_true", help="overwrite an existing profile file")
    add_measure_args(p)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise UsageError(f"{args.out}: exists; choose another --out or pass --force")
    view = load_model(args.model)
    check_runtime_opsets(view)
    prof = api.get_profile(view, profile_options(args, progress=sys.stderr.isatty()))
    prof.save(args.out)
    print(
        f"profiled {len(prof.node_seconds)} nodes of {args.model.name}: "
        f"{prof.total_seconds * 1e3:.3f} ms per run ({prof.source}, {prof.threads} thread(s)); "
        f"saved {args.out}"
    )
    for note in prof.unattributed[:10]:
        print(f"  note: {note}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    return 0
