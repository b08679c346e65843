"""What a request says before its work: the input shapes it will use (and which it guessed, with the
option that sets them), threads against CPUs, and, after a measurement, whether the machine was busy.

A guessed shape decides the cut (a detector profiled at 64x64 splits elsewhere than at 320x320), and
threads beyond the cores or another process on them make every estimate wrong; a user who is not told
cannot see it coming.  The lines go to the request's :class:`~onnxpipe.core.events.Listener`; options are
named as fields (:mod:`onnxpipe.core.options`), which the CLI words as its flags.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from onnxpipe.core.dims import dims_text
from onnxpipe.core.events import Listener
from onnxpipe.core.machine import BUSY_WARNING_CPUS, available_cpu_count, busy_elsewhere, sample
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.decoder_dims import decoder_inputs
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import expected_text
from onnxpipe.ir.shapes import guessed_dims, resolve_input_shapes
from onnxpipe.planning.request import PlanRequest


def input_lines(
    view: ModelView,
    overrides: Mapping[str, Sequence[int]],
    *,
    from_inputs: bool = False,
    phases: Sequence[PhaseShape] = (),
) -> list[str]:
    """A line per model input: dtype, declared dims (symbols by name), the shape it will be run at and
    which dims were guessed; then the ``shapes`` that would set every guessed input.  ``from_inputs``:
    the sizes given are those of the user's input files.  With ``phases`` (a decoder's), its own inputs
    are sized by each phase, which no hint need set."""
    shapes = resolve_input_shapes(view, overrides)
    own = decoder_inputs(view) if phases else set()
    per_phase = {p.phase: resolve_input_shapes(view, overrides, phase=p) for p in phases}
    guesses: dict[str, list[str]] = {}
    for name, axis, symbol in guessed_dims(view, overrides):
        guesses.setdefault(name, []).append(
            f"{f'dim {axis}' if symbol is None else symbol}={shapes[name][axis]}"
        )
    lines: list[str] = []
    hints: list[str] = []
    for name in view.inputs:
        info = view.tensor(name)
        if name not in shapes:  # a sequence, map or optional: no shape to size, no random values to make
            lines.append(
                f"input {name}: {expected_text(view, name)} (not a tensor: only real inputs feed it)"
            )
            continue
        shape = shapes[name]
        if name in own:
            at = ", ".join(f"{phase} {'x'.join(map(str, s[name]))}" for phase, s in per_phase.items())
            lines.append(
                f"input {name}: {info.dtype} {dims_text(info.shape, '[?]')} -> {at} (sized per phase)"
            )
            continue
        at = "x".join(map(str, shape)) or "scalar"
        guessed = guesses.get(name, [])
        given = "the inputs" if from_inputs else opt("shapes")
        how = f"given by {given}" if name in overrides else "fixed"
        if guessed:
            how = f"guessed {', '.join(guessed)}"
        lines.append(f"input {name}: {info.dtype} {dims_text(info.shape, '[?]')} -> run at {at} ({how})")
        if guessed:
            hints.append(opt("shapes", f"{name}={','.join(map(str, shape))}"))
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
            f"and costs measured so mislead; use {opt('threads', cpus)} or fewer"
        )
    running, what = (stages, "stages") if workers is None else (workers, "workers")
    if running is not None and running * threads > cpus:
        fit = max(1, cpus // threads)
        return (
            f"{running} {what} x {threads} thread(s) = {running * threads} threads on {cpus} CPU(s): run on "
            f"this machine the {what} share CPUs and the pipeline is slower than planned; use "
            f"{opt(what, fit)} or fewer here, or run the stages on more machines"
        )
    return None


@contextlib.contextmanager
def busy_watch(listener: Listener, step: str, *, measuring: bool = True) -> Iterator[None]:
    """Warn after ``step`` when it was ``measuring`` and other processes kept the machine busy: the costs
    it measured include their interference."""
    before = sample()
    yield
    after = sample()
    busy = busy_elsewhere(before, after)
    if measuring and busy is not None and busy > BUSY_WARNING_CPUS:
        load = ""
        if before is not None and after is not None and before.load_1min is not None:
            load = f" (load average {before.load_1min:.2f} before, {after.load_1min:.2f} after)"
        listener.warn(
            f"other processes kept {busy:.1f} CPU(s) busy during {step}{load}: the measured costs "
            f"include their interference; measure again on a quiet machine (or pass a saved "
            f"{opt('saved')})"
        )


def before_work(
    listener: Listener,
    view: ModelView,
    profile: ProfileOptions,
    request: PlanRequest | None = None,
    phases: Sequence[PhaseShape] = (),
    *,
    on_cluster: bool = False,
) -> None:
    """The preamble of ``profile``, ``plan`` and ``split``: the input shapes (a decoder's own inputs sized
    per ``phases``), then the threads against the CPUs: the stages' when they run on this machine (a
    ``request`` without devices, not ``on_cluster``: calibrated on a Ray cluster, whose nodes' CPUs this
    machine's say nothing of), and the most any measurement here runs with (``profile.threads``,
    default 1, and those of devices profiled here)."""
    given = profile.inputs.shapes if profile.inputs is not None else profile.shapes
    for text in input_lines(view, given, from_inputs=profile.inputs is not None, phases=phases):
        listener.line(text)
    devices = request.devices.devices if request is not None and request.devices is not None else ()
    threads = max([profile.threads or 1, *(d.engine.threads for d in devices if d.profile_here)])
    running = workers = None
    if request is not None and request.devices is None and not on_cluster:
        running = request.stages if isinstance(request.stages, int) else None
        workers = request.workers
    warning = threads_warning(running, threads, workers=workers)
    if warning is not None:
        listener.warn(warning)
