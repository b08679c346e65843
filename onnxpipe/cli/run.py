"""``onnxpipe run DIR``: run a split folder as a pipeline, measure it, optionally against the model.

The parser; the work is :mod:`onnxpipe.cli.commands.run`, which :mod:`onnxpipe.cli` loads only when the
subcommand runs, and which raises the :class:`~onnxpipe.core.errors.OnnxpipeError` subclasses mapped to
exit codes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.cli.argtypes import count, positive_int
from onnxpipe.core.choices import Backend, LocalMode, values
from onnxpipe.runtime.choices import DEFAULT_LOCAL_MODE, DEFAULT_SLOTS

NAME = "run"
HELP = "run a split folder as a pipeline and measure it"

MEASURED_MICROBATCHES = 32
"""Micro-batches ``run`` streams when neither ``--inputs`` nor ``--microbatches`` says how many."""
DEFAULT_WARMUP = 4
SINGLE_LATENCY_MICROBATCHES = 8
"""Micro-batches run one at a time after the measured stream, for the latency of one alone."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``onnxpipe run``."""
    parser.add_argument("dir", type=Path, help="a folder written by 'onnxpipe split'")
    w = parser.add_argument_group("workers")
    w.add_argument(
        "--backend", choices=values(Backend), default="local", help="local workers or a Ray cluster"
    )
    w.add_argument(
        "--local-mode",
        choices=(LocalMode.PROCESSES.value, LocalMode.THREADS.value),
        default=DEFAULT_LOCAL_MODE,
        help=f"local workers as processes (shared memory) or threads (default {DEFAULT_LOCAL_MODE})",
    )
    w.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="intra-op threads per stage (default: the split's devices', else the plan's)",
    )
    w.add_argument(
        "--devices",
        type=Path,
        metavar="FILE",
        help="devices file naming each stage's provider and threads (default: the split's, docs/devices.md)",
    )
    w.add_argument(
        "--slots",
        type=positive_int,
        metavar="N",
        default=DEFAULT_SLOTS,
        help=f"micro-batches each link between stages holds (default {DEFAULT_SLOTS})",
    )
    w.add_argument(
        "--pin",
        action="store_true",
        help="pin each local worker (and, with --compare, each baseline) to CPUs of its own, on "
        "physical cores no other worker uses",
    )
    w.add_argument(
        "--ray-address", metavar="ADDR", help="address of a running Ray cluster (default: start a local one)"
    )
    w.add_argument(
        "--ray-resources", type=Path, metavar="FILE", help="JSON file of per-stage Ray actor resources"
    )

    i = parser.add_argument_group("inputs")
    i.add_argument(
        "--inputs",
        type=Path,
        metavar="FILE.npz",
        help=".npz with one array per model input, micro-batches stacked on axis 0",
    )
    i.add_argument(
        "--microbatches",
        "-m",
        type=positive_int,
        metavar="M",
        help=f"micro-batches to run (default: all of --inputs, else {MEASURED_MICROBATCHES})",
    )
    i.add_argument(
        "--warmup", type=count, default=DEFAULT_WARMUP, metavar="W", help="untimed micro-batches run first"
    )
    i.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="shape of a random model input (default: the shapes the plan was made for)",
    )
    i.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    i.add_argument(
        "--model", type=Path, metavar="MODEL", help="the source model (default: the path in the manifest)"
    )

    o = parser.add_argument_group("results")
    o.add_argument("--report", type=Path, metavar="FILE.json", help="write the measurements as JSON")
    o.add_argument(
        "--outputs", type=Path, metavar="FILE.npz", help="write the model outputs as .npz, stacked on axis 0"
    )
    o.add_argument(
        "--compare",
        action="store_true",
        help="also run the model as one session (1 thread, all threads) and as K replicas",
    )
