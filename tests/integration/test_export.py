"""Tests of onnxpipe.export: valid stage files that chain back to the model, and an atomic output folder."""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.api import ExportOptions
from onnxpipe.core.errors import ExportError
from onnxpipe.export.outdir import staged_folder
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.stages import assign_stages
from onnxpipe.planning.types import Plan
from onnxpipe.verification.chain import StageChain

OPSET = [helper.make_opsetid("", 17)]


# --------------------------------------------------------------------------------------------------
# helpers


def plan_for(view: ModelView, bounds: Sequence[int]) -> Plan:
    """A plan with the given bounds over the compute nodes (no profile: made-up costs)."""
    k = len(bounds) - 1
    sizes = {name: t.nbytes() for name, t in view.tensors.items()}
    compute = [0.001 * (s + 1) for s in range(k)]
    stages = assign_stages(view, bounds, sizes, compute, [0.0] * k)
    return Plan(
        model_sha256=view.sha256,
        stages=stages,
        bottleneck_seconds=max(compute),
        lower_bound_seconds=sum(compute) / k,
        cost_source="test",
        threads=1,
        bandwidth_bytes_per_s=math.inf,
        input_shapes={},
        tensor_bytes=sizes,
    )


def even_bounds(m: int, k: int) -> list[int]:
    return [round(i * m / k) for i in range(k + 1)]


def save(model: onnx.ModelProto, path: Path, *, full_check: bool = True) -> Path:
    onnx.checker.check_model(model, full_check=full_check)
    onnx.save_model(model, str(path))
    return path


def run_model(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_chain_equals_model(out: Path, model: Path, feeds: dict[str, np.ndarray]) -> None:
    expected = run_model(model, feeds)
    with StageChain.from_manifest(out) as chain:
        actual = chain.run(feeds)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def stage_models(out: Path) -> list[onnx.ModelProto]:
    manifest = load_manifest(out)
    return [onnx.load(str(out / s.file)) for s in manifest.stages]


def residual_model() -> onnx.ModelProto:
    """An MLP with skips over one and over several stages, a Constant read by several stages, and a
    ``Shape`` of a static weight (``start=-1``) feeding ``ConstantOfShape``; dynamic ``batch``."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), f"w{i}")
        for i in range(4)
    ]
    value = numpy_helper.from_array(np.full((8,), 0.5, np.float32))
    nodes = [
        helper.make_node("Constant", [], ["c"], name="scale", value=value),
        helper.make_node("Shape", ["w3"], ["w3_cols"], name="shape_w3", start=-1),
        helper.make_node(
            "ConstantOfShape",
            ["w3_cols"],
            ["bias"],
            name="bias_fill",
            value=numpy_helper.from_array(np.array([0.1], np.float32)),
        ),
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
        helper.make_node("Relu", ["h0"], ["r0"], name="relu0"),
        helper.make_node("MatMul", ["r0", "w1"], ["h1"], name="mm1"),
        helper.make_node("Mul", ["h1", "c"], ["h1s"], name="scale1"),
        helper.make_node("Add", ["h1s", "r0"], ["a1"], name="skip1"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "bias"], ["h2b"], name="bias2"),
        helper.make_node("Relu", ["h2b"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["h3"], name="mm3"),
        helper.make_node("Mul", ["h3", "c"], ["h3s"], name="scale3"),
        helper.make_node("Add", ["h3s", "r0"], ["y"], name="long_skip"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("r1", TensorProto.FLOAT, ["batch", 8]),
        ],
        initializer=weights,
    )
    model = helper.make_model(
        graph, opset_imports=OPSET, producer_name="onnxpipe-tests", producer_version="7", doc_string="doc"
    )
    model.model_version = 3
    model.domain = "ai.onnxpipe.test"
    helper.set_model_props(model, {"author": "tests"})
    return model


@pytest.fixture
def residual_path(tmp_path: Path) -> Path:
    return save(residual_model(), tmp_path / "residual.onnx")


def feeds_x(batch: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, 8)).astype(np.float32)}


# --------------------------------------------------------------------------------------------------
# stage contents


@pytest.mark.parametrize("k", [2, 3, 4])
def test_residual_split_chains_back_to_the_model(residual_path: Path, tmp_path: Path, k: int) -> None:
    view = load_model(residual_path)
    plan = plan_for(view, even_bounds(len(view.compute_nodes), k))
    out = tmp_path / "out"
    manifest = export_stages(view, plan, out)

    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [f"stage_{i}.onnx" for i in range(k)]
    assert manifest == load_manifest(out)
    models = stage_models(out)
    for i, m in enumerate(models):
        onnx.checker.check_model(m, full_check=True)
        assert m.graph.name == f"residual_stage{i}"
        assert m.ir_version == view.proto.ir_version
        assert list(m.opset_import) == list(view.proto.opset_import)
        assert (m.producer_name, m.producer_version, m.domain, m.model_version, m.doc_string) == (
            "onnxpipe-tests",
            "7",
            "ai.onnxpipe.test",
            3,
            "doc",
        )
        assert {p.key: p.value for p in m.metadata_props} == {"author": "tests"}
        assert [t.name for t in m.graph.input] == list(plan.stages[i].inputs)
        assert [t.name for t in m.graph.output] == list(plan.stages[i].outputs)
    # every compute node in exactly one stage, in order; constant producers are copies
    constants = {"scale", "shape_w3", "bias_fill"}
    placed = [n.name for m in models for n in m.graph.node if n.name not in constants]
    assert placed == [n.name for n in view.compute_nodes]
    # the long skip: r0 leaves stage 0 once and enters the last stage directly
    last = manifest.stages[-1]
    assert "r0" in [t.name for t in last.inputs]
    r0 = next(t for t in manifest.stages[0].outputs if t.name == "r0")
    assert k - 1 in r0.consumers
    assert_chain_equals_model(out, residual_path, feeds_x())


def test_constant_producers_are_copied_and_shape_becomes_constant(
    residual_path: Path, tmp_path: Path
) -> None:
    view = load_model(residual_path)
    plan = plan_for(view, even_bounds(len(view.compute_nodes), 3))
    export_stages(view, plan, tmp_path / "out")
    models = stage_models(tmp_path / "out")
    readers_of_c = [i for i, s in enumerate(plan.stages) if "scale" in s.constant_nodes]
    assert len(readers_of_c) >= 2  # the Constant is read by several stages, each has its own copy
    for i in readers_of_c:
        assert any(n.name == "scale" and n.op_type == "Constant" for n in models[i].graph.node)
    with_bias = [m for m in models if any(n.name == "bias_fill" for n in m.graph.node)]
    assert len(with_bias) == 1
    shape_node = next(n for n in with_bias[0].graph.node if n.name == "shape_w3")
    assert shape_node.op_type == "Constant" and list(shape_node.output) == ["w3_cols"]
    assert numpy_helper.to_array(shape_node.attribute[0].t).tolist() == [8]  # start=-1 honoured
    # constant nodes come first, and no stage receives a constant over the cut
    for m in models:
        ops = [n.name in {"scale", "shape_w3", "bias_fill"} for n in m.graph.node]
        assert ops == sorted(ops, reverse=True)
        assert not {"c", "bias", "w3_cols"} & {t.name for t in m.graph.input}
    # only the weights a stage reads
    for s, m in zip(plan.stages, models, strict=True):
        reads = {t for name in s.node_names for t in view.node_by_name[name].reads}
        assert {t.name for t in m.graph.initializer} == reads & set(view.initializers)


def test_symbolic_dims_stay_symbolic_on_boundary_tensors(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    export_stages(view, plan_for(view, even_bounds(len(view.compute_nodes), 3)), tmp_path / "out")
    manifest = load_manifest(tmp_path / "out")
    for m, entry in zip(stage_models(tmp_path / "out"), manifest.stages, strict=True):
        for vi in list(m.graph.input) + list(m.graph.output):
            dims = vi.type.tensor_type.shape.dim
            assert dims[0].dim_param == "batch" and dims[1].dim_value == 8, vi.name
        for t in entry.inputs + entry.outputs:
            assert t.shape == ("batch", 8) and t.dtype == "float32"
    # the stages run at a batch size nobody profiled
    assert_chain_equals_model(tmp_path / "out", tmp_path / "residual.onnx", feeds_x(batch=5))


@pytest.mark.parametrize("name", ["resnet50", pytest.param("inception_v2", marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize(
    "k", [pytest.param(2, marks=pytest.mark.exhaustive), 3, pytest.param(4, marks=pytest.mark.exhaustive)]
)
def test_ir3_light_models(light_model: Callable[[str], Path], tmp_path: Path, name: str, k: int) -> None:
    path = light_model(name)
    view = load_model(path)
    assert view.proto.ir_version == 3
    plan = plan_for(view, even_bounds(len(view.compute_nodes), k))
    out = tmp_path / "out"
    export_stages(view, plan, out)
    for m in stage_models(out):
        assert m.ir_version == 4  # IR 3 would require every initializer to be a graph input too
        inits = {t.name for t in m.graph.initializer}
        assert inits and not inits & {t.name for t in m.graph.input}
    (input_name,) = view.inputs
    shape = view.tensors[input_name].shape
    assert shape is not None
    x = np.random.default_rng(0).standard_normal([int(d) for d in shape if isinstance(d, int)])
    assert_chain_equals_model(out, path, {input_name: x.astype(np.float32)})


def if_model() -> onnx.ModelProto:
    """An If whose branches read a tensor of an earlier stage, an initializer and a Constant, all from
    the outer graph and nowhere else."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["s", "w"], ["t_out"], name="then_add")],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, ["batch", 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Mul", ["s", "c"], ["e_out"], name="else_mul")],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, ["batch", 4])],
    )
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["c"],
            name="c_const",
            value=numpy_helper.from_array(np.full((4,), -2.0, np.float32)),
        ),
        helper.make_node("Relu", ["x"], ["h"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("ReduceSum", ["h"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Abs", ["branch"], ["y"], name="abs"),
    ]
    graph = helper.make_graph(
        nodes,
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[
            numpy_helper.from_array(np.array(1.0, np.float32), "zero"),
            numpy_helper.from_array(np.arange(4, dtype=np.float32), "w"),
        ],
    )
    return helper.make_model(graph, opset_imports=OPSET)


def test_if_branches_reading_outer_tensors(tmp_path: Path) -> None:
    path = save(if_model(), tmp_path / "if.onnx")
    view = load_model(path)
    names = [n.name for n in view.compute_nodes]
    cut = names.index("if")
    plan = plan_for(view, [0, cut, len(names)])
    assert set(plan.stages[1].node_names) == {"if", "abs"}
    assert set(plan.stages[1].inputs) == {"cond", "s"}  # s is read only inside the branches
    export_stages(view, plan, tmp_path / "out")
    stage1 = stage_models(tmp_path / "out")[1]
    assert {t.name for t in stage1.graph.initializer} == {"w"}
    assert "c_const" in [n.name for n in stage1.graph.node]
    for x in (np.ones((2, 4), np.float32), -np.ones((2, 4), np.float32)):  # both branches
        assert_chain_equals_model(tmp_path / "out", path, {"x": x})


def external_model(tmp_path: Path) -> Path:
    """Three 32x32 MatMuls (4 KiB weights each) saved with their weights in ``model.onnx.data``."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, f"w{i}")
        for i in range(3)
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
        helper.make_node("Tanh", ["h0"], ["t0"], name="tanh0"),
        helper.make_node("MatMul", ["t0", "w1"], ["h1"], name="mm1"),
        helper.make_node("Tanh", ["h1"], ["t1"], name="tanh1"),
        helper.make_node("MatMul", ["t1", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    path = tmp_path / "src" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx.data")
    assert (path.parent / "model.onnx.data").stat().st_size == 3 * 4096
    return path


@pytest.mark.parametrize("mode", ["always", "never", "auto"])
def test_external_data_modes(tmp_path: Path, mode: str) -> None:
    path = external_model(tmp_path)
    view = load_model(path)
    plan = plan_for(view, [0, 2, 4, 5])  # mm0 tanh0 | mm1 tanh1 | mm2
    out = tmp_path / "out"
    manifest = export_stages(view, plan, out, ExportOptions(external_data=mode))
    for entry in manifest.stages:
        data = out / f"stage_{entry.index}.onnx.data"
        if mode == "never":
            assert entry.external_data is None and not data.exists()
            assert (out / entry.file).stat().st_size > 4096
        else:  # "auto" goes external because the source kept its weights outside
            assert entry.external_data == data.name
            assert data.stat().st_size == 4096  # only this stage's weight
            assert (out / entry.file).stat().st_size < 4096
    x = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)
    assert_chain_equals_model(out, path, {"x": x})


def functions_model() -> onnx.ModelProto:
    """``local.Outer`` calls ``local.AddMul``; both are local functions; ``local.Unused`` is not called."""
    add_mul = helper.make_function(
        "local",
        "AddMul",
        ["X", "Y"],
        ["Z"],
        [helper.make_node("Add", ["X", "Y"], ["T"]), helper.make_node("Mul", ["T", "T"], ["Z"])],
        OPSET,
    )
    outer = helper.make_function(
        "local",
        "Outer",
        ["A"],
        ["B"],
        [helper.make_node("AddMul", ["A", "A"], ["B"], domain="local")],
        [*OPSET, helper.make_opsetid("local", 1)],
    )
    unused = helper.make_function(
        "local", "Unused", ["A"], ["B"], [helper.make_node("Neg", ["A"], ["B"])], OPSET
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu"),
            helper.make_node("Outer", ["h"], ["y"], name="outer", domain="local"),
        ],
        "funcs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(
        graph, opset_imports=[*OPSET, helper.make_opsetid("local", 1)], functions=[add_mul, outer, unused]
    )


def test_local_functions_travel_with_the_stage_that_calls_them(tmp_path: Path) -> None:
    path = save(functions_model(), tmp_path / "funcs.onnx")
    view = load_model(path)
    export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    s0, s1 = stage_models(tmp_path / "out")
    assert list(s0.functions) == []
    assert [f.name for f in s1.functions] == ["AddMul", "Outer"]
    for m in (s0, s1):
        assert list(m.opset_import) == list(view.proto.opset_import)
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    assert_chain_equals_model(tmp_path / "out", path, {"x": x})


def test_sparse_initializer_is_carried(tmp_path: Path) -> None:
    dense = np.zeros((4, 4), np.float32)
    dense[0, 1], dense[2, 3] = 1.5, -2.0
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sw"),
        numpy_helper.from_array(np.array([1, 11], np.int64), "sw_idx"),
        [4, 4],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu"),
            helper.make_node("MatMul", ["h", "sw"], ["y"], name="mm"),
        ],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        sparse_initializer=[sparse],
    )
    # onnx's shape inference does not see sparse initializers: no full check
    path = save(helper.make_model(graph, opset_imports=OPSET), tmp_path / "sparse.onnx", full_check=False)
    view = load_model(path)
    export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    s0, s1 = stage_models(tmp_path / "out")
    assert len(s0.graph.sparse_initializer) == 0 and len(s1.graph.sparse_initializer) == 1
    assert_chain_equals_model(tmp_path / "out", path, {"x": np.ones((2, 4), np.float32)})


def test_manifest_records_the_flows(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    plan = plan_for(view, [0, 4, 8, 12])
    manifest = export_stages(view, plan, tmp_path / "out", ExportOptions(microbatches=4))
    assert manifest.source.file == "residual.onnx" and manifest.source.path == "../residual.onnx"
    assert manifest.source.sha256 == view.sha256
    assert [(o.name, o.produced_by) for o in manifest.model_outputs] == [("y", 2), ("r1", 1)]
    s1 = manifest.stages[1]
    r1 = next(t for t in s1.outputs if t.name == "r1")
    assert r1.consumers == ("model_output",)
    assert [(t.name, t.source) for t in s1.inputs] == [("r0", 0), ("a1", 0)] or all(
        t.source == 0 for t in s1.inputs
    )
    assert all(t.bytes_per_sample == 32 for s in manifest.stages for t in s.inputs + s.outputs)
    assert [s.node_count for s in manifest.stages] == [4, 4, 4]
    assert manifest.schedule.microbatches == 4 and len(manifest.schedule.stages) == 3
    assert manifest.schedule.first_latency == pytest.approx(0.006)
    assert manifest.plan.bandwidth_bytes_per_s == math.inf and manifest.plan.k == 3


def test_stage_failing_onnxruntime_names_stage_and_node(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu"),
            helper.make_node("Frobnicate", ["h"], ["y"], name="frob", domain="ai.onnxpipe.unknown"),
        ],
        "unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("ai.onnxpipe.unknown", 1)])
    path = tmp_path / "unknown.onnx"
    onnx.save_model(model, str(path))
    view = load_model(path, check=False)
    expected = r"stage_1\.onnx: stage 1 does not load in onnxruntime at node 'frob' \(Frobnicate\)"
    with pytest.raises(ExportError, match=expected):
        export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["unknown.onnx"]


# --------------------------------------------------------------------------------------------------
# the output folder


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".onnxpipe-" in p.name)


def test_non_empty_folder_is_refused(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError) as info:
        export_stages(view, plan_for(view, [0, 6, 12]), out)
    assert str(info.value) == (  # no `force=True` to suggest: it would refuse the folder too
        f"{out}: exists, is not empty and holds no earlier split (manifest.json); choose another `out` or "
        "empty it (`force=True` replaces only an earlier split)"
    )
    assert info.value.field == "out" and [o.key for o in info.value.options] == ["out", "force"]
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert leftovers(tmp_path) == []


def test_empty_folder_is_used(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    (tmp_path / "out").mkdir()
    export_stages(view, plan_for(view, [0, 6, 12]), tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_force_replaces_the_folder(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "stage_5.onnx").write_text("old")
    (out / "manifest.json").write_text("{}")  # an earlier split: --force replaces only those
    export_stages(view, plan_for(view, [0, 6, 12]), out, ExportOptions(force=True))
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "stage_0.onnx", "stage_1.onnx"]
    assert leftovers(tmp_path) == []


def test_an_earlier_split_is_refused_naming_what_force_replaces(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    out = tmp_path / "out"
    export_stages(view, plan_for(view, [0, 4, 8, 12]), out)
    (out / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(ExportError) as info:
        export_stages(view, plan_for(view, [0, 6, 12]), out)
    assert str(info.value) == (
        f"{out}: exists and holds an earlier split (manifest.json, stage_0.onnx, stage_1.onnx and 1 more); "
        "choose another `out` or pass `force=True` to replace it (the chat_template.jinja you added stay)"
    )


def test_force_carries_the_files_the_user_added_across(residual_path: Path, tmp_path: Path) -> None:
    """Issue 39: a chat template put into a split (as ``generate --chat`` suggests) does not stop the next
    ``--force``, and is in the new split."""
    view = load_model(residual_path)
    out = tmp_path / "out"
    export_stages(view, plan_for(view, [0, 4, 8, 12]), out)
    (out / "chat_template.jinja").write_text("{{ messages }}")
    (out / "generation_config.json").write_text('{"eos_token_id": 2}')
    export_stages(view, plan_for(view, [0, 6, 12]), out, ExportOptions(force=True))
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "generation_config.json",
        "manifest.json",
        "stage_0.onnx",
        "stage_1.onnx",
    ]
    assert (out / "chat_template.jinja").read_text() == "{{ messages }}"
    assert len(load_manifest(out).stages) == 2 and leftovers(tmp_path) == []
    (out / "NOTES.txt").write_text("mine")  # not a file a split folder is given: refused, not deleted
    with pytest.raises(ExportError, match=r"holds NOTES\.txt, which no split wrote"):
        export_stages(view, plan_for(view, [0, 4, 12]), out, ExportOptions(force=True))
    assert (out / "NOTES.txt").read_text() == "mine" and len(load_manifest(out).stages) == 2


def test_a_file_the_user_added_that_the_new_split_writes_otherwise_stops_the_swap(
    residual_path: Path, tmp_path: Path
) -> None:
    view = load_model(residual_path)
    out = tmp_path / "out"
    export_stages(view, plan_for(view, [0, 6, 12]), out)
    (out / "chat_template.jinja").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with (
        pytest.raises(
            ExportError, match=r"holds chat_template\.jinja, which its split did not write and this"
        ),
        staged_folder(out) as tmp,
    ):
        (tmp / "manifest.json").write_text("{}")
        (tmp / "chat_template.jinja").write_text("the model's")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and leftovers(tmp_path) == []
    with staged_folder(out) as tmp:  # the same file: nothing to lose
        (tmp / "manifest.json").write_text("{}")
        (tmp / "chat_template.jinja").write_text("mine")
    assert sorted(p.name for p in out.iterdir()) == ["chat_template.jinja", "manifest.json"]


@pytest.mark.skipif(sys.platform != "linux", reason="renameat2's RENAME_EXCHANGE is Linux's")
def test_force_swaps_the_folders_in_one_step(
    residual_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old split is never absent: the new folder takes its place in one call, not two renames."""
    view = load_model(residual_path)
    out = tmp_path / "out"
    export_stages(view, plan_for(view, [0, 4, 8, 12]), out)

    def no_rename(*args: object) -> None:
        raise AssertionError(f"renamed in two steps: {args}")

    monkeypatch.setattr(os, "rename", no_rename)
    export_stages(view, plan_for(view, [0, 6, 12]), out, ExportOptions(force=True))
    assert len(load_manifest(out).stages) == 2 and leftovers(tmp_path) == []


def test_force_never_deletes_the_source_model(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    with pytest.raises(ExportError, match=r"holds the source model residual\.onnx"):
        export_stages(view, plan_for(view, [0, 6, 12]), tmp_path, ExportOptions(force=True))
    assert residual_path.is_file()


@pytest.mark.parametrize("failing_call", [1, 2])
def test_disk_full_leaves_the_old_folder_and_no_temporary_one(
    residual_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    view = load_model(residual_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "stage_5.onnx").write_text("old")
    (out / "manifest.json").write_text("{}")  # an earlier split: --force replaces only those
    real_save = onnx.save_model
    calls = []

    def save_model(*args: object, **kwargs: object) -> None:
        calls.append(args[1])
        if len(calls) == failing_call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx, "save_model", save_model)
    with pytest.raises(ExportError) as info:
        export_stages(view, plan_for(view, [0, 6, 12]), out, ExportOptions(force=True))
    message = str(info.value)
    assert message == (
        f"{out / f'stage_{failing_call - 1}.onnx'}: cannot be written (No space left on device: disk full); "
        f"{out} is left as it was; free some space or choose another `out`"
    )
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "stage_5.onnx"]
    assert (out / "stage_5.onnx").read_text() == "old"
    assert leftovers(tmp_path) == []


def test_failure_without_an_old_folder_leaves_nothing(
    residual_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = load_model(residual_path)

    def save_model(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(onnx, "save_model", save_model)
    out = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(ExportError, match=r"stage_0\.onnx: cannot be written"):
        export_stages(view, plan_for(view, [0, 6, 12]), out)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["residual.onnx"]


def test_plan_of_another_model_is_refused(residual_path: Path, tmp_path: Path) -> None:
    view = load_model(residual_path)
    other = load_model(save(if_model(), tmp_path / "if.onnx"))
    with pytest.raises(ExportError, match="the plan was made for another model"):
        export_stages(view, plan_for(other, [0, 3, 6]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_boundary_type_unknown_to_onnx_comes_from_onnxruntime(tmp_path: Path) -> None:
    """``com.microsoft.Gelu`` is unknown to ONNX shape inference: the cut tensor's type is asked of ORT."""
    graph = helper.make_graph(
        [
            helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain="com.microsoft"),
            helper.make_node("Relu", ["g"], ["y"], name="relu"),
        ],
        "contrib",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
    )
    model = helper.make_model(graph, opset_imports=[*OPSET, helper.make_opsetid("com.microsoft", 1)])
    path = save(model, tmp_path / "contrib.onnx", full_check=False)
    view = load_model(path)
    assert view.tensor("g").elem_type == 0
    manifest = export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    (g,) = manifest.stages[0].outputs
    assert g.name == "g" and g.dtype == "float32" and g.shape is not None and len(g.shape) == 2
    x = np.random.default_rng(4).standard_normal((3, 6)).astype(np.float32)
    assert_chain_equals_model(tmp_path / "out", path, {"x": x})


@pytest.mark.parametrize("k", [2, 3])
def test_ml_model_with_sequence_of_maps_output(iris_path: Path, tmp_path: Path, k: int) -> None:
    """``ai.onnx.ml``: ZipMap's output is a sequence of maps; Normalizer's output has no known rank in
    ONNX or onnxruntime inference, so cutting before ZipMap needs the rank observed by a run."""
    view = load_model(iris_path)
    manifest = export_stages(view, plan_for(view, even_bounds(len(view.compute_nodes), k)), tmp_path / "o")
    out = {o.name: o for o in manifest.model_outputs}
    assert out["probabilities"].dtype == "seq(map(int64,tensor(float32)))"
    assert out["probabilities"].shape is None
    if k == 3:
        (cut,) = manifest.stages[2].inputs
        assert cut.name == "probability_tensor_normalized" and cut.shape == (None, None)
    x = np.random.default_rng(5).standard_normal((3, 2)).astype(np.float32)
    expected = run_model(iris_path, {"float_input": x})
    with StageChain.from_manifest(tmp_path / "o") as chain:
        actual = chain.run({"float_input": x})
    np.testing.assert_array_equal(actual["label"], expected["label"])
    assert actual["probabilities"] == expected["probabilities"]


def test_constants_listed_after_their_readers_are_reordered(residual_path: Path, tmp_path: Path) -> None:
    """The view may place a constant producer anywhere (it is copied where it is read); stage graphs
    must still list each constant after the constants it reads (seen on torch-exported GPT-2)."""
    view = load_model(residual_path)
    nodes = sorted(view.nodes, key=lambda n: n.name != "bias_fill")  # ConstantOfShape before its Shape
    view = dataclasses.replace(
        view, nodes=tuple(dataclasses.replace(n, position=p) for p, n in enumerate(nodes))
    )
    assert [n.name for n in view.nodes][:2] == ["bias_fill", "scale"]
    out = tmp_path / "out"
    export_stages(view, plan_for(view, even_bounds(len(view.compute_nodes), 2)), out)
    stage = next(m for m in stage_models(out) if any(n.name == "bias_fill" for n in m.graph.node))
    names = [n.name for n in stage.graph.node]
    assert names.index("shape_w3") < names.index("bias_fill")
    assert_chain_equals_model(out, residual_path, feeds_x())


def test_dims_written_as_minus_one_become_unknown(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu"),
            helper.make_node("Neg", ["h"], ["y"], name="neg"),
        ],
        "minus_one",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])],
    )
    path = save(helper.make_model(graph, opset_imports=OPSET), tmp_path / "m.onnx", full_check=False)
    view = load_model(path)
    manifest = export_stages(view, plan_for(view, [0, 1, 2]), tmp_path / "out")
    assert manifest.model_inputs[0].shape == (None, 4)
    (h,) = manifest.stages[0].outputs
    assert h.bytes_per_sample >= 0
    (stage0, _) = stage_models(tmp_path / "out")
    dim = stage0.graph.output[0].type.tensor_type.shape.dim[0]
    assert not dim.HasField("dim_value") and not dim.HasField("dim_param")
    assert_chain_equals_model(tmp_path / "out", path, {"x": np.ones((3, 4), np.float32)})


def test_auto_goes_external_above_the_size_limit_and_never_refuses(
    residual_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 2 GB logic with small limits (a real >2 GB model was checked by hand: see the report)."""
    import onnxpipe.export.stages as export

    view = load_model(residual_path)
    plan = plan_for(view, [0, 6, 12])
    monkeypatch.setattr(export, "AUTO_EXTERNAL_BYTES", 600)  # stage 0 holds 2 weights of 256 B, stage 1 two
    manifest = export_stages(view, plan, tmp_path / "auto")
    assert [s.external_data for s in manifest.stages] == [None, None]  # 256 B weights stay inline (< 1 KiB)
    monkeypatch.setattr(export, "EXTERNAL_THRESHOLD", 0)
    monkeypatch.setattr(export, "AUTO_EXTERNAL_BYTES", 100)
    manifest = export_stages(view, plan, tmp_path / "auto2")
    assert [s.external_data for s in manifest.stages] == ["stage_0.onnx.data", "stage_1.onnx.data"]
    monkeypatch.setattr(export, "PROTOBUF_LIMIT", 100)
    with pytest.raises(ExportError, match=r"stage_0\.onnx: stage 0 holds .* over protobuf's 2 GB limit"):
        export_stages(view, plan, tmp_path / "never", ExportOptions(external_data="never"))
    assert not (tmp_path / "never").exists()
    assert_chain_equals_model(tmp_path / "auto2", residual_path, feeds_x())
