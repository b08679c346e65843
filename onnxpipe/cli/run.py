"""``onnxpipe run DIR``: run a split folder as a pipeline, measure it, optionally against the model (the
parser and its table; the work is :func:`onnxpipe.cli.commands.run`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import Backend, LocalMode, RunOptions
from onnxpipe.cli.argtypes import count, positive_int
from onnxpipe.cli.arguments import JSON, input_flags, ray_flags, shape_flag
from onnxpipe.cli.flags import Table, flag
from onnxpipe.core.choices import values

NAME = "run"
HELP = "run a split folder as a pipeline and measure it"

_LOCAL_MODES = (LocalMode.PROCESSES.value, LocalMode.THREADS.value)

TABLE = Table(
    RunOptions,
    [
        flag(
            "--backend",
            field="backend",
            group="workers",
            choices=values(Backend),
            help="local workers or a Ray cluster",
        ),
        flag(
            "--local-mode",
            field="local_mode",
            group="workers",
            choices=_LOCAL_MODES,
            help="local workers as processes (shared memory) or threads",
        ),
        flag(
            "--threads",
            field="threads",
            group="workers",
            type=positive_int,
            metavar="N",
            help="intra-op threads per stage (default: the split's devices', else the plan's)",
        ),
        flag(
            "--devices",
            field="devices",
            group="workers",
            type=Path,
            metavar="FILE",
            help="devices file naming each stage's provider and threads (default: the split's, "
            "docs/devices.md)",
        ),
        flag(
            "--slots",
            field="slots",
            group="workers",
            type=positive_int,
            metavar="N",
            help="micro-batches each link between stages holds",
        ),
        flag(
            "--pin",
            field="pin",
            group="workers",
            action="store_true",
            help="pin each local worker (and, with --compare, each baseline) to CPUs of its own, on "
            "physical cores no other worker uses",
        ),
        *ray_flags("run", "its micro-batches sent again", group="workers"),
        *input_flags("", "inputs"),
        flag(
            "--microbatches",
            "-m",
            field="microbatches",
            group="inputs",
            type=positive_int,
            metavar="M",
            help="micro-batches to run (default: all the inputs hold, else 32)",
        ),
        flag(
            "--warmup",
            field="warmup",
            group="inputs",
            type=count,
            metavar="W",
            help="untimed micro-batches run first",
        ),
        shape_flag(
            "shapes",
            help="shape of a random model input (default: the shapes the plan was made for)",
            group="inputs",
        ),
        flag("--seed", field="seed", group="inputs", type=int, help="seed of the random inputs"),
        flag(
            "--model",
            field="model",
            group="inputs",
            type=Path,
            metavar="MODEL",
            help="the source model (default: the path in the manifest)",
        ),
        flag(
            "--report",
            field="report",
            group="results",
            type=Path,
            metavar="FILE.json",
            help="write the measurements as JSON",
        ),
        flag(
            "--outputs",
            field="outputs",
            group="results",
            type=Path,
            metavar="FILE.npz",
            help="write the model outputs as .npz, stacked on axis 0",
        ),
        flag(
            "--compare",
            field="compare",
            group="results",
            action="store_true",
            help="also run the model as one session (1 thread, all threads) and as K replicas",
        ),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a folder written by 'onnxpipe split'")
    TABLE.add_to(p)
