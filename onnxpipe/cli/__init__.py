"""The ``onnxpipe`` command: thin argument parsing over :mod:`onnxpipe.api`; the only place that prints.

Exit codes (documented in docs/cli.md): 0 success; 1 verification found a mismatch; 2 usage error;
3 model cannot be loaded; 4 profiling failed or profile of another model; 5 no valid partition;
6 export failed; 7 manifest invalid or stage files changed; 8 a stage failed while running.
argparse's own errors (a missing or unknown option, a bad value) are usage errors too: one line, exit 2.

Each subcommand is two modules: its parser, ``onnxpipe.cli.<name>`` (argparse and light modules only),
and its work, ``onnxpipe.cli.commands.<name>``, imported only when it runs (:data:`.commands.WORK`), so
that ``--help``, ``--version`` and usage errors answer without loading onnx, onnxruntime or numpy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from onnxpipe import __version__
from onnxpipe.cli import export_triton, generate, inspect, plan, profile, run, split, verify
from onnxpipe.cli.arguments import CommandParser, SubcommandParser
from onnxpipe.cli.commands import work
from onnxpipe.core.errors import OnnxpipeError

SUBCOMMANDS = (profile, split, plan, verify, run, generate, inspect, export_triton)
"""The parsers, in the order ``onnxpipe --help`` lists them; each module has ``NAME``, ``HELP`` and
``add_arguments``; the work of each is in :data:`.commands.WORK` under the same name."""


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="onnxpipe",
        description="Split an ONNX model into a balanced pipeline of stage models.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=SubcommandParser
    )
    for module in SUBCOMMANDS:
        module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (errors print one line to stderr).

    argparse's usage errors, ``--help`` and ``--version`` end in :class:`SystemExit` (code 2, 0, 0), as
    argparse does, before any command runs: a usage error writes nothing.
    """
    args = build_parser().parse_args(argv)
    try:
        return work(args.command)(args)
    except OnnxpipeError as e:
        print(f"onnxpipe {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"onnxpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout left (`onnxpipe plan ... | head`): what was written stands; point stdout at
        # /dev/null so that the interpreter's final flush does not fail again, and exit as SIGPIPE would
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
