"""Tests of onnxpipe.verification and onnxpipe.verification.chain: the chained stages against the original
model."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from manifest_edits import sealed
from models import runtimes_differ_model, save
from onnx import TensorProto, helper, numpy_helper

from onnxpipe import api
from onnxpipe.api import (
    ExportOptions,
    PlanRequest,
    ProfileOptions,
    SplitOptions,
    VerifyOptions,
    verify,
)
from onnxpipe.cli import main
from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.files import file_sha256
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan
from onnxpipe.runtime.inputs import input_shapes_for
from onnxpipe.verification.chain import StageChain
from onnxpipe.verification.compare import compare
from onnxpipe.verification.options import tolerance_for
from onnxpipe.verification.verify import planned_input_shapes


def plan_for(view: ModelView, bounds: list[int]) -> Plan:
    k = len(bounds) - 1
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    stages = assign_stages(view, bounds, sizes, [1.0] * k, [0.0] * k)
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=1.0,
        lower_bound_seconds=1.0,
        cost_source="test",
        threads=1,
        bandwidth_bytes_per_s=math.inf,
        input_shapes={},
        tensor_bytes=sizes,
    )


def skip_model() -> onnx.ModelProto:
    """mm0 -> relu -> scale (by Constant c) -> mm1 -> add(skip from relu) -> y; x is also an output."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.5).astype(np.float32), f"w{i}")
        for i in range(2)
    ]
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="c_const",
            value=numpy_helper.from_array(np.full((8,), 3.0, np.float32)),
        ),
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
        helper.make_node("Relu", ["h0"], ["r0"], name="relu"),
        helper.make_node("Mul", ["r0", "c"], ["s"], name="scale"),
        helper.make_node("MatMul", ["s", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "r0"], ["y"], name="skip"),
    ]
    graph = helper.make_graph(
        nodes,
        "skip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
        ],
        initializer=weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def split(tmp_path: Path) -> Path:
    """``<tmp>/skip.onnx`` split in 3 stages into ``<tmp>/out``; the Constant ends up in stage 1."""
    path = tmp_path / "skip.onnx"
    onnx.save_model(skip_model(), str(path))
    view = load_model(path)
    plan = plan_for(view, [0, 2, 4, 5])
    assert plan.stages[1].node_names == ("scale", "mm1") and plan.stages[1].constant_nodes == ("c_const",)
    export_stages(view, plan, tmp_path / "out")
    return tmp_path / "out"


def test_good_split_verifies(split: Path) -> None:
    report = verify(split, VerifyOptions(runs=2, seed=3))
    assert report.ok
    assert [o.name for o in report.outputs] == ["y", "x"]
    for o in report.outputs:
        assert o.allclose and o.shape_equal and o.dtype_equal and o.expected_shape == (1, 8)
        assert o.max_abs_diff <= 1e-5 and o.expected_dtype == "float32"
    assert report.input_shapes == {"x": (1, 8)} and report.runs == 2 and report.seed == 3
    assert report.model_path == split.parent / "skip.onnx"  # found through the manifest's ../skip.onnx
    text = report.summary()
    assert "y: ok (max abs diff" in text
    assert text.endswith(
        "verify: 2 output(s) match the original over 2 run(s) (tolerance: |a-b| <= 1e-05 + 0.0001*max|a|)"
    )
    assert report.ok


def test_shape_overrides_reach_the_inputs(split: Path) -> None:
    report = verify(split, VerifyOptions(shapes={"x": (5, 8)}))
    assert report.ok and report.input_shapes == {"x": (5, 8)}
    assert report.outputs[0].expected_shape == (5, 8)


def tamper_constant(out: Path, stage: int, value: float) -> None:
    """Change the Constant of ``stage`` and record the new sha256, as if the export had written it."""
    path = out / f"stage_{stage}.onnx"
    model = onnx.load(str(path))
    (node,) = (n for n in model.graph.node if n.op_type == "Constant")
    node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.full((8,), value, np.float32)))
    onnx.save_model(model, str(path))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stages"][stage]["sha256"] = file_sha256(path)
    (out / "manifest.json").write_text(sealed(manifest))


def test_tampered_stage_is_reported_not_raised(split: Path) -> None:
    tamper_constant(split, 1, 3.001)
    report = verify(split)
    assert not report.ok
    y, x = report.outputs
    assert not y.ok and not y.allclose and y.shape_equal and y.dtype_equal
    assert y.max_abs_diff > 1e-4 and 0 < y.max_rel_diff < 1
    assert x.ok  # the pass-through output is untouched
    assert "y: MISMATCH" in report.summary() and "DO NOT match" in report.summary()
    assert not report.ok


def test_tolerance_is_relative_to_the_output_scale(split: Path) -> None:
    tamper_constant(split, 1, 3.001)
    diff = verify(split).outputs[0].max_rel_diff
    assert verify(split, VerifyOptions(rtol=diff * 1.01)).ok
    assert not verify(split, VerifyOptions(rtol=diff * 0.99, atol=0.0)).ok


def test_model_of_another_sha_is_refused(split: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    model = skip_model()
    model.doc_string = "changed"
    onnx.save_model(model, str(other))
    recorded = load_manifest(split).source.sha256
    with pytest.raises(ManifestError) as info:
        verify(split, VerifyOptions(model=other))
    message = str(info.value)
    assert message.startswith(f"{other}: sha256 {file_sha256(other)} is not the source sha256 {recorded}")
    assert "pass the model that was split (`model`)" in message


def test_model_found_through_the_manifest_or_given(split: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere" / "skip.onnx"
    moved.parent.mkdir()
    shutil.move(tmp_path / "skip.onnx", moved)
    with pytest.raises(UsageError, match=r"the source model recorded in .*manifest\.json is not there"):
        verify(split)
    assert verify(split, VerifyOptions(model=moved)).ok
    # the recorded path is relative: moving the model and the folder together keeps it valid
    together = tmp_path / "elsewhere" / "out"
    shutil.move(split, together)
    assert verify(together).ok


def test_changed_stage_file_is_refused_before_running(split: Path) -> None:
    with (split / "stage_1.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ManifestError, match=r"stage 1 file stage_1\.onnx changed after export"):
        verify(split)


# --------------------------------------------------------------------------------------------------
# the runner


def test_runner_passes_tensors_by_name(split: Path) -> None:
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    with StageChain.from_manifest(split) as chain:
        assert chain.input_names == ("x",) and chain.output_names == ("y", "x")
        out = chain.run({"x": x})
    assert list(out) == ["y", "x"]
    np.testing.assert_array_equal(out["x"], x)  # a model output that is a model input
    import onnxruntime as ort

    ref = ort.InferenceSession(str(split.parent / "skip.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out["y"], ref.run(["y"], {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_runner_lifecycle_and_missing_inputs(split: Path) -> None:
    chain = StageChain.from_manifest(split, threads=2)
    with pytest.raises(UsageError, match="model input 'x' is not in the feeds"):
        chain.run({})
    chain.close()
    with pytest.raises(UsageError, match="the stage chain is closed"):
        chain.run({"x": np.zeros((1, 8), np.float32)})


# --------------------------------------------------------------------------------------------------
# the comparison itself


def test_compare_nan_equals_nan_and_inf_equals_inf() -> None:
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    c = compare("t", a, a.copy(), rtol=0.0, atol=0.0)
    assert c.ok and c.max_abs_diff == 0.0 and c.max_abs_expected == 1.0
    b = np.array([1.0, 2.0, np.inf, -np.inf], np.float32)
    c = compare("t", a, b, rtol=1e-4, atol=1e-5)
    assert not c.ok and c.max_abs_diff == math.inf
    b = np.array([1.0, np.nan, -np.inf, -np.inf], np.float32)
    assert not compare("t", a, b, rtol=1e-4, atol=1e-5).ok


def test_compare_scale_shape_and_dtype() -> None:
    a = np.array([1000.0, 0.001], np.float32)
    b = np.array([1000.05, 0.002], np.float32)  # 0.001 off next to 0.001: fine next to 1000
    c = compare("t", a, b, rtol=1e-4, atol=1e-5)
    assert c.ok and c.max_rel_diff == pytest.approx(5e-5, rel=1e-2)
    assert not compare("t", a, b, rtol=1e-5, atol=1e-5).ok
    shape = compare("t", a, a.reshape(2, 1), rtol=1e-4, atol=1e-5)
    assert not shape.ok and not shape.shape_equal and shape.max_abs_diff == math.inf
    assert "shape [2, 1] != [2]" in shape.describe()
    dtype = compare("t", a, a.astype(np.float64), rtol=1e-4, atol=1e-5)
    assert dtype.allclose and not dtype.dtype_equal and not dtype.ok
    assert "dtype float64 != float32" in dtype.describe()
    ints = compare("t", np.array([1, 2], np.int64), np.array([1, 3], np.int64), rtol=0, atol=0)
    assert not ints.ok and ints.max_abs_diff == 1.0
    strings = np.array(["a", "b"], dtype=object)
    assert compare("t", strings, strings.copy(), rtol=0, atol=0).ok
    assert compare("t", np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), rtol=0, atol=0).ok


def test_compare_sequences_of_maps_with_tolerance() -> None:
    def maps(*rows: dict[int, float]) -> np.ndarray:
        out = np.empty(len(rows), dtype=object)
        out[:] = list(rows)
        return out

    a = maps({0: 0.5, 1: 0.5}, {0: 0.25, 1: 0.75})
    close = maps({0: 0.50001, 1: 0.5}, {0: 0.25, 1: 0.75})
    assert compare("p", a, close, rtol=1e-4, atol=1e-5).ok
    assert not compare("p", a, close, rtol=1e-6, atol=1e-6).ok
    other_keys = maps({0: 0.5, 2: 0.5}, {0: 0.25, 2: 0.75})
    assert compare("p", a, other_keys, rtol=1e-4, atol=1e-5).max_abs_diff == math.inf


def test_model_that_was_never_a_file_needs_model_path(tmp_path: Path) -> None:
    from onnxpipe.ir.load import view_from_proto

    proto = skip_model()
    view = view_from_proto(proto)
    manifest = export_stages(
        view, plan_for(view, [0, 2, 5]), tmp_path / "out", ExportOptions(source_name="skip.onnx")
    )
    assert manifest.source.path is None and manifest.source.file == "skip.onnx"
    with pytest.raises(
        UsageError, match=r"records no path for the source model skip\.onnx; pass it with `model`"
    ):
        verify(tmp_path / "out")
    path = tmp_path / "skip.onnx"
    path.write_bytes(proto.SerializeToString())
    assert verify(tmp_path / "out", VerifyOptions(model=path)).ok


def width_20_model() -> onnx.ModelProto:
    """x[b, n] + w[20] -> relu -> * m[b, n] -> y: runs only when n is 20 (or 1), not at the default 16."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 20, dtype=np.float32), "w")
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "m"], ["y"], name="mask"),
    ]
    graph = helper.make_graph(
        nodes,
        "width_20",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "n"]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, ["b", "n"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "n"])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def width_20_split(tmp_path: Path) -> Path:
    """:func:`width_20_model` split in 2 with ``--shape x=1,20 m=1,20``."""
    path = tmp_path / "w20.onnx"
    onnx.save_model(width_20_model(), str(path))
    out = tmp_path / "out"
    result = api.split(
        path,
        SplitOptions(
            out=out,
            plan=PlanRequest(2),
            profile=ProfileOptions(cost="static", shapes={"x": (1, 20), "m": (1, 20)}),
        ),
    )
    assert result.report is not None and result.report.ok
    return out


def test_verify_uses_the_shapes_the_split_was_made_for(
    width_20_split: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: a later 'onnxpipe verify DIR' used default sizes (n=16), which this model refuses."""
    assert load_manifest(width_20_split).plan.profiled_input_shapes == {"x": (1, 20), "m": (1, 20)}
    report = verify(width_20_split)
    assert report.ok and report.input_shapes == {"x": (1, 20), "m": (1, 20)}
    capsys.readouterr()
    assert main(["verify", str(width_20_split)]) == 0
    assert "match the original" in capsys.readouterr().out


def test_verify_layers_shape_overrides_on_the_planned_shapes(width_20_split: Path) -> None:
    # a size given for the symbol 'b' through x reaches m, which keeps its planned n = 20
    report = verify(width_20_split, VerifyOptions(shapes={"x": (3, 20)}))
    assert report.ok and report.input_shapes == {"x": (3, 20), "m": (3, 20)}
    assert report.outputs[0].expected_shape == (3, 20)
    # the same helper gives 'onnxpipe run' its random inputs' shapes
    manifest = load_manifest(width_20_split)
    model = width_20_split.parent / "w20.onnx"
    assert input_shapes_for(manifest, model, {"x": (3, 20)}) == {"x": (3, 20), "m": (3, 20)}
    assert input_shapes_for(manifest, model, {}) == {"x": (1, 20), "m": (1, 20)}
    # an override this model refuses is still the user's to give, and said so
    with pytest.raises(UsageError, match=r"fails on random inputs of shapes x=\[1, 16\], m=\[1, 16\]"):
        verify(width_20_split, VerifyOptions(shapes={"x": (1, 16)}))


def test_planned_shapes_fall_back_to_the_defaults_for_an_input_the_plan_lacks(split: Path) -> None:
    manifest = load_manifest(split)
    bare = replace(manifest, plan=replace(manifest.plan, profiled_input_shapes={}))
    view = load_model(split.parent / "skip.onnx")
    assert planned_input_shapes(bare, view) == {"x": (1, 8)}
    assert planned_input_shapes(bare, view, {"x": (4, 8)}) == {"x": (4, 8)}


def test_a_float16_model_is_verified_at_its_types_tolerance(tmp_path: Path) -> None:
    """An fp16 model's stages differ from the whole model by what onnxruntime's fp16 kernels round
    otherwise; the split is held to float16's tolerance, which the report names."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(4):
        w = onnx.numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float16) / 4, f"w{i}")
        inits.append(w)
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]),
        ]
        x = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "fp16",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, [1, 32])],
        [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT16, [1, 32])],
        inits,
    )
    path = tmp_path / "fp16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = api.split(
        path, SplitOptions(out=tmp_path / "s", plan=PlanRequest(2), profile=ProfileOptions(cost="static"))
    )
    assert result.report is not None and result.report.ok
    (out,) = result.report.outputs
    assert (out.rtol, out.atol) == (tolerance_for("float16").rtol, tolerance_for("float16").atol)
    strict = verify(tmp_path / "s", VerifyOptions(rtol=0.0, atol=0.0, record=False))
    assert (strict.rtol, strict.atol) == (0.0, 0.0)


@pytest.mark.parametrize(("runtime", "package"), [("openvino", "openvino"), ("tract", "tract")])
def test_a_runtime_that_differs_by_itself_does_not_fail_the_split(
    runtime: str, package: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 39: the stages on OpenVINO (tract) equal the whole model there, and both differ from
    onnxruntime by the runtime's own resize; verify says which differs from what and passes."""
    pytest.importorskip(package)
    model = save(runtimes_differ_model(), tmp_path / "resizes.onnx")
    out = tmp_path / "out"
    api.split(
        model, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static"), verify=False)
    )
    report = verify(out, VerifyOptions(runtime=runtime))
    (y,) = report.outputs
    on = report.on_runtime
    assert on is not None and on.ran and on.label.startswith(runtime)
    assert not y.ok and y.max_abs_diff > 1e-3  # the stages against onnxruntime
    assert on.stages[0].ok and on.stages[0].max_abs_diff <= 1e-5  # the stages against the whole model there
    assert not on.whole[0].ok and on.whole[0].max_abs_diff == pytest.approx(y.max_abs_diff, rel=1e-3)
    assert report.ok
    assert len(report.notes) == 1 and f"{on.label} differs from onnxruntime by itself" in report.notes[0]
    assert f"y by max abs diff {on.whole[0].max_abs_diff:.3g}" in report.notes[0]
    assert main(["verify", str(out), "--runtime", runtime]) == 0
    printed = capfd.readouterr().out
    assert f"y: ok (stages against the whole model, both on {on.label}: max abs diff" in printed
    assert f"the original on onnxruntime (CPUExecutionProvider) and on {on.label}" in printed
    assert f"verify: 1 output(s) match the whole model on {on.label}" in printed
    assert "note: " + report.notes[0] in printed
    assert main(["verify", str(out), "--runtime", runtime, "--json"]) == 0
    doc = json.loads(capfd.readouterr().out)["verification"]
    assert doc["ok"] and doc["outputs"][0]["ok"] and doc["notes"] == report.notes
    assert doc["on_runtime"]["runtime"] == on.label and doc["on_runtime"]["not_run"] is None
    (three,) = doc["on_runtime"]["outputs"]
    assert three["stages_vs_whole"]["ok"] and not three["whole_vs_onnxruntime"]["ok"]


def test_a_changed_stage_fails_against_both_on_a_runtime(
    split: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A stage that computes something else differs from the whole model on its runtime as well as from
    onnxruntime: the split is at fault, and the line says so with all three differences."""
    pytest.importorskip("openvino")
    tamper_constant(split, 1, 3.001)
    report = verify(split, VerifyOptions(runtime="openvino"))
    assert not report.ok and report.on_runtime is not None and report.on_runtime.ran
    assert not report.on_runtime.stages[0].ok and report.on_runtime.whole[0].ok
    assert report.notes == []
    assert main(["verify", str(split), "--runtime", "openvino"]) == 1
    printed = capfd.readouterr().out
    assert "y: MISMATCH (stages against the whole model, both on openvino (CPU): max abs diff" in printed
    assert "; stages against onnxruntime: max abs diff" in printed
    assert "verify: 2 output(s) DO NOT match the original, nor the whole model on openvino (CPU)" in printed
    assert "x: ok (max abs diff 0, max rel diff 0)" in printed
