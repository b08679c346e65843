"""What a command says before its work, and after it: the input shapes it will use (and which it
guessed, with the ``--shape`` that sets them), threads against CPUs, a busy machine, the total time.

A guessed shape decides the cut (a detector profiled at 64x64 splits elsewhere than at 320x320), and
threads beyond the cores or another process on them make every estimate wrong; a user who is not told
cannot see it coming.  The lines go to stdout before the result, or to stderr with ``--json`` so that
stdout stays one JSON document.  The API prints nothing: all of it is here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from onnxpipe.core.machine import BUSY_WARNING_CPUS, CpuSample, available_cpu_count, busy_elsewhere, sample
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import parse_shape_overrides, resolve_input_shapes
from onnxpipe.planning.request import PlanRequest


class Say:
    """Lines about the work, to stdout (stderr with ``--json``); :meth:`done` prints the total time."""

    def __init__(self, *, json_output: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else (sys.stderr if json_output else sys.stdout)
        self.start = time.perf_counter()

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def warn(self, text: str) -> None:
        self.line(f"warning: {text}")

    def step(self, what: str) -> None:
        """A step begins: ``... exporting 4 stages (at 3.2 s)``, one line, readable in a log."""
        self.line(f"... {what} (at {time.perf_counter() - self.start:.1f} s)")

    def done(self, what: str) -> None:
        self.line(f"{what} in {time.perf_counter() - self.start:.1f} s")


def _show_dims(dims: Sequence[object] | None) -> str:
    if dims is None:
        return "[?]"
    return "[" + ", ".join("?" if d is None or (isinstance(d, int) and d < 0) else str(d) for d in dims) + "]"


def input_lines(view: ModelView, overrides: Mapping[str, Sequence[int]]) -> list[str]:
    """A line per model input: dtype, declared dims (symbols by name), the shape it will be run at and
    which dims were guessed; then the ``--shape`` flags that would set every guessed input."""
    shapes = resolve_input_shapes(view, overrides)
    given_symbols = {
        d for name, dims in overrides.items() for d in (view.tensor(name).shape or ()) if isinstance(d, str)
    }
    lines: list[str] = []
    hints: list[str] = []
    for name in view.inputs:
        info = view.tensor(name)
        shape = shapes[name]
        at = "x".join(map(str, shape)) or "scalar"
        guessed: list[str] = []
        if name not in overrides and info.shape is not None:
            for axis, d in enumerate(info.shape):
                if isinstance(d, int) and d >= 0:
                    continue
                if isinstance(d, str) and d in given_symbols:
                    continue
                guessed.append(f"{d if isinstance(d, str) else f'dim {axis}'}={shape[axis]}")
        how = "given by --shape" if name in overrides else "fixed"
        if guessed:
            how = f"guessed {', '.join(guessed)}"
        lines.append(f"input {name}: {info.dtype} {_show_dims(info.shape)} -> run at {at} ({how})")
        if guessed:
            hints.append(f"--shape {name}={','.join(map(str, shape))}")
    if hints:
        lines.append(
            "  the guessed sizes decide the costs and so the cut; set the real ones with "
            + " ".join(hints)
            + " (your sizes in place of these)"
        )
    return lines


def threads_warning(
    stages: int | None, threads: int, cpus: int | None = None, *, workers: int | None = None
) -> str | None:
    """A warning when the stages' threads (or the profiler's) exceed the CPUs this process may use:
    they would share CPUs and run slower than planned, and the costs measured at them mislead.  With
    ``workers`` (an interleaved split) it is the workers that run at once, each one stage at a time."""
    cpus = cpus if cpus is not None else available_cpu_count()
    if threads > cpus:
        return (
            f"{threads} thread(s) per stage on {cpus} CPU(s): the threads of one stage already share CPUs, "
            f"and costs measured so mislead; use --threads {cpus} or fewer"
        )
    running, what = (stages, "stages") if workers is None else (workers, "workers")
    if running is not None and running * threads > cpus:
        fit = max(1, cpus // threads)
        return (
            f"{running} {what} x {threads} thread(s) = {running * threads} threads on {cpus} CPU(s): run on "
            f"this machine the {what} share CPUs and the pipeline is slower than planned; use --{what} "
            f"{fit} or fewer here, or run the stages on more machines"
        )
    return None


class BusyWatch:
    """Samples the machine before a measuring step and warns after it when other processes were busy."""

    def __init__(self, say: Say, step: str) -> None:
        self.say = say
        self.step = step
        self.before: CpuSample | None = sample()

    def check(self) -> float | None:
        after = sample()
        busy = busy_elsewhere(self.before, after)
        if busy is not None and busy > BUSY_WARNING_CPUS:
            load = ""
            if self.before is not None and after is not None and self.before.load_1min is not None:
                load = f" (load average {self.before.load_1min:.2f} before, {after.load_1min:.2f} after)"
            self.say.warn(
                f"other processes kept {busy:.1f} CPU(s) busy during {self.step}{load}: the measured costs "
                "include their interference; measure again on a quiet machine (or pass a saved --profile)"
            )
        return busy


def profiling_threads(threads: int | None, devices_threads: Sequence[int] = ()) -> int:
    """The most intra-op threads any measurement on this machine runs with: ``--threads`` (default 1),
    and those of devices profiled here."""
    return max([1 if threads is None else threads, *devices_threads])


def before_work(
    say: Say,
    view: ModelView,
    overrides: Mapping[str, Sequence[int]],
    *,
    stages: int | None,
    threads: int,
    workers: int | None = None,
) -> None:
    """The preamble: input shapes (guessed ones named), and the stages' threads against the CPUs."""
    for text in input_lines(view, overrides):
        say.line(text)
    warning = threads_warning(stages, threads, workers=workers)
    if warning is not None:
        say.warn(warning)


def plan_preamble(say: Say, view: ModelView, args: argparse.Namespace, request: PlanRequest) -> None:
    """:func:`before_work` for ``plan`` and ``split``: nothing with a saved ``--profile`` (its own shapes
    hold); the stages' threads counted when they run on this machine (no devices file), and the most
    threads a device profiled here measures with."""
    if args.profile is not None:
        return
    devices = request.devices.devices if request.devices is not None else ()
    here = [d.threads for d in devices if d.profile_here]
    before_work(
        say,
        view,
        parse_shape_overrides(args.shape),
        stages=args.stages if isinstance(args.stages, int) and request.devices is None else None,
        threads=profiling_threads(args.threads, here),
        workers=request.workers if request.devices is None else None,
    )
