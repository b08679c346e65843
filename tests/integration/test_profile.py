"""Tests of onnxpipe.cost.measure: per-node times at ENABLE_ALL mapped back to the original nodes."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.core.errors import ProfileError, UsageError
from onnxpipe.core.progress import Progress
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.model import ModelView

_rng = np.random.default_rng(0)


def _vi(name: str, shape: list[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name: str, shape: tuple[int, ...], positive: bool = False) -> onnx.TensorProto:
    values = _rng.standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(np.abs(values) + 0.5 if positive else values, name)


def _model(nodes: list[onnx.NodeProto], inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _conv_model() -> onnx.ModelProto:
    """Conv+BN+Relu, Conv+Relu, Conv+Add(residual): onnxruntime fuses each group into one NCHWc Conv and
    renames the tensors between them, so only values tell the groups apart.  Nodes are unnamed."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "r2"], ["y"]),
    ]
    inits = [
        _init("w1", (16, 3, 3, 3)),
        _init("b1", (16,)),
        _init("s", (16,)),
        _init("bb", (16,)),
        _init("m", (16,)),
        _init("v", (16,), positive=True),
        _init("w2", (32, 16, 3, 3)),
        _init("w3", (32, 32, 3, 3)),
    ]
    return _model(nodes, [_vi("x", ["N", 3, "H", "W"])], [_vi("y", ["N", 32, "H", "W"])], inits)


def _matmul_model() -> onnx.ModelProto:
    """MatMul+Add (fused into one Gemm/FusedMatMul), then Relu and a Constant feeding a Mul."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["lin"], name="add"),
        helper.make_node("Relu", ["lin"], ["act"], name="relu"),
        helper.make_node(
            "Constant", [], ["two"], value=numpy_helper.from_array(np.array(2.0, np.float32)), name="two"
        ),
        helper.make_node("Mul", ["act", "two"], ["y"], name="scale"),
    ]
    return _model(
        nodes, [_vi("x", ["batch", 64])], [_vi("y", None)], [_init("w", (64, 128)), _init("b", (128,))]
    )


@pytest.fixture(scope="module")
def conv_profile() -> tuple[ModelView, Profile]:
    view = view_from_proto(_conv_model())
    return view, profile_model(view, runs=3, warmup=1, shapes={"x": (1, 3, 32, 32)})


# ---------------------------------------------------------------------------------------- attribution


def test_every_compute_node_gets_a_time_summing_to_the_total(conv_profile: tuple[ModelView, Profile]) -> None:
    view, prof = conv_profile
    assert list(prof.node_seconds) == [n.name for n in view.compute_nodes]
    assert all(s >= 0 for s in prof.node_seconds.values())
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)
    assert prof.total_seconds > 0
    assert prof.source == "profile" and prof.threads == 1 and prof.runs == 3
    assert prof.input_shapes == {"x": (1, 3, 32, 32)}


def test_fused_conv_groups_become_regions(conv_profile: tuple[ModelView, Profile]) -> None:
    view, prof = conv_profile
    names = [n.name for n in view.compute_nodes]
    # three groups, told apart although onnxruntime renamed every tensor between them
    assert prof.regions == (tuple(names[0:3]), tuple(names[3:5]), tuple(names[5:7]))
    conv1, bn, relu1, conv2, _, conv3, _ = names
    # time is spread by FLOPs: each Conv dominates its group, and the bigger Convs cost more
    assert prof.node_seconds[conv1] > prof.node_seconds[bn] + prof.node_seconds[relu1]
    assert prof.node_seconds[conv3] > prof.node_seconds[conv1]
    assert prof.node_seconds[conv2] > prof.node_seconds[conv1]
    assert prof.exact_fraction < 0.05  # everything runs inside fused groups
    assert any("fused group" in note for note in prof.unattributed)


def test_tensor_bytes_are_measured(conv_profile: tuple[ModelView, Profile]) -> None:
    _, prof = conv_profile
    assert prof.tensor_bytes["x"] == 1 * 3 * 32 * 32 * 4
    assert prof.tensor_bytes["r1"] == 1 * 16 * 32 * 32 * 4
    assert prof.tensor_bytes["y"] == 1 * 32 * 32 * 32 * 4
    assert prof.tensor_bytes["w2"] == 32 * 16 * 3 * 3 * 4


def test_values_matched_in_chunks_give_the_same_regions(
    conv_profile: tuple[ModelView, Profile],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Big activations are exposed a few at a time; a 1-byte budget runs one tensor per session."""
    import onnxpipe.cost.measure

    view, prof = conv_profile
    monkeypatch.setattr(onnxpipe.cost.measure, "VALUE_CHUNK_BYTES", 1)
    chunked = profile_model(view, runs=1, warmup=0, shapes={"x": (1, 3, 32, 32)}, progress=True)
    assert chunked.regions == prof.regions
    assert chunked.tensor_bytes == prof.tensor_bytes
    err = capsys.readouterr().err  # progress went on, in log lines
    assert "profiled model: 0 warm-up run(s), then 1 timed twice: with onnxruntime's profiler" in err


def test_matmul_add_fusion_maps_back() -> None:
    view = view_from_proto(_matmul_model())
    prof = profile_model(view, runs=3, warmup=1, shapes={"x": (32, 64)})
    assert set(prof.node_seconds) == {"matmul", "add", "relu", "scale"}
    regions = {frozenset(r) for r in prof.regions}
    assert any({"matmul", "add"} <= r for r in regions)
    assert prof.node_seconds["matmul"] > prof.node_seconds["add"]
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)


def test_reorder_of_an_input_goes_to_its_neighbours() -> None:
    """A 16-channel input is reordered to NCHWc by a node of its own: no original node does that work."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    view = view_from_proto(
        _model(nodes, [_vi("x", [1, 16, 32, 32])], [_vi("y", None)], [_init("w", (16, 16, 3, 3))])
    )
    prof = profile_model(view, runs=2, warmup=1)
    assert prof.regions == (("conv", "relu"),)
    assert any(note.startswith("ReorderInput: work no original node does") for note in prof.unattributed)
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)


def test_merged_duplicate_branches_cost_nothing() -> None:
    """onnxruntime computes two identical branches once: one branch gets the time, the other none."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m1"], name="mm1"),
        helper.make_node("Relu", ["m1"], ["a1"], name="relu1"),
        helper.make_node("MatMul", ["x", "w"], ["m2"], name="mm2"),
        helper.make_node("Relu", ["m2"], ["a2"], name="relu2"),
        helper.make_node("Add", ["a1", "a2"], ["y"], name="add"),
    ]
    view = view_from_proto(_model(nodes, [_vi("x", [64, 64])], [_vi("y", None)], [_init("w", (64, 64))]))
    prof = profile_model(view, runs=2, warmup=1)
    zero = {n for n, s in prof.node_seconds.items() if s == 0.0}
    assert zero in ({"mm1", "relu1"}, {"mm2", "relu2"})
    assert prof.regions == ()  # no group spans both branches
    assert prof.exact_fraction == pytest.approx(1.0)
    assert any("cost 0" in note for note in prof.unattributed)


def test_node_medians_without_run_markers() -> None:
    from onnxpipe.cost.trace import node_medians

    def kernel(name: str, ts: int, dur: int) -> dict[str, object]:
        return {
            "cat": "Node",
            "name": f"{name}_kernel_time",
            "ts": ts,
            "dur": dur,
            "args": {"output_size": "8"},
        }

    runs = [{"cat": "Session", "name": "model_run", "ts": t, "dur": 50} for t in (0, 100, 200)]
    events = [kernel("a", 10, 99), kernel("a", 110, 5), kernel("b", 120, 1), kernel("a", 210, 7)]
    medians, sizes = node_medians(runs + events, 2)  # the first run is a warm-up
    assert medians == {"a": 6.0, "b": 0.5} and sizes == {"a": 8, "b": 8}
    medians, _ = node_medians(events, 2)
    assert medians == {"a": 6.0, "b": 1.0}


def test_external_weights_need_a_file() -> None:
    model = _matmul_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="w.bin")
    with pytest.raises(ProfileError, match="external files but the model was not loaded from a file"):
        profile_model(view_from_proto(model), runs=1, warmup=0)


def test_profiling_leaves_the_view_untouched() -> None:
    view = view_from_proto(_matmul_model())
    before = view.proto.SerializeToString()
    profile_model(view, runs=1, warmup=0)
    assert view.proto.SerializeToString() == before


def test_subgraph_model() -> None:
    """An If whose branches read outer tensors: its kernel time includes the branch it ran."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["a", "a"], ["t"], name="then_mul")], "then", [], [_vi("t", [4, 8])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Add", ["a", "a"], ["e"], name="else_add")], "else", [], [_vi("e", [4, 8])]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("If", ["cond"], ["y0"], then_branch=then_g, else_branch=else_g, name="if"),
        helper.make_node("Sigmoid", ["y0"], ["y"], name="sig"),
    ]
    view = view_from_proto(
        _model(nodes, [_vi("x", [4, 8]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [4, 8])])
    )
    prof = profile_model(view, runs=2, warmup=1)
    assert set(prof.node_seconds) == {"relu", "if", "sig"}
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)


def test_external_data_model_with_renamed_nodes(tmp_path: Path) -> None:
    """Weights in a separate file, unnamed nodes renamed by the view: onnxruntime sees the view's names."""
    path = tmp_path / "ext.onnx"
    onnx.save_model(
        _conv_model(), str(path), save_as_external_data=True, location="ext.onnx.data", size_threshold=0
    )
    view = load_model(path)
    assert any(t.data_location == TensorProto.EXTERNAL for t in view.proto.graph.initializer)
    prof = profile_model(view, runs=2, warmup=1, shapes={"x": (1, 3, 16, 16)})
    assert list(prof.node_seconds) == [n.name for n in view.compute_nodes]
    assert prof.model_name == "ext.onnx" and prof.model_sha256 == view.sha256
    assert len(prof.regions) == 3
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)


@pytest.mark.slow
@pytest.mark.exhaustive  # the fast lane attributes a conv model's profile (conv_profile)
def test_light_resnet50_is_fully_attributed(light_model: Callable[[str], Path]) -> None:
    """NCHWc renames nearly every tensor of ResNet-50; all its time still lands on original nodes."""
    view = load_model(light_model("resnet50"))
    prof = profile_model(view, runs=3, warmup=1)
    compute = {n.name for n in view.compute_nodes}
    assert set(prof.node_seconds) == compute
    assert sum(prof.node_seconds.values()) >= 0.99 * prof.total_seconds
    assert sum(prof.node_seconds.values()) == pytest.approx(prof.total_seconds, rel=1e-6)
    by_name = view.node_by_name
    assert len(prof.regions) >= 50  # one fused Conv(+BN+Relu+Sum) group per Conv
    for region in prof.regions:
        ops = [by_name[n].op_type for n in region]
        assert ops.count("Conv") == 1, ops
        assert len(region) <= 4
    convs = [n for n in view.compute_nodes if n.op_type == "Conv"]
    assert all(prof.node_seconds[n.name] > 0 for n in convs)
    assert not any("no original node" in note for note in prof.unattributed)


# ------------------------------------------------------------------------------------------- errors


def test_model_onnxruntime_cannot_run_raises_profile_error() -> None:
    nodes = [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob")]
    graph = helper.make_graph(nodes, "g", [_vi("x", [2])], [_vi("y", [2])])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    with pytest.raises(ProfileError, match=r"onnxruntime cannot load the model.*`cost=static`") as info:
        profile_model(view_from_proto(model), runs=1, warmup=0)
    assert "\n" not in str(info.value)


def test_unsupported_opset_raises_profile_error() -> None:
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])], opset=99
    )
    with pytest.raises(ProfileError, match=r"onnxruntime cannot load"):
        profile_model(view_from_proto(model), runs=1, warmup=0)


def test_run_failure_names_the_shapes() -> None:
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [_vi("x", ["n"])],
        [_vi("y", None)],
        [shape],
    )
    with pytest.raises(ProfileError, match=r"failed running.*x=\[7\].*`shapes="):
        profile_model(view_from_proto(model), runs=1, warmup=0, shapes={"x": (7,)})


def test_bad_arguments() -> None:
    view = view_from_proto(_matmul_model())
    with pytest.raises(UsageError, match=r"threads"):
        profile_model(view, threads=0)
    with pytest.raises(UsageError, match=r"runs"):
        profile_model(view, runs=0)


# ---------------------------------------------------------------------------------------- saved form


def test_json_round_trip(conv_profile: tuple[ModelView, Profile], tmp_path: Path) -> None:
    _, prof = conv_profile
    again = Profile.from_json(prof.to_json())
    assert again == prof
    path = tmp_path / "profile.json"
    prof.save(path)
    loaded = Profile.load(path)
    assert loaded == prof
    assert loaded.regions == prof.regions and isinstance(loaded.regions[0], tuple)
    assert loaded.input_shapes["x"] == (1, 3, 32, 32)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema_version=2), "schema_version 2"),
        (lambda d: d.pop("node_seconds"), "missing field 'node_seconds'"),
        (lambda d: d["node_seconds"].update(bad=-1.0), r"node_seconds\['bad'\]"),
        (lambda d: d.update(source="guess"), "source: expected one of profile, static, got 'guess'"),
        (lambda d: d.update(regions=[["only_one"]]), "regions"),
        (lambda d: d["tensor_bytes"].update(t=1.5), r"tensor_bytes\['t'\]"),
    ],
)
def test_from_json_rejects_bad_content(
    conv_profile: tuple[ModelView, Profile], edit: Callable[[dict[str, object]], object], message: str
) -> None:
    data = json.loads(conv_profile[1].to_json())
    edit(data)
    with pytest.raises(ProfileError, match=f"my.json: .*{message}"):
        Profile.from_json(json.dumps(data), source_name="my.json")


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match=r"p.json: not valid JSON"):
        Profile.load(bad)
    with pytest.raises(ProfileError, match=r"missing.json: cannot read"):
        Profile.load(tmp_path / "missing.json")


def test_check_matches_refuses_another_model(conv_profile: tuple[ModelView, Profile], tmp_path: Path) -> None:
    view, prof = conv_profile
    prof.check_matches(view)
    other = view_from_proto(_matmul_model())
    with pytest.raises(
        ProfileError, match=r"made for model .*not the in-memory model.*re-run onnxpipe profile"
    ):
        prof.check_matches(other)
    path = tmp_path / "profile.json"
    prof.save(path)
    with pytest.raises(ProfileError, match=r"^profile.json: made for"):
        Profile.load(path).check_matches(other)


# ------------------------------------------------------------------------------------------ progress


def test_progress_bar() -> None:
    out = io.StringIO()
    with Progress(4, "work", enabled=True, stream=out) as bar:
        for _ in range(4):
            bar.advance()
    assert "work: 4/4 steps in " in out.getvalue()  # not a terminal: plain lines a log can hold
    quiet = io.StringIO()
    with Progress(4, "work", enabled=False, stream=quiet) as bar:
        bar.advance()
    assert quiet.getvalue() == ""
