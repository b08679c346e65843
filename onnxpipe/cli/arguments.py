"""What every subcommand's parser shares: one-line argparse errors, help that shows each default, and the
flags several subcommands take (measurement, inputs, planning, decoders), so that ``--threads`` reads the
same everywhere.

Parsers only: this module imports argparse, the door's options (light) and core, never onnx, onnxruntime
or numpy, so that ``onnxpipe --help`` stays fast.

The argparse value types are here too, so that ``--threads 0`` reads the same everywhere, and the flags'
values turned into the options' (``--shape x=1,3`` into ``{"x": (1, 3)}``).

>>> shapes(["x=1,3,224,224"])
{'x': (1, 3, 224, 224)}
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from onnxpipe.api.options import (
    DEFAULT_MICROBATCHES,
    DEFAULT_TIME_SLACK,
    LocalMode,
    defaults_text,
)
from onnxpipe.cli.flags import Flag, flag, grouped
from onnxpipe.core.errors import UsageError
from onnxpipe.core.units import parse_bytes, parse_rate


def whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"{value} must be at least {minimum}" if minimum else f"{value} must be 0 or more"
        )
    return value


def positive_int(text: str) -> int:
    """1 or more: stage, thread, run and micro-batch counts."""
    return whole_number(text, 1)


def count(text: str) -> int:
    """0 or more: warm-up runs."""
    return whole_number(text, 0)


def _number(text: str, fits: Callable[[float], bool], must: str) -> float:
    """``text`` as a number that ``fits``, else an argparse error saying what it ``must`` be."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not fits(value):
        raise argparse.ArgumentTypeError(f"{text} must be {must}")
    return value


def positive_number(text: str) -> float:
    """A finite number above 0 (``nan`` and ``inf`` refused)."""
    return _number(text, lambda v: v > 0 and math.isfinite(v), "a positive finite number")


def nonnegative_number(text: str) -> float:
    """A finite number of 0 or more: a tolerance, a share (``--time-slack 0.01`` is 1%)."""
    return _number(text, lambda v: v >= 0 and math.isfinite(v), "a finite number of 0 or more")


def probability(text: str) -> float:
    """A number above 0 and at most 1: ``--top-p``."""
    return _number(text, lambda v: 0 < v <= 1, "above 0 and at most 1")


def bandwidth(text: str) -> float:
    """Bytes per second above 0, as a number or spelled as devices files spell it (``"1 Gbit/s"``,
    ``"100 MB/s"``), so that one link reads the same on the command line and in a file."""
    try:
        value, what = float(text), "number"
    except ValueError:
        try:
            value, what = parse_rate(text), "rate"
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a rate; give bytes per second (125000000) or e.g. '1 Gbit/s'"
            ) from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a positive finite {what}")
    return value


def byte_sizes(text: str) -> tuple[int, ...]:
    """Sizes of 1 byte or more, comma-separated, each in bytes or spelled as a devices file spells a size
    (``"4 MiB"``): ``--bytes 65536,1MiB``."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part) if part.isdigit() else parse_bytes(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a size; give bytes (65536) or e.g. '1 MiB'"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{part} must be 1 byte or more")
        sizes.append(value)
    return tuple(sizes)


def token_ids(text: str) -> tuple[int, ...]:
    """A prompt's token ids: whole numbers >= 0 separated by commas or spaces (``"1,2,3"``)."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one token id (e.g. 1,2,3)")
    ids: list[int] = []
    for p in parts:
        try:
            value = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{p!r} is not a token id (a whole number)") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{value} is not a token id: ids are 0 or more")
        ids.append(value)
    return tuple(ids)


def stages_arg(text: str) -> int | str:
    """``--stages``: a number of stages, or ``auto``."""
    return "auto" if text == "auto" else positive_int(text)


def shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``--shape`` given as ``["name=1,3,224,224", ...]`` (``x`` also separates dims; ``name=`` is a scalar).

    The name is everything before the last ``=``, so names holding ``=`` still work.
    """
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims_text = item.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--shape {item!r}: expected NAME=D1,D2,...; write it like input=1,3,224,224")
        text = dims_text.strip().replace("x", ",").replace("X", ",")
        dims: list[int] = []
        if text:
            for part in text.split(","):
                part = part.strip()
                try:
                    value = int(part)
                except ValueError:
                    raise UsageError(
                        f"--shape {item!r}: {part!r} is not a whole number; write NAME=D1,D2,..."
                    ) from None
                if value < 0:
                    raise UsageError(
                        f"--shape {item!r}: dims must be >= 0, got {value}; give sizes like NAME=1,3,224,224"
                    )
                dims.append(value)
        if name in result:
            raise UsageError(f"--shape {item!r}: input {name!r} is given twice; give each input once")
        result[name] = tuple(dims)
    return result


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
            or (isinstance(default, list | tuple | dict) and not default)
            or action.required
            or (not action.option_strings and action.nargs not in ("?", "*"))
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class CommandParser(argparse.ArgumentParser):
    """A parser whose own errors are one line, like every other onnxpipe error.

    argparse prints its whole usage block before the error, which buries the one line that matters; the
    project's rule is one line naming what is wrong and what to do.  The usage stays one ``--help`` away
    (the line says so), and the exit code stays argparse's 2, the usage-error code of docs/cli.md.
    Options are never abbreviated: ``--prompt`` is not taken for ``--prompt-ids``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        what = " ".join(message.split())  # one line, whatever a type function put in its message
        self.exit(2, f"{self.prog}: error: {what}; see '{self.prog} --help'\n")

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        """argparse's, after refusing an unknown option by name (:meth:`refuse_unknown_options`); a
        subcommand's parser (one with no subcommands) also refuses what is left (an extra positional)
        itself: argparse hands it up to the top-level parser, whose error would read ``onnxpipe: error:
        unrecognized arguments`` and point at the top-level help, which does not list the subcommand's
        options; refused here, the line names the subcommand and its ``--help``."""
        given = list(sys.argv[1:] if args is None else args)
        self.refuse_unknown_options(given)
        parsed, extras = super().parse_known_args(given, namespace)
        if extras and self._subparsers is None:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def refuse_unknown_options(self, args: Sequence[str]) -> None:
        """Refuse the first of ``args`` that argparse would take for an option this parser does not have,
        naming it and the closest option it has: ``unknown option --stags (did you mean --stages?)``.

        argparse checks the required options first, so a typo in one (``--stags 3``) read ``the following
        arguments are required: --stages/-k`` and hid the typo.  Tokens are read as argparse reads them:
        ``--`` ends the options, a lone ``-``, a number and a token with a space are values, ``-k3`` is
        ``-k`` with its value; a parser with subcommands reads only up to the command (the subcommand's
        parser reads the rest)."""
        for arg in args:
            if arg == "--":
                return
            if not _looks_like_option(arg):
                if self._subparsers is not None:
                    return
                continue
            name = arg.split("=", 1)[0]
            if name in self._option_string_actions or arg[:2] in self._option_string_actions:
                continue
            self.error(f"unknown option {name}{self._did_you_mean(name)}")

    def _did_you_mean(self, name: str) -> str:
        """`` (did you mean --stages?)``: the shown option closest to ``name``, by the words after the
        dashes (the dashes every option shares would make any two look alike); empty when none is."""
        shown = {
            option.lstrip("-"): option
            for option, action in self._option_string_actions.items()
            if action.help is not argparse.SUPPRESS and option.startswith("--")
        }
        close = difflib.get_close_matches(name.lstrip("-"), shown, n=1)
        return f" (did you mean {shown[close[0]]}?)" if close else ""


def _looks_like_option(arg: str) -> bool:
    """Whether argparse takes ``arg`` for an option (known or not) rather than a value."""
    if not arg.startswith("-") or arg == "-" or " " in arg:
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


LOCAL_MODES = (LocalMode.PROCESSES.value, LocalMode.THREADS.value)
"""The ``--local-mode`` choices: how workers on this machine run."""

QUIET = Flag(
    ("--quiet", "-q"),
    field=None,
    help="no progress: no bar on a terminal, no progress lines in a log (stderr not a terminal)",
    settings={"action": "store_true"},
)
JSON = Flag(
    ("--json",),
    field=None,
    help="print one JSON document on stdout instead of the tables (schema: docs/cli.md); what the "
    "command says about its work goes to stderr",
    settings={"action": "store_true"},
)


def shape_flag(help: str = "concrete shape of a model input with dynamic dims (repeatable)") -> Flag:
    return flag(
        "--shape",
        field="shapes",
        action="append",
        metavar="NAME=D1,D2,...",
        to_field=shapes,
        help=help,
    )


INPUT_FLAGS = [
    flag(
        "--inputs",
        field="input_files",
        action="append",
        metavar="FILE",
        help="real model inputs to run on instead of random ones: an .npz with one array per input (by "
        "name) or a folder of <input>.npy files; repeat for several samples (they fix the shapes)",
    ),
    flag(
        "--inputs-stacked",
        field="stacked_files",
        action="append",
        metavar="FILE",
        help="like --inputs, an .npz whose arrays hold several samples along a leading axis",
    ),
]
"""``--inputs`` and ``--inputs-stacked``: the user's sample inputs."""


TOLERANCE_FLAGS = [
    flag(
        "--rtol",
        type=nonnegative_number,
        help="relative tolerance: an output matches when max|a-b| <= atol + rtol * max|a| (default: by "
        f"the output's type: {defaults_text('rtol')})",
    ),
    flag(
        "--atol",
        type=nonnegative_number,
        help=f"absolute tolerance (see --rtol; default: by the output's type: {defaults_text('atol')})",
    ),
]
"""The tolerance a verification holds the outputs to (fields of :class:`~onnxpipe.api.VerifyOptions`,
or of :class:`~onnxpipe.api.SplitOptions`): by each output's type unless given."""


def measure_flags(prefix: str = "profile.", *, devices: bool = True) -> list[Flag]:
    """How costs are measured: fields of a :class:`~onnxpipe.api.ProfileOptions` at ``prefix``
    (``devices``: the command also takes a devices file, whose devices have threads of their own)."""
    per_device = "; with --devices each device's threads" if devices else ""
    flags = [
        flag(
            "--threads",
            type=positive_int,
            help=f"intra-op threads to profile with, which the stages run with (default 1{per_device})",
        ),
        flag("--runs", type=positive_int, help="timed runs to take the median of"),
        flag("--warmup", type=count, help="untimed warm-up runs"),
        shape_flag(),
        *INPUT_FLAGS,
    ]
    return grouped("measurement", flags, at=prefix)


_STAGE_FLAGS = [
    flag(
        "--stages",
        "-k",
        field="plan.stages",
        type=stages_arg,
        metavar="K|auto",
        help="number of stages, or auto",
    ),
    flag("--profile", field="profile.saved", help="reuse a profile saved by 'onnxpipe profile'"),
    flag(
        "--cost",
        field="profile.cost",
        help="measured (default) or static costs",
    ),
    flag(
        "--bandwidth",
        field="plan.bandwidth_bytes_per_s",
        type=bandwidth,
        metavar="RATE",
        help="link bandwidth: bytes/s (125000000) or a rate as devices files write it ('1 Gbit/s'); "
        "bytes a stage receives count as transfer time (default: free)",
    ),
    flag(
        "--link-model",
        field="plan.link_model",
        help="serial: a stage's transfer in adds to its compute; overlap: links run beside compute and "
        "the larger counts (default: serial without --devices, overlap with it or when training)",
    ),
    flag(
        "--objective",
        field="plan.objective",
        help="throughput: the slowest stage or link sets the pace of a stream of requests; latency: "
        "the sum of every stage and link, what one request alone waits (single-sequence decoding)",
    ),
    flag(
        "--workers",
        field="plan.workers",
        type=positive_int,
        metavar="W",
        help="deal the K stages out to W identical workers in turn (stage s on worker s %% W), so that "
        "each worker gets about 1/W of the time and of the weights (inference; K a multiple of W)",
    ),
    flag(
        "--time-slack",
        field="plan.time_slack",
        type=nonnegative_number,
        metavar="F",
        help="with --workers: accept a split up to F slower than the fastest (default "
        f"{DEFAULT_TIME_SLACK}, i.e. 1%%) if it balances the workers' weights better",
    ),
    flag(
        "--split-nodes",
        field="plan.split_nodes",
        help="auto: a node that holds the split back (a big MatMul, Gemm or Conv with constant weights) "
        "may be cut into parts in consecutive stages when that lowers the slowest stage; off (default): "
        "contiguous stages of whole nodes",
    ),
]
"""How many stages, from which costs, over which links, on how many workers."""


_SCHEDULE_FLAGS = [
    flag(
        "--devices",
        field="plan.devices",
        type=Path,
        help="cluster file: devices in pipeline order and their links",
    ),
    flag(
        "--order",
        field="plan.order",
        help="keep the devices' order, or search it",
    ),
    flag(
        "--boundary-dtype",
        field="plan.boundary_dtype",
        help="what the float32 activations crossing a cut travel as, cast or quantized inside the stage "
        "files: float16, bfloat16, int8 (a per-tensor scale), or auto: float16 where a cut's transfer "
        "would bound the pipeline at the --devices links' rates (default: float32, as they are)",
    ),
    flag(
        "--schedule",
        field="plan.schedule.kind",
        help="stream (inference), gpipe or 1f1b (training), auto (best training schedule)",
    ),
    flag(
        "--microbatches",
        field="plan.schedule.microbatches",
        type=positive_int,
        help=f"micro-batches M per batch (default {DEFAULT_MICROBATCHES})",
    ),
    flag(
        "--batch",
        field="plan.schedule.batch",
        type=positive_int,
        help="samples per training iteration (default: M)",
    ),
    flag(
        "--backward-ratio",
        field="plan.schedule.backward_ratio",
        type=positive_number,
        help="backward time over forward time (training)",
    ),
]
"""The devices and their order, the schedule the plan simulates, and what training splits a batch
into (``plan.schedule``)."""


_DECODER_FLAGS = [
    flag(
        "--phase",
        help="balance the layer cuts for a prompt (prefill), a generation step (decode), or both "
        "(default: the worse phase as close as it can be to its own best split)",
    ),
    flag(
        "--layer-cuts",
        choices=("on", "off"),
        to_field=lambda v: v == "on",
        from_field=lambda v: "on" if v else "off",
        help="cut only between layers, each layer's KV cache in one stage (default on)",
    ),
    flag(
        "--ends",
        help="embedding and LM head: where the balance puts them (free), with the first/last layer "
        "(attached), or each in a stage of its own (own)",
    ),
    flag(
        "--max-context",
        type=positive_int,
        metavar="TOKENS",
        help="context the KV cache memory per stage is counted at (at most the model's own context)",
    ),
    flag("--prefill-tokens", type=positive_int, metavar="N", help="prompt tokens of the prefill shape"),
    flag("--decode-past", type=count, metavar="N", help="cached tokens of the decode shape"),
]
"""How a decoder's layers are cut and the shapes its phases are measured at."""


PLANNING_FLAGS = [
    *grouped("planning", [*_STAGE_FLAGS, *_SCHEDULE_FLAGS]),
    *grouped("decoders (models with a KV cache)", _DECODER_FLAGS, at="plan.decoder."),
]
"""What to plan (a :class:`~onnxpipe.api.PlanRequest` at ``plan.``), from which costs, and how a
decoder LLM with a KV cache is split (ignored for other models: ``plan.decoder``)."""


RAY_ADDRESS = flag(
    "--ray-address", metavar="ADDR", help="address of a running Ray cluster (default: start a local one)"
)


def ray_flags(work: str, lost: str) -> list[Flag]:
    """``--ray-address``, ``--ray-resources``, ``--ray-files``, ``--ray-restarts`` and
    ``--ray-restart-timeout``: where the stages' actors run and what a lost one costs, for ``run`` and
    ``generate`` alike (``work``: what a timeout stops; ``lost``: what happens to a lost actor's work)."""
    return [
        RAY_ADDRESS,
        flag(
            "--ray-resources",
            metavar="FILE",
            help="JSON file of per-stage Ray actor resources (pins each stage to a node)",
        ),
        flag(
            "--ray-files",
            help="ship each stage's files through Ray to the node its actor lands on (checked by sha256, "
            "cached there), or read them from a folder every node has at the same path",
        ),
        flag(
            "--ray-restarts",
            type=count,
            metavar="N",
            help=f"times Ray starts a lost stage actor again on a node with its resources, {lost} (0: a "
            f"lost node fails the {work})",
        ),
        flag(
            "--ray-restart-timeout",
            type=positive_number,
            metavar="S",
            help=f"seconds a lost stage actor may take to run again before the {work} stops",
        ),
    ]
