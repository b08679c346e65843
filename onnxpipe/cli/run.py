"""``onnxpipe run DIR``: run a split folder as a pipeline, measure it, optionally against the model (the
parser and its table; the work is :func:`onnxpipe.cli.commands.run`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import Backend, RunOptions
from onnxpipe.cli.argtypes import count, positive_int
from onnxpipe.cli.arguments import JSON, LOCAL_MODES, input_flags, ray_flags, shape_flag
from onnxpipe.cli.flags import Table, flag, grouped
from onnxpipe.core.choices import values

NAME = "run"
HELP = "run a split folder as a pipeline and measure it"

_WORKERS = [
    flag("--backend", choices=values(Backend), help="local workers or a Ray cluster"),
    flag("--local-mode", choices=LOCAL_MODES, help="local workers as processes (shared memory) or threads"),
    flag(
        "--threads",
        type=positive_int,
        metavar="N",
        help="intra-op threads per stage (default: the split's devices', else the plan's)",
    ),
    flag(
        "--devices",
        type=Path,
        metavar="FILE",
        help="devices file naming each stage's provider and threads (default: the split's, docs/devices.md)",
    ),
    flag("--slots", type=positive_int, metavar="N", help="micro-batches each link between stages holds"),
    flag(
        "--pin",
        action="store_true",
        help="pin each local worker (and, with --compare, each baseline) to CPUs of its own, on "
        "physical cores no other worker uses",
    ),
    *ray_flags("run", "its micro-batches sent again"),
]
_INPUTS = [
    *input_flags(),
    flag(
        "--microbatches",
        "-m",
        type=positive_int,
        metavar="M",
        help="micro-batches to run (default: all the inputs hold, else 32)",
    ),
    flag("--warmup", type=count, metavar="W", help="untimed micro-batches run first"),
    shape_flag("shape of a random model input (default: the shapes the plan was made for)"),
    flag("--seed", type=int, help="seed of the random inputs"),
    flag("--model", type=Path, metavar="MODEL", help="the source model (default: the path in the manifest)"),
]
_RESULTS = [
    flag("--report", type=Path, metavar="FILE.json", help="write the measurements as JSON"),
    flag(
        "--outputs",
        type=Path,
        metavar="FILE.npz",
        help="write the model outputs as .npz, stacked on axis 0",
    ),
    flag(
        "--compare",
        action="store_true",
        help="also run the model as one session (1 thread, all threads) and as K replicas",
    ),
]

TABLE = Table(
    RunOptions,
    [
        *grouped("workers", _WORKERS),
        *grouped("inputs", _INPUTS),
        *grouped("results", _RESULTS),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by 'onnxpipe split'")
    TABLE.add_to(p)
