"""The work of ``onnxpipe links`` (parser and table: :mod:`onnxpipe.cli.links`): measure a devices
file's links on a Ray cluster."""

from __future__ import annotations

import argparse

from onnxpipe import api
from onnxpipe.cli.links import TABLE
from onnxpipe.cli.say import Say


def run(args: argparse.Namespace) -> int:
    say = Say("links", json_output=args.json)
    options = TABLE.options(args)
    report = api.links(args.devices, options, listener=say)
    print(report.to_json() if args.json else say.text(api.format_links(report)))
    if report.written is not None:
        say.line(f"wrote {report.written}")
    say.done("measured")
    return 0
