"""The work of ``onnxpipe run`` (parser and table: :mod:`onnxpipe.cli.run`): run a split folder as a
pipeline and measure it, optionally against the model."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.run import TABLE
from onnxpipe.cli.say import Say


def run(args: argparse.Namespace) -> int:
    """Run ``args.dir`` as a pipeline and print what it delivered; 1 when ``--compare`` finds a mismatch."""
    say = Say("run", json_output=args.json)
    options = TABLE.options(args)
    report = api.run(args.dir, options, listener=say)
    print(api.run_json(report) if args.json else say.text(api.format_report(report)))
    for path in (options.report, options.outputs):
        if path is not None:
            say.line(f"wrote {path}")
    say.done("ran")
    return 1 if report.outputs_match is False else 0
