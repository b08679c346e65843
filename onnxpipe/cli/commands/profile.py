"""The work of ``onnxpipe profile`` (parser: :mod:`onnxpipe.cli.profile`)."""

from __future__ import annotations

import argparse
import sys

from onnxpipe import api
from onnxpipe.cli.commands.common import profile_options
from onnxpipe.core.errors import UsageError
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.load import load_model


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
    if prof.inputs:
        shown = ", ".join(
            f"{r.file} ({r.samples} sample{'s' if r.samples != 1 else ''})" for r in prof.inputs
        )
        print(f"  inputs: {shown}")
    for note in prof.unattributed[:10]:
        print(f"  note: {note}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    return 0
