"""The Python API: the same steps as the CLI, returning typed results instead of printing.

Each step can be called on its own (``load_model`` → ``get_profile``/``profile_model`` → ``plan`` or
``make_plan`` → ``export_stages`` → ``verify``) or all at once through :func:`split`, which takes what to
plan as a stage count or a :class:`~onnxpipe.plan.request.PlanRequest`, and everything else as one
:class:`SplitOptions`::

    split("model.onnx", 3, "stages/")
    split("model.onnx", PlanRequest(4, workers=2), "stages/",
          SplitOptions(profile=ProfileOptions(cost="static"), verify=False))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from onnxpipe.calibrate.loop import CalibrationOptions
from onnxpipe.calibrate.loop import calibrate as run_calibration
from onnxpipe.calibrate.timing import choose_timer, time_model
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.kinds import CostSource
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import ProfileOptions, get_profile
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.stages import ExportOptions, export_stages
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_kinds import Phase, PhaseShape
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.plan.decoder_plan import check_stage_count
from onnxpipe.plan.planner import plan
from onnxpipe.plan.request import PlanRequest
from onnxpipe.plan.types import Plan
from onnxpipe.verification.verify import VerifyReport, verify

__all__ = [
    "CalibrationOptions",
    "ExportOptions",
    "PlanRequest",
    "ProfileOptions",
    "SplitOptions",
    "SplitResult",
    "get_profile",
    "plan",
    "split",
]


@dataclass(frozen=True)
class SplitOptions:
    """Everything :func:`split` is told besides the model, the plan request and the folder.

    ``profile``: where the costs come from; ``calibration``: rounds of timing the exported stages and
    partitioning again (:mod:`onnxpipe.calibrate`); ``export``: replacing an earlier split and where the
    weights go; ``verify``: compare the chained stages with the model before returning.
    """

    profile: ProfileOptions = field(default_factory=ProfileOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    verify: bool = True


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split` produced: the plan, the manifest written, and the verification (if run)."""

    plan: Plan
    manifest: Manifest
    out_dir: Path
    report: VerifyReport | None


def split(
    model: str | Path,
    stages: int | Literal["auto"] | PlanRequest,
    out: str | Path,
    options: SplitOptions | None = None,
) -> SplitResult:
    """Load, profile (or reuse a profile), partition optimally, export the stages, and verify them.

    ``stages``: a stage count, ``"auto"``, or a whole :class:`PlanRequest` (devices, device order,
    schedule, workers...).  Everything that can be refused without costs (the output folder, the
    model's opsets, the request) is refused before profiling.
    """
    request = stages if isinstance(stages, PlanRequest) else PlanRequest(stages)
    opts = options or SplitOptions()
    out_dir = Path(out).absolute()  # verification must find the folder even if "." is replaced
    view = load_model(model)
    check_exportable(view, out_dir, force=opts.export.force)
    request.check()
    _check_calibration(request, opts.calibration)
    if opts.calibration.rounds and len(decoder_phases(view, request, opts.profile)) > 1:
        raise UsageError(
            f"{view.label}: --calibrate times the stages at one shape; with a decoder give --phase prefill "
            "or --phase decode (not both)"
        )
    phases = decoder_profiles(view, request, opts.profile)
    prof = phases.get(Phase.DECODE) or phases.get(Phase.PREFILL) or get_profile(view, opts.profile)
    the_plan = _calibrated(view, prof, request, opts.calibration, phases)
    manifest = export_stages(
        view, the_plan, out_dir, force=opts.export.force, external_data=opts.export.external_data
    )
    report = verify(out_dir, shapes=opts.profile.shapes) if opts.verify else None
    return SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=report)


def _check_calibration(request: PlanRequest, calibration: CalibrationOptions) -> None:
    if not calibration.rounds:
        return
    if request.interleaved and calibration.mode == "pipeline":
        raise UsageError(
            "--calibrate-in pipeline times every stage on CPUs of its own, but interleaved stages share "
            "their workers' CPUs: use --calibrate-in alone"
        )
    if request.devices is not None:
        raise UsageError(
            "--calibrate times the stages on this machine, which a devices file plans for other ones; "
            "give each device a profile measured on it (profile_path) instead"
        )


def decoder_phases(view: ModelView, request: PlanRequest, options: ProfileOptions) -> tuple[PhaseShape, ...]:
    """The phases a decoder is profiled at (none for other models, for a saved profile, which holds one
    shape, and with ``layer_cuts`` off); a stage count that cuts between layers cannot make is refused
    here, before any cost is measured."""
    dec = find_decoder(view) if request.decoder.layer_cuts else None
    if dec is None:
        return ()
    if request.on_identical_workers and not request.interleaved and isinstance(request.stages, int):
        check_stage_count(view, dec, request.stages, request.decoder.ends)
    return () if options.saved is not None else request.decoder.phases()


def decoder_profiles(view: ModelView, request: PlanRequest, options: ProfileOptions) -> dict[Phase, Profile]:
    """A decoder's profiles at the phases ``request.decoder`` balances for (empty when
    :func:`decoder_phases` gives none)."""
    shapes = decoder_phases(view, request, options)
    return phase_profiles(view, options, shapes) if shapes else {}


def _calibrated(
    view: ModelView,
    prof: Profile,
    request: PlanRequest,
    calibration: CalibrationOptions,
    phases: Mapping[Phase, Profile] | None = None,
) -> Plan:
    """The plan, from the profile corrected by calibration when asked; it records the machine's speed
    as the estimates were made (``reference_seconds``), for a later run to compare its own with."""

    def make(p: Profile) -> Plan:
        return plan(view, p, request, phase_profiles=phases if p is prof else None)

    if not calibration.rounds:
        the_plan = make(prof)
        measured_here = (
            prof.source == CostSource.PROFILE and request.devices is None and prof.total_seconds > 0
        )
        if measured_here:  # a measured profile's median whole run is the machine's speed it saw
            the_plan = dataclasses.replace(the_plan, reference_seconds=prof.total_seconds)
        return the_plan
    k = request.stages if isinstance(request.stages, int) else len(make(prof).stages)
    timer, how = choose_timer("alone" if request.interleaved else calibration.mode, k, prof.threads)
    prof, the_plan, rounds = run_calibration(view, prof, make, rounds=calibration.rounds, timer=timer)
    first, last = rounds[0], rounds[-1]
    note = (
        f"calibrated in {len(rounds)} round(s), {how}: the estimates were off by up to "
        f"{first.worst_error * 100:.1f}% at first"
        + (f", {last.worst_error * 100:.1f}% in round {len(rounds)}" if len(rounds) > 1 else "")
        + "; the estimates below come from the corrected costs"
    )
    return dataclasses.replace(
        the_plan, notes=(*the_plan.notes, note), reference_seconds=time_model(view, prof)
    )
