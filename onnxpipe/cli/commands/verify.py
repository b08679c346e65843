"""The work of ``onnxpipe verify`` (parser and table: :mod:`onnxpipe.cli.verify`)."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.say import Say
from onnxpipe.cli.tables import format_verify_report
from onnxpipe.cli.verify import TABLE


def run(args: argparse.Namespace) -> int:
    say = Say("verify", json_output=args.json)  # made first: its total time counts the verification
    report = api.verify(args.dir, TABLE.options(args))
    print(api.verify_json(report) if args.json else format_verify_report(report))
    if report.record_note is not None:
        say.line(f"note: {report.record_note}")
    elif report.recorded_in is not None:
        say.line(f"recorded in {report.recorded_in}: verification {'passed' if report.ok else 'failed'}")
    say.done("verified")
    return 0 if report.ok else 1
