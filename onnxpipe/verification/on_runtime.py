"""The stages on another runtime, held to the whole model on that runtime as well as to onnxruntime.

A runtime may differ from onnxruntime on the whole model already (OpenVINO's cubic resize with
``exclude_outside``, tract's linear resize with ``align_corners``): then the chained stages on it differ
from onnxruntime too, and that says nothing about the split.  So where every stage runs on one runtime
other than the reference (onnxruntime on the CPU), ``verify`` runs the whole model there as well and
compares three ways, per output:

* the stages against the whole model, both on the runtime: what the split itself changes;
* the stages against onnxruntime: what :attr:`VerifyReport.outputs` has always held;
* the whole model on the runtime against onnxruntime: what the runtime changes by itself.

An output passes when the stages match onnxruntime, or match the whole model on their runtime (the split
adds nothing to the runtime's own difference, which a note then names with its size).  A chain that mixes
runtimes has no one runtime to run the whole model on; it is held to onnxruntime alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.verification.compare import OutputComparison


@dataclass(frozen=True)
class OnRuntime:
    """The whole model run on ``label``, the one runtime every stage ran on, and what it compared to.

    ``stages[i]`` and ``whole[i]`` are of the report's ``outputs[i]``; both are empty when the whole model
    did not run there (``not_run`` says why).
    """

    label: str
    """What ran the stages and this run of the whole model (``openvino (CPU)``, ``tract``)."""
    stages: tuple[OutputComparison, ...] = ()
    """The chained stages against the whole model, both on ``label``: what the split changes."""
    whole: tuple[OutputComparison, ...] = ()
    """The whole model on ``label`` against onnxruntime on the CPU: what the runtime changes by itself."""
    not_run: str | None = None
    """Why the whole model did not run on ``label`` (the stages are then held to onnxruntime alone)."""

    @property
    def ran(self) -> bool:
        return self.not_run is None and bool(self.stages)


def passes(reference: OutputComparison, on: OnRuntime | None, i: int) -> bool:
    """Whether output ``i`` passes: the stages match onnxruntime (``reference``), or the whole model on
    the runtime they ran on (``on``)."""
    return reference.ok or (on is not None and on.ran and on.stages[i].ok)


def output_line(reference: OutputComparison, on: OnRuntime | None, i: int, own: str = "") -> str:
    """One output's line: its verdict and its differences from onnxruntime; where these fail and the whole
    model ran on the stages' runtime, each of the three comparisons (``own``: the tolerance of this
    output, where outputs differ in it)."""
    status = "ok" if passes(reference, on, i) else "MISMATCH"
    if on is None or not on.ran or reference.ok:
        return f"{reference.name}: {status} ({reference.diffs}{own})"
    return (
        f"{reference.name}: {status} (stages against the whole model, both on {on.label}: "
        f"{on.stages[i].diffs}; stages against onnxruntime: {reference.diffs}; the whole model on "
        f"{on.label} against onnxruntime: {on.whole[i].diffs}{own})"
    )


def verdict(outputs: tuple[OutputComparison, ...], on: OnRuntime | None) -> str:
    """What the outputs match: ``match the original``, ``match the whole model on openvino (CPU)``, or
    ``DO NOT match ...``; the tolerance follows it."""
    n = len(outputs)
    if all(o.ok for o in outputs):
        return f"{n} output(s) match the original"
    if on is None or not on.ran:
        return f"{n} output(s) DO NOT match the original"
    if all(passes(o, on, i) for i, o in enumerate(outputs)):
        return f"{n} output(s) match the whole model on {on.label}, which differs from onnxruntime by itself"
    return f"{n} output(s) DO NOT match the original, nor the whole model on {on.label}"


def notes(outputs: tuple[OutputComparison, ...], on: OnRuntime | None) -> list[str]:
    """What the verdict leaves out: the runtime's own difference from onnxruntime, which the split does
    not add to, with its size; or why the whole model was not run on the runtime."""
    if on is None:
        return []
    if not on.ran:
        return [
            f"the whole model does not run on {on.label} ({on.not_run}): the stages were held to "
            "onnxruntime alone"
        ]
    own = [w for o, s, w in zip(outputs, on.stages, on.whole, strict=True) if not o.ok and s.ok]
    if not own:
        return []
    sizes = ", ".join(
        f"{w.name} by max abs diff {w.max_abs_diff:.3g} (max rel diff {w.max_rel_diff:.3g})" for w in own
    )
    return [
        f"{on.label} differs from onnxruntime by itself: the whole model on it gives {sizes}; the stages on "
        f"it match the whole model there, so the split adds nothing to that difference"
    ]
