"""``plan``: load, profile (or reuse a profile), and plan the stages; and the steps ``split`` shares with
it: loading a model for a request, a decoder's profiles at its phases, calibration.

``profile``: measure (or count) every node's cost, and save the profile where asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from onnxpipe.api.options import PlanOptions
from onnxpipe.api.paths import check_output_file, check_plot, writing
from onnxpipe.api.preamble import before_work, busy_watch
from onnxpipe.api.results import PlanResult
from onnxpipe.calibrate.devices import calibrate_on_devices, how_timed
from onnxpipe.calibrate.loop import calibrate_phases
from onnxpipe.calibrate.options import CalibrationOptions
from onnxpipe.calibrate.timing import choose_timer, cluster_timer, time_model
from onnxpipe.core.choices import CalibrationMode, Phase
from onnxpipe.core.errors import UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.runnable import RETRY_NOTE
from onnxpipe.cost.source import get_profile
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.decoder import FoundDecoder, decoder_of
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.joined import named_embedding
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import expected_text, load_samples
from onnxpipe.ir.seq2seq import family_hint
from onnxpipe.ir.shapes import non_tensor_inputs
from onnxpipe.planning.decoder_plan import check_stage_count, refuse_own_ends
from onnxpipe.planning.draw import draw_plan
from onnxpipe.planning.planner import plan as make_plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan


def plan(
    model: str | Path | ModelView, options: PlanOptions, *, listener: Listener | None = None
) -> PlanResult:
    """The plan ``options.plan`` asks for, from the costs ``options.profile`` says; drawn to
    ``options.plot`` when given (refused before any work when it cannot be drawn there)."""
    say = listener or SILENT
    if options.plot is not None:
        check_plot(options.plot)
    view = load(model, options.embedding)
    found = FoundDecoder.of(view)  # once for the request: its checks, its phases, each plan tried
    request = options.plan
    profile, shapes = start(view, request, options.profile, say, decoder=found)
    with busy_watch(say, "profiling", measuring=profile.measured):
        prof, phases = measure(view, profile, shapes, say)
    save_profile(prof, profile)
    the_plan = make_plan(view, prof, request, phase_profiles=phases, decoder=found)
    drawn = None if options.plot is None else draw_plan(the_plan, options.plot, title=view.file_name)
    return PlanResult(plan=the_plan, drawn=drawn)


def profile(
    model: str | Path | ModelView, options: ProfileOptions | None = None, *, listener: Listener | None = None
) -> Profile:
    """``model``'s profile as ``options`` say (measured on onnxruntime by default), saved to
    ``options.out`` when given: a file there is replaced only with ``options.force``, and one that cannot
    be written is refused before anything is measured."""
    say = listener or SILENT
    opts = options or ProfileOptions()
    check_profile_target(opts)
    view = model if isinstance(model, ModelView) else load_model(model)
    check_runtime_opsets(view)
    if opts.measured:
        before_work(say, view, opts)
    with busy_watch(say, "profiling", measuring=opts.measured):
        prof = get_profile(view, opts, progress=say.progress)
    save_profile(prof, opts)
    return prof


def check_profile_target(options: ProfileOptions) -> None:
    """Refuse, before any work, a profile file that exists (without ``force``) or cannot be written."""
    out = options.out
    if out is None:
        return
    if out.exists() and not options.force:
        raise UsageError(
            f"{out}: exists; choose another {opt('ProfileOptions.out')} or pass {opt('force', True)}"
        )
    check_output_file(out, "ProfileOptions.out")


def save_profile(prof: Profile, options: ProfileOptions) -> None:
    """Write ``prof`` to ``options.out`` when given."""
    if options.out is not None:
        with writing(options.out, "ProfileOptions.out"):
            prof.save(options.out)


def load(model: str | Path | ModelView, embedding: Path | None = None) -> ModelView:
    """The model, loaded unless it was; a text model that takes ``inputs_embeds`` joined with its
    ``embedding`` model, else with the one the ``genai_config.json`` beside it names
    (:mod:`onnxpipe.ir.joined`): what ``plan`` plans is what ``split`` splits."""
    if isinstance(model, ModelView):
        if embedding is not None:
            raise UsageError(f"{opt('embedding', embedding)}: joins a model file; give the text model's path")
        return model
    embedding = embedding or named_embedding(Path(model))
    return load_model(model) if embedding is None else load_model(model, embedding=embedding)


def start(
    view: ModelView,
    request: PlanRequest,
    profile: ProfileOptions,
    say: Listener,
    *,
    runs_model: bool = False,
    decoder: FoundDecoder | None = None,
    on_cluster: bool = False,
) -> tuple[ProfileOptions, tuple[PhaseShape, ...]]:
    """``profile`` with the user's input files read and checked against ``view`` (so that a bad file is
    refused before any work), and a decoder's phases to profile at (:func:`decoder_phases`); the request
    refused where it cannot serve before any cost is measured (a stage count the model cannot make, an
    opset onnxruntime cannot run, an input no random value can be made for when the model must run,
    ``runs_model`` or a measured profile); then the preamble said (``on_cluster``: the stages are
    calibrated on a Ray cluster, not run here)."""
    request.check_stage_count(len(view.compute_nodes), view.label + family_hint(view.path))
    phases = decoder_phases(view, request, profile, decoder)
    if profile.has_input_files:
        samples = load_samples(view, profile.input_files, stacked=profile.stacked_files)
        profile = dataclasses.replace(profile, inputs=samples, input_files=(), stacked_files=())
    if (runs_model or profile.measured) and profile.inputs is None:
        refuse_untyped_inputs(view)
    if profile.measured:
        check_runtime_opsets(view)  # before the preamble: a refusal prints nothing else
    if profile.saved is None:  # a saved profile's own shapes and threads hold
        before_work(say, view, profile, request, phases, on_cluster=on_cluster)
    return profile, phases


def measure(
    view: ModelView, profile: ProfileOptions, shapes: tuple[PhaseShape, ...], say: Listener
) -> tuple[Profile, dict[Phase, Profile]]:
    """The profile a plan is made from, and a decoder's at each of its phases (``shapes``): the
    generation step's, else the prompt's, else the model's own."""
    phases = phase_profiles(view, profile, shapes, progress=say.progress) if shapes else {}
    prof = phases.get(Phase.DECODE) or phases.get(Phase.PREFILL)
    return prof or get_profile(view, profile, progress=say.progress), phases


def decoder_phases(
    view: ModelView, request: PlanRequest, options: ProfileOptions, decoder: FoundDecoder | None = None
) -> tuple[PhaseShape, ...]:
    """The phases a decoder is profiled at (none for other models, for a saved profile, which holds one
    shape, and with ``layer_cuts`` off; only decode's for plans off a chain of identical workers, a
    devices file, interleaved workers and the like, which balance one phase); a stage count that cuts
    between layers cannot make, and ``ends="own"`` where it cannot be planned, are refused here, before
    any cost is measured."""
    dec = decoder_of(view, decoder) if request.decoder.layer_cuts else None
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


def note_retries(the_plan: Plan, prof: Profile) -> Plan:
    """The sizes a measured profile finally used after a failed run, in the plan's notes too."""
    retried = tuple(n for n in prof.unattributed if n.startswith(RETRY_NOTE))
    return dataclasses.replace(the_plan, notes=(*the_plan.notes, *retried)) if retried else the_plan


def calibrated_plan(
    view: ModelView,
    prof: Profile,
    request: PlanRequest,
    calibration: CalibrationOptions,
    phases: Mapping[Phase, Profile] | None = None,
    decoder: FoundDecoder | None = None,
) -> Plan:
    """The plan, from the profile corrected by calibration when asked; it records the machine's speed
    as the estimates were made (``reference_seconds``), for a later run to compare its own with.
    ``decoder``: the model's decoder as the door found it, for every plan calibration tries."""

    def make(p: Profile) -> Plan:
        return make_plan(view, p, request, phase_profiles=phases if p is prof else None, decoder=decoder)

    if not calibration.rounds:
        return make(prof)
    if request.devices is not None and calibration.mode != CalibrationMode.RAY:
        # every stage timed on its device, or, for a device not here, as the reference profile was
        # measured with the device's speed kept (:mod:`.calibrate.devices`)
        on_devices = calibrate_on_devices(
            view,
            prof,
            request,
            lambda p, r: make_plan(view, p, r, decoder=decoder),
            rounds=calibration.rounds,
        )
        how = how_timed(request.devices, prof.threads)
        return dataclasses.replace(on_devices.plan, notes=(*on_devices.plan.notes, on_devices.note(how)))
    if not prof.on_reference:
        raise UsageError(
            f"{opt('CalibrationOptions.rounds')} times the stages in onnxruntime, and the profile was "
            f"measured on {prof.runtime}; give {opt('devices')} with devices of that runtime to calibrate "
            "on it"
        )
    mode = CalibrationMode.ALONE if request.interleaved else calibration.mode
    if mode == CalibrationMode.RAY:
        timer, how = cluster_timer(calibration.ray_address, calibration.ray_resources)
    else:
        k = request.stages if isinstance(request.stages, int) else len(make(prof).stages)
        timer, how = choose_timer(mode, k, prof.threads)
    start: dict[Phase | None, Profile] = {None: prof}
    if phases is not None and Phase.PREFILL in phases and Phase.DECODE in phases:  # both, together
        start = {Phase.PREFILL: phases[Phase.PREFILL], Phase.DECODE: phases[Phase.DECODE]}
    key = None if None in start else Phase.DECODE

    def remake(ps: Mapping[Phase | None, Profile]) -> Plan:
        if key is None:
            return make(ps[None])
        named = {phase: p for phase, p in ps.items() if phase is not None}
        return make_plan(view, ps[key], request, phase_profiles=named, decoder=decoder)

    done = calibrate_phases(view, start, remake, rounds=calibration.rounds, timer=timer)
    used = done.profiles[key]
    return dataclasses.replace(
        done.plan, notes=(*done.plan.notes, done.note(how)), reference_seconds=time_model(view, used)
    )


def refuse_untyped_inputs(view: ModelView) -> None:
    """Refuse, before any work, to run a model on random values when an input is a sequence, a map or an
    optional: none can be made for it, and no file of arrays can hold one."""
    others = sorted(non_tensor_inputs(view))
    if others:
        name = others[0]
        raise UsageError(
            f"{view.label}: input {name!r} is {expected_text(view, name)}, which onnxpipe cannot make random "
            "values for and a file of arrays cannot hold; give real inputs from Python "
            f"({opt('ProfileOptions.inputs')}), or plan from static costs without running the model "
            f"({opt('cost', 'static')} and {opt('verify', False)})"
        )
