"""The work of ``onnxpipe profile`` (parser and table: :mod:`onnxpipe.cli.profile`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.profile import TABLE
from onnxpipe.cli.say import Say


def run(args: argparse.Namespace) -> int:
    say = Say("profile", quiet=args.quiet)
    prof = api.profile(args.model, TABLE.options(args), listener=say)
    on = "" if prof.on_reference else f" on {prof.runtime}"
    print(
        f"profiled {len(prof.node_seconds)} nodes of {args.model.name}{on}: "
        f"{prof.total_seconds * 1e3:.3f} ms per run ({prof.source}, {prof.threads} thread(s)); "
        f"saved {args.out}"
    )
    if prof.inputs:
        shown = ", ".join(
            f"{r.file} ({r.samples} sample{'s' if r.samples != 1 else ''})" for r in prof.inputs
        )
        print(f"  inputs: {shown}")
    for note in prof.unattributed[:10]:
        print(f"  note: {say.text(note)}")
    if len(prof.unattributed) > 10:
        print(f"  ... and {len(prof.unattributed) - 10} more notes in {args.out}")
    say.done("profiled")
    return 0
