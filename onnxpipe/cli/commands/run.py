"""The work of ``onnxpipe run`` (parser: :mod:`onnxpipe.cli.run`): run a split folder as a pipeline and
measure it, optionally against the model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.cli.commands.early import check_output_file
from onnxpipe.cli.commands.preamble import Say, threads_warning
from onnxpipe.cli.run import MEASURED_MICROBATCHES, SINGLE_LATENCY_MICROBATCHES
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.ir.shapes import parse_shape_overrides
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.backends.ray_resources import load_ray_resources
from onnxpipe.runtime.base import (
    BackendConfig,
    LocalConfig,
    RayConfig,
    Tensors,
)
from onnxpipe.runtime.inputs import input_shapes_for, load_npz, random_inputs
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.baselines import Feeds, add_baselines, distinct
from onnxpipe.runtime.report.build import build_report
from onnxpipe.runtime.report.measure import measure
from onnxpipe.runtime.report.text import format_report
from onnxpipe.runtime.session import peak_rss_bytes
from onnxpipe.runtime.spec import Placement, manifest_placements, placement_of
from onnxpipe.verification.verify import source_model_path


def _placements(args: argparse.Namespace, manifest: Manifest) -> list[Placement] | None:
    """Each stage's placement from ``--devices``; None: as the manifest records (with ``--threads``)."""
    if args.devices is None:
        return None
    cluster = load_cluster(args.devices)
    by_name = {d.name: d for d in cluster.devices}
    result: list[Placement] = []
    for st in manifest.stages:
        dev = by_name.get(st.device)
        if dev is None:
            if len(cluster.devices) == manifest.k:
                dev = cluster.devices[st.index]  # a manifest planned without names: pipeline order
            else:
                raise UsageError(
                    f"{args.devices}: has no device {st.device!r}, which stage {st.index} runs on; "
                    f"devices are {', '.join(by_name)}"
                )
        result.append(placement_of(dev, args.threads))
    return result


def _source_model(args: argparse.Namespace, manifest: Manifest, *, needed: bool) -> Path | None:
    try:
        return source_model_path(args.dir, manifest, args.model)
    except (ManifestError, UsageError):
        if needed:
            raise
        return None


def run(args: argparse.Namespace) -> int:
    """Run ``args.dir`` as a pipeline and print what it delivered; 1 when ``--compare`` finds a mismatch."""
    say = Say()
    for path, option in ((args.report, "--report"), (args.outputs, "--outputs")):
        if path is not None:
            check_output_file(path, option)
    manifest = load_manifest(args.dir)
    placements = _placements(args, manifest)
    input_types = {t.name: t.dtype for t in manifest.model_inputs}
    overrides = parse_shape_overrides(args.shape)
    model = _source_model(args, manifest, needed=args.compare or args.inputs is None)
    if args.inputs is not None:
        if overrides:
            raise UsageError("--shape is for random inputs; the shapes of --inputs are those in the file")
        inputs = load_npz(args.inputs, input_types)
        if args.microbatches is not None:
            inputs = [inputs[j % len(inputs)] for j in range(args.microbatches)]
        shapes = {n: tuple(int(d) for d in v.shape) for n, v in inputs[0].items()}
    else:
        assert model is not None
        shapes = input_shapes_for(manifest, model, overrides)
        inputs = random_inputs(model, shapes, args.microbatches or MEASURED_MICROBATCHES, seed=args.seed)
    resources = None
    if args.ray_resources is not None:
        if args.backend != "ray":
            raise UsageError("--ray-resources is for --backend ray")
        resources = load_ray_resources(args.ray_resources, manifest.k)
    config = backend_config(args, resources)  # refused before anything starts
    if args.backend == "local":  # Ray places its workers elsewhere, maybe on other machines
        cpu = [p for p in (placements or manifest_placements(manifest, args.threads)) if not p.uses_gpu]
        if cpu:
            warning = threads_warning(len(cpu), max(p.threads for p in cpu), workers=manifest.plan.workers)
            if warning is not None:
                say.warn(f"{warning} (split again with fewer stages to run it here)")
    say.step(f"starting {manifest.k} stage worker(s)")
    with Pipeline.from_manifest(args.dir, config, threads=args.threads, placements=placements) as pipeline:
        single = min(len(inputs), SINGLE_LATENCY_MICROBATCHES)
        say.step(f"running {len(inputs)} micro-batch(es) after {args.warmup} warm-up")
        measurement = measure(
            pipeline, inputs, warmup=args.warmup, single=single, keep_outputs=args.outputs is not None
        )
        checked: list[tuple[Feeds, Tensors]] = []
        if args.compare:  # checked apart from the timed stream, which drops its outputs (see measure)
            once = distinct(inputs)
            checked = list(zip(once, pipeline.run_many(once), strict=True))
    report = build_report(
        pipeline,
        measurement,
        warmup=args.warmup,
        input_shapes=shapes,
        driver_peak_rss_bytes=peak_rss_bytes(),
    )
    if args.compare:
        assert model is not None
        say.step("running the model without the pipeline for --compare (the baselines)")
        report = add_baselines(report, pipeline, model, inputs, warmup=args.warmup, checked=checked)
    print(format_report(report))
    if args.report is not None:
        _write(args.report, report.to_json())
        print(f"wrote {args.report}")
    if args.outputs is not None:
        _save_outputs(args.outputs, measurement.outputs)
        print(f"wrote {args.outputs}")
    say.done("ran")
    return 1 if report.outputs_match is False else 0


def backend_config(args: argparse.Namespace, resources: list[dict[str, Any]] | None) -> BackendConfig:
    """``--backend`` and the options of the backend it names; another backend's options are refused."""
    if args.backend == "ray":
        if args.pin:
            raise UsageError("--pin is for local workers; Ray places its actors itself")
        return RayConfig(address=args.ray_address, resources=resources, slots=args.slots)
    if args.ray_address is not None:
        raise UsageError("--ray-address is for --backend ray")
    return LocalConfig(mode=args.local_mode, slots=args.slots, pin=args.pin)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot be written ({e.strerror or e})") from e


def _save_outputs(path: Path, outputs: Any) -> None:
    names = list(outputs[0]) if outputs else []
    stacked = {n: np.stack([o[n] for o in outputs]) for n in names}
    try:
        with path.open("wb") as f:
            np.savez(f, **stacked)  # type: ignore[arg-type]
    except OSError as e:
        raise UsageError(f"{path}: cannot be written ({e.strerror or e})") from e
    except ValueError as e:
        raise UsageError(f"{path}: outputs of different shapes cannot be stacked ({e})") from e
