"""Unit tests of onnxpipe.planning: stage assignment, fused-group cuts, the streaming schedule."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from paths import SAMPLE_MODELS

from onnxpipe.ir.load import view_from_proto
from onnxpipe.planning.sequences import allowed_cuts_from_regions
from onnxpipe.planning.stages import assign_stages
from onnxpipe.schedule.simulate import simulate

SAMPLES = SAMPLE_MODELS


def _skip_model() -> onnx.ModelProto:
    """x -> r1 -> r2 -> r3 -> add(r3, r1) -> y, a Constant read by r2 and by the add's partner."""
    w = numpy_helper.from_array(np.ones((4,), np.float32), "w")
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], name="const", value=numpy_helper.from_array(np.full((4,), 2.0, np.float32))
        ),
        helper.make_node("Relu", ["x"], ["h1"], name="r1"),
        helper.make_node("Mul", ["h1", "c"], ["h2"], name="r2"),
        helper.make_node("Add", ["h2", "w"], ["h3"], name="r3"),
        helper.make_node("Add", ["h3", "h1"], ["h4"], name="skip"),
        helper.make_node("Mul", ["h4", "c"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_assign_stages_skip_connection_and_constant_copies() -> None:
    view = view_from_proto(_skip_model())
    assert [n.name for n in view.compute_nodes] == ["r1", "r2", "r3", "skip", "out"]
    sizes = {"x": 16, "h1": 16, "h2": 16, "h3": 16, "h4": 16, "y": 16}
    stages = assign_stages(view, (0, 1, 3, 5), sizes, (1.0, 2.0, 3.0), (0.0, 0.5, 0.5))
    s0, s1, s2 = stages
    assert s0.node_names == ("r1",) and s0.inputs == ("x",) and s0.outputs == ("h1",)
    # h1 jumps over stage 1 to stage 2: stage 0 emits it once, stage 2 receives it
    assert s1.node_names == ("r2", "r3") and s1.inputs == ("h1",) and s1.outputs == ("h3",)
    # weights: the initializer w and the Constant c (copied into the stage) count as parameters
    assert s1.constant_nodes == ("const",) and s1.param_bytes == 16 + 16
    assert s2.inputs == ("h3", "h1") and s2.outputs == ("y",)
    assert s2.constant_nodes == ("const",)
    assert s0.constant_nodes == ()
    every = [n for s in stages for n in s.node_names]
    assert sorted(every) == sorted(n.name for n in view.compute_nodes)
    assert s1.bytes_in == 16 and s2.bytes_in == 32
    assert s1.cost_seconds == pytest.approx(2.5)


def test_allowed_cuts_keep_fused_groups_whole() -> None:
    view = view_from_proto(_skip_model())
    allowed = allowed_cuts_from_regions(view.compute_nodes, [("r2", "r3"), ("out",)])
    # positions 0..5; cutting at 2 would split r2 (pos 1) from r3 (pos 2)
    assert allowed == [True, True, False, True, True, True]


def test_stream_schedule_matches_hand_computation() -> None:
    sched = simulate("stream", [1.0, 3.0, 2.0], None, [0.0, 0.0, 0.0], 3)
    # stage 1 is the bottleneck: micro-batches leave it at 4, 7, 10; stage 2 ends at 6, 9, 12
    assert [(st.microbatch, st.start, st.end) for st in sched.stages[0]] == [
        (0, 0.0, 1.0),
        (1, 1.0, 2.0),
        (2, 2.0, 3.0),
    ]
    assert [(st.microbatch, st.start, st.end) for st in sched.stages[1]] == [
        (0, 1.0, 4.0),
        (1, 4.0, 7.0),
        (2, 7.0, 10.0),
    ]
    assert [(st.microbatch, st.start, st.end) for st in sched.stages[2]] == [
        (0, 4.0, 6.0),
        (1, 7.0, 9.0),
        (2, 10.0, 12.0),
    ]
    assert sched.makespan == pytest.approx(1 + 3 + 2 + 2 * 3)
    assert sched.first_latency == pytest.approx(6.0)
    assert sched.steady_state_throughput_per_s == pytest.approx(1 / 3)


def test_scattered_groups_do_not_block_cuts() -> None:
    view = view_from_proto(_skip_model())
    # r1 (pos 0) and out (pos 4) are far apart for a 2-node group: 5 > 2*2+4 is False, so still kept
    assert allowed_cuts_from_regions(view.compute_nodes, [("r1", "out")]) == [True] + [False] * 4 + [True]


def test_far_apart_group_is_ignored() -> None:
    from onnxpipe.ir.model import NodeInfo

    nodes = tuple(NodeInfo(i, i, f"n{i}", "Relu", "", (), (), (f"t{i}",), 0, False, False) for i in range(20))
    allowed = allowed_cuts_from_regions(nodes, [("n0", "n19"), ("n5", "n6")])
    assert allowed[6] is False
    assert sum(allowed) == 20  # only the cut inside the compact group (n5, n6) is forbidden


@dataclass(frozen=True)
class _FakeSplit:
    name: str
    bottleneck: float
    lower_bound: float = 0.0


def test_fused_groups_are_cut_when_they_leave_too_few_positions() -> None:
    from onnxpipe.core.errors import PartitionError
    from onnxpipe.planning.sequences import keeping_fused_groups

    def solve(allowed: object) -> _FakeSplit:
        if allowed is not None:
            raise PartitionError("allowed_cuts permits only 1 cut positions")
        return _FakeSplit("split without groups", 1.0)

    notes: list[str] = []
    assert keeping_fused_groups(solve, [True, False, True], notes).name == "split without groups"
    assert notes == ["fused groups had to be cut to make this many stages"]
    with pytest.raises(PartitionError, match="permits only"):  # nothing to relax: the error stands
        keeping_fused_groups(solve, [True, True, True], [])
    keeping_fused_groups(solve, [True, False, True], notes)
    assert len(notes) == 1  # said once, however often asked


def test_cutting_fused_groups_keeps_the_positions_no_stage_may_start_at() -> None:
    """Dropping the fused groups still keeps ``cuttable`` (no stage of nothing but remade values); only
    when that leaves too few positions does anything go."""
    from onnxpipe.core.errors import PartitionError
    from onnxpipe.planning.sequences import keeping_fused_groups

    cuttable = (True, True, False, True, True)
    allowed = (True, False, False, True, True)
    tried: list[object] = []

    def solve(cuts: Sequence[bool] | None) -> _FakeSplit:
        tried.append(None if cuts is None else tuple(cuts))
        if cuts is not None and tuple(cuts) == allowed:
            raise PartitionError("allowed_cuts permits only 1 cut positions")
        return _FakeSplit("cuttable" if cuts is not None else "anywhere", 1.0)

    notes: list[str] = []
    assert keeping_fused_groups(solve, allowed, notes, cuttable).name == "cuttable"
    assert tried == [allowed, cuttable]
    assert keeping_fused_groups(solve, cuttable, [], cuttable).name == "cuttable"  # no group: one solve

    def too_few(cuts: Sequence[bool] | None) -> _FakeSplit:
        if cuts is not None:
            raise PartitionError("allowed_cuts permits only 1 cut positions")
        return _FakeSplit("anywhere", 1.0)

    assert keeping_fused_groups(too_few, allowed, [], cuttable).name == "anywhere"


@pytest.mark.parametrize(
    ("kept", "cut", "chosen"), [(1.05, 1.0, "kept"), (1.06, 1.0, "cut"), (2.0, 1.0, "cut")]
)
def test_fused_groups_are_kept_only_while_they_cost_little_balance(
    kept: float, cut: float, chosen: str
) -> None:
    """Within FUSED_GROUP_SLACK (5%) of the best split that cuts them, the groups stay whole."""
    from onnxpipe.planning.sequences import keeping_fused_groups

    notes: list[str] = []
    result = keeping_fused_groups(
        lambda allowed: _FakeSplit("kept", kept) if allowed is not None else _FakeSplit("cut", cut),
        [True, False, True],
        notes,
    )
    assert result.name == chosen
    if chosen == "kept":
        assert notes == []
    else:
        assert len(notes) == 1 and f"{kept / cut:.2f}x as slow" in notes[0]


def test_a_fused_group_holding_most_of_the_model_does_not_unbalance_the_plan() -> None:
    """A profile whose value matching failed reports one group of every node but the last (ResNet-50 on
    an AVX2 machine did): the plan cuts through it rather than leave one stage all the work."""
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model
    from onnxpipe.planning.workers import make_plan

    view = load_model(SAMPLES / "resnet_tiny.onnx")
    prof = static_profile(view)
    names = [n.name for n in view.compute_nodes]
    balanced = make_plan(view, prof, 2)
    fused = make_plan(view, replace(prof, regions=(tuple(names[:-1]),)), 2)
    assert [s.node_names for s in fused.stages] == [s.node_names for s in balanced.stages]
    assert fused.bottleneck_seconds == pytest.approx(balanced.bottleneck_seconds)
    assert any("fused groups were cut" in note for note in fused.notes)
    assert not any("fused groups" in note for note in balanced.notes)


def test_measured_costs_tie_within_their_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan of measured costs counts splits within :data:`MEASURED_TIE_RTOL` of the best as ties (the
    fewest bytes win: ``test_partition`` shows that noise then moves no cut), static costs keep the
    solver's own tolerance: the plan's bounds are the solver's with that tolerance."""
    from onnxpipe.cost.profile import CostSource
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model
    from onnxpipe.ir.shapevalues import value_kinds
    from onnxpipe.partition import TIE_RTOL, solve
    from onnxpipe.planning.sequences import sequences
    from onnxpipe.planning.workers import MEASURED_TIE_RTOL, make_plan, near_tie_rtol, start_seconds

    view = load_model(SAMPLES / "transformer_tiny.onnx")
    static = static_profile(view)
    measured = replace(static, source=CostSource.PROFILE.value)
    monkeypatch.setattr("onnxpipe.planning.workers.call_seconds", lambda threads: 0.0)  # no session here
    assert near_tie_rtol(static) == TIE_RTOL and near_tie_rtol(measured) == MEASURED_TIE_RTOL
    seq = sequences(view, measured)
    extra = start_seconds(view, seq.compute, value_kinds(view), measured)
    bounds = {}
    for tie in (TIE_RTOL, MEASURED_TIE_RTOL):
        part = solve(
            seq.costs, 5, cut_bytes=seq.cut_bytes, allowed_cuts=seq.allowed, tie_rtol=tie, start_seconds=extra
        )
        bounds[tie] = [b - a for a, b in itertools.pairwise(part.bounds)]
    assert bounds[TIE_RTOL] != bounds[MEASURED_TIE_RTOL]  # a near-tie that the tolerance resolves otherwise
    for profile, tie in ((static, TIE_RTOL), (measured, MEASURED_TIE_RTOL)):
        plan = make_plan(view, profile, 5)
        assert [len(s.node_names) for s in plan.stages] == bounds[tie]


def test_stage_estimates_count_the_nodes_a_stage_copies() -> None:
    """A stage that makes again a value of shapes alone (a mask) runs those copies on every call: its
    estimate counts them, and the partitioner balanced the stages with them."""
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model
    from onnxpipe.ir.shapevalues import value_kinds
    from onnxpipe.planning.sequences import sequences
    from onnxpipe.planning.workers import make_plan, start_seconds

    view = load_model(SAMPLES / "transformer_tiny.onnx")
    prof = static_profile(view)
    seq = sequences(view, prof)
    extra = start_seconds(view, seq.compute, value_kinds(view), prof)
    assert extra[0] == 0.0 and max(extra) > 0
    plan = make_plan(view, prof, 3)
    assert any(stage.recomputed_nodes for stage in plan.stages)
    for stage in plan.stages:
        own = math.fsum(prof.node_seconds[n] for n in stage.node_names)
        copies = math.fsum(prof.node_seconds.get(n, 0.0) for n in stage.recomputed_nodes)
        assert stage.compute_seconds == pytest.approx(own + copies, rel=1e-9, abs=1e-15)
    assert plan.bottleneck_seconds == max(stage.cost_seconds for stage in plan.stages)


def test_what_a_stage_copies_sums_to_the_same_seconds_in_every_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seconds of the nodes a stage copies are summed in one order, not in the order a set of node
    names iterates in (which follows ``PYTHONHASHSEED``): else a stage's estimate, and the manifest's
    digest, changed in their last bits from one run of the same command to the next."""
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model
    from onnxpipe.ir.model import ModelView
    from onnxpipe.ir.shapevalues import ValueKinds, value_kinds
    from onnxpipe.planning import workers
    from onnxpipe.planning.sequences import sequences

    makers = workers._makers
    view = load_model(SAMPLES / "transformer_tiny.onnx")
    prof = static_profile(view)
    seq = sequences(view, prof)
    kinds = value_kinds(view)

    def seconds_iterating(backwards: bool) -> tuple[float, ...]:
        class Iterated(frozenset[str]):
            """Node names that iterate in name order, or backwards: two processes' set orders."""

            def __iter__(self) -> Iterator[str]:
                return iter(sorted(frozenset.__iter__(self), reverse=backwards))

        def ordered(
            view: ModelView, kinds: ValueKinds, tensor: str, memo: dict[str, frozenset[str]]
        ) -> Iterated:
            return Iterated(makers(view, kinds, tensor, memo))

        monkeypatch.setattr(workers, "_makers", ordered)
        return workers.start_seconds(view, seq.compute, kinds, prof)

    assert seconds_iterating(False) == seconds_iterating(True)


def test_each_stage_estimate_counts_a_session_calls_fixed_cost() -> None:
    """Measured costs: every stage pays one session call per micro-batch (injected here; measured once
    per process otherwise), the same for each, so it moves no cut; static costs: nothing added."""
    from onnxpipe.cost.profile import CostSource
    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model
    from onnxpipe.planning.workers import make_plan, per_call_cost

    view = load_model(SAMPLES / "resnet_tiny.onnx")
    static = static_profile(view)
    measured = replace(static, source=CostSource.PROFILE.value)
    assert per_call_cost(static, None) == 0.0 and per_call_cost(measured, 2e-5) == 2e-5
    plain = make_plan(view, static, 3)
    called = make_plan(view, measured, 3, per_call_seconds=2e-5)
    assert [s.node_names for s in called.stages] == [s.node_names for s in plain.stages]
    for a, b in zip(plain.stages, called.stages, strict=True):
        assert b.compute_seconds == pytest.approx(a.compute_seconds + 2e-5, rel=1e-12)
    assert called.bottleneck_seconds == pytest.approx(plain.bottleneck_seconds + 2e-5, rel=1e-12)
    assert any("0.020 ms per call" in n for n in called.notes)
    assert not any("per call" in n for n in plain.notes)


def test_fused_groups_within_the_slack_of_the_bound_are_kept_without_a_second_solve() -> None:
    """A split within 5% of the lower bound cannot be beaten by more than 5%: no need to solve again."""
    from onnxpipe.planning.sequences import keeping_fused_groups

    asked: list[object] = []

    def solve(allowed: object) -> _FakeSplit:
        asked.append(allowed)
        return _FakeSplit("kept" if allowed is not None else "cut", 1.04, lower_bound=1.0)

    assert keeping_fused_groups(solve, [True, False, True], []).name == "kept"
    assert asked == [[True, False, True]]


def _best(costs: list[float], k: int, allowed: list[bool] | None) -> float:
    """The smallest slowest stage over every split into ``k`` stages (cuts where ``allowed``)."""
    n = len(costs)
    best = math.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        if allowed is not None and not all(allowed[c] for c in cuts):
            continue
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fused_group_rule_against_brute_force(data: st.DataObject) -> None:
    """Whatever the groups: the split is within the slack of the best one that may cut them, it keeps
    them whole exactly when the best split that does is within that slack, and a note says when not."""
    from onnxpipe.partition import solve
    from onnxpipe.planning.sequences import FUSED_GROUP_SLACK, keeping_fused_groups

    costs = data.draw(st.lists(st.floats(0.01, 10.0), min_size=2, max_size=8))
    n = len(costs)
    k = data.draw(st.integers(1, n))
    inner = data.draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    allowed = [True, *inner, True]
    notes: list[str] = []
    part = keeping_fused_groups(lambda a: solve(costs, k, allowed_cuts=a), allowed, notes)
    free, kept = _best(costs, k, None), _best(costs, k, allowed)
    assert part.bottleneck <= (1 + FUSED_GROUP_SLACK) * free * (1 + 1e-9)
    whole = all(allowed[b] for b in part.bounds)
    if kept <= (1 + FUSED_GROUP_SLACK) * free * (1 - 1e-9):
        assert whole and part.bottleneck == pytest.approx(kept, rel=1e-9) and notes == []
    elif kept > (1 + FUSED_GROUP_SLACK) * free * (1 + 1e-9):
        assert not whole and part.bottleneck == pytest.approx(free, rel=1e-9)
        assert len(notes) == 1 and "fused groups" in notes[0]
