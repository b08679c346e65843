"""Tests of onnxpipe.core.codec: records written as JSON and read back, every type it knows, and one
asserted message per kind of bad value, naming the file and the JSON path."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal, NamedTuple

import pytest

from onnxpipe.core.codec import Codec, Expected, FieldError, Finite, Minimum, Special
from onnxpipe.core.errors import ManifestError
from onnxpipe.core.jsonread import Document, Rule, Value


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Size(NamedTuple):
    colour: Colour
    width: int
    height: int


StageOrModel = Annotated[int | Literal["model"], Expected('a stage index or "model"')]
Hex = Annotated[str, Rule(lambda s: all(c in "0123456789abcdef" for c in s), "lowercase hex digits")]


@dataclass(frozen=True)
class Inner:
    name: str
    source: StageOrModel
    sha: Hex | None = None


@dataclass(frozen=True)
class Outer:
    """Every kind of field the codec reads and writes."""

    index: int
    count: Annotated[int, Minimum(1)]
    seconds: float
    offset: Annotated[float, Finite()]
    spent: Annotated[float, Finite(least=0.0)]
    flag: bool
    colour: Colour
    inner: Inner
    inners: tuple[Inner, ...]
    shape: tuple[int | str | None, ...] | None
    shapes: Mapping[str, tuple[int, ...]]
    by_colour: tuple[tuple[Colour, float], ...]
    sizes: tuple[Size, ...]
    pair: tuple[str, int]
    groups: tuple[tuple[str, ...], ...] = ()
    logits: str | None = None
    seed: Annotated[int, Minimum(None)] = 0
    notes: tuple[str, ...] = ()
    maybe: Inner | None = None
    cache: str = field(default="", compare=False)


@dataclass(frozen=True)
class Ordered:
    """A record whose fields must agree: ``first <= last``."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.first > self.last:
            raise FieldError("last", f"expected at least {self.first}, got {self.last}")


def _outer(**changes: Any) -> Outer:
    values: dict[str, Any] = {
        "index": 0,
        "count": 2,
        "seconds": math.inf,
        "offset": -1.5,
        "spent": 0.0,
        "flag": True,
        "colour": Colour.RED,
        "inner": Inner("a", "model", "ab"),
        "inners": (Inner("b", 0), Inner("c", 1, None)),
        "shape": ("batch", 8, None),
        "shapes": {"x": (1, 8)},
        "by_colour": ((Colour.BLUE, 0.5), (Colour.RED, 0.25)),
        "sizes": (Size(Colour.RED, 3, 4),),
        "pair": ("opset", 17),
    }
    return Outer(**{**values, **changes})


CODEC = Codec()


def _doc() -> Document:
    return Document("f.json", ManifestError, "fix it", root="top")


def _read(kind: Any, obj: Any) -> Any:
    return CODEC.decode(kind, _doc().read(json.loads(json.dumps(obj, allow_nan=True))))


def test_a_record_round_trips_through_json_text() -> None:
    o = _outer(logits="out", seed=-3, notes=("n",), maybe=Inner("d", "model"), groups=(("a", "b"), ("c",)))
    obj = CODEC.encode(Outer, o)
    assert obj["groups"] == [["a", "b"], ["c"]]  # a tuple of string tuples is a list of lists, not pairs
    assert _read(Outer, obj) == o


def test_what_each_type_is_written_as() -> None:
    obj = CODEC.encode(Outer, _outer())
    assert obj["seconds"] is None  # JSON has no infinity: null stands for it
    assert obj["colour"] == "red" and type(obj["colour"]) is str
    assert obj["inner"] == {"name": "a", "source": "model", "sha": "ab"}
    assert obj["inners"][1] == {"name": "c", "source": 1}  # a None default says nothing: left out
    assert obj["shape"] == ["batch", 8, None]
    assert obj["shapes"] == {"x": [1, 8]}
    assert obj["by_colour"] == {"blue": 0.5, "red": 0.25}  # pairs keyed by a string: an object
    assert obj["sizes"] == [{"colour": "red", "width": 3, "height": 4}]  # a NamedTuple: an object
    assert obj["pair"] == ["opset", 17]
    assert obj["seed"] == 0  # a default that says something is written
    assert "notes" not in obj and "maybe" not in obj and "logits" not in obj
    assert CODEC.encode(Outer, _outer(logits="y"))["logits"] == "y"


def test_a_field_outside_the_records_value_is_neither_written_nor_read() -> None:
    obj = CODEC.encode(Outer, _outer(cache="in memory"))
    assert "cache" not in obj
    obj["cache"] = "from the file"
    assert _read(Outer, obj).cache == ""


def test_absent_fields_with_defaults_read_as_their_defaults_and_unknown_keys_are_ignored() -> None:
    obj = CODEC.encode(Outer, _outer())
    obj["from_the_future"] = {"anything": 1}
    back = _read(Outer, obj)
    assert back == _outer() and back.notes == () and back.maybe is None
    assert isinstance(back.shapes, Mapping) and back.shapes["x"] == (1, 8)


def test_nan_and_minus_infinity_are_refused_on_write() -> None:
    with pytest.raises(ValueError, match="NaN"):
        CODEC.encode(Outer, _outer(seconds=math.nan))
    with pytest.raises(ValueError, match="-inf"):
        CODEC.encode(Outer, _outer(seconds=-math.inf))


def _set(key: str, value: Any) -> dict[str, Any]:
    obj: dict[str, Any] = CODEC.encode(Outer, _outer())
    target: Any = obj
    *parents, last = key.split("/")
    for p in parents:
        target = target[int(p)] if p.isdigit() else target[p]
    target[int(last) if last.isdigit() else last] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_set("index", "3"), "index: expected an integer, got string '3'"),
        (_set("index", True), "index: expected an integer, got true"),
        (_set("index", -1), "index: expected an integer >= 0, got -1"),
        (_set("count", 0), "count: expected an integer >= 1, got 0"),
        (_set("seconds", "fast"), "seconds: expected a number or null (infinity), got string 'fast'"),
        (_set("seconds", -0.5), "seconds: expected a number >= 0, got -0.5"),
        (_set("seconds", math.nan), "seconds: expected a number >= 0, got nan"),
        (_set("offset", None), "offset: expected a number, got null"),
        (_set("flag", 1), "flag: expected true or false, got int 1"),
        (_set("colour", "green"), "colour: expected one of red, blue, got 'green'"),
        (_set("colour", 3), "colour: expected a string, got int 3"),
        (_set("inner", "a"), "inner: expected an object, got string 'a'"),
        (_set("inner/source", -1), 'inner.source: expected a stage index or "model", got int -1'),
        (
            _set("inner/source", "models"),
            "inner.source: expected a stage index or \"model\", got string 'models'",
        ),
        (_set("inner/sha", "XY"), "inner.sha: expected lowercase hex digits, got 'XY'"),
        (_set("inner/sha", 3), "inner.sha: expected a string or null, got int 3"),
        (_set("inners", {}), "inners: expected a list, got an object"),
        (_set("inners/1", ["c"]), "inners[1]: expected an object, got a list"),
        (_set("shape", "batch"), "shape: expected a list or null, got string 'batch'"),
        (_set("shape/0", 1.5), "shape[0]: expected an integer or a string or null, got float 1.5"),
        (_set("shapes", [[1]]), "shapes: expected an object, got a list"),
        (_set("shapes/x", [1, -8]), "shapes['x'][1]: expected an integer >= 0, got -8"),
        (_set("spent", -0.5), "spent: expected a finite number >= 0, got -0.5"),
        (_set("spent", None), "spent: expected a number, got null"),
        (_set("by_colour", {"green": 1.0}), "by_colour.green: expected one of red, blue, got 'green'"),
        (
            _set("by_colour/red", "slow"),
            "by_colour.red: expected a number or null (infinity), got string 'slow'",
        ),
        (_set("sizes/0/width", None), "sizes[0].width: expected an integer, got null"),
        (_set("pair", ["opset"]), "pair: expected a list of 2, got 1 items"),
        (_set("logits", 3), "logits: expected a string or null, got int 3"),
    ],
)
def test_a_bad_value_is_named_by_its_json_path(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError) as info:
        _read(Outer, obj)
    assert str(info.value) == f"f.json: {message}; fix it"


def test_a_missing_field_is_named_by_its_path() -> None:
    obj = CODEC.encode(Outer, _outer())
    del obj["inners"][0]["source"]
    with pytest.raises(ManifestError) as info:
        _read(Outer, obj)
    assert str(info.value) == "f.json: missing field 'inners[0].source'; fix it"


def test_a_record_that_refuses_its_values_is_named_at_the_field() -> None:
    assert _read(Ordered, {"first": 1, "last": 2}) == Ordered(1, 2)
    with pytest.raises(ManifestError) as info:
        _read(Ordered, {"first": 3, "last": 2})
    assert str(info.value) == "f.json: last: expected at least 3, got 2; fix it"


@dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclass(frozen=True)
class Drawing:
    points: tuple[Point, ...]


def test_a_special_type_is_written_and_read_by_its_own_converter() -> None:
    """A type with a format of its own (a point written ``"x,y"``) keeps it inside records."""

    def decode(v: Value) -> Point:
        x, y = v.string().split(",")
        return Point(int(x), int(y))

    codec = Codec({Point: Special(lambda p: f"{p.x},{p.y}", decode)})
    d = Drawing((Point(1, 2), Point(3, 4)))
    assert codec.encode(Drawing, d) == {"points": ["1,2", "3,4"]}
    assert codec.decode(Drawing, _doc().read({"points": ["1,2", "3,4"]})) == d


def test_a_type_the_codec_does_not_know_is_a_bug_not_a_bad_file() -> None:
    @dataclass(frozen=True)
    class Odd:
        value: complex

    with pytest.raises(TypeError, match="cannot read"):
        CODEC.decode(Odd, _doc().read({"value": 1}))
