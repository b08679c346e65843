"""Every options object of the door, and every choice they take: light, so that the CLI reads their fields
and defaults without loading onnx, onnxruntime or numpy.

Each subcommand has one options object, whose fields and defaults are the CLI's flags (the CLI's table of
flags maps one to the other, :mod:`onnxpipe.cli.flags`); the commands that partition share their parts:
:class:`PlanRequest` (what to plan), :class:`ProfileOptions` (where the costs come from),
:class:`CalibrationOptions` and :class:`ExportOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from onnxpipe.calibrate.options import DEFAULT_ROUNDS, CalibrationOptions
from onnxpipe.core.choices import (
    Backend,
    BoundaryDtype,
    CalibrationMode,
    CostSource,
    DeviceOrder,
    Ends,
    ExternalData,
    LinkModel,
    LocalMode,
    Objective,
    Phase,
    PhaseChoice,
    RayFiles,
    Runtime,
    ScheduleChoice,
    ScheduleKind,
    SplitNodes,
    TritonPlatform,
    VerifyRuntime,
)
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.options import ExportOptions, TritonOptions
from onnxpipe.planning.request import DEFAULT_TIME_SLACK, DecoderOptions, PlanRequest, ScheduleRequest
from onnxpipe.runtime.options import GenerateOptions, LinkOptions, RunOptions, Sampling, as_paths
from onnxpipe.schedule.timeline import DEFAULT_MICROBATCHES
from onnxpipe.verification.options import VerifyOptions, defaults_text


@dataclass(frozen=True)
class PlanOptions:
    """What :func:`onnxpipe.plan` plans (``plan``), from which costs (``profile``); ``plot``: a picture of
    the schedule and the stage loads to draw (``.png`` or ``.svg``, matplotlib)."""

    plan: PlanRequest
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    plot: Path | None = None
    embedding: Path | None = None
    """As :attr:`SplitOptions.embedding`: the plan is the one ``split`` makes."""

    def __post_init__(self) -> None:
        as_paths(self, "plot", "embedding")


@dataclass(frozen=True)
class SplitOptions:
    """What :func:`onnxpipe.split` writes into ``out``: the plan asked for (``plan``), from which costs
    (``profile``), calibrated or not (``calibration``), exported how (``export``), verified or not
    (``verify``: the chained stages compared with the model before returning).

    ``static``: split a copy of the model with its input shapes frozen at ``profile.shapes`` (else the
    defaults of :func:`onnxpipe.ir.shapes.resolve_input_shapes`), its shape arithmetic folded
    (:mod:`onnxpipe.ir.static`): every stage then has fixed shapes, for runtimes and NPUs that need them.
    """

    out: Path
    plan: PlanRequest
    profile: ProfileOptions = field(default_factory=ProfileOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    verify: bool = True
    static: bool = False
    rtol: float | None = None
    atol: float | None = None
    """The verification's tolerance (:class:`VerifyOptions`): by each output's type unless given."""
    embedding: Path | None = None
    """The embedding model (token ids in, ``inputs_embeds`` out) of a text model that takes
    ``inputs_embeds``, joined ahead of it so that the split takes token ids (:mod:`onnxpipe.ir.joined`);
    default: the one the ``genai_config.json`` beside the model names (``model.embedding.filename``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        as_paths(self, "embedding")
        # what cannot work together is refused here, before anything is loaded
        VerifyOptions(rtol=self.rtol, atol=self.atol)  # refuses a bad tolerance
        if self.profile.out is not None and self.profile.out.absolute() == self.out.absolute():
            raise UsageError(f"{opt('ProfileOptions.out')}: the profile cannot be the split's folder")
        if self.calibration.rounds:
            self._check_calibration()

    def _check_calibration(self) -> None:
        """Calibration's refusals: what it cannot time, or time that way."""
        request, mode = self.plan, self.calibration.mode
        if request.split_nodes == SplitNodes.AUTO:
            raise UsageError(
                f"{opt('CalibrationOptions.rounds')} corrects the costs of the model's own nodes, and "
                f"{opt('split_nodes', 'auto')} cuts one: give one or the other"
            )
        if request.interleaved and mode in (CalibrationMode.PIPELINE, CalibrationMode.RAY):
            raise UsageError(
                f"{opt('CalibrationOptions.mode', mode)} times every stage in a worker of its own, but "
                f"interleaved stages share their workers' CPUs: use {opt('CalibrationOptions.mode', 'alone')}"
            )
        if request.devices is not None and mode == CalibrationMode.PIPELINE:
            raise UsageError(
                f"{opt('CalibrationOptions.rounds')} with {opt('devices')} times each stage alone on its "
                f"device's runtime: leave out {opt('CalibrationOptions.mode', 'pipeline')}"
            )


@dataclass(frozen=True)
class InspectOptions:
    """How :func:`onnxpipe.inspect` reads a split folder: with ``check_files`` (the default), each stage
    file's sha256 is checked against the manifest's, as ``verify`` and ``run`` do, and what is missing or
    changed is reported (:attr:`FolderInspection.file_problems`)."""

    check_files: bool = True


__all__ = [
    "DEFAULT_MICROBATCHES",
    "DEFAULT_ROUNDS",
    "DEFAULT_TIME_SLACK",
    "Backend",
    "BoundaryDtype",
    "CalibrationMode",
    "CalibrationOptions",
    "CostSource",
    "DecoderOptions",
    "DeviceOrder",
    "Ends",
    "ExportOptions",
    "ExternalData",
    "GenerateOptions",
    "InspectOptions",
    "LinkModel",
    "LinkOptions",
    "LocalMode",
    "Objective",
    "Phase",
    "PhaseChoice",
    "PlanOptions",
    "PlanRequest",
    "ProfileOptions",
    "RayFiles",
    "RunOptions",
    "Runtime",
    "Sampling",
    "ScheduleChoice",
    "ScheduleKind",
    "ScheduleRequest",
    "SplitNodes",
    "SplitOptions",
    "TritonOptions",
    "TritonPlatform",
    "VerifyOptions",
    "VerifyRuntime",
    "defaults_text",
]
