"""A CPU stage and a GPU stage: planned from profiles measured on each, verified, measured against predicted.

For a machine lent an accelerator; one short script (a few minutes on a small model), never required by
the tests.  Steps:

1. **Providers**: which onnxruntime execution providers this machine has, and OpenVINO's devices.  The
   GPU stage runs on TensorRT when present, else CUDA (``--gpu-provider`` chooses); with neither, the
   benchmark says so and exits 0 without writing a result.
2. **Profiles on each device**: the model profiled on the CPU (onnxruntime's profiler) and on the GPU
   provider (the whole model timed there, its nodes' shares by static cost:
   :mod:`onnxpipe.cost.runtime_profile`); a devices file of one CPU and one GPU device, both
   ``profile_here``.
3. **A 2-stage split** planned on those costs (``split --devices``), then calibrated (``--calibrate``:
   each stage timed on its own device, the costs corrected, partitioned again).
4. **Verified**: the chained stages, each on its device (``verify --runtime devices``), against the whole
   model on the CPU (verify's tolerance; its largest relative difference is recorded, since a GPU's
   kernels may round differently).
5. **Measured against predicted**: each stage's median time on its device against the plan's estimate,
   before and after calibration; and a pipeline run of the split against the whole model on the GPU.

``--gpu-provider CPUExecutionProvider`` runs every step with the "GPU" stage on the CPU: a dry run of the
script itself on a machine without an accelerator (its figures mean nothing about GPUs).

Writes ``benchmarks/results/gpu.json`` (a row per step), or nothing when it skips.

    python -m benchmarks gpu [--model resnet50] [--threads 4] [--gpu-provider auto] [--runs 20] [--out DIR]
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

from benchmarks.common import benchmark_parser, model_path, params_of, shown, write_result
from onnxpipe import api
from onnxpipe.api import VerifyOptions, verify
from onnxpipe.calibrate.devices import time_stages_on_devices
from onnxpipe.calibrate.options import CalibrationOptions
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.runtimes import EngineConfig, median_seconds, open_engine
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime import Pipeline

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider")
MODELS = {"resnet50": ("light_resnet50", None), "yolov8n": ("nudenet", {"images": (1, 3, 320, 320)})}


def gpu_provider(asked: str, available: list[str]) -> tuple[str | None, str]:
    """The provider the GPU stage runs on, or None and why not."""
    if asked != "auto":
        if asked not in available:
            return (
                None,
                f"--gpu-provider {asked} is not available here (onnxruntime has {', '.join(available)})",
            )
        return asked, f"as asked ({asked})"
    for p in GPU_PROVIDERS:
        if p in available:
            return p, "the first GPU provider present"
    return None, (
        f"no GPU provider here: this onnxruntime has {', '.join(available)} (install onnxruntime-gpu on "
        "a machine with a GPU, or pass --gpu-provider CPUExecutionProvider for a dry run)"
    )


def _openvino_devices() -> list[str]:
    try:
        import openvino as ov

        return list(ov.Core().available_devices)
    except Exception:  # noqa: BLE001 - only listed
        return []


def _stage_rows(label: str, result: api.SplitResult, seconds: list[float]) -> dict[str, Any]:
    stages = result.plan.stages
    return {
        "step": label,
        "devices": [s.device for s in stages],
        "bounds": [len(s.node_names) for s in stages],
        "predicted_seconds": [s.compute_seconds for s in stages],
        "measured_seconds": seconds,
        "measured_over_predicted": [
            m / p if p > 0 else None
            for m, p in zip(seconds, (s.compute_seconds for s in stages), strict=True)
        ],
        "max_over_mean_measured": max(seconds) / statistics.fmean(seconds),
        "verified": result.report.ok if result.report is not None else None,
        "notes": list(result.plan.notes),
    }


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    parser.add_argument("--threads", type=int, default=4, help="intra-op threads of the CPU stage")
    parser.add_argument("--gpu-provider", default="auto", help="auto, or an onnxruntime provider name")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each stage")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    available = list(ort.get_available_providers())
    provider, why = gpu_provider(args.gpu_provider, available)
    print(
        f"onnxruntime providers: {', '.join(available)}; "
        f"OpenVINO devices: {', '.join(_openvino_devices()) or 'none'}"
    )
    if provider is None:
        print(f"gpu: skipped, {why}")
        return 0
    print(f"gpu stage on {provider}: {why}")
    source, shapes = MODELS[args.model]
    path = model_path(source)
    view = load_model(path)
    cpu = Device("cpu", profile_here=True, engine=EngineConfig(threads=args.threads))
    options = {"device_id": 0} if provider != "CPUExecutionProvider" else {}
    engine = EngineConfig(provider, tuple((k, str(v)) for k, v in options.items()), threads=1)
    gpu = Device("gpu", engine, profile_here=True)
    cluster = Cluster((cpu, gpu), (Link(),), "cpu + gpu")
    request = PlanRequest(2, devices=cluster)
    profile_options = ProfileOptions(threads=args.threads, shapes=shapes or {}, runs=10)
    rows: list[dict[str, Any]] = []
    profile = get_profile(view, profile_options)
    by_name = {d.name: d for d in cluster.devices}
    with tempfile.TemporaryDirectory(prefix="onnxpipe-gpu-") as tmp:
        for label, rounds in (("from_profiles", 0), ("calibrated", 2)):
            out = Path(tmp) / label
            options_ = api.SplitOptions(
                out=out,
                plan=request,
                profile=dataclasses.replace(profile_options, saved=profile, threads=None),
                calibration=CalibrationOptions(rounds=rounds),
            )
            result = api.split(path, options_)
            measured = time_stages_on_devices(view, result.plan, profile, by_name, runs=args.runs)
            on_devices = verify(
                out, VerifyOptions(runtime="devices", shapes=shapes or {})
            )  # each stage on its device
            row = _stage_rows(label, result, measured)
            row["verified_on_devices"] = on_devices.ok
            row["max_rel_diff_on_devices"] = max(o.max_rel_diff for o in on_devices.outputs)
            rows.append(row)
            print(
                f"{label}: cut {row['bounds']}, predicted "
                f"{' / '.join(f'{t * 1e3:.2f}' for t in row['predicted_seconds'])} ms, measured "
                f"{' / '.join(f'{t * 1e3:.2f}' for t in measured)} ms, verified on the devices "
                f"{row['verified_on_devices']} (max rel diff {row['max_rel_diff_on_devices']:.2g})",
                flush=True,
            )
        feeds = random_feeds(view, profile.input_shapes)
        whole = open_engine(
            path,
            EngineConfig(provider=provider, provider_options=tuple((k, str(v)) for k, v in options.items())),
        )
        whole_seconds = median_seconds(lambda: whole.run(whole.output_names, feeds), runs=args.runs, warmup=2)
        whole.close()
        with Pipeline.from_manifest(Path(tmp) / "calibrated") as pipe:
            pipe.run_many([feeds] * 4)
            start = time.perf_counter()
            pipe.run_many([feeds] * args.runs)
            per_item = (time.perf_counter() - start) / args.runs
        rows.append(
            {
                "step": "pipeline_vs_whole_on_gpu",
                "pipeline_seconds_per_microbatch": per_item,
                "whole_model_on_gpu_seconds": whole_seconds,
                "pipeline_over_whole": per_item / whole_seconds,
            }
        )
        print(
            f"pipeline {per_item * 1e3:.2f} ms per micro-batch, "
            f"whole model on {provider} {whole_seconds * 1e3:.2f} ms"
        )
    elapsed = time.perf_counter() - started
    params = params_of(args, provider=provider, providers=available, elapsed_seconds=elapsed)
    print(f"wrote {shown(write_result('gpu', params, rows, out=args.out))} ({elapsed:.0f} s)")
    return 0
