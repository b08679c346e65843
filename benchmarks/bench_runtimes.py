"""Balance on each runtime: plans from onnxruntime's costs against plans from the runtime's own costs.

A plan balanced on onnxruntime's costs is not balanced on OpenVINO or tract, which fuse and vectorise
differently.  For each model and each runtime R (onnxruntime, OpenVINO, tract; 1 thread; K stages):

* ``ort_costs``: the plan ``onnxpipe split --stages K`` makes from onnxruntime's measured profile (cached
  under ``benchmarks/results/profiles/``), run on R as it is;
* ``own_costs``: the plan made for K devices of runtime R: the model profiled on R
  (``profile --runtime R``: per-layer reports mapped to nodes), then ``--calibrate ROUNDS`` on R (each
  stage timed on R, the costs corrected, partitioned again: :mod:`onnxpipe.calibrate.devices`).

Both plans' stages are then timed on R side by side, their 2K engines taking turns a few runs at a time
(:func:`onnxpipe.core.runtimes.time_in_turns`), so that a machine whose speed drifts slows both alike;
``--repeats`` such timings, the plans' order alternating, give each stage its median.
Reported per plan: slowest / mean stage (goal for ``own_costs``: at most 1.10 on every runtime) and
slowest / fastest.  A runtime that cannot run the whole model is skipped with its reason (tract and
YOLOv8's dynamic ``Conv``).

Writes ``benchmarks/results/runtimes.json``: a row per model, runtime and plan.

    python -m benchmarks runtimes [--models resnet50,gpt2_tiny] [--runtimes onnxruntime,openvino,tract]
                                  [--k 3] [--rounds 3] [--runs 20] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import benchmark_parser, cached_profile, model_path, params_of, shown, write_result
from onnxpipe.calibrate.devices import calibrate_on_devices
from onnxpipe.calibrate.timing import ready_engines, scratch_stages, time_in_turns
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import Runtime, choice
from onnxpipe.core.errors import OnnxpipeError
from onnxpipe.core.runtimes import EngineConfig, open_engine
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.types import Plan

MODELS = {
    "resnet50": ("light_resnet50", None),
    "gpt2_tiny": ("gpt2_tiny", {"input_ids": (4, 128)}),
    "yolov8n": ("nudenet", {"images": (1, 3, 320, 320)}),
    "rapidocr_det": ("rapidocr_det", {"x": (1, 3, 320, 320)}),
    "resnet_tiny": ("resnet_tiny", None),  # the sample model: a quick check of the script itself
}
GOAL = 1.10


def _devices(k: int, runtime: Runtime) -> Cluster:
    devices = tuple(
        Device(f"{runtime.value}{i}", profile_here=True, engine=EngineConfig(runtime=runtime))
        for i in range(k)
    )
    return Cluster(devices, (Link(),) * (k - 1), f"{k} x {runtime.value}")


def _whole_runs(view: ModelView, profile: Profile, runtime: Runtime) -> str | None:
    """None when ``runtime`` runs the whole model, else why not."""
    assert view.path is not None
    try:
        engine = open_engine(view.path, EngineConfig(runtime=runtime))
        feeds = random_feeds(view, profile.input_shapes)
        engine.run(engine.output_names, feeds)
        engine.close()
    except Exception as e:  # noqa: BLE001 - the runtime's own refusal, of any type
        return str(e).splitlines()[0][:200]
    return None


def time_side_by_side(
    view: ModelView, profile: Profile, plans: Sequence[Plan], runtime: Runtime, runs: int
) -> list[list[float]]:
    """Every stage of every plan timed on ``runtime``, all of them taking turns."""
    with contextlib.ExitStack() as stack:
        engines = []
        counts = []
        for p in plans:
            out, manifest = stack.enter_context(scratch_stages(view, p))
            configs = {st.device: EngineConfig(runtime=runtime) for st in manifest.stages}
            ready = list(ready_engines(view, profile, out, manifest, configs))
            engines.extend(ready)
            counts.append(len(ready))
        seconds = time_in_turns(engines, runs=runs)
        for engine, _, _ in engines:
            engine.close()
    result: list[list[float]] = []
    start = 0
    for n in counts:
        result.append(seconds[start : start + n])
        start += n
    return result


def bench(name: str, runtimes: Sequence[Runtime], args: Any) -> list[dict[str, Any]]:
    source, shapes = MODELS[name]
    view = load_model(model_path(source))
    profile, _ = cached_profile(source, view, threads=1, shapes=shapes)
    ort_plan = plan(view, profile, PlanRequest(args.k))
    rows: list[dict[str, Any]] = []
    for runtime in runtimes:
        why = _whole_runs(view, profile, runtime)
        if why is not None:
            print(f"  {name} on {runtime.value}: skipped, the whole model does not run there ({why})")
            rows.append({"model": name, "runtime": runtime.value, "skipped": why})
            continue
        request = PlanRequest(args.k, devices=_devices(args.k, runtime))
        try:
            calibrated = calibrate_on_devices(
                view, profile, request, lambda p, r: plan(view, p, r), rounds=args.rounds
            )
            own_plan, rounds = calibrated.plan, [r[None] for r in calibrated.rounds]
        except OnnxpipeError as e:
            print(f"  {name} on {runtime.value}: skipped, {e}")
            rows.append({"model": name, "runtime": runtime.value, "skipped": str(e)})
            continue
        # repeats, the plans' order alternating: each stage's median over them, so that a burst of
        # other work during one timing does not decide the figure
        repeats = [
            time_side_by_side(view, profile, pair, runtime, args.runs)
            for pair in ([ort_plan, own_plan], [own_plan, ort_plan]) * args.repeats
        ][: max(1, args.repeats)]
        ordered = [r if i % 2 == 0 else r[::-1] for i, r in enumerate(repeats)]
        measured = [
            [statistics.median(rep[p][s] for rep in ordered) for s in range(len(ordered[0][p]))]
            for p in range(2)
        ]
        for label, p, times in zip(("ort_costs", "own_costs"), (ort_plan, own_plan), measured, strict=True):
            mean = statistics.fmean(times)
            row = {
                "model": name,
                "runtime": runtime.value,
                "plan": label,
                "k": args.k,
                "bounds": [len(s.node_names) for s in p.stages],
                "stage_seconds": times,
                "max_over_mean": max(times) / mean,
                "max_over_min": max(times) / min(times),
                "predicted_seconds": [s.compute_seconds for s in p.stages],
                "calibration_rounds": len(rounds) if label == "own_costs" else 0,
                "calibration_first_error": rounds[0].worst_error if label == "own_costs" else None,
            }
            rows.append(row)
            shown_times = " / ".join(f"{t * 1e3:.2f}" for t in times)
            print(
                f"  {name} on {runtime.value}, {label}: {shown_times} ms, slowest/mean "
                f"{row['max_over_mean']:.3f}, slowest/fastest {row['max_over_min']:.3f}",
                flush=True,
            )
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    measured = [r for r in rows if "plan" in r]
    by: dict[str, dict[str, float]] = {}
    for r in measured:
        by.setdefault(f"{r['model']}/{r['runtime']}", {})[r["plan"]] = r["max_over_mean"]
    own = [r["max_over_mean"] for r in measured if r["plan"] == "own_costs"]
    return {
        "goal_max_over_mean": GOAL,
        "max_over_mean": by,
        "own_costs_within_goal": sum(1 for x in own if x <= GOAL),
        "own_costs_cases": len(own),
        "worst_own_costs_max_over_mean": max(own, default=None),
    }


def main(argv: list[str]) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument(
        "--models", default="resnet50,gpt2_tiny", help="comma-separated: " + ", ".join(MODELS)
    )
    parser.add_argument("--runtimes", default="onnxruntime,openvino,tract")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="calibration rounds on each runtime")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each stage per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings of both plans, order alternating")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    runtimes = [choice(Runtime, r, "runtimes") for r in args.runtimes.split(",") if r]
    rows: list[dict[str, Any]] = []
    for name in names:
        rows.extend(bench(name, runtimes, args))
    figures = summary(rows)
    print(
        f"own costs within {GOAL:.2f}x of the mean stage: {figures['own_costs_within_goal']} of "
        f"{figures['own_costs_cases']} (worst {figures['worst_own_costs_max_over_mean']})"
    )
    path: Path = write_result("runtimes", params_of(args, goal=GOAL), rows, summary=figures, out=args.out)
    print(f"wrote {shown(path)}")
    return 0
