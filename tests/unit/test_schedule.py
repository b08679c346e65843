"""Tests of onnxpipe.schedule: timelines against hand-computed ones, micro-batches held per schedule, and
the schedule as the manifest writes and reads it."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pytest

from onnxpipe.core.errors import ManifestError, UsageError
from onnxpipe.core.jsonread import Document, Value
from onnxpipe.manifest import layout
from onnxpipe.manifest.layout import timeline_obj
from onnxpipe.schedule.simulate import in_flight, simulate, step_order
from onnxpipe.schedule.timeline import Step, Timeline, Transfer


def _rows(tl: Timeline) -> list[list[tuple[str, int, float, float]]]:
    return [[(s.kind, s.microbatch, s.start, s.end) for s in row] for row in tl.stages]


# --------------------------------------------------------------------------------------------------
# hand-computed timelines


def test_gpipe_two_stages_by_hand() -> None:
    tl = simulate("gpipe", [1, 1], [2, 2], [0, 0], 2)
    assert _rows(tl) == [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5, 7), ("B", 1, 7, 9)],
        [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 3, 5), ("B", 1, 5, 7)],
    ]
    assert tl.makespan == 9
    assert tl.bubble_fraction == pytest.approx(1 / 3)  # (K-1)/(M+K-1)
    assert tl.steady_state_throughput_per_s == pytest.approx(1 / 3)
    assert tl.first_latency == 7
    assert tl.transfers == ()


def test_gpipe_three_stages_by_hand() -> None:
    tl = simulate("gpipe", [1, 1, 1], [2, 2, 2], [0, 0, 0], 4)
    f = [[("F", j, s + j, s + j + 1) for j in range(4)] for s in range(3)]
    # the last stage starts backwards at 6; each stage up starts 2 later
    b = [[("B", j, 6 + 2 * (2 - s) + 2 * j, 8 + 2 * (2 - s) + 2 * j) for j in range(4)] for s in range(3)]
    assert _rows(tl) == [f[s] + b[s] for s in range(3)]
    assert tl.makespan == 18


def test_1f1b_three_stages_by_hand() -> None:
    tl = simulate("1f1b", [1, 1, 1], [2, 2, 2], [0, 0, 0], 4)
    assert _rows(tl) == [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("F", 2, 2, 3), ("B", 0, 7, 9),
         ("F", 3, 9, 10), ("B", 1, 10, 12), ("B", 2, 13, 15), ("B", 3, 16, 18)],
        [("F", 0, 1, 2), ("F", 1, 2, 3), ("B", 0, 5, 7), ("F", 2, 7, 8),
         ("B", 1, 8, 10), ("F", 3, 10, 11), ("B", 2, 11, 13), ("B", 3, 14, 16)],
        [("F", 0, 2, 3), ("B", 0, 3, 5), ("F", 1, 5, 6), ("B", 1, 6, 8),
         ("F", 2, 8, 9), ("B", 2, 9, 11), ("F", 3, 11, 12), ("B", 3, 12, 14)],
    ]  # fmt: skip
    assert tl.makespan == 18
    assert tl.bubble_fraction == pytest.approx(2 / 6)


def test_stream_with_a_slow_link_by_hand() -> None:
    """The link into stage 1 takes 2 per micro-batch: it is the bottleneck, and it overlaps compute."""
    tl = simulate("stream", [1, 1], None, [0, 2], 3)
    assert _rows(tl) == [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("F", 2, 2, 3)],
        [("F", 0, 3, 4), ("F", 1, 5, 6), ("F", 2, 7, 8)],
    ]
    assert tl.transfers == (
        Transfer(1, "F", 0, 1, 3),
        Transfer(1, "F", 1, 3, 5),
        Transfer(1, "F", 2, 5, 7),
    )
    assert tl.makespan == 8
    assert tl.steady_state_throughput_per_s == 0.5
    assert tl.bubble_fraction == pytest.approx(1 - 6 / 16)
    assert tl.first_latency == 4


def test_training_links_both_ways_by_hand() -> None:
    """Activations go over link 1 forward and gradients come back over it, each taking 0.5."""
    tl = simulate("gpipe", [1, 1], [1, 1], [0, 0.5], 2)
    assert _rows(tl) == [
        [("F", 0, 0, 1), ("F", 1, 1, 2), ("B", 0, 5, 6), ("B", 1, 6, 7)],
        [("F", 0, 1.5, 2.5), ("F", 1, 2.5, 3.5), ("B", 0, 3.5, 4.5), ("B", 1, 4.5, 5.5)],
    ]
    assert tl.transfers == (
        Transfer(1, "F", 0, 1, 1.5),
        Transfer(1, "F", 1, 2, 2.5),
        Transfer(1, "B", 0, 4.5, 5),
        Transfer(1, "B", 1, 5.5, 6),
    )
    assert tl.makespan == 7


def test_links_are_full_duplex() -> None:
    """1F1B sends activations and gradients over one link at the same time: they must not wait."""
    rng = random.Random(5)
    overlapped = 0
    for _ in range(40):
        k, m = 3, rng.randint(4, 8)
        fwd = [rng.uniform(0.5, 1.5) for _ in range(k)]
        bwd = [rng.uniform(1, 3) for _ in range(k)]
        link = [0.0, rng.uniform(0.5, 2), rng.uniform(0.5, 2)]
        tl = simulate("1f1b", fwd, bwd, link, m)
        _check_rules(tl, fwd, bwd, link)
        for a in tl.transfers:
            for b in tl.transfers:
                if a.link == b.link and a.kind == "F" and b.kind == "B":
                    overlapped += a.start < b.end - 1e-9 and b.start < a.end - 1e-9
    assert overlapped > 0


def test_source_link_feeds_stage_zero() -> None:
    tl = simulate("stream", [1], None, [3], 2)
    assert _rows(tl) == [[("F", 0, 3, 4), ("F", 1, 6, 7)]]
    assert [(t.link, t.start, t.end) for t in tl.transfers] == [(0, 0, 3), (0, 3, 6)]


def test_stream_matches_the_flow_shop_formula() -> None:
    """Identical jobs through a flow shop: makespan = sum of stage times + (M - 1) * the slowest."""
    rng = random.Random(3)
    for _ in range(30):
        k, m = rng.randint(1, 5), rng.randint(1, 7)
        fwd = [rng.uniform(0.1, 3) for _ in range(k)]
        tl = simulate("stream", fwd, None, [0.0] * k, m)
        assert tl.makespan == pytest.approx(sum(fwd) + (m - 1) * max(fwd))
        assert tl.steady_state_throughput_per_s == pytest.approx(1 / max(fwd))
        assert tl.first_latency == pytest.approx(sum(fwd))
        for s in range(k):
            assert [st.microbatch for st in tl.stages[s]] == list(range(m))


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("k", "m"), [(1, 1), (2, 3), (3, 4), (4, 8), (5, 2)])
def test_balanced_bubble_formula(kind: str, k: int, m: int) -> None:
    tl = simulate(kind, [1.0] * k, [2.0] * k, [0.0] * k, m)  # type: ignore[arg-type]
    assert tl.makespan == pytest.approx((m + k - 1) * 3)
    assert tl.bubble_fraction == pytest.approx((k - 1) / (m + k - 1))


# --------------------------------------------------------------------------------------------------
# dependency rules hold in random timelines


def _check_rules(tl: Timeline, fwd: list[float], bwd: list[float], link: list[float]) -> None:
    k, m = tl.k, tl.microbatches
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[str, int, int], float] = {}
    for s, row in enumerate(tl.stages):
        prev = 0.0
        for st in row:
            assert st.start >= prev - 1e-12  # one step at a time, in order
            prev = st.end
            assert st.end - st.start == pytest.approx(fwd[s] if st.kind == "F" else bwd[s])
            end[(st.kind, s, st.microbatch)] = st.end
            start[(st.kind, s, st.microbatch)] = st.start
    training = tl.kind != "stream"
    for s in range(k):
        for j in range(m):
            if s > 0:
                assert start[("F", s, j)] >= end[("F", s - 1, j)] + link[s] - 1e-9
            if training:
                assert start[("B", s, j)] >= end[("F", s, j)] - 1e-9
                if s < k - 1:
                    assert start[("B", s, j)] >= end[("B", s + 1, j)] + link[s + 1] - 1e-9
    for lk in range(k):  # one transfer at a time per link and direction
        for d in ("F", "B"):
            ts = sorted((t.start, t.end) for t in tl.transfers if t.link == lk and t.kind == d)
            for (_, e1), (s2, _) in itertools.pairwise(ts):
                assert s2 >= e1 - 1e-12


@pytest.mark.parametrize("kind", ["stream", "gpipe", "1f1b"])
def test_random_timelines_obey_the_rules(kind: str) -> None:
    rng = random.Random(7)
    for _ in range(60):
        k, m = rng.randint(1, 5), rng.randint(1, 9)
        fwd = [rng.choice([0.0, rng.uniform(0.1, 2)]) for _ in range(k)]
        bwd = [rng.uniform(0, 4) for _ in range(k)]
        link = [0.0] + [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(k - 1)]
        tl = simulate(kind, fwd, bwd, link, m)  # type: ignore[arg-type]
        _check_rules(tl, fwd, bwd if kind != "stream" else [0.0] * k, link)
        assert 0.0 <= tl.bubble_fraction <= 1.0
        busiest = max([f + (b if kind != "stream" else 0) for f, b in zip(fwd, bwd, strict=True)] + link)
        # fill and drain only add to the steady state
        assert tl.makespan >= m * busiest - 1e-9


# --------------------------------------------------------------------------------------------------
# step orders and memory formulas


def test_step_orders() -> None:
    assert step_order("stream", 0, 3, 3) == (("F", 0), ("F", 1), ("F", 2))
    assert step_order("gpipe", 1, 3, 2) == (("F", 0), ("F", 1), ("B", 0), ("B", 1))
    assert step_order("1f1b", 0, 4, 5) == (
        ("F", 0), ("F", 1), ("F", 2),
        ("F", 3), ("B", 0), ("F", 4), ("B", 1),
        ("B", 2), ("B", 3), ("B", 4),
    )  # fmt: skip
    assert step_order("1f1b", 3, 4, 2) == (("F", 0), ("B", 0), ("F", 1), ("B", 1))
    assert step_order("1f1b", 0, 4, 2) == (("F", 0), ("F", 1), ("B", 0), ("B", 1))  # M < K: all warm-up


def _held(tl: Timeline, s: int) -> int:
    """Most micro-batches whose forward has started on stage s and whose backward has not finished."""
    if tl.kind == "stream":
        events = [(st.start, 1) for st in tl.stages[s]] + [(st.end, -1) for st in tl.stages[s]]
    else:
        events = [(st.start, 1) for st in tl.stages[s] if st.kind == "F"]
        events += [(st.end, -1) for st in tl.stages[s] if st.kind == "B"]
    events.sort(key=lambda e: (e[0], e[1]))  # frees before takes at the same instant
    held = peak = 0
    for _, d in events:
        held += d
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("kind", ["stream", "gpipe", "1f1b"])
def test_in_flight_matches_simulation(kind: str) -> None:
    rng = random.Random(11)
    for k in range(1, 6):
        for m in range(1, 9):
            fwd = [rng.uniform(0.5, 2) for _ in range(k)]
            bwd = [rng.uniform(0.5, 4) for _ in range(k)]
            tl = simulate(kind, fwd, bwd, [0.0] * k, m)  # type: ignore[arg-type]
            for s in range(k):
                assert _held(tl, s) == in_flight(kind, s, k, m), (kind, k, m, s)  # type: ignore[arg-type]


def test_memory_formulas() -> None:
    assert [in_flight("gpipe", s, 4, 6) for s in range(4)] == [6, 6, 6, 6]
    assert [in_flight("1f1b", s, 4, 6) for s in range(4)] == [4, 3, 2, 1]
    assert [in_flight("1f1b", s, 4, 2) for s in range(4)] == [2, 2, 2, 1]
    assert [in_flight("stream", s, 4, 6) for s in range(4)] == [1, 1, 1, 1]
    assert in_flight("gpipe", 0, 4, 0) == 0


def test_simulate_rejects_bad_input() -> None:
    with pytest.raises(UsageError, match="`microbatches`"):
        simulate("stream", [1], None, [0], 0)
    with pytest.raises(UsageError, match="choose one of stream, gpipe, 1f1b"):
        simulate("pipedream", [1], None, [0], 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backward"):
        simulate("gpipe", [1], None, [0], 1)
    with pytest.raises(ValueError, match="link"):
        simulate("stream", [1, 1], None, [0], 1)
    with pytest.raises(ValueError, match="non-negative"):
        simulate("stream", [1, -1], None, [0, 0], 1)


def test_zero_cost_stages_give_infinite_throughput() -> None:
    tl = simulate("stream", [0.0, 0.0], None, [0.0, 0.0], 3)
    assert tl.makespan == 0 and tl.steady_state_throughput_per_s == math.inf and tl.bubble_fraction == 0


# --------------------------------------------------------------------------------------------------
# the manifest's schedule: written and read back


def _timeline_obj(tl: Timeline, names: list[str] | None = None) -> dict[str, Any]:
    return timeline_obj(tl, names)


def _read(obj: object) -> Timeline:
    """The schedule read back as the manifest reads its ``schedule`` field."""
    return layout.timeline(
        Value(obj, "schedule", Document("manifest.json", ManifestError, "re-run onnxpipe split"))
    )


def test_timeline_json_round_trip() -> None:
    tl = simulate("1f1b", [1.0, 2.0], [2.0, 3.0], [0.0, 0.25], 3)
    obj = _timeline_obj(tl, ["cpu0", "gpu0"])
    text = json.dumps(obj, allow_nan=False)
    again = _read(json.loads(text))
    assert again == tl
    assert obj["devices"][1]["device"] == "gpu0"
    assert obj["devices"][0]["steps"][0] == ["F", 0, 0.0, 1.0]
    assert obj["bubble_fraction"] == pytest.approx(tl.bubble_fraction)
    zero = _timeline_obj(simulate("stream", [0.0], None, [0.0], 1))
    assert zero["steady_state_throughput_per_s"] is None
    assert _read(zero).steady_state_throughput_per_s == math.inf


def test_timeline_json_errors_name_the_path() -> None:
    obj = _timeline_obj(simulate("gpipe", [1.0], [1.0], [0.0], 2))
    obj["devices"][0]["steps"][1] = ["X", 1, 0.0, 1.0]
    with pytest.raises(ManifestError, match=r"schedule\.devices\[0\]\.steps\[1\]\[0\]"):
        _read(obj)
    obj = _timeline_obj(simulate("gpipe", [1.0], [1.0], [0.0], 2))
    obj["kind"] = "zb-h1"
    with pytest.raises(ManifestError, match=r"schedule\.kind"):
        _read(obj)
    del obj["makespan_seconds"]
    obj["kind"] = "gpipe"
    with pytest.raises(ManifestError, match=r"missing field 'schedule\.makespan_seconds'"):
        _read(obj)


def test_step_is_plain_data() -> None:
    assert Step("F", 0, 0.0, 1.0) == Step("F", 0, 0.0, 1.0)
