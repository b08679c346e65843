"""The work of ``onnxpipe run`` (parser and table: :mod:`onnxpipe.cli.run`): run a split folder as a
pipeline and measure it, optionally against the model."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.run import TABLE
from onnxpipe.cli.say import Say


def run(args: argparse.Namespace) -> int:
    """Run ``args.dir`` as a pipeline and print what it delivered; 1 when ``--compare`` finds a mismatch."""
    say = Say("run")
    options = TABLE.options(args)
    report = api.run(args.dir, options, listener=say)
    print(say.text(api.format_report(report)))
    for path in (options.report, options.outputs):
        if path is not None:
            print(f"wrote {path}")
    say.done("ran")
    return 1 if report.outputs_match is False else 0
