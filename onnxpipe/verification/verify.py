"""Check that a split folder's chained stages compute what the original model computes.

Both run in onnxruntime (CPU, the default optimization level) on the same seeded random inputs
(:func:`onnxpipe.ir.feeds.random_feeds`) at the shapes the plan was made for (the manifest's
``plan.profiled_input_shapes``, which ``split`` and ``run`` use too), with any ``shapes`` given layered on
top (:func:`planned_input_shapes`), and every model output is compared by
:func:`onnxpipe.verification.compare.compare`.  A mismatch is not an exception: the report says
``ok=False`` and the CLI exits with 1.

``runtime`` runs the stages elsewhere (:class:`~onnxpipe.verification.options.VerifyOptions`); the
original always runs in onnxruntime on the CPU, the reference every chain is held to by the same
norm-based tolerance, and on the stages' runtime too where they share one (:class:`OnRuntime`).

The original model is the one the manifest records (its ``source.path``, relative to the folder) unless
``model`` names another copy; either way its sha256 must be the manifest's.

The result is written into the split folder's manifest (``verification``, :func:`record_verification`).
A folder that looks complete but was never compared with the model is the worst kind of wrong: ``split``
verifies its stages in the temporary folder it writes them to and records the result there before that
folder replaces the output folder, so that only a folder never verified (``--no-verify``) is marked
unverified and an interrupted verification (Ctrl-C) replaces nothing; ``onnxpipe verify`` records its
own result the same way, which completes such a folder without ``--force``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.core.choices import Runtime, VerifyRuntime
from onnxpipe.core.errors import ManifestError, UsageError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import EngineConfig, open_engine
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.joined import runnable_file
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples, load_samples
from onnxpipe.ir.shapes import failure_hint, resolve_input_shapes, symbol_sizes
from onnxpipe.manifest import MANIFEST_NAME, Manifest, VerificationRecord, load_manifest, write_manifest
from onnxpipe.verification.chain import run_stage_by_stage
from onnxpipe.verification.compare import OutputComparison, compare, merge
from onnxpipe.verification.options import (
    BY_BOUNDARY,
    QUANTIZED_OPS,
    Tolerance,
    VerifyOptions,
    loosest_boundary,
)

REFERENCE = EngineConfig()
"""What the original runs on, the reference every chain is held to: onnxruntime on the CPU."""


@dataclass(frozen=True)
class OnRuntime:
    """The whole model run on ``label``, the one runtime every stage ran on, and what it compared to.

    Why: a runtime may differ from onnxruntime on the whole model already (OpenVINO's cubic resize with
    ``exclude_outside``), and then its stages differ too, which says nothing about the split; so an
    output also passes when its stages match the whole model on their runtime (a note names the
    runtime's own difference).  ``stages[i]`` and ``whole[i]`` are of the report's ``outputs[i]``; both
    are empty when the whole model did not run there (``not_run`` says why).
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


@dataclass(frozen=True)
class VerifyReport:
    """Per-output comparisons over ``runs`` random input sets (seeds ``seed .. seed+runs-1``).

    ``outputs``: the chained stages against the original in onnxruntime on the CPU.  ``on_runtime``:
    where every stage ran on one other runtime, the whole model run there too and the comparisons with
    it; an output passes when its stages match either (:attr:`ok`).
    """

    outputs: tuple[OutputComparison, ...]
    rtol: float
    atol: float
    seed: int
    runs: int
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    model_path: Path | None = None
    stage_runtimes: tuple[str, ...] = ()
    """What ran each stage (``onnxruntime (CPUExecutionProvider)``, ``openvino (CPU)``, ``tract``)."""
    input_files: tuple[str, ...] = ()
    """The files of the user's inputs the chain ran on; none: seeded random values."""
    recorded_in: Path | None = None
    """The manifest the result was written into (:func:`onnxpipe.verify`), if it was."""
    record_note: str | None = None
    """Why the result could not be written into the folder's manifest, if it could not."""
    on_runtime: OnRuntime | None = None
    """The whole model on the stages' one runtime, where that is not onnxruntime on the CPU."""
    computes_in: str | None = None
    """The float type most of the model's arithmetic is in, where it is narrower than its float outputs'
    (a float16 model with float32 inputs and outputs): those outputs were held to its tolerance."""
    boundary_dtype: str = "float32"
    """The narrowest type the split's boundaries cross in (``boundary_dtype``): float outputs were held to
    its tolerance (:data:`~onnxpipe.verification.options.BY_BOUNDARY`) where looser."""

    def passes(self, i: int) -> bool:
        """Whether output ``i`` passes: its stages match onnxruntime, or the whole model on the runtime
        they ran on (:class:`OnRuntime`)."""
        on = self.on_runtime
        return self.outputs[i].ok or (on is not None and on.ran and on.stages[i].ok)

    @property
    def ok(self) -> bool:
        """Every output's stages match the original, or the whole model on the runtime they ran on."""
        return all(self.passes(i) for i in range(len(self.outputs)))

    @property
    def notes(self) -> list[str]:
        """What the verdict leaves out: why float outputs were held to a narrower type's tolerance, and a
        runtime's own difference from onnxruntime (which the split does not add to), with its size, or
        why the whole model was not run on it."""
        own: list[str] = []
        if self.computes_in is not None:
            own.append(
                f"the model computes in {self.computes_in} (its float inputs and outputs are cast): its "
                f"float outputs are held to {self.computes_in}'s tolerance"
            )
        if self.boundary_dtype in BY_BOUNDARY:
            bound = BY_BOUNDARY[self.boundary_dtype].describe()
            own.append(f"boundaries cross as {self.boundary_dtype}: float outputs are held to {bound}")
        on = self.on_runtime
        if on is not None and not on.ran:
            own.append(
                f"the whole model does not run on {on.label} ({on.not_run}): the stages were held to "
                "onnxruntime alone"
            )
        elif on is not None:
            apart = [
                w for o, s, w in zip(self.outputs, on.stages, on.whole, strict=True) if not o.ok and s.ok
            ]
            sizes = ", ".join(
                f"{w.name} by max abs diff {w.max_abs_diff:.3g} (max rel diff {w.max_rel_diff:.3g})"
                for w in apart
            )
            if apart:
                own.append(
                    f"{on.label} differs from onnxruntime by itself: the whole model on it gives {sizes}; "
                    "the stages on it match the whole model there, so the split adds nothing to that "
                    "difference"
                )
        return own

    @property
    def stages_line(self) -> str | None:
        """``stages: stage 0 on openvino (CPU), ...; the original on ...``, where a stage ran elsewhere
        than onnxruntime on the CPU."""
        if not self.stage_runtimes or set(self.stage_runtimes) == {REFERENCE.label}:
            return None
        on = ", ".join(f"stage {i} on {r}" for i, r in enumerate(self.stage_runtimes))
        whole = self.on_runtime
        also = f" and on {whole.label}" if whole is not None and whole.ran else ""
        return f"stages: {on}; the original on {REFERENCE.label}{also}"

    @property
    def tolerance(self) -> str:
        """The tolerance the outputs were held to: one, or each output's by its type (the loosest named)."""
        bound = Tolerance(self.rtol, self.atol).describe()
        if all((o.rtol, o.atol) == (self.rtol, self.atol) for o in self.outputs):
            return bound
        return f"by each output's type, up to {bound}"

    def output_line(self, i: int, own: str = "") -> str:
        """Output ``i``'s verdict and differences from onnxruntime; where these fail and the whole model
        ran on the stages' runtime, each of the three comparisons (``own``: its tolerance, where outputs
        differ in it)."""
        reference, on = self.outputs[i], self.on_runtime
        status = "ok" if self.passes(i) else "MISMATCH"
        if on is None or not on.ran or reference.ok:
            return f"{reference.name}: {status} ({reference.diffs}{own})"
        return (
            f"{reference.name}: {status} (stages against the whole model, both on {on.label}: "
            f"{on.stages[i].diffs}; stages against onnxruntime: {reference.diffs}; the whole model on "
            f"{on.label} against onnxruntime: {on.whole[i].diffs}{own})"
        )

    @property
    def verdict(self) -> str:
        """``1 output(s) match the original``, or what they match or do not."""
        n, on = len(self.outputs), self.on_runtime
        if all(o.ok for o in self.outputs):
            return f"{n} output(s) match the original"
        if on is None or not on.ran:
            return f"{n} output(s) DO NOT match the original"
        if self.ok:
            return (
                f"{n} output(s) match the whole model on {on.label}, which differs from onnxruntime by itself"
            )
        return f"{n} output(s) DO NOT match the original, nor the whole model on {on.label}"

    def record(self) -> VerificationRecord:
        """The manifest's record of this result: passed or failed, and how."""
        return VerificationRecord(
            status="passed" if self.ok else "failed",
            rtol=self.rtol,
            atol=self.atol,
            seed=self.seed,
            runs=self.runs,
            input_shapes={k: tuple(int(d) for d in v) for k, v in self.input_shapes.items()},
        )

    def summary(self) -> str:
        """Print-friendly lines: what ran where, one line per output, the verdict, then any notes."""
        head = [f"  {self.stages_line}"] if self.stages_line is not None else []
        lines = [*head, *(f"  {self.output_line(i)}" for i in range(len(self.outputs)))]
        lines.append(f"verify: {self.verdict} over {self.runs} run(s) (tolerance: {self.tolerance})")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def record_verification(directory: str | Path, report: VerifyReport) -> None:
    """Write ``report``'s result into ``directory``'s manifest (atomically).  Raises ``OSError`` when the
    folder cannot be written; the caller says what that means for it."""
    d = Path(directory)
    manifest = load_manifest(d, check_files=False)
    write_manifest(d / MANIFEST_NAME, replace(manifest, verification=report.record()))


def verify_folder(out_dir: str | Path, options: VerifyOptions) -> VerifyReport:
    """Run the original model and the chained stages of ``out_dir`` on the same inputs and compare, as
    ``options`` say (:class:`~onnxpipe.verification.options.VerifyOptions`; see the module docstring).

    Raises :class:`ManifestError` for a bad manifest, changed stage files, or a model whose sha256 is
    not the manifest's source; never for a mismatch (see :attr:`VerifyReport.ok`).
    """
    d = Path(out_dir)
    manifest = load_manifest(d, check_files=True)
    threads, seed = options.threads, options.seed
    engines = stage_engines(manifest, options.runtime, threads)
    model = source_model_path(d, manifest, options.model)
    sha = file_sha256(model)
    if sha != manifest.source.sha256:
        raise ManifestError(
            f"{model}: sha256 {sha} is not the source sha256 {manifest.source.sha256} recorded in "
            f"{d / MANIFEST_NAME}; pass the model that was split ({opt('model')}) or split it again"
        )
    view = load_model(model, check=False, embedding=source_embedding(d, manifest))
    samples = options.samples
    if samples is None and (options.input_files or options.stacked_files):
        samples = load_samples(view, options.input_files, stacked=options.stacked_files)
    names = [o.name for o in manifest.model_outputs]

    # the original first, then the stages one at a time: never two of them in memory at once
    if samples is not None:
        input_shapes = samples.shapes
        all_feeds: list[Mapping[str, Any]] = list(samples.feeds)
    else:
        input_shapes = planned_input_shapes(manifest, view, options.shapes)
        all_feeds = [random_feeds(view, input_shapes, seed + r) for r in range(options.runs)]
    fails = partial(_random_failure, manifest, view, input_shapes, options.shapes)
    expected = _run_original(model, view, names, all_feeds, threads, samples, fails)
    one = one_runtime(engines)
    whole = _run_whole(model, names, all_feeds, one) if one is not None else None
    staged = run_stage_by_stage(d, all_feeds, threads=threads, check_files=False, engines=engines)
    quantized = any(n.op_type in QUANTIZED_OPS for n in view.nodes)
    computes_in = narrower_compute_type(view)
    boundary = loosest_boundary(st.boundary_dtype for st in manifest.stages)

    def tolerance(dtype: str) -> Tolerance:
        return options.tolerance(dtype, quantized=quantized, computes_in=computes_in, boundary=boundary)

    outputs = compare_all(names, expected, staged, tolerance)
    on_runtime = None
    if one is not None and isinstance(whole, str):
        on_runtime = OnRuntime(one.label, not_run=whole)
    elif one is not None and isinstance(whole, list):
        on_runtime = OnRuntime(
            one.label,
            stages=compare_all(names, whole, staged, tolerance),
            whole=compare_all(names, expected, whole, tolerance),
        )
    return VerifyReport(
        outputs=outputs,
        rtol=max((o.rtol for o in outputs), default=0.0),
        atol=max((o.atol for o in outputs), default=0.0),
        seed=seed,
        runs=len(all_feeds),
        input_shapes=input_shapes,
        model_path=model,
        stage_runtimes=tuple(e.label for e in engines) if engines is not None else (),
        input_files=tuple(r.file for r in samples.records) if samples is not None else (),
        on_runtime=on_runtime,
        computes_in=computes_in,
        boundary_dtype=boundary,
    )


_NARROW_FLOATS = ("float16", "bfloat16")


def narrower_compute_type(view: ModelView) -> str | None:
    """``float16`` or ``bfloat16`` where most float tensors the model's compute nodes write are of that
    type while some float output is wider (the outputs cast back, as onnxruntime's float16 converter
    does with ``keep_io_types``); else None (the outputs' own types tell the tolerance)."""
    outputs = {view.tensors[o].dtype for o in view.outputs if o in view.tensors}
    if not outputs & {"float32", "float64"}:
        return None
    written = (view.tensors[o].dtype for n in view.compute_nodes for o in n.outputs if o in view.tensors)
    counts = Counter(d for d in written if d.startswith(("float", "bfloat")))
    most = counts.most_common(1)[0][0] if counts else None
    return most if most in _NARROW_FLOATS else None


def compare_all(
    names: Sequence[str],
    expected: Sequence[Mapping[str, Any]],
    actual: Sequence[Mapping[str, Any]],
    tolerance: Callable[[str], Tolerance],
) -> tuple[OutputComparison, ...]:
    """Each output of ``names`` compared over every run, the worst run kept (``tolerance``: by the
    expected output's dtype)."""
    merged: dict[str, OutputComparison] = {}
    for want, got in zip(expected, actual, strict=True):
        for n in names:
            a = _as_array(want[n])
            tol = tolerance(str(a.dtype))
            c = compare(n, a, _as_array(got[n]), rtol=tol.rtol, atol=tol.atol)
            merged[n] = merge(merged[n], c) if n in merged else c
    return tuple(merged[n] for n in names)


def one_runtime(engines: Sequence[EngineConfig] | None) -> EngineConfig | None:
    """The one engine every stage runs on, where that is not the reference (onnxruntime on the CPU):
    the whole model runs there too.  None for the reference, or a chain that mixes runtimes."""
    if not engines or len(set(engines)) != 1 or engines[0].label == REFERENCE.label:
        return None
    return engines[0]


def _run_whole(
    model: Path, names: Sequence[str], all_feeds: Sequence[Mapping[str, Any]], config: EngineConfig
) -> list[dict[str, Any]] | str:
    """The original's outputs on ``config``'s runtime for every feed set, or why it does not run there
    (a runtime that cannot run the whole model may still run every stage)."""
    try:
        engine = open_engine(model, config)
        try:
            return [dict(zip(names, engine.run(names, dict(f)), strict=True)) for f in all_feeds]
        finally:
            engine.close()
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - the runtime's own refusal, of any type
        return error_line(e)


def stage_engines(
    manifest: Manifest, runtime: VerifyRuntime | None, threads: int
) -> list[EngineConfig] | None:
    """Each stage's engine for ``runtime`` (see :func:`verify_folder`); None: onnxruntime on the CPU."""
    if runtime is None:
        return None
    if runtime == VerifyRuntime.DEVICES:
        if manifest.cluster is None:
            raise UsageError(
                f"{opt('runtime', VerifyRuntime.DEVICES)}: {manifest.k} stages were split without "
                f"{opt('devices')}, so the manifest names no runtime per stage; give one runtime "
                f"({opt('runtime', VerifyRuntime.OPENVINO)}) or split with {opt('devices')}"
            )
        by_name = {dev.name: dev for dev in manifest.cluster.devices}
        return [by_name[st.device].engine_config(threads) for st in manifest.stages]
    return [EngineConfig(runtime=Runtime(runtime.value), threads=threads)] * manifest.k


def planned_input_shapes(
    manifest: Manifest, view: ModelView, overrides: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """The shapes the plan was made for (``plan.profiled_input_shapes``), with ``overrides`` on top.

    A size an override gives a symbolic dim (``batch``, ``seq``) reaches every other input that names
    it, so the inputs stay consistent; an input the manifest records no shape for gets the defaults of
    :func:`onnxpipe.ir.shapes.resolve_input_shapes`.  ``view`` is the source model.
    """
    given = {n: tuple(int(d) for d in v) for n, v in (overrides or {}).items()}
    inputs = set(view.inputs)
    symbols = symbol_sizes(view, {n: v for n, v in given.items() if n in inputs})
    merged = dict(given)
    for name, dims in manifest.plan.profiled_input_shapes.items():
        if name in given or name not in inputs:
            continue
        planned = tuple(int(d) for d in dims)
        declared = view.tensor(name).shape
        if declared is not None and len(declared) == len(planned):
            planned = tuple(
                symbols.get(d, v) if isinstance(d, str) else v for d, v in zip(declared, planned, strict=True)
            )
        merged[name] = planned
    return resolve_input_shapes(view, merged)


def _run_original(
    model: Path,
    view: ModelView,
    names: Sequence[str],
    all_feeds: Sequence[Mapping[str, Any]],
    threads: int,
    given: Samples | None,
    fails: Callable[[str], str],
) -> list[dict[str, np.ndarray]]:
    """The original's outputs for every feed set, in onnxruntime on the CPU; a failure on the user's
    inputs (``given``) says so, one on random inputs says ``fails(why)``: at what shapes, why, and what
    to give.  ``view`` is ``model`` loaded: a merged decoder runs as its unwrapped with-past graph."""
    source = view.session_source() or model
    external = view.base_dir if isinstance(source, bytes) else None
    session = open_session(source, session_options(threads=threads, external_dir=external))
    results: list[dict[str, np.ndarray]] = []
    for feeds in all_feeds:
        try:
            values = session.run(list(names), dict(feeds))
        except Exception as e:
            if given is not None:
                raise UsageError(
                    f"{model}: the model itself fails on the given inputs {given.describe()} "
                    f"({error_line(e)}); give inputs it runs on"
                ) from e
            raise UsageError(
                f"{model}: the model itself fails on random inputs {fails(error_line(e))}"
            ) from e
        results.append({n: _as_array(v) for n, v in zip(names, values, strict=True)})
    return results


def _random_failure(
    manifest: Manifest,
    view: ModelView,
    input_shapes: Mapping[str, tuple[int, ...]],
    overrides: Mapping[str, Sequence[int]],
    why: str,
) -> str:
    """What a failure of the original on random inputs (``why``) says after its shapes: the split's own
    input files to give again, or the sizes chosen at the split (not the ones given to verify,
    ``overrides``) and the inputs only real values set (:func:`~onnxpipe.ir.shapes.failure_hint`)."""
    shown = ", ".join(f"{n}={list(v)}" for n, v in input_shapes.items())
    used = manifest.plan.profiled_inputs
    hint = (
        "the split was made on "
        + ", ".join(r.file for r in used)
        + ": give "
        + " ".join(opt("input_files", r.file) for r in used)
        + " again"
        if used
        else failure_hint(view, input_shapes, overrides)
    )
    return f"of shapes {shown} ({why}); {hint}"


def _as_array(value: object) -> np.ndarray:
    """A tensor as is; a sequence (of maps, of tensors of unequal shapes) as a 1-D object array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        with suppress(ValueError):  # a ragged sequence
            stacked = np.asarray(value)
            if stacked.dtype != object:
                return stacked
        return np.fromiter(value, dtype=object, count=len(value))
    return np.asarray(value)


def _recorded(directory: Path, path: str, what: str, otherwise: str) -> Path:
    """The file the manifest in ``directory`` records at ``path`` (relative to it, or absolute), named
    without its ``..`` steps (``stages/../../models/m.onnx`` as ``../models/m.onnx``) as messages name
    it: resolved (a linked folder is followed, not cut away), then relative to the current folder where
    it lies below it.  A file that is not there is a :class:`UsageError` saying ``otherwise``."""
    p = directory / path
    if ".." in p.parts:
        p = p.resolve()
        with suppress(ValueError, OSError):
            p = p.relative_to(Path.cwd().resolve())
    if not p.is_file():
        raise UsageError(f"{p}: the {what} recorded in {directory / MANIFEST_NAME} is not there; {otherwise}")
    return p


def source_model_path(directory: Path, manifest: Manifest, model_path: str | Path | None) -> Path:
    """``model_path`` if given, else the manifest's ``source.path`` resolved against ``directory``."""
    if model_path is not None:
        p = Path(model_path)
        if not p.is_file():
            raise UsageError(f"{p}: no such model file; give the model that was split")
        return p
    if manifest.source.path is None:
        raise UsageError(
            f"{directory / MANIFEST_NAME}: records no path for the source model {manifest.source.file}; "
            f"pass it with {opt('model')}"
        )
    return _recorded(directory, manifest.source.path, "source model", f"pass its path with {opt('model')}")


def source_embedding(directory: Path, manifest: Manifest) -> Path | None:
    """The embedding model the split joined ahead of its source (``source.embedding``), else ``None``."""
    if manifest.source.embedding is None:
        return None
    return _recorded(
        directory, manifest.source.embedding, "embedding model", "put it back, or split the model again"
    )


def runnable_source(directory: Path, manifest: Manifest, model_path: str | Path | None) -> Path:
    """The file a worker running the whole source model opens: the source (``model_path`` if given), its
    merged decoder unwrapped, and joined with the embedding model the split joined ahead of it."""
    path = source_model_path(directory, manifest, model_path)
    return runnable_file(path, source_embedding(directory, manifest))
