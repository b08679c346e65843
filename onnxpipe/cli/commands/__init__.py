"""The work of each subcommand, one module per subcommand, imported only when that subcommand runs.

The parsers (:mod:`onnxpipe.cli.profile`, ...) import argparse and light modules only; the work here
loads onnx, onnxruntime and numpy.  Kept apart so that ``onnxpipe --help``, ``--version`` and a usage
error answer without loading them (a test checks that they stay unloaded).  Each module has
``run(args) -> int``, the exit code.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from onnxpipe.cli.say import reading

WORK: dict[str, str] = {
    "profile": "onnxpipe.cli.commands.profile",
    "split": "onnxpipe.cli.commands.split",
    "plan": "onnxpipe.cli.commands.plan",
    "verify": "onnxpipe.cli.commands.verify",
    "run": "onnxpipe.cli.commands.run",
    "generate": "onnxpipe.cli.commands.generate",
    "links": "onnxpipe.cli.commands.links",
    "inspect": "onnxpipe.cli.commands.inspect",
    "export-triton": "onnxpipe.cli.commands.export_triton",
}
"""Subcommand name -> the module that does its work."""


READS: dict[str, str] = {"profile": "model", "split": "model", "plan": "model", "verify": "dir"}
"""Subcommand name -> the argument naming the model or folder it reads first (:func:`work` says so)."""


def work(name: str, args: argparse.Namespace | None = None) -> Callable[[argparse.Namespace], int]:
    """The ``run`` function of subcommand ``name``, its module imported now; with ``args``, first the
    line saying what it reads (:func:`onnxpipe.cli.say.reading`), before that import loads onnx and
    onnxruntime (seconds on a loaded machine)."""
    if args is not None and name in READS:
        reading(getattr(args, READS[name]), quiet=getattr(args, "quiet", False))
    run: Callable[[argparse.Namespace], int] = importlib.import_module(WORK[name]).run
    return run
