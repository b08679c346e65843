"""Unit tests of onnxpipe.ir.feeds: concrete input shapes, --shape parsing, seeded random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxpipe.cli.arguments import shapes as parse_shape_overrides
from onnxpipe.core.errors import UsageError
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes


def _vi(
    name: str, shape: list[int | str | None] | None, elem: int = TensorProto.FLOAT
) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _view(nodes: list[onnx.NodeProto], inputs, outputs, inits=()) -> ModelView:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return view_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _two_input_view() -> ModelView:
    """``image[batch, 3, h, w]`` and ``ids[batch, seq]`` sharing the symbolic ``batch``."""
    return _view(
        [
            helper.make_node("Relu", ["image"], ["a"], name="relu"),
            helper.make_node("Cast", ["ids"], ["b"], to=TensorProto.FLOAT, name="cast"),
        ],
        [_vi("image", ["batch", 3, "h", "w"]), _vi("ids", ["batch", "seq"], TensorProto.INT64)],
        [_vi("a", None), _vi("b", None)],
    )


# ------------------------------------------------------------------------------------------ shapes


def test_symbolic_dims_get_defaults() -> None:
    shapes = resolve_input_shapes(_two_input_view())
    assert shapes == {"image": (1, 3, 64, 64), "ids": (1, 16)}


def test_unnamed_dims_and_fixed_dims() -> None:
    view = _view(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [_vi("x", [None, 8, None])],
        [_vi("y", None)],
    )
    assert resolve_input_shapes(view) == {"x": (1, 8, 16)}


def test_override_wins_and_reaches_shared_symbols() -> None:
    shapes = resolve_input_shapes(_two_input_view(), {"image": (4, 3, 96, 128)})
    assert shapes["image"] == (4, 3, 96, 128)
    assert shapes["ids"] == (4, 16)  # the same symbolic "batch"


def test_same_symbol_same_size_everywhere() -> None:
    view = _view(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [_vi("a", ["n", "t"]), _vi("b", ["t", "t"])],
        [_vi("y", None)],
    )
    shapes = resolve_input_shapes(view)
    assert shapes["a"][1] == shapes["b"][0] == shapes["b"][1]


def test_override_errors_name_the_input() -> None:
    view = _two_input_view()
    with pytest.raises(UsageError, match=r"'nope'.*not a model input.*image, ids"):
        resolve_input_shapes(view, {"nope": (1,)})
    with pytest.raises(UsageError, match=r"image.*rank 4"):
        resolve_input_shapes(view, {"image": (1, 3, 64)})
    with pytest.raises(UsageError, match=r"dim 1 of input 'image' is fixed at 3"):
        resolve_input_shapes(view, {"image": (1, 4, 64, 64)})


def test_unknown_rank_needs_an_override() -> None:
    view = _view([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", None)], [_vi("y", None)])
    with pytest.raises(UsageError, match=r"`shapes=x="):
        resolve_input_shapes(view)
    assert resolve_input_shapes(view, {"x": (2, 5)}) == {"x": (2, 5)}


def test_parse_shape_overrides() -> None:
    assert parse_shape_overrides(["x=1,3,224,224", "ids=2x7", "scalar="]) == {
        "x": (1, 3, 224, 224),
        "ids": (2, 7),
        "scalar": (),
    }
    assert parse_shape_overrides(["a=b=1,2"]) == {"a=b": (1, 2)}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("x", "expected NAME=D1,D2"),
        ("=1,2", "expected NAME=D1,D2"),
        ("x=1,two", "'two' is not a whole number"),
        ("x=1,,2", "'' is not a whole number"),
        ("x=1,-2", "dims must be >= 0"),
    ],
)
def test_parse_shape_overrides_errors(item: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_shape_overrides([item])


def test_parse_shape_overrides_duplicate() -> None:
    with pytest.raises(UsageError, match=r"given twice"):
        parse_shape_overrides(["x=1", "x=2"])


# ------------------------------------------------------------------------------------------- feeds


def _embedding_view(axis: int = 0) -> ModelView:
    table = numpy_helper.from_array(np.zeros((100, 7), np.float32), "table")
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64, name="cast"),
        helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids_u"], name="unsq"),
        helper.make_node("Gather", ["table", "ids_u"], ["emb"], axis=axis, name="gather"),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT, name="mcast"),
        helper.make_node("Cast", ["flags"], ["flags_f"], to=TensorProto.FLOAT, name="fcast"),
        helper.make_node("Cast", ["other"], ["other_f"], to=TensorProto.FLOAT, name="ocast"),
    ]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    return _view(
        nodes,
        [
            _vi("ids", ["b", "s"], TensorProto.INT32),
            _vi("attention_mask", ["b", "s"], TensorProto.INT64),
            _vi("flags", ["b", "s"], TensorProto.BOOL),
            _vi("other", ["b", "s"], TensorProto.INT64),
            _vi("x", ["b", "s"], TensorProto.FLOAT16),
        ],
        [_vi("emb", None), _vi("mask_f", None), _vi("flags_f", None), _vi("other_f", None)],
        [table, axes],
    )


def test_random_feeds_kinds_and_ranges() -> None:
    view = _embedding_view()
    shapes = resolve_input_shapes(view, {"ids": (4, 500)})
    feeds = random_feeds(view, shapes, seed=3)
    assert set(feeds) == {"ids", "attention_mask", "flags", "other", "x"}
    ids = feeds["ids"]
    assert ids.dtype == np.int32 and ids.shape == (4, 500)
    assert ids.min() >= 0 and ids.max() < 100 and ids.max() > 50  # spread over the table's rows
    assert feeds["attention_mask"].dtype == np.int64 and (feeds["attention_mask"] == 1).all()
    assert feeds["flags"].dtype == np.bool_ and 0 < feeds["flags"].mean() < 1
    assert set(np.unique(feeds["other"]).tolist()) <= {0, 1}
    assert feeds["x"].dtype == np.float16


def test_random_feeds_gather_axis() -> None:
    view = _embedding_view(axis=1)
    feeds = random_feeds(view, resolve_input_shapes(view, {"ids": (1, 400)}))
    assert feeds["ids"].max() < 7


def test_random_feeds_are_seeded() -> None:
    view = _two_input_view()
    shapes = resolve_input_shapes(view)
    a, b, c = (random_feeds(view, shapes, seed=s) for s in (0, 0, 1))
    assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["ids"], b["ids"])
    assert not np.array_equal(a["image"], c["image"])
    assert a["image"].dtype == np.float32 and abs(float(a["image"].std()) - 1.0) < 0.1


def test_random_feeds_refuse_strings_and_missing_shapes() -> None:
    view = _view(
        [helper.make_node("Identity", ["s"], ["y"], name="id")],
        [_vi("s", [2], TensorProto.STRING)],
        [_vi("y", None, TensorProto.STRING)],
    )
    with pytest.raises(UsageError, match=r"'s'.*STRING"):
        random_feeds(view, {"s": (2,)})
    with pytest.raises(UsageError, match=r"no shape for input 's'"):
        random_feeds(view, {})


def test_scalar_inputs_are_arrays() -> None:
    view = _view(
        [helper.make_node("Identity", [n], [f"{n}_out"], name=f"id_{n}") for n in ("f", "i", "b")],
        [_vi("f", []), _vi("i", [], TensorProto.INT64), _vi("b", [], TensorProto.BOOL)],
        [_vi("f_out", None), _vi("i_out", None, TensorProto.INT64), _vi("b_out", None, TensorProto.BOOL)],
    )
    feeds = random_feeds(view, resolve_input_shapes(view))
    for name, dtype in (("f", np.float32), ("i", np.int64), ("b", np.bool_)):
        assert isinstance(feeds[name], np.ndarray) and feeds[name].shape == () and feeds[name].dtype == dtype


def test_negative_dims_count_as_unknown() -> None:
    view = _view(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [-1, 3, -1, -1])], [_vi("y", None)]
    )
    assert resolve_input_shapes(view) == {"x": (1, 3, 64, 64)}
    assert resolve_input_shapes(view, {"x": (2, 3, 48, 32)}) == {"x": (2, 3, 48, 32)}
