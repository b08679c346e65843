"""``onnxpipe links DEVICES``: each link of a devices file measured on a Ray cluster, between the nodes
its devices run on, through the transport a pipeline's stages use; the file written again with them
(the parser and its table; the work is :func:`onnxpipe.cli.commands.links`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxpipe.api.options import LinkOptions
from onnxpipe.cli.argtypes import byte_sizes, positive_int
from onnxpipe.cli.arguments import JSON
from onnxpipe.cli.flags import Table, flag

NAME = "links"
HELP = "measure a devices file's links on a Ray cluster and write them into it"

TABLE = Table(
    LinkOptions,
    [
        flag(
            "--ray-address",
            metavar="ADDR",
            help="address of a running Ray cluster (default: start a local one)",
        ),
        flag(
            "--ray-resources",
            type=Path,
            metavar="FILE",
            help="JSON file of each device's Ray resources, in pipeline order (as run takes per stage): "
            "they put each device's probe on its node",
        ),
        flag(
            "--split",
            type=Path,
            metavar="DIR",
            help="a split folder: each link is timed with the bytes its stages send across it",
        ),
        flag(
            "--bytes",
            field="sizes",
            type=byte_sizes,
            metavar="N[,N...]",
            help="sizes to time each link at, in bytes or as '4 MiB' (default: the split's boundaries, "
            "else 64 KiB, 1 MiB and 4 MiB)",
        ),
        flag(
            "--repeats",
            type=positive_int,
            metavar="N",
            help="transfers per size, one at a time; their median counts",
        ),
        flag(
            "--out",
            type=Path,
            metavar="FILE.json",
            help="write the devices file again, its links the measured ones",
        ),
        JSON,
    ],
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("devices", type=Path, help="a devices file (docs/devices.md), devices in pipeline order")
    TABLE.add_to(p)
