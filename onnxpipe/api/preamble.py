"""What a request says before its work: the input shapes it will use (and which it guessed, with the
option that sets them), threads against CPUs, and, after a measurement, whether the machine was busy.

A guessed shape decides the cut (a detector profiled at 64x64 splits elsewhere than at 320x320), and
threads beyond the cores or another process on them make every estimate wrong; a user who is not told
cannot see it coming.  The lines go to the request's :class:`~onnxpipe.core.events.Listener`; options are
named as fields (:mod:`onnxpipe.core.options`), which the CLI words as its flags.

The paths a request writes or reads are checked here too, before anything is loaded or measured.  A
request that loads a 650 MB model for 15 s and then refuses its output path, its picture's file name
or a missing matplotlib has wasted the user's time; every such refusal is made here first, from the
arguments and the file system alone, in one line with the documented exit code.  A path is writable
when a file can really be made there (a probe file made and removed in the nearest folder that exists):
permission bits do not say it for root, nor for a read-only file system.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from onnxpipe.core.dims import dims_text
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.events import Listener
from onnxpipe.core.extras import install_hint
from onnxpipe.core.machine import BUSY_WARNING_CPUS, available_cpu_count, busy_elsewhere, sample
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.decoder_dims import decoder_inputs
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import expected_text
from onnxpipe.ir.shapes import guessed_dims, resolve_input_shapes
from onnxpipe.planning.draw import SUFFIXES
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


def _nearest_folder(path: Path) -> Path:
    """The folder ``path`` (a file or folder to be made) would be created in, or the nearest one above
    it that exists, where the missing ones would be created."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def _cannot_write_in(folder: Path) -> str | None:
    """Why no file can be made in ``folder``, or None when one can (a probe file made and removed)."""
    if not folder.is_dir():
        return f"{folder} is not a folder"
    probe = folder / f".onnxpipe-probe-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return _reason(e)
    os.close(fd)
    probe.unlink(missing_ok=True)
    return None


def _reason(e: OSError) -> str:
    if e.errno == errno.EROFS:
        return "the file system is read-only"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return e.strerror or str(e)


def check_output_file(path: Path, field: str) -> None:
    """Refuse an output file ``path`` that cannot be written: a folder, or in a folder where no file can be
    made; the line names the option ``field`` to change."""
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; give {opt(field)} a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{path}: cannot be written (permission denied); choose another {opt(field)}")
    folder = _nearest_folder(path)
    why = _cannot_write_in(folder)
    if why is not None:
        raise UsageError(f"{path}: cannot be written ({why} in {folder}); choose another {opt(field)}")


@contextlib.contextmanager
def writing(path: Path, field: str) -> Iterator[None]:
    """Writing the output file ``path`` (checked before the work by :func:`check_output_file`): an
    ``OSError`` that still comes is one line naming the option ``field`` to change."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"{path}: cannot be written ({e.strerror or e}); choose another {opt(field)}") from e


def check_output_folder(path: Path) -> None:
    """Refuse a split's output folder that cannot be made: split writes its stages into a temporary
    folder beside it and renames it, so the folder it lives in must take a new entry."""
    why = _cannot_write_in(_nearest_folder(path if path.name not in ("", ".", "..") else path.absolute()))
    if why is None and path.is_dir() and not any(path.iterdir()):
        why = _cannot_write_in(path)  # an empty folder stays: the stages move into it, one by one
    if why is not None:
        raise ExportError(f"{path}: cannot be written ({why}); choose another {opt('out')}")


def check_plot(path: Path) -> None:
    """Refuse a picture to draw before the work: a format not drawn, matplotlib missing, not writable."""
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(
            f"{path}: cannot tell the picture format; give a file name ending in " + " or ".join(SUFFIXES)
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            f"{opt('plot')} needs matplotlib, which is not installed; {install_hint('plot')}, "
            f"or leave out {opt('plot')}"
        )
    check_output_file(path, "plot")
