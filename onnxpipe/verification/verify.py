"""Check that a split folder's chained stages compute what the original model computes.

Both run in onnxruntime (CPU, the default optimization level) on the same seeded random inputs
(:func:`onnxpipe.ir.feeds.random_feeds`) at the shapes the plan was made for (the manifest's
``plan.profiled_input_shapes``, which ``split`` and ``run`` use too), with any ``shapes`` given layered on
top (:func:`planned_input_shapes`), and every model output is compared by
:func:`onnxpipe.verification.compare.compare`.  A mismatch is not an exception: the report says
``ok=False`` and the CLI exits with 1.

``runtime`` checks the split on another runtime: every stage on ``onnxruntime``, ``openvino`` or ``tract``,
or ``devices``: each stage on the runtime of its device in the manifest's cluster (a split made for a
devices file), a chain that may mix runtimes.  The original always runs in onnxruntime on the CPU: it is
the reference every runtime's chain is held to, by the same norm-based tolerance.

The original model is the one the manifest records (its ``source.path``, relative to the folder) unless
``model`` names another copy; either way its sha256 must be the manifest's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.core.choices import Runtime, VerifyRuntime
from onnxpipe.core.errors import ManifestError, UsageError, VerificationError, error_line
from onnxpipe.core.files import file_sha256
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import EngineConfig
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples, load_samples
from onnxpipe.ir.shapes import failure_hint, resolve_input_shapes, symbol_sizes
from onnxpipe.manifest import MANIFEST_NAME, Manifest, load_manifest
from onnxpipe.verification.chain import run_stage_by_stage
from onnxpipe.verification.compare import OutputComparison, compare, merge
from onnxpipe.verification.options import QUANTIZED_OPS, VerifyOptions


@dataclass(frozen=True)
class VerifyReport:
    """Per-output comparisons over ``runs`` random input sets (seeds ``seed .. seed+runs-1``)."""

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

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def tolerance(self) -> str:
        """The tolerance the outputs were held to: one, or each output's by its type (the loosest named)."""
        bound = f"|a-b| <= {self.atol:g} + {self.rtol:g}*max|a|"
        if all((o.rtol, o.atol) == (self.rtol, self.atol) for o in self.outputs):
            return bound
        return f"by each output's type, up to {bound}"

    def summary(self) -> str:
        """Print-friendly lines: one per output, then the verdict."""
        lines = [f"  {o.describe()}" for o in self.outputs]
        if self.stage_runtimes and set(self.stage_runtimes) != {"onnxruntime (CPUExecutionProvider)"}:
            on = ", ".join(f"stage {i} on {r}" for i, r in enumerate(self.stage_runtimes))
            lines.insert(0, f"  stages: {on}; the original on onnxruntime (CPUExecutionProvider)")
        verdict = "match" if self.ok else "DO NOT match"
        lines.append(
            f"verify: {len(self.outputs)} output(s) {verdict} the original over {self.runs} run(s) "
            f"(tolerance: {self.tolerance})"
        )
        return "\n".join(lines)

    def raise_for_mismatch(self) -> None:
        """Raise :class:`VerificationError` naming the first output that does not match."""
        bad = [o for o in self.outputs if not o.ok]
        if bad:
            raise VerificationError(
                f"output {bad[0].describe()}; {len(bad)} of {len(self.outputs)} outputs differ "
                f"(tolerance {self.tolerance})"
            )


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
    view = load_model(model, check=False)
    samples = options.samples
    if samples is None and (options.input_files or options.stacked_files):
        samples = load_samples(view, options.input_files, stacked=options.stacked_files)
    runs = options.runs
    names = [o.name for o in manifest.model_outputs]

    # the original first, then the stages one at a time: never two of them in memory at once
    if samples is not None:
        input_shapes = samples.shapes
        all_feeds: list[Mapping[str, Any]] = list(samples.feeds)
        runs = len(all_feeds)
    else:
        input_shapes = planned_input_shapes(manifest, view, options.shapes)
        all_feeds = [random_feeds(view, input_shapes, seed + r) for r in range(runs)]
    expected = _run_original(model, names, all_feeds, threads, input_shapes, view, samples, manifest)
    merged: dict[str, OutputComparison] = {}
    staged = run_stage_by_stage(d, all_feeds, threads=threads, check_files=False, engines=engines)
    quantized = any(n.op_type in QUANTIZED_OPS for n in view.nodes)
    for actual, want in zip(staged, expected, strict=True):
        for n in names:
            tol = options.tolerance(str(want[n].dtype), quantized=quantized)
            c = compare(n, want[n], _as_array(actual[n]), rtol=tol.rtol, atol=tol.atol)
            merged[n] = merge(merged[n], c) if n in merged else c
    outputs = tuple(merged[n] for n in names)
    return VerifyReport(
        outputs=outputs,
        rtol=max((o.rtol for o in outputs), default=0.0),
        atol=max((o.atol for o in outputs), default=0.0),
        seed=seed,
        runs=runs,
        input_shapes=input_shapes,
        model_path=model,
        stage_runtimes=tuple(e.label for e in engines) if engines is not None else (),
        input_files=tuple(r.file for r in samples.records) if samples is not None else (),
    )


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
    names: Sequence[str],
    all_feeds: Sequence[Mapping[str, Any]],
    threads: int,
    input_shapes: Mapping[str, tuple[int, ...]],
    view: ModelView,
    given: Samples | None,
    manifest: Manifest,
) -> list[dict[str, np.ndarray]]:
    session = open_session(model, session_options(threads=threads))
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
            shown = ", ".join(f"{n}={list(v)}" for n, v in input_shapes.items())
            used = manifest.plan.profiled_inputs
            hint = (
                "the split was made on "
                + ", ".join(r.file for r in used)
                + ": give "
                + " ".join(opt("input_files", r.file) for r in used)
                + " again"
                if used
                else failure_hint(view, input_shapes)
            )
            raise UsageError(
                f"{model}: the model itself fails on random inputs of shapes {shown} "
                f"({error_line(e)}); {hint}"
            ) from e
        results.append({n: _as_array(v) for n, v in zip(names, values, strict=True)})
    return results


def _as_array(value: object) -> np.ndarray:
    """A tensor as is; a sequence (of maps, of tensors of unequal shapes) as a 1-D object array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list):
        try:
            stacked = np.asarray(value)
            if stacked.dtype != object:
                return stacked
        except ValueError:
            pass
        out = np.empty(len(value), dtype=object)
        for i, v in enumerate(value):
            out[i] = v
        return out
    return np.asarray(value)


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
    p = directory / manifest.source.path  # an absolute recorded path stays absolute
    if not p.is_file():
        raise UsageError(
            f"{p}: the source model recorded in {directory / MANIFEST_NAME} is not there; "
            f"pass its path with {opt('model')}"
        )
    return p
