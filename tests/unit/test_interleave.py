"""Interleaved splits (:mod:`onnxpipe.partition.interleave`): exact against brute force, and bad input."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.reference_dp import reference_interleaved
from onnxpipe.core.errors import PartitionError
from onnxpipe.partition import interleave
from onnxpipe.partition.interleave import evaluate_interleaved, solve_interleaved

COST = st.sampled_from([0.0, 1e-3, 0.5, 1.0, 2.0, 3.0, 7.25])


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[float], int, int, dict[str, object]]:
    k = draw(st.integers(1, 3))
    v = draw(st.integers(1, 3))
    n = draw(st.integers(k * v, 10))
    costs = draw(st.lists(COST, min_size=n, max_size=n))
    kw: dict[str, object] = {"time_slack": draw(st.sampled_from([0.0, 0.05, 0.3]))}
    if draw(st.booleans()):
        kw["item_mem"] = draw(st.lists(st.integers(0, 9).map(float), min_size=n, max_size=n))
    if draw(st.booleans()):
        kw["cut_bytes"] = draw(st.lists(st.integers(0, 6).map(float), min_size=n + 1, max_size=n + 1))
        kw["bandwidth"] = draw(st.sampled_from([math.inf, 2.0, 0.5]))
    if draw(st.booleans()):
        flags = draw(st.lists(st.booleans(), min_size=n + 1, max_size=n + 1))
        if sum(flags[1:n]) >= k * v - 1:
            kw["allowed_cuts"] = flags
    return costs, k, v, kw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_equals_brute_force(req: tuple[list[float], int, int, dict[str, object]]) -> None:
    costs, k, v, kw = req
    got = solve_interleaved(costs, k, k * v, **kw)  # type: ignore[arg-type]
    assert got == reference_interleaved(costs, k, v, **kw)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(requests())
def test_invariants(req: tuple[list[float], int, int, dict[str, object]]) -> None:
    costs, k, v, kw = req
    got = solve_interleaved(costs, k, k * v, **kw)  # type: ignore[arg-type]
    b = got.stages.bounds
    assert b[0] == 0 and b[-1] == len(costs) and all(x < y for x, y in itertools.pairwise(b))
    assert got.workers == tuple(s % k for s in range(k * v))
    assert got.k == k
    assert math.isclose(sum(got.stages.compute), sum(costs), rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(
        sum(got.worker_seconds),
        sum(got.stages.compute) + sum(got.stages.transfer),
        rel_tol=1e-12,
        abs_tol=1e-12,
    )
    assert got.bottleneck == max(got.worker_seconds)
    assert got.fastest <= got.bottleneck <= got.fastest * (1 + float(kw["time_slack"]))  # type: ignore[arg-type]
    assert got.lower_bound <= got.fastest * (1 + 1e-12)
    allowed = kw.get("allowed_cuts")
    if allowed is not None:
        assert all(allowed[p] for p in b[1:-1])  # type: ignore[index]
    again = evaluate_interleaved(
        costs,
        k,
        b,
        item_mem=kw.get("item_mem"),  # type: ignore[arg-type]
        cut_bytes=kw.get("cut_bytes"),  # type: ignore[arg-type]
        bandwidth=kw.get("bandwidth", math.inf),  # type: ignore[arg-type]
    )
    assert again.worker_seconds == got.worker_seconds and again.worker_memory == got.worker_memory


def test_weights_at_the_end_are_shared_by_interleaving() -> None:
    """Like ResNet-50: equal time per item, the weights in the last quarter.  Two contiguous halves put
    every weight on worker 1; four interleaved stages give each worker half the time and half the weights."""
    costs = [1.0] * 8
    mem = [0.0] * 6 + [10.0, 10.0]
    got = solve_interleaved(costs, 2, 4, item_mem=mem)
    assert got.worker_seconds == (4.0, 4.0)
    assert got.worker_memory == (10.0, 10.0)
    # worker 0: items 0 and 4-6; worker 1: items 1-3 and 7 (of the equally good splits, the first)
    assert got.stages.bounds == (0, 1, 4, 7, 8)
    contiguous = evaluate_interleaved(costs, 2, (0, 4, 8), item_mem=mem)
    assert contiguous.worker_memory == (0.0, 20.0)


def test_slack_trades_time_for_memory() -> None:
    costs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    mem = [0.0, 0.0, 0.0, 0.0, 0.0, 12.0]  # one item holds every weight: nothing to balance
    exact = solve_interleaved(costs, 2, 2, item_mem=mem)
    assert exact.bottleneck == 3.0 and exact.worker_memory == (0.0, 12.0)
    mem2 = [0.0, 0.0, 0.0, 6.0, 6.0, 0.0]
    tight = solve_interleaved(costs, 2, 2, item_mem=mem2)
    assert tight.stages.bounds == (0, 3, 6) and tight.worker_memory == (0.0, 12.0)
    loose = solve_interleaved(costs, 2, 2, item_mem=mem2, time_slack=0.4)  # 4.2 s allowed: 4 + 2 fits
    assert loose.stages.bounds == (0, 4, 6) and loose.worker_seconds == (4.0, 2.0)
    assert loose.worker_memory == (6.0, 6.0) and loose.fastest == 3.0
    too_tight = solve_interleaved(costs, 2, 2, item_mem=mem2, time_slack=0.3)  # 3.9 s: 4 does not fit
    assert too_tight.stages.bounds == (0, 3, 6)


def test_transfers_count_on_the_receiving_worker() -> None:
    got = evaluate_interleaved([1.0] * 4, 2, (0, 1, 2, 3, 4), cut_bytes=[0, 8, 0, 4, 0], bandwidth=4.0)
    assert got.stages.transfer == (0.0, 2.0, 0.0, 1.0)
    assert got.worker_seconds == (2.0, 5.0)  # stages 1 and 3: 1 + 2 and 1 + 1
    assert got.stages.cut_bytes_total == 12


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([1.0] * 4, 0, 2), {}, "workers must be a positive integer"),
        (([1.0] * 4, 2, 0), {}, "stages must be a positive integer"),
        (([1.0] * 3, 2, 4), {}, "cannot split 3 items into 4 non-empty stages"),
        (
            ([1.0] * 8, 3, 5),
            {},
            "5 stages cannot be dealt out to 3 workers: give a multiple of 3, or one more",
        ),
        (([], 1, 1), {}, "costs is empty"),
        (([1.0, -1.0], 1, 2), {}, "costs"),
        (([1.0] * 4, 2, 4), {"time_slack": -0.1}, "time_slack must be a finite number >= 0"),
        (([1.0] * 4, 2, 4), {"bandwidth": 0.0}, "bandwidth must be a positive number"),
        (([1.0] * 4, 2, 4), {"item_mem": [1.0]}, "item_mem"),
        (
            ([1.0] * 4, 2, 2),
            {"cut_bytes": [0, 5, 5, 5, 0], "bandwidth": 1e-320},
            "would take longer than any",
        ),
        (([1.0] * 4, 2, 4), {"allowed_cuts": [True, False, False, True, True]}, "permits only 1 cut"),
    ],
)
def test_bad_requests_are_refused(args: tuple[object, ...], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PartitionError, match=message):
        solve_interleaved(*args, **kwargs)  # type: ignore[arg-type]


def test_a_search_too_large_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interleave, "MAX_SPLITS", 100)
    with pytest.raises(
        PartitionError, match=r"may have to examine 165 placements of its cuts \(at most 100\)"
    ):
        solve_interleaved([1.0] * 12, 2, 4)  # C(11, 3) = 165


def test_a_search_with_too_many_prefixes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero costs prune nothing: the prefixes formed one by one are what takes the time."""
    monkeypatch.setattr(interleave, "MAX_PREFIXES", 1000)
    with pytest.raises(PartitionError, match=r"through 2,002 prefixes \(at most 1,000\)"):
        solve_interleaved([0.0] * 16, 6, 12)  # sum over j <= 9 of C(15 - (11 - j), j) = C(14, 9)
    assert solve_interleaved([0.0] * 14, 6, 12).stages.bounds == (0, *range(1, 12), 14)  # C(12, 9) = 220


def test_cut_bytes_ties_do_not_depend_on_summation_order() -> None:
    """0.3 + (0.1 + 0.2) != 0.1 + (0.2 + 0.3) in floats; whole bytes make the totals exact."""
    kw = {"cut_bytes": [0, 0.3, 0.1, 0.2, 0.3, 5.0, 0], "time_slack": 1.0}
    got = solve_interleaved([1.0] * 6, 2, 4, **kw)  # type: ignore[arg-type]
    assert got == reference_interleaved([1.0] * 6, 2, 2, **kw)  # type: ignore[arg-type]


def test_evaluate_refuses_stages_that_do_not_deal_out_evenly() -> None:
    with pytest.raises(PartitionError, match="2 stages cannot be dealt out to 3 workers"):
        evaluate_interleaved([1.0] * 4, 3, (0, 2, 4))


def test_one_stage_more_than_a_multiple_wraps_back_to_worker_zero() -> None:
    """``V * K + 1`` stages: the last runs on worker 0 with the first (a tied table held once); the
    search balances the workers as for any interleaved split, against every split enumerated here."""
    costs, mem = [1.0, 2.0, 2.0, 2.0, 2.0, 1.0], [5.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    got = solve_interleaved(costs, 2, 3, item_mem=mem)
    assert got.workers == (0, 1, 0)
    scored = [
        evaluate_interleaved(costs, 2, (0, a, b, 6), item_mem=mem)
        for a, b in itertools.combinations(range(1, 6), 2)
    ]
    fastest = min(p.bottleneck for p in scored)
    assert got.bottleneck == fastest == 6.0  # worker 0: the first and the last stage, 1 + 3
    assert max(got.worker_memory) == min(max(p.worker_memory) for p in scored if p.bottleneck == fastest)
