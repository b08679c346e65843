"""What the CLI says about the work, as the door's :class:`~onnxpipe.core.events.Listener`: the lines
before it, its steps, warnings, and the total time at the end.

The lines go to stdout before the result, or to stderr with ``--json`` so that stdout stays one JSON
document; an option they name is worded as the subcommand's flag.  ``--quiet`` drops the steps and the
progress bars, not the warnings.
"""

from __future__ import annotations

import os
import sys
import time
from contextvars import ContextVar
from pathlib import Path

from onnxpipe.cli.parsers import worded
from onnxpipe.core.text import human_bytes

COMMAND_START: ContextVar[float | None] = ContextVar("onnxpipe_command_start", default=None)
"""When the running command began (a :func:`time.perf_counter` value), set by :func:`onnxpipe.cli.main`.

The times :class:`Say` prints count from it: the process's start when ``main`` is the process's entry
(the console script), so that ``split in 1.2 s`` is what the user's clock says, loading onnx and
onnxruntime included; the call to ``main`` when it is called in a running process."""


def process_start() -> float:
    """The :func:`time.perf_counter` value at which this process started: from ``/proc`` (Linux), at the
    kernel's clock tick; elsewhere, now."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (name)": fields 3 on
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        age = uptime - int(fields[22 - 3]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks
    except (OSError, ValueError, IndexError):
        return time.perf_counter()
    return time.perf_counter() - max(0.0, age)


class Say:
    """Lines about the work of subcommand ``command``; :meth:`done` prints the total time, counted from the
    command's start (:data:`COMMAND_START`), else from now."""

    def __init__(self, command: str, *, json_output: bool = False, quiet: bool = False) -> None:
        self.command = command
        self.stream = sys.stderr if json_output else sys.stdout
        self.quiet = quiet
        self.progress = not quiet
        started = COMMAND_START.get()
        self.start = time.perf_counter() if started is None else started

    def text(self, text: str) -> str:
        """``text`` with the options it names worded as flags."""
        return worded(text, self.command)

    def line(self, text: str) -> None:
        print(self.text(text), file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        self.line(f"warning: {text}")

    def step(self, what: str) -> None:
        """A step begins: ``... exporting 4 stages (at 3.2 s)``, one line, readable in a log."""
        if not self.quiet:
            self.line(f"... {what} (at {time.perf_counter() - self.start:.1f} s)")

    def done(self, what: str) -> None:
        self.line(f"{what} in {time.perf_counter() - self.start:.1f} s")


def reading(path: Path, *, quiet: bool = False) -> None:
    """The first step of a command given a model or a split folder, said on a terminal before onnx and
    onnxruntime are imported (half a second, several on a loaded machine), so that the command answers
    at once.  On stderr, and only to a person: a log or a pipe gets what it always got, and a refusal
    that follows is still the one line of its own."""
    if quiet or not (path.is_file() or path.is_dir()) or not sys.stderr.isatty():
        return
    if path.is_file():  # the model file, and the weight files beside it named after it (model.onnx.data)
        files = [path, *(p for p in path.parent.glob(f"{path.name}*") if p != path and p.is_file())]
    else:
        files = [p for p in path.iterdir() if p.is_file()]
    size = human_bytes(sum(p.stat().st_size for p in files))
    print(f"... reading {path.name or path} ({size})", file=sys.stderr, flush=True)
