"""``split``: load, profile (or reuse a profile), partition optimally, export the stages, verify them.

The request is checked once before anything is measured: the options when they were made, here the
output folder, the model's opsets, the stage count, a GenAI config that cannot serve.  Then the steps
run in order, each told to the listener as it begins, so that no step of a long split is silent.

``split --stages auto`` on this machine: the chosen split run briefly against the whole model, and one
stage when the pipeline does not pay here.

``auto`` chooses the stage count from the estimates: the slowest stage over 1..CPUs stages.  The
estimates leave out what a pipeline adds per micro-batch (a hand-off between workers, a session call per
stage, the workers sharing the CPUs with the driver): on a small machine and a small model that is more
than the split saves, and ``run --compare`` then said the pipeline was slower than one session of the
whole model (0.66x for the sample ResNet on 2 CPUs, right after ``auto`` had chosen 2 stages).  So when
``auto`` chooses more than one stage here, the split is written to a temporary folder and run as ``run``
runs it, beside one session of the whole model (one thread, the baseline ``run --compare`` names
``session_1_thread``); when the pipeline's throughput is below that session's, the plan of one stage is
taken instead, and a note says why in one line.  The measurement is one function
(:func:`measure_gain`), which tests replace.

``verify``: the chained stages of a split folder against the model, the result recorded in the folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import timeit
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from onnxpipe.api.options import SplitOptions
from onnxpipe.api.paths import check_output_folder
from onnxpipe.api.plans import calibrated_plan, load, measure, note_retries, save_profile, start
from onnxpipe.api.preamble import busy_watch
from onnxpipe.api.results import SplitResult
from onnxpipe.api.seq2seq import split_folder
from onnxpipe.core.choices import CalibrationMode, Phase, SplitNodes, VerifyRuntime
from onnxpipe.core.dims import dims_text
from onnxpipe.core.errors import ExportError, OnnxpipeError, UsageError, VerificationError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.model_config import SourceConfig, read_source_config
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import runs_here
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import CostSource, Profile
from onnxpipe.cost.runnable import runnable_shapes
from onnxpipe.export.checks import check_exportable
from onnxpipe.export.genai import Unsupported, check_source_fits, model_facts
from onnxpipe.export.options import ExportOptions
from onnxpipe.export.outdir import check_target, normalized
from onnxpipe.export.stages import write_stages
from onnxpipe.ir.decoder import FoundDecoder, decoder_of
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.ir.static import static_view, unsettled
from onnxpipe.manifest import MANIFEST_NAME, Manifest
from onnxpipe.planning.planner import planned
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan
from onnxpipe.runtime.inputs import input_shapes_for, random_inputs
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.verification.options import VerifyOptions
from onnxpipe.verification.verify import VerifyReport, record_verification, verify_folder


def split(
    model: str | Path | ModelView, options: SplitOptions, *, listener: Listener | None = None
) -> SplitResult:
    """Split ``model`` (a file, or a model already loaded) as ``options`` say, into ``options.out``.

    Everything that can be refused without costs (the output folder, the model's opsets, the request, a
    GenAI config) is refused before profiling.  The folder is written whole or not at all; its manifest
    records the verification's result (``unverified`` with ``verify=False``): the stages are verified
    before their folder replaces ``options.out``, so that an earlier split there stays as it was until
    the new one is verified, and a Ctrl-C that stops the export or the verification says so.
    """
    say = listener or SILENT
    opts = options
    out_dir = normalized(opts.out).absolute()  # verification must find the folder even if "." is replaced
    model_path = None if isinstance(model, ModelView) else Path(model).absolute()
    if model_path is not None and model_path.is_dir():  # an encoder-decoder's folder: its own door
        return split_folder(model_path, dataclasses.replace(opts, out=out_dir), say, split)
    if model_path is not None:
        check_target(out_dir, force=opts.export.force, protected=(model_path, model_path.parent))
    check_output_folder(out_dir)
    genai = None if opts.export.genai_config is None else read_source_config(opts.export.genai_config)
    view = load(model, opts.embedding)
    found = FoundDecoder.of(view)  # once for the request: its checks, its phases, each plan, the export
    check_exportable(view, out_dir, force=opts.export.force)
    if genai is not None:
        check_genai_request(view, opts.plan, genai, out_dir, found)
    request = opts.plan
    on_cluster = opts.calibration.mode == CalibrationMode.RAY
    profile_options, phase_shapes = start(
        view, request, opts.profile, say, runs_model=opts.verify, decoder=found, on_cluster=on_cluster
    )
    view, profile_options, retried = _sized(view, opts, profile_options, bool(phase_shapes))
    if view is not found.view:  # frozen at its sizes: another graph
        found = FoundDecoder.of(view)
    if profile_options.measured:
        say.step("profiling")
    step = "profiling and calibration" if opts.calibration.rounds else "profiling"
    with busy_watch(say, step, measuring=profile_options.measured or opts.calibration.rounds > 0):
        prof, phases = measure(view, profile_options, phase_shapes, say)
        say.step("planning, calibrating" if opts.calibration.rounds else "planning")
        view, the_plan = _plan_of(view, prof, opts, phases, found)
    save_profile(prof, profile_options)
    the_plan = _noted(note_retries(the_plan, prof), retried, view if opts.static else None)
    say.step(f"exporting {the_plan.k} stages")
    samples = prof.samples
    first = samples.first if samples is not None else None
    checks = VerifyOptions(
        shapes={} if samples is not None else profile_options.shapes,
        samples=samples,
        runtime=_verify_runtime(the_plan),
        rtol=opts.rtol,
        atol=opts.atol,
    )
    verified = _Verified(checks, say, out_dir, Path(opts.out))
    with verified.interrupts():
        manifest = write_stages(
            view,
            the_plan,
            out_dir,
            opts.export,
            feeds=first,
            genai_source=genai,
            then=verified if opts.verify else None,
            decoder=found,
        )
    return SplitResult(plan=the_plan, manifest=manifest, out_dir=out_dir, report=verified.report)


def _plan_of(
    view: ModelView, prof: Profile, opts: SplitOptions, phases: Mapping[Phase, Profile], found: FoundDecoder
) -> tuple[ModelView, Plan]:
    """The plan to export, and the view it cuts (another one where a node is split into parts).

    A plan of several stages on identical workers is run briefly beside one session of the whole model
    (:func:`paid_here`), and one stage is kept where the pipeline does not pay on this machine.
    """
    request = opts.plan
    if request.split_nodes == SplitNodes.AUTO:
        cut = planned(view, prof, request, decoder=found)  # the stages name the cut node's parts: export it
        return cut.view, cut.plan
    the_plan = calibrated_plan(view, prof, request, opts.calibration, phases, found)

    def one_stage() -> Plan:  # asked for by stages="auto" only: one stage is a request of its own then
        whole = dataclasses.replace(request, stages=1)
        return calibrated_plan(view, prof, whole, opts.calibration, phases, found)

    return view, paid_here(view, the_plan, prof, request, one_stage)


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
        named = "; ".join(
            f"stage {i} emits {name} {dims_text(dims, 'of unknown rank', symbols=False)}"
            for i, name, dims in open_dims
        )
        notes.append(
            f"{len(open_dims)} stage output(s) of the static split keep dims that the frozen input sizes do "
            f"not settle: {named} (their sizes follow data, as a NonZero's count or an If on a value "
            "does, which no freezing fixes)"
        )
    return dataclasses.replace(the_plan, notes=(*the_plan.notes, *notes)) if notes else the_plan


class _Verified:
    """The verification of a split, run on its complete folder before that replaces ``out`` (the
    ``then`` of :func:`~onnxpipe.export.stages.write_stages`), its result recorded in the manifest: an
    earlier split in ``out`` stays as it was until the new one is verified, and a Ctrl-C during the
    export or the verification says so."""

    def __init__(self, checks: VerifyOptions, say: Listener, out: Path, shown: Path) -> None:
        self.checks = checks
        self.say = say
        self.out = shown
        """The output folder as the user named it."""
        self.earlier = out.is_dir() and any(out.iterdir())
        self.started = False
        self.report: VerifyReport | None = None

    def __call__(self, folder: Path, manifest: Manifest) -> Manifest:
        self.say.step("verifying")
        self.started = True
        try:
            report = verify_folder(folder, self.checks)
        except OnnxpipeError as e:  # named as the folder it was about to become, not the temporary one
            raise type(e)(str(e).replace(str(folder), str(self.out))) from e
        if not report.ok and report.boundary_dtype != "float32":  # refused: nothing replaces ``out``
            worst = max((o for o in report.outputs if not o.ok), key=lambda o: o.max_rel_diff)
            raise VerificationError(
                f"{self.out}: {report.boundary_dtype} boundaries move output {worst.name!r} by "
                f"{worst.max_abs_diff:.3g}, beyond their tolerance ({report.tolerance}); choose a wider "
                f"{opt('boundary_dtype')} (float16 or float32)"
            )
        try:
            record_verification(folder, report)
        except OSError as e:
            raise ExportError(
                f"{self.out}: the verification's result cannot be written into its manifest ({e}); "
                f"{self.left}"
            ) from e
        self.report = report
        return dataclasses.replace(manifest, verification=report.record())

    @contextlib.contextmanager
    def interrupts(self) -> Iterator[None]:
        """A Ctrl-C while the stages are written or verified, saying what it leaves: the earlier split
        unchanged, or no folder."""
        try:
            yield
        except KeyboardInterrupt as e:
            if self.report is not None:
                raise
            when = "during verification" if self.started else "while the stages were written"
            raise KeyboardInterrupt(f"{when}: {self.left}") from e

    @property
    def left(self) -> str:
        """What a split stopped before its folder replaced ``out`` leaves there."""
        if self.earlier:
            return f"the earlier split in {self.out} is unchanged"
        return f"nothing was written to {self.out}"


def check_genai_request(
    view: ModelView, request: PlanRequest, source: SourceConfig, out_dir: Path, found: FoundDecoder
) -> None:
    """Refuse, before any cost is measured, a GenAI config that cannot serve: a model that is no decoder,
    a split that may cut inside a layer, a model or devices ONNX Runtime GenAI cannot run, a config of
    another model, or one inside the folder ``force`` would replace."""
    where = source.path
    dec = decoder_of(view, found)
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
        refused = [d for d in request.devices.devices if not d.engine.kind.genai]
        if refused:
            raise UsageError(
                f"{where}: device {refused[0].name!r} runs {refused[0].engine.runtime}, which ONNX Runtime "
                "GenAI cannot run; "
                f"leave out {opt('genai_config')} or that device"
            )
    if out_dir.exists() and source.path.absolute().resolve().is_relative_to(out_dir.resolve()):
        raise ExportError(
            f"{out_dir}: holds {source.path.name} ({opt('genai_config')}), which the split would replace; "
            f"choose another {opt('out')} or move the config"
        )


def _verify_runtime(the_plan: Plan) -> VerifyRuntime | None:
    """``devices`` when a stage's device names another runtime than onnxruntime and every stage's runtime
    is here: the split is then verified as it will run; else None (onnxruntime on the CPU)."""
    if the_plan.cluster is None:
        return None
    by_name = {d.name: d for d in the_plan.cluster.devices}
    used = [by_name[s.device] for s in the_plan.stages if s.device in by_name]
    if all(d.engine.kind.reference for d in used) or not all(runs_here(d.engine) for d in used):
        return None
    return VerifyRuntime.DEVICES


TRIAL_MICROBATCHES = 32
"""Micro-batches of one round of the short run, as many as ``run`` measures by default."""
TRIAL_ROUNDS = 3


def measure_gain(view: ModelView, plan: Plan) -> float:
    """The pipeline's throughput over one session's of the whole model (one thread), on the same random
    micro-batches at the planned shapes: ``plan`` written to a temporary folder and run as ``run`` runs
    it by default (thread workers: no process is started, so a caller's script needs no ``__main__``
    guard); each side's best of :data:`TRIAL_ROUNDS` rounds of :data:`TRIAL_MICROBATCHES`."""
    assert view.path is not None
    with tempfile.TemporaryDirectory(prefix="onnxpipe-auto-") as tmp:
        out = Path(tmp) / "stages"
        manifest = write_stages(view, plan, out, ExportOptions())
        feeds = random_inputs(view.path, input_shapes_for(manifest, view.path, {}), TRIAL_MICROBATCHES)
        session = open_session(view.path, session_options(threads=1))
        with Pipeline.from_manifest(out) as pipe:
            pipe.run_many(feeds[:4])  # warm-up
            piped = min(timeit.repeat(lambda: pipe.run_many(feeds), number=1, repeat=TRIAL_ROUNDS))
        session.run(None, feeds[0])
        whole = min(
            timeit.repeat(lambda: [session.run(None, f) for f in feeds], number=1, repeat=TRIAL_ROUNDS)
        )
    return whole / piped if piped > 0 else 1.0


def paid_here(
    view: ModelView,
    the_plan: Plan,
    profile: Profile,
    request: PlanRequest,
    one_stage: Callable[[], Plan],
    gain: Callable[[ModelView, Plan], float] | None = None,
) -> Plan:
    """``the_plan`` when ``auto`` chose one stage, or when its pipeline beats one session of the whole
    model in a short run here (``gain``, default :func:`measure_gain`); else ``one_stage()``, with a note
    that says why.  Only for ``auto`` on this machine (no devices file), on measured costs of a model file
    with no node cut (a static profile says nothing of this machine's speed)."""
    applies = (
        request.stages == "auto"
        and request.devices is None
        and the_plan.k > 1
        and not the_plan.node_splits
        and profile.source == CostSource.PROFILE.value
        and view.path is not None
    )
    if not applies:
        return the_plan
    try:
        ratio = (gain or measure_gain)(view, the_plan)
    except (OnnxpipeError, OSError, RuntimeError) as e:  # random inputs a model refuses, a full disk...
        note = f"{opt('stages', 'auto')}: the split could not be run against the whole model here ({e})"
        return dataclasses.replace(the_plan, notes=(*the_plan.notes, note))
    measured = (
        f"a short run of the {the_plan.k}-stage pipeline here gave {ratio:.2f}x the throughput of one "
        "session of the whole model (one thread)"
    )
    if ratio >= 1.0:
        return dataclasses.replace(the_plan, notes=(*the_plan.notes, f"{opt('stages', 'auto')}: {measured}"))
    whole = one_stage()
    note = (
        f"{opt('stages', 'auto')} chose 1 stage: {measured}; on this machine the hand-offs between stages "
        f"cost more than the split saves (give {opt('stages')} K to split anyway)"
    )
    return dataclasses.replace(
        whole, notes=(*whole.notes, note), stage_counts_tried=the_plan.stage_counts_tried
    )


def verify(folder: str | Path, options: VerifyOptions | None = None) -> VerifyReport:
    """Run the original model and the chained stages of ``folder`` on the same inputs and compare them.

    With ``options.runtime`` running every stage on one other runtime, the whole model runs there too,
    and :attr:`VerifyReport.on_runtime` holds the stages against it and it against onnxruntime: an output
    passes when its stages match either, and :attr:`VerifyReport.notes` give the runtime's own
    difference.  A mismatch is not an exception: :attr:`VerifyReport.ok` says it.  With
    ``options.record`` (the default) the result is written into the folder's manifest; a folder that
    cannot be written keeps what it said, and :attr:`VerifyReport.record_note` says why.
    """
    opts = options or VerifyOptions()
    report = verify_folder(folder, opts)
    if not opts.record:
        return report
    try:
        record_verification(folder, report)
    except OSError as e:
        note = (
            f"{folder}: the result could not be written into its manifest ({e.strerror or e}); "
            "the folder still reads as it did"
        )
        return dataclasses.replace(report, record_note=note)
    return dataclasses.replace(report, recorded_in=Path(folder) / MANIFEST_NAME)
