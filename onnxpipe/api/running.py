"""``run``: a split folder run as a pipeline and measured, optionally against the model itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from onnxpipe.api.paths import check_output_file, writing
from onnxpipe.api.preamble import threads_warning
from onnxpipe.core.choices import Backend
from onnxpipe.core.errors import ManifestError, RuntimeStageError, UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.ir.joined import runnable_file
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.backends.ray_resources import load_ray_resources
from onnxpipe.runtime.base import BackendConfig, LocalConfig, RayConfig, Tensors
from onnxpipe.runtime.inputs import input_shapes_for, load_inputs, random_inputs
from onnxpipe.runtime.options import (
    DEFAULT_SLOTS,
    MEASURED_MICROBATCHES,
    SINGLE_LATENCY_MICROBATCHES,
    RunOptions,
    WorkerOptions,
)
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.baselines import Feeds, add_baselines, distinct
from onnxpipe.runtime.report.build import build_report
from onnxpipe.runtime.report.measure import Measurement, measure
from onnxpipe.runtime.report.model import RunReport
from onnxpipe.runtime.session import peak_rss_bytes
from onnxpipe.runtime.spec import Placement, manifest_placements, placement_of
from onnxpipe.verification.verify import source_embedding, source_model_path


def run(
    folder: str | Path, options: RunOptions | None = None, *, listener: Listener | None = None
) -> RunReport:
    """Run the split in ``folder`` as a pipeline as ``options`` say, and report what it delivered.

    With ``options.compare`` the report holds the baselines (one session of the whole model, and K
    replicas) and whether the outputs matched (:attr:`RunReport.outputs_match`).  ``options.report`` and
    ``options.outputs`` are written when given; both are refused before any worker starts when they
    cannot be written.
    """
    say = listener or SILENT
    opts = options or RunOptions()
    for path, field in ((opts.report, "report"), (opts.outputs, "outputs")):
        if path is not None:
            check_output_file(path, field)
    directory = Path(folder)
    manifest = load_manifest(directory)  # the stage files are hashed here, once per run
    placements = _placements(opts, manifest)
    source = _source(directory, manifest, opts.model, needed=opts.compare)
    model = runnable_file(*source) if opts.compare and source is not None else None  # built only to compare
    inputs, shapes = _inputs(opts, directory, manifest, source)
    config = backend_config(opts, manifest.k, slots=opts.slots, pin=opts.pin)
    if opts.backend == Backend.LOCAL:  # Ray places its workers elsewhere, maybe on other machines
        _warn_threads(say, placements or manifest_placements(manifest, opts.threads), manifest)
    say.step(f"starting {manifest.k} stage worker(s)")
    with Pipeline.from_manifest(
        directory, config, threads=opts.threads, placements=placements, check_files=False
    ) as pipeline:
        say.step(f"running {len(inputs)} micro-batch(es) after {opts.warmup} warm-up")
        single = min(len(inputs), SINGLE_LATENCY_MICROBATCHES)
        measured = measure(
            pipeline,
            inputs,
            warmup=opts.warmup,
            single=single,
            keep_outputs=opts.outputs is not None,
            partial=True,
        )
        checked: list[tuple[Feeds, Tensors]] = []
        if opts.compare and measured.failure is None:  # apart from the timed stream (see measure)
            once = distinct(inputs)
            checked = list(zip(once, pipeline.run_many(once), strict=True))
    report = build_report(
        pipeline, measured, warmup=opts.warmup, input_shapes=shapes, driver_peak_rss_bytes=peak_rss_bytes()
    )
    if measured.failure is not None:  # what was delivered is kept, then the run fails as it did
        _write_results(opts, report, measured)
        raise RuntimeStageError(
            f"{measured.failure} (after {measured.microbatches} micro-batch(es) delivered)"
        )
    if opts.compare:
        assert model is not None
        say.step("running the model without the pipeline (the baselines)")
        report = add_baselines(report, pipeline, model, inputs, warmup=opts.warmup, checked=checked)
    _write_results(opts, report, measured)
    return report


def _placements(opts: RunOptions, manifest: Manifest) -> list[Placement] | None:
    """Each stage's placement from ``opts.devices``; None: as the manifest records (with ``threads``)."""
    cluster = opts.devices
    if cluster is None:
        return None
    by_name = {d.name: d for d in cluster.devices}
    result: list[Placement] = []
    for st in manifest.stages:
        dev = by_name.get(st.device)
        if dev is None:
            if len(cluster.devices) != manifest.k:
                raise UsageError(
                    f"{cluster.source or 'the devices file'}: has no device {st.device!r}, which stage "
                    f"{st.index} runs on; devices are {', '.join(by_name)}"
                )
            dev = cluster.devices[st.index]  # a manifest planned without names: pipeline order
        result.append(placement_of(dev, opts.threads))
    return result


def _source(
    directory: Path, manifest: Manifest, model: Path | None, *, needed: bool
) -> tuple[Path, Path | None] | None:
    """The source model's file and the embedding model the split joined ahead of it; ``None`` where they
    are not at hand and not ``needed``."""
    try:
        return source_model_path(directory, manifest, model), source_embedding(directory, manifest)
    except (ManifestError, UsageError):
        if needed:
            raise
        return None


def _inputs(
    opts: RunOptions, directory: Path, manifest: Manifest, source: tuple[Path, Path | None] | None
) -> tuple[list[Tensors], dict[str, tuple[int, ...]]]:
    """The micro-batches to stream, and their shapes: read from the user's files, or random."""
    if opts.has_input_files:
        inputs = load_inputs(
            opts.input_files, opts.stacked_files, {t.name: t.dtype for t in manifest.model_inputs}
        )
        if opts.microbatches is not None:
            inputs = [inputs[j % len(inputs)] for j in range(opts.microbatches)]
        return inputs, {n: tuple(int(d) for d in v.shape) for n, v in inputs[0].items()}
    # the source as split, its weights left on disk (the embedding model's table read to join it)
    view = None if source is None else load_model(source[0], check=False, embedding=source[1])
    shapes = input_shapes_for(manifest, view, opts.shapes)
    count = opts.microbatches or MEASURED_MICROBATCHES
    return random_inputs(view or (directory, manifest), shapes, count, seed=opts.seed), shapes


def backend_config(
    opts: WorkerOptions, stages: int, *, slots: int = DEFAULT_SLOTS, pin: bool = False
) -> BackendConfig:
    """The backend ``opts.backend`` names (``run``'s or ``generate``'s, another backend's options refused
    when they were made) for a split of ``stages`` stages: local workers with ``slots`` and ``pin``, or
    Ray actors, the resources file read with one entry per stage."""
    if opts.backend == Backend.LOCAL:
        return LocalConfig(mode=opts.local_mode, slots=slots, pin=pin)
    given = opts.ray_resources
    resources = load_ray_resources(given, stages) if isinstance(given, Path) else given
    return RayConfig(
        address=opts.ray_address,
        resources=resources,
        slots=slots,
        files=opts.ray_files,
        restarts=opts.ray_restarts,
        restart_timeout=opts.ray_restart_timeout,
    )


def _warn_threads(say: Listener, placements: list[Placement], manifest: Manifest) -> None:
    cpu = [p for p in placements if not p.uses_gpu]
    if cpu:
        warning = threads_warning(len(cpu), max(p.threads for p in cpu), workers=manifest.plan.workers)
        if warning is not None:
            say.warn(f"{warning} (split again with fewer stages to run it here)")


def _write_results(opts: RunOptions, report: RunReport, measured: Measurement) -> None:
    if opts.report is not None:
        with writing(opts.report, "report"):
            opts.report.write_bytes(report.to_json().encode("utf-8"))
    if opts.outputs is not None:
        outputs = measured.outputs
        names = list(outputs[0]) if outputs else []
        try:
            stacked = {n: np.stack([o[n] for o in outputs]) for n in names}
        except ValueError as e:
            raise UsageError(f"{opts.outputs}: outputs of different shapes cannot be stacked ({e})") from e
        with writing(opts.outputs, "outputs"), opts.outputs.open("wb") as f:
            np.savez(f, **stacked)  # type: ignore[arg-type]
