"""Unit tests of onnxpipe.ir.graph on plain names: orders, live bytes, cut bytes."""

from __future__ import annotations

import pytest

from onnxpipe.core.errors import ModelLoadError
from onnxpipe.ir.graph import (
    cut_profile,
    dfs_order,
    greedy_live_order,
    live_bytes_profile,
    stable_order,
)

# x -> a -> b -> c -> y, with a skip a -> y
DEPS = [("x",), ("a",), ("b",), ("c", "a")]
OUTS = [("a",), ("b",), ("c",), ("y",)]
SIZE = {"x": 1, "a": 10, "b": 100, "c": 1000, "y": 1}


def test_file_order_detects_non_topological() -> None:
    assert stable_order(DEPS, OUTS, {"x"}) == [0, 1, 2, 3]
    assert stable_order(list(reversed(DEPS)), list(reversed(OUTS)), {"x"}) == [3, 2, 1, 0]


def test_orders_are_topological() -> None:
    for order in (dfs_order(DEPS, OUTS, {"x"}), greedy_live_order(DEPS, OUTS, {"x"}, SIZE)):
        assert order == [0, 1, 2, 3]


def test_cycle_is_an_error() -> None:
    with pytest.raises(ModelLoadError, match="not a DAG"):
        dfs_order([("b",), ("a",)], [("a",), ("b",)], set())
    # the message names the cycle, node by node, and not the node that only reads from it
    with pytest.raises(ModelLoadError, match=r"^nodes 'p' -> 'q' -> 'p' form a cycle") as info:
        dfs_order([("x", "b"), ("a",), ("a",)], [("a",), ("b",), ("c",)], {"x"}, ["p", "q", "r"])
    assert "'r'" not in str(info.value)
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
    assert prof == (0, 12, 16, 0)


def test_cut_profile_counts_equal_tensors_once_while_any_crosses() -> None:
    # a and b hold one value (class 7): a crosses cuts 1..2, b cuts 3..4, c (a value of its own) 2..4
    deps = [("x",), ("x",), ("a",), ("c",), ("b", "c")]
    outs = [("a",), ("c",), ("b",), ("d",), ("y",)]
    sizes = {"a": 8, "b": 8, "c": 100}
    plain = cut_profile(deps, outs, sizes, free=(), classes=None)
    assert plain == (0, 8, 108, 108, 108, 0)
    shared = cut_profile(deps, outs, sizes, free=(), classes={"a": 7, "b": 7, "c": 1})
    assert shared == plain  # a and b never cross one cut together
    deps2 = [("x",), ("x",), ("x",), ("a", "b"), ("a", "b")]
    outs2 = [("a",), ("b",), ("c",), ("d",), ("y",)]
    # a crosses cuts 1..4, b 2..4: the value counts 8 bytes at each, not 16
    assert cut_profile(deps2, outs2, {"a": 8, "b": 8}, free=()) == (0, 8, 16, 16, 16, 0)
    assert cut_profile(deps2, outs2, {"a": 8, "b": 8}, free=(), classes={"a": 0, "b": 0}) == (
        0,
        8,
        8,
        8,
        8,
        0,
    )
