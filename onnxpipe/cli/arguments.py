"""What every subcommand's parser shares: one-line argparse errors, and the argument groups several
subcommands take (measurement, input shapes, planning), so that ``--threads`` reads the same everywhere.

Parsers only: this module imports argparse and light modules, never onnx, onnxruntime or numpy, so that
``onnxpipe --help`` stays fast; what the arguments become (options objects, a devices file read) is
:mod:`onnxpipe.cli.commands.common`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, overload

from onnxpipe.cli.argtypes import bandwidth, count, fraction, positive_int, positive_number
from onnxpipe.core.choices import CostSource, Ends, LinkModel, PhaseChoice, ScheduleChoice, SplitNodes, values
from onnxpipe.ir.decoder_kinds import DECODE_PAST, PREFILL_TOKENS
from onnxpipe.planning.decoder_kinds import DEFAULT_MAX_CONTEXT
from onnxpipe.planning.request import DEFAULT_SPLIT_NODES, DEFAULT_TIME_SLACK

_N = TypeVar("_N")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that ends every option's text with its default, unless the text already says it.

    argparse's own ArgumentDefaultsHelpFormatter also writes ``(default: None)`` and
    ``(default: False)``, which tell nothing; here an option without a default value says nothing more.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default == []
            or (not action.option_strings and action.nargs not in ("?", "*"))
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class CommandParser(argparse.ArgumentParser):
    """A parser whose own errors are one line, like every other onnxpipe error.

    argparse prints its whole usage block before the error, which buries the one line that matters; the
    project's rule is one line naming what is wrong and what to do.  The usage stays one ``--help`` away
    (the line says so), and the exit code stays argparse's 2, the usage-error code of docs/cli.md.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        what = " ".join(message.split())  # one line, whatever a type function put in its message
        self.exit(2, f"{self.prog}: error: {what}; see '{self.prog} --help'\n")


class SubcommandParser(CommandParser):
    """A subcommand's parser, which also refuses arguments it does not know itself.

    argparse hands a subcommand's unknown arguments up to the top-level parser, whose error would read
    ``onnxpipe: error: unrecognized arguments`` and point at the top-level help, which does not list the
    subcommand's options; refused here, the line names the subcommand and its ``--help``.
    """

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def stages_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def add_quiet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress: no bar on a terminal, no progress lines in a log (stderr not a terminal)",
    )


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document on stdout instead of the tables (schema: docs/cli.md); what the "
        "command says about its work goes to stderr",
    )


def add_measure_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="intra-op threads to profile with, which the stages run with (default 1; with --devices each "
        "device's threads)",
    )
    g.add_argument("--runs", type=positive_int, default=30, help="timed runs to take the median of")
    g.add_argument("--warmup", type=count, default=3, help="untimed warm-up runs")
    add_shape_arg(g)
    add_inputs_args(g)


def add_inputs_args(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--inputs",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="real model inputs to run on instead of random ones: an .npz with one array per input (by "
        "name) or a folder of <input>.npy files; repeat for several samples (they fix the shapes)",
    )
    g.add_argument(
        "--inputs-stacked",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="like --inputs, an .npz whose arrays hold several samples along a leading axis",
    )


def add_shape_arg(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="concrete shape of a model input with dynamic dims (repeatable)",
    )


def add_planning_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("planning")
    g.add_argument(
        "--stages", "-k", type=stages_arg, required=True, metavar="K|auto", help="number of stages, or auto"
    )
    g.add_argument("--profile", type=Path, help="reuse a profile saved by 'onnxpipe profile'")
    g.add_argument(
        "--cost", choices=values(CostSource), default="profile", help="measured (default) or static costs"
    )
    g.add_argument(
        "--bandwidth",
        type=bandwidth,
        default=math.inf,
        metavar="RATE",
        help="link bandwidth: bytes/s (125000000) or a rate as devices files write it ('1 Gbit/s'); bytes "
        "a stage receives count as transfer time (default: free)",
    )
    g.add_argument(
        "--link-model",
        choices=values(LinkModel),
        default=None,
        help="serial: a stage's transfer in adds to its compute; overlap: links run beside compute and "
        "the larger counts (default: serial without --devices, overlap with it or when training)",
    )
    g.add_argument(
        "--workers",
        type=positive_int,
        metavar="W",
        help="deal the K stages out to W identical workers in turn (stage s on worker s %% W), so that "
        "each worker gets about 1/W of the time and of the weights (inference; K a multiple of W)",
    )
    g.add_argument(
        "--time-slack",
        type=fraction,
        metavar="F",
        help=f"with --workers: accept a split up to F slower than the fastest (default {DEFAULT_TIME_SLACK}, "
        "i.e. 1%%) if it balances the workers' weights better",
    )
    g.add_argument(
        "--split-nodes",
        choices=values(SplitNodes),
        default=DEFAULT_SPLIT_NODES.value,
        help="auto: a node that holds the split back (a big MatMul, Gemm or Conv with constant weights) "
        "may be cut into parts in consecutive stages when that lowers the slowest stage; off (default): "
        "contiguous stages of whole nodes",
    )
    g.add_argument("--devices", type=Path, help="cluster file: devices in pipeline order and their links")
    g.add_argument(
        "--order", choices=("fixed", "free"), default="fixed", help="keep the devices' order, or search it"
    )
    g.add_argument(
        "--schedule",
        choices=values(ScheduleChoice),
        default="stream",
        help="stream (inference), gpipe or 1f1b (training), auto (best training schedule)",
    )
    g.add_argument("--microbatches", type=positive_int, help="micro-batches M per batch (default 8)")
    g.add_argument("--batch", type=positive_int, help="samples per training iteration (default: M)")
    g.add_argument(
        "--backward-ratio",
        type=positive_number,
        default=2.0,
        help="backward time over forward time (training)",
    )
    add_decoder_args(p)


def add_decoder_args(p: argparse.ArgumentParser) -> None:
    """How a decoder LLM with a KV cache is split (ignored for other models)."""
    g = p.add_argument_group("decoders (models with a KV cache)")
    g.add_argument(
        "--phase",
        choices=values(PhaseChoice),
        default="both",
        help="balance the layer cuts for a prompt (prefill), a generation step (decode), or both "
        "(default: the worse phase as close as it can be to its own best split)",
    )
    g.add_argument(
        "--layer-cuts",
        choices=("on", "off"),
        default="on",
        help="cut only between layers, each layer's KV cache in one stage (default on)",
    )
    g.add_argument(
        "--ends",
        choices=values(Ends),
        default="free",
        help="embedding and LM head: where the balance puts them (free), with the first/last layer "
        "(attached), or each in a stage of its own (own)",
    )
    g.add_argument(
        "--max-context",
        type=positive_int,
        default=DEFAULT_MAX_CONTEXT,
        metavar="TOKENS",
        help=f"context the KV cache memory per stage is counted at (default {DEFAULT_MAX_CONTEXT})",
    )
    g.add_argument(
        "--prefill-tokens",
        type=positive_int,
        default=PREFILL_TOKENS,
        metavar="N",
        help=f"prompt tokens of the prefill shape (default {PREFILL_TOKENS})",
    )
    g.add_argument(
        "--decode-past",
        type=count,
        default=DECODE_PAST,
        metavar="N",
        help=f"cached tokens of the decode shape (default {DECODE_PAST})",
    )
