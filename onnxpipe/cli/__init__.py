"""The ``onnxpipe`` command: it parses, maps flags to options through one table per subcommand, calls
:mod:`onnxpipe.api`, and prints; the only place that prints, and the only one that names a flag.

Exit codes (documented in docs/cli.md): 0 success; 1 verification found a mismatch; 2 usage error;
3 model cannot be loaded; 4 profiling failed or profile of another model; 5 no valid partition;
6 export failed; 7 manifest invalid or stage files changed; 8 a stage failed while running.
argparse's own errors (a missing or unknown option, a bad value) are usage errors too: one line, exit 2;
an unknown option is named, with the closest one, before any missing required one.
A library error names the option to change as its field (:mod:`onnxpipe.core.options`); it is printed
with that option worded as its flag.

Each subcommand has its table of flags in :mod:`onnxpipe.cli.parsers` (argparse, the door's light options
and core only), and its work, a function of :mod:`onnxpipe.cli.commands` calling the door, whose functions
load onnx, onnxruntime and numpy on first use: ``--help``, ``--version`` and usage errors answer without
loading them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from onnxpipe.cli.arguments import CommandParser
from onnxpipe.cli.commands import WORK
from onnxpipe.cli.parsers import SUBCOMMANDS, worded
from onnxpipe.cli.say import COMMAND_START, process_start
from onnxpipe.core.errors import OnnxpipeError
from onnxpipe.core.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="onnxpipe",
        description="Split an ONNX model into a balanced pipeline of stage models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (errors print one line to stderr).

    argparse's usage errors, ``--help`` and ``--version`` end in :class:`SystemExit` (code 2, 0, 0), as
    argparse does, before any command runs: a usage error writes nothing.  The time a command prints
    counts from the process's start when ``argv`` is None (the console script), else from this call.
    """
    started = COMMAND_START.set(process_start() if argv is None else time.perf_counter())
    try:
        return _main(argv)
    finally:
        COMMAND_START.reset(started)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return WORK[args.command](args)
    except OnnxpipeError as e:
        print(f"onnxpipe {args.command}: error: {worded(str(e), args.command)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # a library's interrupt may say what it left: "during ...: ..."
        print(f"onnxpipe {args.command}: interrupted{f' {e}' if str(e) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`onnxpipe plan ... | head`): what was written stands; point stdout at
        # /dev/null so that the interpreter's final flush does not fail again, and exit as SIGPIPE would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
