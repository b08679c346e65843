"""Tests for :mod:`onnxpipe.planning.nodesplit`: which nodes can be cut, and the cut model computes the same.

Each op kind is cut into 2 and 3 parts and run with ``onnx.reference`` (no onnxruntime in this lane) on
random inputs against the original model: equal up to float32 summation order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import onnx
import pytest
from models import dominated_head_model
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxpipe.core.errors import UsageError
from onnxpipe.cost.profile import CostSource
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.load import view_from_proto
from onnxpipe.planning.nodesplit import plan as nodesplit_plan
from onnxpipe.planning.nodesplit.cut import PartCosts, cut_node
from onnxpipe.planning.nodesplit.find import SplitKind, Splittable, find_splittable, part_sizes
from onnxpipe.planning.nodesplit.plan import carried_profile, merged_sizes, plan_splitting_nodes
from onnxpipe.planning.workers import make_plan

RNG = np.random.default_rng(0)


def _model(
    nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray], x: list[int], y: str
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def matmul_bias_relu() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Relu", ["x"], ["x1"], name="pre"),
            helper.make_node("MatMul", ["x1", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["b", "m"], ["a"], name="bias"),
            helper.make_node("Relu", ["a"], ["r"], name="act"),
            helper.make_node("Mul", ["r", "two"], ["y"], name="scale"),
        ],
        {"w": RNG.standard_normal((16, 10)), "b": RNG.standard_normal(10), "two": np.array(2.0)},
        [2, 3, 16],
        "y",
    )


def matmul_softmax() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Softmax", ["m"], ["y"], name="soft"),
        ],
        {"w": RNG.standard_normal((16, 10))},
        [2, 3, 16],
        "y",
    )


def gemm() -> onnx.ModelProto:
    return _model(
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="gemm", transB=1, alpha=0.5, beta=2.0)],
        {"w": RNG.standard_normal((9, 12)), "c": RNG.standard_normal((1, 9))},
        [4, 12],
        "y",
    )


def conv_bn_relu() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "s", "o", "mu", "var"], ["n"], name="bn"),
            helper.make_node("Mul", ["n", "k"], ["m"], name="chan"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        {
            "w": RNG.standard_normal((7, 3, 3, 3)),
            "b": RNG.standard_normal(7),
            "s": RNG.standard_normal(7),
            "o": RNG.standard_normal(7),
            "mu": RNG.standard_normal(7),
            "var": RNG.uniform(0.5, 2.0, 7),
            "k": RNG.standard_normal((7, 1, 1)),
        },
        [1, 3, 8, 8],
        "y",
    )


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    (out,) = ReferenceEvaluator(model).run(None, {"x": x})
    return np.asarray(out)


CASES = [
    (matmul_bias_relu, "mm", SplitKind.COLUMNS, ("mm", "bias", "act", "scale"), [2, 3, 16]),
    (matmul_softmax, "mm", SplitKind.COLUMNS, ("mm",), [2, 3, 16]),
    (matmul_softmax, "mm", SplitKind.REDUCTION, ("mm",), [2, 3, 16]),
    (gemm, "gemm", SplitKind.COLUMNS, ("gemm",), [4, 12]),
    (conv_bn_relu, "conv", SplitKind.CHANNELS, ("conv", "bn", "chan", "relu"), [1, 3, 8, 8]),
]


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize(("make", "node", "kind", "chain", "shape"), CASES)
def test_cut_model_equals_the_original(
    make: object, node: str, kind: SplitKind, chain: tuple[str, ...], shape: list[int], parts: int
) -> None:
    assert callable(make)
    model = make()
    view = view_from_proto(model)
    spec = find_splittable(view)[node]
    assert kind in spec.kinds
    assert spec.chain == chain
    cut = cut_node(view, spec, kind, parts)
    assert len(cut.parts) == parts
    order = [n.name for n in cut.view.nodes]
    flat = [n for p in cut.parts for n in p]
    at = order.index(flat[0])
    assert order[at : at + len(flat) + 1] == [*flat, cut.join]  # the parts and the join stay together
    assert all(n not in order for n in chain)
    x = RNG.standard_normal(shape).astype(np.float32)
    want, got = run(model, x), run(cut.view.proto, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert cut.view.sha256 == view.sha256  # the stages are checked against the original file


def test_carrying_stops_at_a_shared_tensor_and_a_non_slicing_constant() -> None:
    shared = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Relu", ["m"], ["r"], name="act"),
            helper.make_node("Add", ["r", "r"], ["y"], name="twice"),
        ],
        {"w": RNG.standard_normal((4, 6))},
        [2, 4],
        "y",
    )
    assert find_splittable(view_from_proto(shared))["mm"].chain == ("mm", "act")
    rows = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "per_row"], ["y"], name="rowbias"),
        ],
        {"w": RNG.standard_normal((4, 6)), "per_row": RNG.standard_normal((2, 1))},
        [2, 4],
        "y",
    )
    spec = find_splittable(view_from_proto(rows))["mm"]
    assert spec.chain == ("mm", "rowbias")  # a (2, 1) constant broadcasts along the columns: carried
    cols = _model(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Add", ["m", "odd"], ["y"], name="oddbias"),
        ],
        {"w": RNG.standard_normal((4, 6)), "odd": RNG.standard_normal((2, 6))},
        [2, 4],
        "y",
    )
    assert find_splittable(view_from_proto(cols))["mm"].chain == ("mm", "oddbias")
    assert find_splittable(view_from_proto(cols))["mm"].kinds == (SplitKind.COLUMNS,)


def test_nodes_without_constant_weights_are_not_splittable() -> None:
    model = _model([helper.make_node("MatMul", ["x", "x"], ["y"], name="sq")], {}, [4, 4], "y")
    assert find_splittable(view_from_proto(model)) == {}


def test_too_many_parts_are_refused() -> None:
    view = view_from_proto(gemm())
    spec = find_splittable(view)["gemm"]
    with pytest.raises(UsageError, match="gemm"):
        cut_node(view, spec, SplitKind.COLUMNS, 10)
    with pytest.raises(UsageError, match="reduction"):
        cut_node(view, spec, SplitKind.REDUCTION, 2)


def test_part_sizes() -> None:
    assert part_sizes(10, 3) == [4, 3, 3]
    assert sum(part_sizes(50257, 8)) == 50257


def test_the_planner_cuts_the_dominating_node_when_it_helps() -> None:
    view = view_from_proto(dominated_head_model())
    prof = static_profile(view, shapes={"x": (64, 128)})
    contiguous = make_plan(view, prof, 4)
    planned = plan_splitting_nodes(view, prof, 4)
    assert planned.plan.bottleneck_seconds < contiguous.bottleneck_seconds
    (split,) = planned.plan.node_splits
    assert (split.node, split.kind, split.carried, split.measured) == (
        "head_mm",
        "columns",
        ("head_bias",),
        False,
    )
    assert split.contiguous_bottleneck_seconds == contiguous.bottleneck_seconds
    assert split.contiguous_bound_seconds <= contiguous.bottleneck_seconds
    assert len(set(split.stages)) == split.parts  # parts that shared a stage were merged
    stage_of = planned.plan.stage_of()
    assert "head_mm" not in stage_of and stage_of[split.join] == split.stages[-1]
    assert planned.view.sha256 == view.sha256 and planned.profile.model_sha256 == view.sha256
    total = math.fsum(planned.profile.node_seconds.values())
    assert total == pytest.approx(math.fsum(prof.node_seconds.values()), rel=1e-9)  # shares, a free join
    assert any("cut by columns" in n for n in planned.plan.notes)


def test_the_planner_keeps_whole_nodes_when_cutting_does_not_help() -> None:
    view = view_from_proto(dominated_head_model(vocab=128))  # no node dominates
    prof = static_profile(view, shapes={"x": (64, 128)})
    one = plan_splitting_nodes(view, prof, 1)
    assert one.plan.node_splits == () and one.view is view
    for k in (2, 3, 4):
        planned = plan_splitting_nodes(view, prof, k)
        contiguous = make_plan(view, prof, k).bottleneck_seconds
        if planned.plan.node_splits:  # a cut only where it lowers the slowest stage
            assert planned.plan.bottleneck_seconds < contiguous
        else:
            assert planned.view is view and planned.plan.bottleneck_seconds == contiguous


def test_merged_sizes() -> None:
    spec = find_splittable(view_from_proto(gemm()))["gemm"]
    assert merged_sizes(spec, SplitKind.COLUMNS, (3, 3, 4, 4, 4)) == [4, 5]  # 9 in 5 parts: 2,2,2,2,1
    assert merged_sizes(spec, SplitKind.COLUMNS, (1, 2, 3)) == [3, 3, 3]


def test_the_count_of_parts_is_chosen_by_the_parts_as_they_will_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal parts that one stage takes are merged into one wider part; when a wider part costs more than
    the equal parts it replaces, the count of parts is chosen by what the merged parts cost, so the plan
    is the best over every count of one part per stage (a brute force over the counts)."""
    view = view_from_proto(dominated_head_model())
    prof = dataclasses.replace(static_profile(view, shapes={"x": (64, 128)}), source=CostSource.PROFILE.value)

    def costed(
        view: object, profile: object, spec: Splittable, kind: SplitKind, layouts: Any, **_: object
    ) -> Any:
        chain = sum(max(0.0, prof.node_seconds[n]) for n in spec.chain)
        extent = spec.extent(kind)
        equal = {tuple(part_sizes(extent, p)) for p in range(2, 9)}

        def part(size: int, sizes: tuple[int, ...]) -> float:  # a merged part runs 3x slower than its share
            return chain * size / extent * (1.0 if sizes in equal else 3.0)

        return [PartCosts(len(s), tuple(part(x, tuple(s)) for x in s), 0.0, True) for s in layouts]

    monkeypatch.setattr(nodesplit_plan, "sized_costs", costed)
    monkeypatch.setattr("onnxpipe.planning.workers.call_seconds", lambda threads: 0.0)  # no session here
    k = 8
    planned = plan_splitting_nodes(view, prof, k)
    (split,) = planned.plan.node_splits
    assert split.measured and len(set(split.stages)) == split.parts
    spec = find_splittable(view)[split.node]
    best = math.inf
    for p in range(2, k + 1):  # one part per stage, each count of equal parts, as planned from the cut model
        kind = SplitKind(split.kind)
        (costs,) = costed(view, prof, spec, kind, [part_sizes(spec.extent(kind), p)])
        cut = cut_node(view, spec, kind, part_sizes(spec.extent(kind), p))
        best = min(best, make_plan(cut.view, carried_profile(prof, cut, costs), k).bottleneck_seconds)
    assert planned.plan.bottleneck_seconds <= best * (1 + 1e-9)
