"""Old and unusual graphs: IR 3, local functions, other domains, quantized ops, optional inputs and
outputs, fan-out to several stages, odd model outputs, sparse and shared weights, training info and
quantization annotations, symbolic dims.

Each model comes from ``tests/models.py``; every cut (or a spread of them) is exported and the chained
stages are compared with the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import (
    all_bounds,
    annotated_model,
    constant_weights_model,
    contrib_model,
    fanout_model,
    feeds_for,
    fp16_keep_io_model,
    functions_model,
    ir3_model,
    make,
    optional_io_model,
    plan_for,
    quantized_model,
    save,
    save_external_constants,
    shared_weights_model,
    training_model,
    vi,
)
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions, VerifyOptions, split, verify
from onnxpipe.core.errors import ExportError
from onnxpipe.export.boundary import BoundaryTypes
from onnxpipe.export.build import StageBuilder
from onnxpipe.export.record import shared_weights
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import MODEL_INPUT, load_manifest
from onnxpipe.verification.chain import StageChain
from onnxpipe.verification.options import DEFAULT_RTOL, tolerance_for


def run_model(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_chain_equals(out: Path, path: Path, feeds: dict[str, np.ndarray], exact: bool = False) -> None:
    want = run_model(path, feeds)
    with StageChain.from_manifest(out) as chain:
        got = chain.run(feeds)
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype, name
        if exact:
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def every_cut_chains_back(
    model: onnx.ModelProto, tmp_path: Path, max_k: int = 3, exact: bool = False, check: bool = True
) -> tuple[ModelView, Path]:
    path = save(model, tmp_path / "model.onnx", check=check)
    view = load_model(path, check=check)
    feeds = feeds_for(model, seed=1)
    for bounds in all_bounds(len(view.compute_nodes), max_k):
        out = tmp_path / f"out_{'_'.join(map(str, bounds))}"
        export_stages(view, plan_for(view, bounds), out)
        assert_chain_equals(out, path, feeds, exact=exact)
    return view, path


def stage_models(out: Path) -> list[onnx.ModelProto]:
    return [onnx.load(str(out / s.file)) for s in load_manifest(out).stages]


# --------------------------------------------------------------------------------------------------
# old IR, functions, domains, quantization


def test_ir3_initializers_listed_as_inputs_are_not_asked_for(tmp_path: Path) -> None:
    view, path = every_cut_chains_back(ir3_model(), tmp_path)
    assert view.inputs == ("x",)
    out = tmp_path / "api"
    result = split(path, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static")))
    assert result.report is not None and result.report.ok
    assert [t.name for t in result.manifest.model_inputs] == ["x"]
    for m, entry in zip(stage_models(out), result.manifest.stages, strict=True):
        assert m.ir_version == 4
        assert not {"w", "b"} & {t.name for t in m.graph.input}
        assert all(t.source != "model" or t.name == "x" for t in entry.inputs)


def test_local_functions_and_their_domains_travel_with_the_caller(tmp_path: Path) -> None:
    view, _ = every_cut_chains_back(functions_model(), tmp_path, check=False)
    compute = [n.name for n in view.compute_nodes]
    out = tmp_path / "out_0_2_4"  # relu tanh | outer neg
    assert compute == ["relu", "tanh", "outer", "neg"]
    s0, s1 = stage_models(out)
    assert list(s0.functions) == []
    assert [f.name for f in s1.functions] == ["Inner", "Outer"]  # Outer calls Inner; Unused stays out
    for m in (s0, s1):
        assert {o.domain for o in m.opset_import} >= {"", "local", "com.microsoft"}
        onnx.checker.check_model(m)


def test_quantized_graph_splits_exactly_at_every_cut(tmp_path: Path) -> None:
    """QuantizeLinear/DequantizeLinear, QLinearConv, QLinearMatMul, MatMulInteger: integer results, so
    the chained stages must equal the model bit for bit."""
    view, _ = every_cut_chains_back(quantized_model(), tmp_path, max_k=3, exact=True)
    manifest = load_manifest(tmp_path / "out_0_2_5_10")  # quant_x qconv | ... | ...
    crossing = {t.name: t.dtype for s in manifest.stages for t in s.inputs}
    assert crossing["cq"] == "uint8"
    assert view.node_by_name["qmatmul"].param_bytes > 0


def test_contrib_ops_unknown_to_onnx_shape_inference(tmp_path: Path) -> None:
    _, _ = every_cut_chains_back(contrib_model(), tmp_path, check=False)
    manifest = load_manifest(tmp_path / "out_0_1_2_4")
    (g,) = manifest.stages[1].inputs
    assert (g.name, g.dtype) == ("h", "float32")
    (f,) = manifest.stages[2].inputs
    assert f.name == "g" and f.dtype == "float32" and f.shape is not None and len(f.shape) == 2


# --------------------------------------------------------------------------------------------------
# optional inputs and outputs, fan-out, odd model outputs


def test_empty_optional_inputs_and_outputs_are_kept(tmp_path: Path) -> None:
    view, _ = every_cut_chains_back(optional_io_model(), tmp_path)
    assert view.node_by_name["clip"].inputs == ("x", "hi")
    out = tmp_path / "out_0_2_8"  # clip ln | relu ... mul: inv_std crosses the cut
    s0, _ = stage_models(out)
    clip = next(n for n in s0.graph.node if n.name == "clip")
    ln = next(n for n in s0.graph.node if n.name == "ln")
    assert list(clip.input) == ["x", "", "hi"] and list(ln.output) == ["ln", "", "inv_std"]
    assert [o.name for o in s0.graph.output] == ["ln", "inv_std"]


def test_outputs_of_one_node_go_to_different_stages_and_odd_model_outputs(tmp_path: Path) -> None:
    """Split's outputs are read in three different stages; ``h`` is a model output read later too;
    ``x`` is a model input returned as it is; ``w_out`` an initializer; ``k_out`` a Constant's output."""
    view, path = every_cut_chains_back(fanout_model(), tmp_path, max_k=4)
    compute = [n.name for n in view.compute_nodes]
    assert compute == ["relu", "split", "tanh", "sigmoid", "add_p1", "neg", "mul_p2", "concat_h"]
    out = tmp_path / "out_0_2_4_6_8"
    manifest = load_manifest(out)
    split_out = {t.name: t.consumers for t in manifest.stages[0].outputs}
    assert split_out["p0"] == (1,) and split_out["p1"] == (2,) and split_out["p2"] == (3,)
    assert split_out["h"] == (3, "model_output")
    produced = {o.name: o.produced_by for o in manifest.model_outputs}
    assert produced == {"y": 3, "h": 0, "x": MODEL_INPUT, "w_out": 3, "k_out": 3}
    last = stage_models(out)[-1]
    assert "w_out" in {t.name for t in last.graph.initializer}
    assert sorted(o.name for o in last.graph.output) == ["k_out", "w_out", "y"]
    result = split(
        path, SplitOptions(out=tmp_path / "api", plan=PlanRequest(3), profile=ProfileOptions(cost="static"))
    )
    assert result.report is not None and result.report.ok


def test_plan_lists_an_initializer_model_output_in_the_last_stage(tmp_path: Path) -> None:
    view = load_model(save(fanout_model(), tmp_path / "m.onnx"))
    plan = plan_for(view, [0, 4, len(view.compute_nodes)])
    assert "w_out" in plan.stages[-1].outputs


def test_sparse_initializer_read_by_two_stages_is_copied_into_both(tmp_path: Path) -> None:
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sw"),
        numpy_helper.from_array(np.array([1, 11], np.int64), "sw_idx"),
        [4, 4],
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "sw"], ["h"], name="mm0"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("MatMul", ["r", "sw"], ["y"], name="mm1"),
        ],
        "sparse",
        [vi("x", ["N", 4])],
        [vi("y", ["N", 4])],
        sparse_initializer=[sparse],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = save(model, tmp_path / "sparse.onnx", check=False)
    view = load_model(path, check=False)
    export_stages(view, plan_for(view, [0, 2, 3]), tmp_path / "out")
    assert [len(m.graph.sparse_initializer) for m in stage_models(tmp_path / "out")] == [1, 1]
    assert_chain_equals(tmp_path / "out", path, feeds_for(model))


# --------------------------------------------------------------------------------------------------
# shared weights


def test_shared_weight_is_copied_into_every_stage_and_counted(tmp_path: Path) -> None:
    path = save(shared_weights_model(), tmp_path / "shared.onnx")
    view = load_model(path)
    plan = plan_for(view, [0, 3, 6, 9, 13])  # one block per stage, each reads w_shared
    export_stages(view, plan, tmp_path / "out")
    for m in stage_models(tmp_path / "out"):
        assert "w_shared" in {t.name for t in m.graph.initializer}
    builder = StageBuilder(view, BoundaryTypes(view))
    shared = shared_weights(view, [builder.weights_of(s) for s in plan.stages])
    assert shared.per_stage == (1024, 1024, 1024, 1024)  # 16 x 16 float32
    assert shared.duplicated == 3 * 1024
    one = shared_weights(view, [builder.weights_of(s) for s in plan_for(view, [0, 13]).stages])
    assert one.per_stage == (0,) and one.duplicated == 0
    assert_chain_equals(tmp_path / "out", path, feeds_for(view.proto))


def test_manifest_reports_duplicated_weight_bytes(tmp_path: Path) -> None:
    path = save(shared_weights_model(), tmp_path / "shared.onnx")
    view = load_model(path)
    manifest = export_stages(view, plan_for(view, [0, 3, 6, 9, 13]), tmp_path / "out")
    reread = load_manifest(tmp_path / "out")
    assert reread == manifest
    assert [s.shared_param_bytes for s in reread.stages] == [1024] * 4
    assert reread.plan.duplicated_param_bytes == 3 * 1024


# --------------------------------------------------------------------------------------------------
# training info, quantization annotations


def test_training_info_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = save(training_model(), tmp_path / "trainable.onnx")
    view = load_model(path)
    with pytest.raises(ExportError) as info:
        export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    assert str(info.value) == (
        f"{path}: carries training_info (1 training algorithm(s) bound to its weights), which cannot be "
        "split across stages; save the model without it (del model.training_info[:]) and split that"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainable.onnx"]


def test_quantization_annotations_stay_with_their_tensors(tmp_path: Path) -> None:
    path = save(annotated_model(), tmp_path / "annotated.onnx")
    view = load_model(path)
    export_stages(view, plan_for(view, [0, 1, 3]), tmp_path / "out")
    s0, s1 = stage_models(tmp_path / "out")
    # "a" crosses the cut: both stages annotate it; "y" lives in stage 1 only
    assert [a.tensor_name for a in s0.graph.quantization_annotation] == ["a"]
    assert [a.tensor_name for a in s1.graph.quantization_annotation] == ["a", "y"]
    for m in (s0, s1):
        names = {t.name for t in m.graph.initializer}
        for ann in m.graph.quantization_annotation:
            params = {e.key: e.value for e in ann.quant_parameter_tensor_names}
            assert params == {"SCALE_TENSOR": "a_scale", "ZERO_POINT_TENSOR": "a_zero"}
            assert set(params.values()) <= names  # the parameters they name are there
    assert_chain_equals(tmp_path / "out", path, feeds_for(view.proto))


def test_model_and_graph_metadata_are_kept(tmp_path: Path) -> None:
    model = shared_weights_model()
    model.graph.doc_string = "graph doc"
    entry = model.graph.metadata_props.add()
    entry.key, entry.value = "origin", "tests"
    helper.set_model_props(model, {"author": "me"})
    path = save(model, tmp_path / "m.onnx")
    view = load_model(path)
    export_stages(view, plan_for(view, [0, 6, 13]), tmp_path / "out")
    for m in stage_models(tmp_path / "out"):
        assert m.graph.doc_string == "graph doc"
        assert {p.key: p.value for p in m.graph.metadata_props} == {"origin": "tests"}
        assert {p.key: p.value for p in m.metadata_props} == {"author": "me"}


# --------------------------------------------------------------------------------------------------
# symbolic dims


def two_symbols_model() -> onnx.ModelProto:
    """``x: [batch, seq, 8]``; a Reshape merges batch and seq, another splits them back."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Reshape", ["r", "flat"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w"], ["m"], name="mm"),
        helper.make_node("Tanh", ["m"], ["t"], name="tanh"),
        helper.make_node("Reshape", ["t", "xs"], ["u"], name="unflatten"),
        helper.make_node("Add", ["u", "x"], ["y"], name="skip"),
    ]
    inits = [
        numpy_helper.from_array(np.array([-1, 8], np.int64), "flat"),
        numpy_helper.from_array(np.eye(8, dtype=np.float32) * 0.5, "w"),
    ]
    return make(nodes, [vi("x", ["batch", "seq", 8])], [vi("y", ["batch", "seq", 8])], inits)


def test_symbolic_dims_survive_on_every_boundary_and_are_not_frozen(tmp_path: Path) -> None:
    path = save(two_symbols_model(), tmp_path / "sym.onnx")
    result = split(
        path,
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(3),
            profile=ProfileOptions(cost="static", shapes={"x": (2, 5, 8)}),
        ),
    )
    manifest = result.manifest
    assert dict(manifest.plan.profiled_input_shapes) == {"x": (2, 5, 8)}
    for entry, m in zip(manifest.stages, stage_models(tmp_path / "out"), strict=True):
        for t in entry.inputs + entry.outputs:
            assert t.shape is not None
            assert 2 not in t.shape and 5 not in t.shape, (entry.index, t)  # nothing frozen to 2x5
        for v in list(m.graph.input) + list(m.graph.output):
            dims = v.type.tensor_type.shape.dim
            assert not any(d.dim_value in (2, 5) for d in dims), (entry.index, v.name)
    boundary = {t.name: t.shape for s in manifest.stages for t in s.inputs}
    if "r" in boundary:
        assert boundary["r"] == ("batch", "seq", 8)
    for batch, seq in ((1, 1), (3, 7)):
        x = np.random.default_rng(0).standard_normal((batch, seq, 8)).astype(np.float32)
        assert_chain_equals(tmp_path / "out", path, {"x": x})


def test_boundary_of_unknown_rank_in_onnx_is_typed_by_onnxruntime_even_over_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The onnxruntime probe of a stage over 2 GB goes through a file (limit lowered to test it)."""
    import onnxpipe.export.boundary as boundary

    monkeypatch.setattr(boundary, "PROTOBUF_LIMIT", 10)
    path = save(contrib_model(), tmp_path / "c.onnx", check=False)
    view = load_model(path, check=False)
    assert view.tensor("g").elem_type == 0
    manifest = export_stages(view, plan_for(view, [0, 2, 4]), tmp_path / "out")
    (g,) = manifest.stages[0].outputs
    assert g.dtype == "float32" and g.shape is not None and len(g.shape) == 2
    assert_chain_equals(tmp_path / "out", path, feeds_for(view.proto))


def test_int_and_bool_boundaries(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"], name="gt"),
        helper.make_node("Cast", ["pos"], ["pi"], name="cast", to=TensorProto.INT64),
        helper.make_node("CumSum", ["pi", "axis"], ["cs"], name="cumsum"),
        helper.make_node("Not", ["pos"], ["neg"], name="not"),
        helper.make_node("Cast", ["neg"], ["ni"], name="cast2", to=TensorProto.INT64),
        helper.make_node("Sub", ["cs", "ni"], ["y"], name="sub"),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "axis"),
    ]
    model = make(nodes, [vi("x", ["N", 5])], [vi("y", ["N", 5], TensorProto.INT64)], inits)
    every_cut_chains_back(model, tmp_path, exact=True)


# --------------------------------------------------------------------------------------------------
# files as converters write them


def test_fp16_keep_io_types_is_sorted_on_load_and_verified_at_fp16_tolerance(tmp_path: Path) -> None:
    model = fp16_keep_io_model()
    path = save(model, tmp_path / "fp16.onnx", check=False)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(str(path))
    out = tmp_path / "split"
    result = split(path, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static")))
    assert any("out of topological order" in n and "sorted on load" in n for n in result.plan.notes)
    for m in stage_models(out):
        onnx.checker.check_model(m)
    report = verify(out, VerifyOptions(runs=2))
    fp16 = tolerance_for("float16")
    assert report.computes_in == "float16" and report.ok
    assert (report.rtol, report.atol) == (fp16.rtol, fp16.atol) and report.rtol > DEFAULT_RTOL
    assert any("computes in float16" in n for n in report.notes)
    given = verify(out, VerifyOptions(rtol=1e-3, atol=1e-4))  # a tolerance given still holds
    assert (given.rtol, given.atol) == (1e-3, 1e-4)


def test_constant_values_in_external_data_are_read_beside_the_model_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = constant_weights_model()
    path = save_external_constants(model, tmp_path / "model" / "model.onnx")
    stored = onnx.load(str(path), load_external_data=False)
    assert all(n.attribute[0].t.data_location == TensorProto.EXTERNAL for n in stored.graph.node[::4])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # onnx's own readers would look for model.onnx_data here
    out = tmp_path / "split"
    result = split(path, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(runs=2, warmup=1)))
    assert result.report is not None and result.report.ok
    assert_chain_equals(out, path, feeds_for(model, seed=2), exact=True)
    for m in stage_models(out):  # the stages hold their Constants' values themselves
        assert not any(a.t.data_location == TensorProto.EXTERNAL for n in m.graph.node for a in n.attribute)
    frozen = split(
        path,
        SplitOptions(
            out=tmp_path / "static",
            plan=PlanRequest(3),
            profile=ProfileOptions(cost="static", shapes={"x": (2, 16)}),
        ),
    )
    assert frozen.report is not None and frozen.report.ok
