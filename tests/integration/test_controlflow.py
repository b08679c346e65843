"""If, Loop and Scan: bodies read outer tensors without listing them; those reads are real dependencies.

For every cut of each model the stage holding the control-flow node must receive (or contain) every
outer value its bodies read, to any depth, and the chained stages must equal the model on inputs that
take every branch.  Bodies are never cut: the node is copied whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import all_bounds, feeds_for, loop_model, nested_if_model, plan_for, save, scan_model

from onnxpipe.api import ExportOptions, PlanRequest, ProfileOptions, SplitOptions, split
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.verification.chain import StageChain


def expected_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_chain_equals(out: Path, path: Path, all_feeds: Sequence[dict[str, np.ndarray]]) -> None:
    with StageChain.from_manifest(out) as chain:
        for feeds in all_feeds:
            want = expected_outputs(path, feeds)
            got = chain.run(feeds)
            assert set(got) == set(want)
            for name, value in want.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def source_node(view: ModelView, name: str) -> onnx.NodeProto:
    return view.proto.graph.node[view.node_by_name[name].index]


def stage_node(out: Path, stage: int, name: str) -> onnx.NodeProto:
    model = onnx.load(str(out / f"stage_{stage}.onnx"))
    return next(n for n in model.graph.node if n.name == name)


# --------------------------------------------------------------------------------------------------
# If nested three deep


@pytest.fixture(scope="module")
def nested_if(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(nested_if_model(), tmp_path_factory.mktemp("nested_if") / "nested_if.onnx")


def branch_feeds() -> list[dict[str, np.ndarray]]:
    """Inputs that take each way through the three levels (cond1, cond2, cond3)."""
    rows = {
        "else1": -np.ones((2, 4)),  # sum < 0
        "then1 else2": np.full((2, 4), 0.1),  # sum > 0, max(relu) <= 1
        "then1 then2 else3": np.full((2, 4), 2.0),  # max(relu) > 1, min >= -1
        "then1 then2 then3": np.array([[3.0, 3.0, 3.0, -2.0], [1.0, 1.0, 1.0, 1.0]]),  # min < -1
    }
    return [{"x": v.astype(np.float32)} for v in rows.values()]


def test_outer_reads_of_nested_bodies_are_dependencies_of_the_node(nested_if: Path) -> None:
    view = load_model(nested_if)
    if1 = view.node_by_name["if1"]
    # read at levels 1, 2 and 3; t1 is made inside the level-1 body, so it is not an outer read
    assert set(if1.outer_inputs) == {"a", "b", "c", "cond2", "cond3", "k", "w"}
    assert set(if1.reads) == {"cond1", "a", "b", "c", "cond2", "cond3", "k", "w"}
    # conditions and the activations the bodies read come before the If in the order
    position = {n.name: n.position for n in view.nodes}
    for producer in ("relu", "sigmoid", "tanh", "cond2", "cond3"):
        assert position[producer] < if1.position


@pytest.mark.parametrize("k", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
def test_every_cut_of_nested_ifs_chains_back(nested_if: Path, tmp_path: Path, k: int) -> None:
    view = load_model(nested_if)
    compute = [n.name for n in view.compute_nodes]
    bounds_seen = 0
    for bounds in all_bounds(len(compute), k):
        if len(bounds) - 1 != k:
            continue
        bounds_seen += 1
        plan = plan_for(view, bounds)
        out = tmp_path / f"out_{'_'.join(map(str, bounds))}"
        export_stages(view, plan, out)
        s = next(spec for spec in plan.stages if "if1" in spec.node_names)
        earlier = {t for spec in plan.stages[: s.index] for t in spec.outputs}
        for t in ("a", "b", "c", "cond2", "cond3"):  # made by compute nodes: received or made here
            inside = any(t in view.node_by_name[n].outputs for n in s.node_names)
            assert inside or (t in s.inputs and t in earlier), (bounds, t)
        assert "k_const" in s.constant_nodes  # the Constant the level-3 body reads is copied in
        stage_model = onnx.load(str(out / f"stage_{s.index}.onnx"))
        assert "w" in {t.name for t in stage_model.graph.initializer}  # the weight the bodies read
        # never cut inside a body: the If is copied whole, bodies and nested bodies included
        assert stage_node(out, s.index, "if1") == source_node(view, "if1")
        assert_chain_equals(out, nested_if, branch_feeds())
    assert bounds_seen >= 10


def test_nested_ifs_through_the_api_with_measured_costs(nested_if: Path, tmp_path: Path) -> None:
    result = split(
        nested_if,
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(3),
            profile=ProfileOptions(cost="profile", runs=2, warmup=1),
        ),
    )
    assert result.report is not None and result.report.ok
    assert_chain_equals(tmp_path / "out", nested_if, branch_feeds())


# --------------------------------------------------------------------------------------------------
# Loop and Scan


def test_loop_outer_reads_cross_every_cut(tmp_path: Path) -> None:
    path = save(loop_model(), tmp_path / "loop.onnx")
    view = load_model(path)
    loop = view.node_by_name["loop"]
    assert set(loop.outer_inputs) == {"a", "w"}
    feeds = [feeds_for(view.proto, seed, N=n) for seed, n in ((0, 2), (1, 5))]
    compute = [n.name for n in view.compute_nodes]
    for bounds in all_bounds(len(compute), 3):
        plan = plan_for(view, bounds)
        out = tmp_path / f"out_{'_'.join(map(str, bounds))}"
        manifest = export_stages(view, plan, out)
        s = next(spec for spec in plan.stages if "loop" in spec.node_names)
        if "relu" not in s.node_names:
            assert "a" in s.inputs  # read only inside the body, still received
        assert stage_node(out, s.index, "loop") == source_node(view, "loop")
        entry = manifest.stages[s.index]
        assert "w" not in {t.name for t in entry.inputs}  # a weight is carried, never sent
        assert_chain_equals(out, path, feeds)


def test_scan_outer_read_and_dynamic_time_axis(tmp_path: Path) -> None:
    path = save(scan_model(), tmp_path / "scan.onnx")
    view = load_model(path)
    assert set(view.node_by_name["scan"].outer_inputs) == {"g"}
    compute = [n.name for n in view.compute_nodes]
    for bounds in all_bounds(len(compute), 3):
        out = tmp_path / f"out_{'_'.join(map(str, bounds))}"
        manifest = export_stages(view, plan_for(view, bounds), out)
        for entry in manifest.stages:
            for t in entry.inputs + entry.outputs:
                if t.name in ("x", "xr", "ys", "y"):
                    assert t.shape == ("T", 4), (bounds, t)  # the time axis stays symbolic
        assert_chain_equals(out, path, [feeds_for(view.proto, 0, T=t) for t in (1, 4, 7)])


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_loop_body_reading_an_external_weight(tmp_path: Path, mode: str) -> None:
    """The weights the Loop body reads (an outer initializer, and one of the body's own) live in an
    external file; the stage holding the Loop carries both, readable without the source's file."""
    model = loop_model()
    src = tmp_path / "src"
    src.mkdir()
    path = src / "loop.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    view = load_model(path)
    compute = [n.name for n in view.compute_nodes]
    cut = compute.index("loop")
    manifest = export_stages(
        view, plan_for(view, [0, cut, len(compute)]), tmp_path / "out", ExportOptions(external_data=mode)
    )
    loop_stage = manifest.stages[1]
    stage = onnx.load(str(tmp_path / "out" / loop_stage.file))  # small weights stay inside the file
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in stage.graph.initializer}
    np.testing.assert_array_equal(weights["w"], np.linspace(0.5, 0.8, 4).astype(np.float32))
    (loop,) = [n for n in stage.graph.node if n.name == "loop"]
    (bias,) = loop.attribute[0].g.initializer
    assert bias.data_location == onnx.TensorProto.DEFAULT  # read in, not pointing at the source's file
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(bias), np.float32([0.1, -0.1, 0.2, -0.2]))
    assert_chain_equals(tmp_path / "out", path, [feeds_for(view.proto, 3)])


@pytest.mark.parametrize("build", [nested_if_model, loop_model, scan_model], ids=["if", "loop", "scan"])
def test_control_flow_split_verifies_through_the_api(build: object, tmp_path: Path) -> None:
    path = save(build(), tmp_path / "m.onnx")  # type: ignore[operator]
    m = len(load_model(path).compute_nodes)
    for k in (2, min(4, m)):
        result = split(
            path,
            SplitOptions(
                out=tmp_path / f"out{k}", plan=PlanRequest(k), profile=ProfileOptions(cost="static")
            ),
        )
        assert result.report is not None and result.report.ok, result.report.summary()
        assert load_manifest(tmp_path / f"out{k}").k == k
