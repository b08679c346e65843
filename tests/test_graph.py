"""Unit tests of onnxpipe.graph on plain names: orders, live bytes, cut bytes."""

from __future__ import annotations

import pytest

from onnxpipe.errors import ModelLoadError
from onnxpipe.graph import (
    cut_profile,
    dfs_order,
    file_order_if_topological,
    greedy_live_order,
    live_bytes_profile,
)

# x -> a -> b -> c -> y, with a skip a -> y
DEPS = [("x",), ("a",), ("b",), ("c", "a")]
OUTS = [("a",), ("b",), ("c",), ("y",)]
SIZE = {"x": 1, "a": 10, "b": 100, "c": 1000, "y": 1}


def test_file_order_detects_non_topological() -> None:
    assert file_order_if_topological(DEPS, OUTS, {"x"}) == [0, 1, 2, 3]
    assert file_order_if_topological(list(reversed(DEPS)), list(reversed(OUTS)), {"x"}) is None


def test_orders_are_topological() -> None:
    for order in (dfs_order(DEPS, OUTS, {"x"}), greedy_live_order(DEPS, OUTS, {"x"}, SIZE)):
        assert order == [0, 1, 2, 3]


def test_cycle_is_an_error() -> None:
    with pytest.raises(ModelLoadError, match="not a DAG"):
        dfs_order([("b",), ("a",)], [("a",), ("b",)], set())
    with pytest.raises(ModelLoadError, match="not a DAG"):
        greedy_live_order([("b",), ("a",)], [("a",), ("b",)], set(), {})


def test_live_bytes_counts_skip_connections() -> None:
    live = live_bytes_profile([0, 1, 2, 3], DEPS, OUTS, SIZE, set())
    # cut 1: a ; cut 2: b + a (skip) ; cut 3: c + a
    assert live == [10, 110, 1010]


def test_cut_profile_model_inputs_and_free_tensors() -> None:
    deps = [("x", "w"), ("a", "x"), ("b",)]
    outs = [("a",), ("b",), ("y",)]
    prof = cut_profile(deps, outs, {"x": 4, "a": 8, "b": 16, "w": 1000}, free={"w"})
    # cut 1: a and the model input x read again by node 1; cut 2: b
    assert prof.bytes == (0, 12, 16, 0)
