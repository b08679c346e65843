"""``split``: load, profile (or reuse a profile), partition optimally, export the stages, verify them.

The request is checked once, here, before anything is measured: the output folder, the options, the
model's opsets, the stage count, a GenAI config that cannot serve.  Then the steps run in order, each
told to the listener as it begins, so that no step of a long split is silent.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxpipe.api.autotrial import paid_here
from onnxpipe.api.options import SplitOptions
from onnxpipe.api.paths import check_output_folder
from onnxpipe.api.plans import calibrated_plan, load, measured_here, note_retries, start
from onnxpipe.api.preamble import BusyWatch
from onnxpipe.api.profiling import save_profile
from onnxpipe.api.results import SplitResult
from onnxpipe.cluster.costs import provider_available
from onnxpipe.core.choices import Phase, Runtime, SplitNodes, VerifyRuntime
from onnxpipe.core.dims import Dim
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.runnable import runnable_shapes
from onnxpipe.cost.source import get_profile
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.genai import (
    SourceConfig,
    Unsupported,
    check_source_fits,
    model_facts,
    read_source_config,
)
from onnxpipe.export.outdir import check_target, normalized
from onnxpipe.export.stages import write_stages
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.ir.static import static_view, unsettled
from onnxpipe.planning.planner import planned
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan
from onnxpipe.verification.options import VerifyOptions
from onnxpipe.verification.record import record_verification, verification_record
from onnxpipe.verification.verify import verify_folder


def split(
    model: str | Path | ModelView, options: SplitOptions, *, listener: Listener | None = None
) -> SplitResult:
    """Split ``model`` (a file, or a model already loaded) as ``options`` say, into ``options.out``.

    Everything that can be refused without costs (the output folder, the model's opsets, the request, a
    GenAI config) is refused before profiling.  The folder is written whole or not at all; its manifest
    says ``unverified`` until the verification's result is recorded in it.
    """
    say = listener or SILENT
    opts = options
    out_dir = normalized(opts.out).absolute()  # verification must find the folder even if "." is replaced
    model_path = None if isinstance(model, ModelView) else Path(model).absolute()
    if model_path is not None:
        check_target(out_dir, force=opts.export.force, protected=(model_path, model_path.parent))
    check_output_folder(out_dir)
    opts.check()
    _check_calibration(opts)
    genai = None if opts.export.genai_config is None else read_source_config(opts.export.genai_config)
    view = load(model)
    check_exportable(view, out_dir, force=opts.export.force)
    if genai is not None:
        check_genai_request(view, opts.plan, genai, out_dir)
    request = opts.plan
    profile_options, phase_shapes = start(view, request, opts.profile, say, runs_model=opts.verify)
    view, profile_options, retried = _sized(view, opts, profile_options, bool(phase_shapes))
    if profile_options.measured:
        say.step("profiling")
    measuring = profile_options.measured or opts.calibration.rounds > 0
    watch = BusyWatch(say, "profiling and calibration" if opts.calibration.rounds else "profiling")
    phases = (
        phase_profiles(view, profile_options, phase_shapes, progress=say.progress) if phase_shapes else {}
    )
    prof = (
        phases.get(Phase.DECODE)
        or phases.get(Phase.PREFILL)
        or get_profile(view, profile_options, progress=say.progress)
    )
    say.step("planning, calibrating" if opts.calibration.rounds else "planning")
    if request.split_nodes == SplitNodes.AUTO:
        cut = planned(view, prof, request)  # the stages name the cut node's parts: export the cut model
        view, the_plan = cut.view, measured_here(cut.plan, prof, request)
    else:
        the_plan = calibrated_plan(view, prof, request, opts.calibration, phases)
        the_plan = paid_here(
            view,
            the_plan,
            prof,
            request,
            lambda: calibrated_plan(
                view, prof, dataclasses.replace(request, stages=1), opts.calibration, phases
            ),
        )
    if measuring:
        watch.check()
    save_profile(prof, profile_options)
    the_plan = _noted(note_retries(the_plan, prof), retried, view if opts.static else None)
    say.step(f"exporting {the_plan.k} stages")
    samples = prof.samples
    first = samples.first if samples is not None else None
    manifest = write_stages(view, the_plan, out_dir, opts.export, feeds=first, genai_source=genai)
    result = SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=None)
    if not opts.verify:
        return result  # the manifest says unverified until a result is recorded (Ctrl-C leaves it so)
    say.step("verifying")
    checks = VerifyOptions(
        shapes={} if samples is not None else profile_options.shapes,
        samples=samples,
        runtime=_verify_runtime(the_plan),
        rtol=opts.rtol,
        atol=opts.atol,
    )
    return _verified(result, checks)


def _sized(
    view: ModelView, opts: SplitOptions, profile_options: ProfileOptions, phased: bool
) -> tuple[ModelView, ProfileOptions, str | None]:
    """The model to split (frozen for ``static``) and the options it is costed with, at the sizes it runs
    at; and the note on sizes that are not the guessed ones.

    Where the split chooses the sizes and measures nothing first (static costs, or ``static``, which
    freezes them before any run), the model is run once at the guess, and at larger sequence dims if that
    failed (:func:`~onnxpipe.cost.runnable.runnable_shapes`, the measured profile's own rule); sizes the
    user gave, their inputs, a saved profile and a decoder's phases are left as they are."""
    retried = None
    options = profile_options
    chooses = not (phased or options.inputs is not None or options.has_input_files or options.saved)
    if chooses and (opts.static or not options.measured):
        sized = runnable_shapes(view, options.shapes or None)
        retried = sized.note
        if retried is not None:
            options = dataclasses.replace(options, shapes=sized.shapes)
    if opts.static:
        shapes = resolve_input_shapes(view, options.shapes or None)
        view, _ = static_view(view, shapes)
        options = dataclasses.replace(options, shapes=shapes)
    return view, options, retried


def _noted(the_plan: Plan, retried: str | None, frozen: ModelView | None) -> Plan:
    """``the_plan`` with the note on sizes that are not the guessed ones, and for a static split of
    ``frozen`` the boundary tensors whose dims no frozen input size settles, by name."""
    notes = [retried] if retried is not None else []
    open_dims = unsettled(frozen, [(s.index, s.outputs) for s in the_plan.stages]) if frozen else []
    if open_dims:
        named = "; ".join(f"stage {i} emits {name} {_dims_text(dims)}" for i, name, dims in open_dims)
        notes.append(
            f"{len(open_dims)} stage output(s) of the static split keep dims that the frozen input sizes do "
            f"not settle: {named} (their sizes follow data, as a NonZero's count or an If on a value "
            "does, which no freezing fixes)"
        )
    return dataclasses.replace(the_plan, notes=(*the_plan.notes, *notes)) if notes else the_plan


def _dims_text(dims: tuple[Dim, ...] | None) -> str:
    """``[1, ?, 4]``, or ``of unknown rank``."""
    if dims is None:
        return "of unknown rank"
    return "[" + ", ".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in dims) + "]"


def _verified(result: SplitResult, checks: VerifyOptions) -> SplitResult:
    """``result`` with its folder verified as ``checks`` say and the outcome recorded in its manifest."""
    report = verify_folder(result.out_dir, checks)
    try:
        record_verification(result.out_dir, report)
    except OSError as e:
        raise ExportError(
            f"{result.out_dir}: the verification's result cannot be written into its manifest ({e}); "
            "verify the folder again once it can be written"
        ) from e
    recorded = dataclasses.replace(result.manifest, verification=verification_record(report))
    return dataclasses.replace(result, manifest=recorded, report=report)


def check_genai_request(view: ModelView, request: PlanRequest, source: SourceConfig, out_dir: Path) -> None:
    """Refuse, before any cost is measured, a GenAI config that cannot serve: a model that is no decoder,
    a split that may cut inside a layer, a model or devices ONNX Runtime GenAI cannot run, a config of
    another model, or one inside the folder ``force`` would replace."""
    where = source.path
    dec = find_decoder(view)
    if dec is None:
        raise UsageError(
            f"{where}: {opt('genai_config')} is for a decoder LLM with a KV cache, and {view.label} is not "
            f"one (no past/present cache pairs found); leave {opt('genai_config')} out"
        )
    if not request.decoder.layer_cuts:
        raise UsageError(
            f"{where}: ONNX Runtime GenAI needs each layer's cache in one stage: leave out "
            f"{opt('layer_cuts', False)}, or {opt('genai_config')}"
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
                f"leave out {opt('genai_config')} or that device"
            )
    if out_dir.exists() and source.path.absolute().resolve().is_relative_to(out_dir.resolve()):
        raise ExportError(
            f"{out_dir}: holds {source.path.name} ({opt('genai_config')}), which the split would replace; "
            f"choose another {opt('out')} or move the config"
        )


def _check_calibration(opts: SplitOptions) -> None:
    """Calibration's refusals: what it cannot time, or time that way."""
    if not opts.calibration.rounds:
        return
    request = opts.plan
    calibrate = opt("CalibrationOptions.rounds")
    timed_in = opt("CalibrationOptions.mode", "pipeline")
    if request.split_nodes == SplitNodes.AUTO:
        raise UsageError(
            f"{calibrate} corrects the costs of the model's own nodes, and {opt('split_nodes', 'auto')} cuts "
            "one: give one or the other"
        )
    if request.interleaved and opts.calibration.mode in ("pipeline", "ray"):
        raise UsageError(
            f"{opt('CalibrationOptions.mode', opts.calibration.mode)} times every stage in a worker of its "
            f"own, but interleaved stages share their workers' CPUs: use "
            f"{opt('CalibrationOptions.mode', 'alone')}"
        )
    if request.devices is not None and opts.calibration.mode == "pipeline":
        raise UsageError(
            f"{calibrate} with {opt('devices')} times each stage alone on its device's runtime: leave "
            f"out {timed_in}"
        )


def _verify_runtime(the_plan: Plan) -> VerifyRuntime | None:
    """``devices`` when a stage's device names another runtime than onnxruntime and every stage's runtime
    is here: the split is then verified as it will run; else None (onnxruntime on the CPU)."""
    if the_plan.cluster is None:
        return None
    by_name = {d.name: d for d in the_plan.cluster.devices}
    used = [by_name[s.device] for s in the_plan.stages if s.device in by_name]
    if all(d.runtime == Runtime.ONNXRUNTIME for d in used) or not all(provider_available(d) for d in used):
        return None
    return VerifyRuntime.DEVICES
