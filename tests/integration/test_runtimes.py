"""Stages fed to other runtimes: every stage of a split runs on OpenVINO and on tract where the whole model
does, a chain that mixes runtimes equals the original, costs are measured on each runtime, and a split is
calibrated on its devices' runtimes.

The splits are made with static costs (no profiling), three stages each.  A stage chain on a runtime is
held to the whole model on the same runtime and to the original on onnxruntime, by verify's norm-based
tolerance (:func:`onnxpipe.verification.compare.compare`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from onnxpipe.api import SplitOptions, VerifyOptions, split, verify
from onnxpipe.calibrate.devices import calibrate_on_devices
from onnxpipe.calibrate.options import CalibrationOptions
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import Runtime
from onnxpipe.core.errors import RuntimeStageError, UsageError, error_line
from onnxpipe.core.runtimes import EngineConfig, open_engine
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.runtime_profile import profile_on_runtime
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime import Pipeline
from onnxpipe.verification.chain import StageChain
from onnxpipe.verification.compare import compare
from onnxpipe.verification.options import DEFAULT_ATOL, DEFAULT_RTOL
from onnxpipe.verification.verify import planned_input_shapes

pytestmark = pytest.mark.slow

STATIC = partial(SplitOptions, profile=ProfileOptions(cost="static"), verify=False)
OTHER_RUNTIMES = (Runtime.OPENVINO, Runtime.TRACT)


def _sample(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        folder: Path = request.getfixturevalue("sample_models_dir")
        return folder / f"{name}.onnx"

    return get


def _fixture(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        path: Path = request.getfixturevalue(name)
        return path

    return get


def _light(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        light: Callable[[str], Path] = request.getfixturevalue("light_model")
        return light(name)

    return get


MODELS: dict[str, Callable[[pytest.FixtureRequest], Path]] = {
    "mlp": _sample("mlp"),
    "resnet_tiny": _sample("resnet_tiny"),
    "transformer_tiny": _sample("transformer_tiny"),
    "shufflenet": _light("shufflenet"),
    "inception_v2": _light("inception_v2"),
    "rapidocr_det": _fixture("rapidocr_det_path"),
    "gpt2_tiny_dynamo": _fixture("gpt2_tiny_dynamo_path"),  # weights in an external data file
}

FAST = ("mlp", "resnet_tiny", "transformer_tiny", "shufflenet")
"""The fast lane's models on each runtime (the samples, one corpus CNN); the exhaustive lane runs all."""
CASES = [
    pytest.param(name, rt, id=f"{name}-{rt.value}", marks=() if name in FAST else pytest.mark.exhaustive)
    for name in MODELS
    for rt in OTHER_RUNTIMES
]


@pytest.mark.parametrize(("name", "runtime"), CASES)
def test_every_stage_runs_on_the_runtime_where_the_whole_model_does(
    name: str, runtime: Runtime, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model = MODELS[name](request)
    out = tmp_path / "split"
    split(model, STATIC(out=out, plan=PlanRequest(3)))
    manifest = load_manifest(out)
    view = load_model(model, check=False)
    feeds = random_feeds(view, planned_input_shapes(manifest, view), 0)
    names = [o.name for o in manifest.model_outputs]
    reference = open_engine(model, EngineConfig()).run(names, feeds)
    try:
        whole = open_engine(model, EngineConfig(runtime=runtime)).run(names, feeds)
    except Exception as e:  # noqa: BLE001 - the runtime's own refusal, of any type
        pytest.skip(f"the whole {name} does not run on {runtime.value} either: {error_line(e)}")
    with StageChain.from_manifest(out, engines=[EngineConfig(runtime=runtime)] * manifest.k) as chain:
        staged = chain.run(feeds)
    for n, want, alone in zip(names, reference, whole, strict=True):
        on_runtime = compare(n, alone, np.asarray(staged[n]), rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
        assert on_runtime.ok, f"{name} on {runtime.value}, stages against the whole: {on_runtime.describe()}"
        if compare(n, want, alone, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL).ok:  # the runtime agrees whole
            against = compare(n, want, np.asarray(staged[n]), rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
            assert against.ok, f"{name} on {runtime.value}, stages against onnxruntime: {against.describe()}"


def _three_runtimes() -> Cluster:
    devices = (
        Device("openvino-cpu", engine=EngineConfig(runtime=Runtime.OPENVINO)),
        Device("ort-cpu"),
        Device("tract-cpu", engine=EngineConfig(runtime=Runtime.TRACT)),
    )
    return Cluster(devices, (Link(),) * 2, "three runtimes")


def test_a_mixed_chain_equals_the_original(sample_models_dir: Path, tmp_path: Path) -> None:
    """OpenVINO, then onnxruntime, then tract: verify on the devices' runtimes, and the pipeline too."""
    model = sample_models_dir / "resnet_tiny.onnx"
    out = tmp_path / "split"
    split(model, STATIC(out=out, plan=PlanRequest(3, devices=_three_runtimes())))
    report = verify(out, VerifyOptions(runtime="devices", runs=2))
    assert report.ok, report.summary()
    assert report.stage_runtimes == ("openvino (CPU)", "onnxruntime (CPUExecutionProvider)", "tract")
    assert "stage 0 on openvino (CPU), stage 1 on onnxruntime" in report.summary()
    assert "tolerance: |a-b| <= 1e-05 + 0.0001*max|a|" in report.summary()
    view = load_model(model, check=False)
    manifest = load_manifest(out)
    feeds = random_feeds(view, planned_input_shapes(manifest, view), 3)
    with Pipeline.from_manifest(out) as pipe:
        got = pipe.run(feeds)
    want = open_engine(model, EngineConfig()).run(["logits"], feeds)[0]
    assert compare("logits", want, got["logits"], rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL).ok


def test_a_stage_a_runtime_cannot_load_is_one_line(sample_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    split(sample_models_dir / "mlp.onnx", STATIC(out=out, plan=PlanRequest(2)))
    (out / "stage_1.onnx").write_bytes(b"not a model")
    with pytest.raises(RuntimeStageError, match=r"stage_1\.onnx: stage 1 does not load in tract \("):
        StageChain.from_manifest(out, engines=[EngineConfig(runtime=Runtime.TRACT)] * 2, check_files=False)


@pytest.mark.parametrize("runtime", OTHER_RUNTIMES, ids=lambda r: r.value)
def test_profile_on_a_runtime(sample_models_dir: Path, runtime: Runtime) -> None:
    view = load_model(sample_models_dir / "mlp.onnx")
    prof = profile_on_runtime(view, EngineConfig(runtime=runtime), runs=3, warmup=1)
    assert prof.runtime == EngineConfig(runtime=runtime).label
    assert set(prof.node_seconds) == {n.name for n in view.compute_nodes}
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-9)
    # both runtimes name the mlp's layers after its nodes: every reported second lands on a node
    assert prof.exact_fraction == pytest.approx(1.0)
    # the matrix products (fused with their bias adds, whose node OpenVINO names them after) dominate
    products = [n.name for n in view.compute_nodes if n.op_type in ("Gemm", "MatMul", "Add")]
    assert sum(prof.node_seconds[n] for n in products) > 0.5 * prof.total_seconds


def test_calibration_on_the_devices_runtimes(sample_models_dir: Path) -> None:
    """Every stage timed on its device's runtime; the plan's estimates are then what was measured."""
    view = load_model(sample_models_dir / "resnet_tiny.onnx")
    here = _three_runtimes()  # each device here, profiled and timed on its own runtime
    request = PlanRequest(
        3, devices=Cluster(tuple(replace(d, profile_here=True) for d in here.devices), here.links)
    )
    done = calibrate_on_devices(view, static_profile(view), request, lambda p, r: plan(view, p, r), rounds=2)
    the_plan, rounds = done.plan, [r[None] for r in done.rounds]
    assert 1 <= len(rounds) <= 2
    assert all(m > 0 for m in rounds[0].measured_seconds)
    assert the_plan.cluster is not None
    assert the_plan.cluster.devices == request.devices.devices if request.devices else False  # not scratch
    assert all("calibrated per stage on" in r.source for r in the_plan.device_costs)
    last = rounds[-1]
    if done.went_back is None and tuple(len(s.node_names) for s in the_plan.stages) == last.bounds:
        # the cut the last round timed: corrected to the measured times, or within the tolerance already
        for stage, measured in zip(the_plan.stages, last.measured_seconds, strict=True):
            assert stage.compute_seconds == pytest.approx(measured, rel=0.021)


def test_calibrating_a_tract_profile_in_onnxruntime_is_refused(
    sample_models_dir: Path, tmp_path: Path
) -> None:
    model = sample_models_dir / "mlp.onnx"
    prof = profile_on_runtime(load_model(model), EngineConfig(runtime=Runtime.TRACT), runs=2, warmup=1)
    with pytest.raises(UsageError, match="the profile was measured on tract; give `devices`"):
        split(
            model,
            SplitOptions(
                out=tmp_path / "out",
                plan=PlanRequest(2),
                profile=ProfileOptions(saved=prof),
                calibration=CalibrationOptions(rounds=1),
            ),
        )


@pytest.mark.parametrize("runtime", OTHER_RUNTIMES, ids=lambda r: r.value)
def test_an_input_a_runtime_renames_is_bound_by_its_position(runtime: Runtime, tmp_path: Path) -> None:
    """OpenVINO names an input that feeds a Dropout after the Dropout's output (``d``, not ``r60``): a
    stage is fed by the file's input order where the runtime lost the name."""
    nodes = [helper.make_node("Dropout", ["r60"], ["d"], name="drop"), helper.make_node("Relu", ["d"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("r60", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "drop.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
    (y,) = open_engine(path, EngineConfig(runtime=runtime)).run(["y"], {"r60": x})
    assert np.array_equal(y, np.maximum(x, 0))
