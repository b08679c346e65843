"""The Python API: the same steps as the CLI, returning typed results instead of printing.

Each step can be called on its own (``load_model`` → ``get_profile``/``profile_model`` → ``plan`` or
``make_plan`` → ``export_stages`` → ``verify``) or all at once through :func:`split`, which takes what to
plan as a stage count or a :class:`~onnxpipe.planning.request.PlanRequest`, and everything else as one
:class:`SplitOptions`::

    split("model.onnx", 3, "stages/")
    split("model.onnx", PlanRequest(4, workers=2), "stages/",
          SplitOptions(profile=ProfileOptions(cost="static"), verify=False))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from onnxpipe.calibrate.devices import calibrate_on_devices, check_devices_here
from onnxpipe.calibrate.loop import CalibrationOptions, calibrate_phases, calibration_note
from onnxpipe.calibrate.timing import choose_timer, time_model
from onnxpipe.cluster.costs import provider_available
from onnxpipe.core.choices import CalibrationMode, CostSource, Phase, Runtime, SplitNodes
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.cost.measure import RETRY_NOTE
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import DEFAULT_RUNTIME, Profile
from onnxpipe.cost.source import ProfileOptions, get_profile
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.genai import (
    SourceConfig,
    Unsupported,
    check_source_fits,
    model_facts,
    read_source_config,
)
from onnxpipe.export.stages import ExportOptions, export_stages
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.ir.static import static_view
from onnxpipe.manifest import Manifest
from onnxpipe.planning.decoder import refuse_own_ends
from onnxpipe.planning.decoder_plan import check_stage_count
from onnxpipe.planning.planner import plan, planned
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan
from onnxpipe.verification.record import record_verification, verification_record
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
    partitioning again (:mod:`onnxpipe.calibrate`); ``export``: replacing an earlier split, where the
    weights go, and the config a decoder's ``genai_config.json`` starts from; ``verify``: compare the
    chained stages with the model before returning.  ``on_step`` is told each step as it begins
    (``"profiling"``, ``"planning"``, ``"exporting 4 stages"``, ``"verifying"``): the CLI says so, so that
    no step of a long split is silent; the API itself prints nothing.
    """

    profile: ProfileOptions = field(default_factory=ProfileOptions)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)
    export: ExportOptions = field(default_factory=ExportOptions)
    verify: bool = True
    on_step: Callable[[str], None] | None = field(default=None, compare=False)
    static: bool = False
    """Split a copy of the model with its input shapes frozen at ``profile.shapes`` (else the defaults
    of :func:`onnxpipe.ir.shapes.resolve_input_shapes`), its shape arithmetic folded
    (:mod:`onnxpipe.ir.static`): every stage then has fixed shapes, for runtimes and NPUs that need them."""


@dataclass(frozen=True)
class SplitResult:
    """What :func:`split` produced: the plan, the manifest written, and the verification (if run)."""

    plan: Plan
    manifest: Manifest
    out_dir: Path
    report: VerifyReport | None


def split(
    model: str | Path | ModelView,
    stages: int | Literal["auto"] | PlanRequest,
    out: str | Path,
    options: SplitOptions | None = None,
) -> SplitResult:
    """Load, profile (or reuse a profile), partition optimally, export the stages, and verify them.

    ``model``: a file, or a model already loaded (the CLI loads it first to say what it will do).
    ``stages``: a stage count, ``"auto"``, or a whole :class:`PlanRequest` (devices, device order,
    schedule, workers...).  Everything that can be refused without costs (the output folder, the
    model's opsets, the request) is refused before profiling.
    """
    request = stages if isinstance(stages, PlanRequest) else PlanRequest(stages)
    opts = options or SplitOptions()
    out_dir = Path(out).absolute()  # verification must find the folder even if "." is replaced
    genai = None if opts.export.genai_config is None else read_source_config(opts.export.genai_config)
    view = model if isinstance(model, ModelView) else load_model(model)
    check_exportable(view, out_dir, force=opts.export.force)
    request.check()
    if genai is not None:
        check_genai_request(view, request, genai, out_dir)
    if opts.static:
        shapes = resolve_input_shapes(view, opts.profile.shapes or None)
        view, _ = static_view(view, shapes)
        opts = dataclasses.replace(opts, profile=dataclasses.replace(opts.profile, shapes=shapes))
    _check_calibration(request, opts.calibration)
    step = opts.on_step or (lambda what: None)
    if opts.profile.saved is None:  # a saved profile is read at once (and refused without a word)
        step("profiling")
    phases = decoder_profiles(view, request, opts.profile)
    prof = phases.get(Phase.DECODE) or phases.get(Phase.PREFILL) or get_profile(view, opts.profile)
    step("planning, calibrating" if opts.calibration.rounds else "planning")
    samples = prof.samples
    if request.split_nodes == SplitNodes.AUTO:
        cut = planned(view, prof, request)  # the stages name the cut node's parts: export the cut model
        view, the_plan = cut.view, _measured_here(cut.plan, prof, request)
    else:
        the_plan = _calibrated(view, prof, request, opts.calibration, phases)
    retried = tuple(n for n in prof.unattributed if n.startswith(RETRY_NOTE))
    if retried:  # the sizes finally used, in the manifest's notes too
        the_plan = dataclasses.replace(the_plan, notes=(*the_plan.notes, *retried))
    step(f"exporting {the_plan.k} stages")
    manifest = export_stages(
        view,
        the_plan,
        out_dir,
        force=opts.export.force,
        external_data=opts.export.external_data,
        feeds=samples.first if samples is not None else None,
        genai_source=genai,
    )
    report = None  # the manifest says unverified until the result is recorded (Ctrl-C leaves it so)
    if opts.verify:
        planned_shapes = None if samples is not None else opts.profile.shapes
        step("verifying")
        report = verify(out_dir, shapes=planned_shapes, samples=samples, runtime=_verify_runtime(the_plan))
        try:
            record_verification(out_dir, report)
            manifest = dataclasses.replace(manifest, verification=verification_record(report))
        except OSError as e:
            raise ExportError(
                f"{out_dir}: the verification's result cannot be written into its manifest ({e}); "
                "run onnxpipe verify there once it can be written"
            ) from e
    return SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=report)


def check_genai_request(view: ModelView, request: PlanRequest, source: SourceConfig, out_dir: Path) -> None:
    """Refuse, before any cost is measured, a ``--genai-config`` that cannot serve: a model that is no
    decoder, a split that may cut inside a layer, a model or devices ONNX Runtime GenAI cannot run, a
    config of another model, or one inside the folder ``--force`` would replace."""
    where = source.path
    dec = find_decoder(view)
    if dec is None:
        raise UsageError(
            f"{where}: --genai-config is for a decoder LLM with a KV cache, and {view.label} is not one (no "
            "past/present cache pairs found); leave --genai-config out"
        )
    if not request.decoder.layer_cuts:
        raise UsageError(
            f"{where}: ONNX Runtime GenAI needs each layer's cache in one stage: leave out --layer-cuts off, "
            "or --genai-config"
        )
    facts = model_facts(view, dec)
    if isinstance(facts, Unsupported):
        raise UsageError(f"{where}: ONNX Runtime GenAI cannot run {view.label}: {facts.reason}")
    check_source_fits(source, facts[1])
    if request.devices is not None:
        tract = [d.name for d in request.devices.devices if d.runtime == Runtime.TRACT]
        if tract:
            raise UsageError(
                f"{where}: device {tract[0]!r} runs tract, which ONNX Runtime GenAI cannot run; "
                "leave out --genai-config or that device"
            )
    if out_dir.exists() and source.path.absolute().resolve().is_relative_to(out_dir.resolve()):
        raise ExportError(
            f"{out_dir}: holds {source.path.name} (--genai-config), which the split would replace; "
            "choose another --out or move the config"
        )


def _check_calibration(request: PlanRequest, calibration: CalibrationOptions) -> None:
    if not calibration.rounds:
        return
    if request.split_nodes == SplitNodes.AUTO:
        raise UsageError(
            "--calibrate corrects the costs of the model's own nodes, and --split-nodes auto cuts one: "
            "give one or the other"
        )
    if request.interleaved and calibration.mode == CalibrationMode.PIPELINE:
        raise UsageError(
            "--calibrate-in pipeline times every stage on CPUs of its own, but interleaved stages share "
            "their workers' CPUs: use --calibrate-in alone"
        )
    if request.devices is not None:
        if calibration.mode == CalibrationMode.PIPELINE:
            raise UsageError(
                "--calibrate with --devices times each stage alone on its device's runtime: leave out "
                "--calibrate-in pipeline"
            )
        check_devices_here(request.devices)  # before profiling: every stage is timed where it will run


def _measured_here(the_plan: Plan, prof: Profile, request: PlanRequest) -> Plan:
    """A measured profile's median whole run is the machine's speed the estimates saw: recorded."""
    if prof.source == CostSource.PROFILE and request.devices is None and prof.total_seconds > 0:
        return dataclasses.replace(the_plan, reference_seconds=prof.total_seconds)
    return the_plan


def decoder_phases(view: ModelView, request: PlanRequest, options: ProfileOptions) -> tuple[PhaseShape, ...]:
    """The phases a decoder is profiled at (none for other models, for a saved profile, which holds one
    shape, and with ``layer_cuts`` off; only decode's for plans off a chain of identical workers,
    ``--devices``, ``--workers`` and the like, which balance one phase); a stage count that cuts between
    layers cannot make, and ``--ends own`` where it cannot be planned, are refused here, before any cost
    is measured."""
    dec = find_decoder(view) if request.decoder.layer_cuts else None
    if dec is None:
        return ()
    other = request.off_the_chain
    if other is not None:
        refuse_own_ends(request.decoder.ends, other)
    if (request.on_identical_workers or request.interleaved) and isinstance(request.stages, int):
        check_stage_count(view, dec, request.stages, request.decoder.ends)
    if options.saved is not None:
        return ()
    shapes = request.decoder.phases()
    if other is not None:  # these plans balance one phase: decode's
        return tuple(s for s in shapes if s.phase == Phase.DECODE) or shapes
    return shapes


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
        return _measured_here(make(prof), prof, request)
    if request.devices is not None:
        return _calibrated_on_devices(view, prof, request, calibration)
    if prof.runtime != DEFAULT_RUNTIME:
        raise UsageError(
            f"--calibrate times the stages in onnxruntime, and the profile was measured on {prof.runtime}; "
            f"give --devices with devices of that runtime to calibrate on it"
        )
    k = request.stages if isinstance(request.stages, int) else len(make(prof).stages)
    timer, how = choose_timer(
        CalibrationMode.ALONE if request.interleaved else calibration.mode, k, prof.threads
    )
    both = phases is not None and Phase.PREFILL in phases and Phase.DECODE in phases
    if both:
        assert phases is not None
        done = calibrate_phases(
            view,
            {Phase.PREFILL: phases[Phase.PREFILL], Phase.DECODE: phases[Phase.DECODE]},
            lambda ps: plan(view, ps[Phase.DECODE], request, phase_profiles=_named_phases(ps)),
            rounds=calibration.rounds,
            timer=timer,
        )
    else:
        done = calibrate_phases(
            view, {None: prof}, lambda ps: make(ps[None]), rounds=calibration.rounds, timer=timer
        )
    used = done.profiles[Phase.DECODE if both else None]
    return dataclasses.replace(
        done.plan, notes=(*done.plan.notes, done.note(how)), reference_seconds=time_model(view, used)
    )


def _named_phases(profiles: Mapping[Phase | None, Profile]) -> dict[Phase, Profile]:
    return {phase: p for phase, p in profiles.items() if phase is not None}


def _calibrated_on_devices(
    view: ModelView, prof: Profile, request: PlanRequest, calibration: CalibrationOptions
) -> Plan:
    """The plan calibrated with every stage timed on its own device's runtime (:mod:`.calibrate.devices`)."""
    the_plan, rounds = calibrate_on_devices(
        view, prof, request, lambda p, r: plan(view, p, r), rounds=calibration.rounds
    )
    note = calibration_note([{None: r} for r in rounds], "each stage timed alone on its device's runtime")
    return dataclasses.replace(the_plan, notes=(*the_plan.notes, note))


def _verify_runtime(the_plan: Plan) -> str | None:
    """``"devices"`` when a stage's device names another runtime than onnxruntime and every stage's
    runtime is here: the split is then verified as it will run; else None (onnxruntime on the CPU)."""
    if the_plan.cluster is None:
        return None
    by_name = {d.name: d for d in the_plan.cluster.devices}
    used = [by_name[s.device] for s in the_plan.stages if s.device in by_name]
    if all(d.runtime == Runtime.ONNXRUNTIME for d in used) or not all(provider_available(d) for d in used):
        return None
    return "devices"
