"""The subcommands' parsers, in the order ``onnxpipe --help`` lists them, and their tables of flags.

Each module has ``NAME``, ``HELP``, ``TABLE`` (:class:`~onnxpipe.cli.flags.Table`) and ``add_arguments``;
the work of each is in :data:`onnxpipe.cli.commands.WORK` under the same name.
"""

from __future__ import annotations

import onnxpipe.cli.export_triton as export_triton
import onnxpipe.cli.generate as generate
import onnxpipe.cli.inspect as inspect
import onnxpipe.cli.links as links
import onnxpipe.cli.plan as plan
import onnxpipe.cli.profile as profile
import onnxpipe.cli.run as run
import onnxpipe.cli.split as split
import onnxpipe.cli.verify as verify
from onnxpipe.cli.flags import word
from onnxpipe.core.options import render

SUBCOMMANDS = (profile, split, plan, verify, run, generate, links, inspect, export_triton)


def worded(text: str, command: str) -> str:
    """``text`` with every option it names worded as a flag (``--stages 2``): as ``command``'s flag where it
    has one, else as the flag another subcommand sets it with."""
    tables = [m.TABLE for m in sorted(SUBCOMMANDS, key=lambda m: command != m.NAME)]  # its own first
    return render(text, lambda ref: word(ref, tables))
