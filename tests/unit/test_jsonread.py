"""Tests of onnxpipe.core.jsonread, the typed JSON field reader the manifest reader is written with."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from onnxpipe.core.jsonread import Document, Rule, Value, describe, syntax_error_text


class _Bad(Exception):
    pass


def _doc() -> Document:
    return Document("f.json", _Bad, "fix it", root="top")


def _fails(read: Callable[[], object], message: str) -> None:
    with pytest.raises(_Bad) as info:
        read()
    assert str(info.value) == message


def test_reader_messages_name_the_file_the_path_and_what_to_do() -> None:
    top = _doc().read({"a": {"b": [{"c": "x"}]}}).fields()
    c = top["a"].fields()["b"].objects(lambda f: f["c"])[0]
    assert c.path == "a.b[0].c" and c.string() == "x"
    _fails(c.integer, "f.json: a.b[0].c: expected an integer, got string 'x'; fix it")
    _fails(lambda: top["a"].fields()["z"], "f.json: missing field 'a.z'; fix it")
    _fails(lambda: _doc().read([]).fields(), "f.json: top: expected an object, got a list; fix it")
    assert str(top.fail("wrong as a whole")) == "f.json: top: wrong as a whole; fix it"
    assert str(top["a"].fields().fail("too long")) == "f.json: a: too long; fix it"
    assert isinstance(top["a"].fail("too long"), _Bad)
    assert str(top["a"].expected("a list")) == "f.json: a: expected a list, got an object; fix it"


def test_reader_optional_keys_read_their_default() -> None:
    top = _doc().read({"n": 3}).fields()
    assert top.get("n", 0).integer() == 3
    assert top.get("m", 5).integer() == 5 and top.get("m", 5).path == "m"
    assert top.get("l", []).list_of(Value.string) == ()


def test_reader_integers() -> None:
    v = _doc().read
    assert v(0).integer() == 0 and v(-4).integer(minimum=None) == -4 and v(3).integer(minimum=3) == 3
    _fails(v(True).integer, "f.json: top: expected an integer, got true; fix it")
    _fails(v(1.0).integer, "f.json: top: expected an integer, got float 1.0; fix it")
    _fails(lambda: v(0).integer(minimum=1), "f.json: top: expected an integer >= 1, got 0; fix it")


def test_reader_numbers_read_null_as_infinity_and_refuse_nan() -> None:
    v = _doc().read
    assert v(None).number() == math.inf
    assert v(2).number() == 2.0 and type(v(2).number()) is float
    assert v(-1.5).number(minimum=-2) == -1.5
    _fails(v(math.nan).number, "f.json: top: expected a number >= 0, got nan; fix it")
    _fails(v(-0.5).number, "f.json: top: expected a number >= 0, got -0.5; fix it")
    _fails(lambda: v(0.5).number(minimum=1.5), "f.json: top: expected a number >= 1.5, got 0.5; fix it")
    _fails(v("1").number, "f.json: top: expected a number or null (infinity), got string '1'; fix it")


def test_reader_strings_and_rules() -> None:
    v = _doc().read
    short: Rule[str] = Rule(lambda s: len(s) < 3, "a short string")
    assert v("ab").string(short) == "ab" and v(None).opt_string(short) is None
    _fails(lambda: v("abc").string(short), "f.json: top: expected a short string, got 'abc'; fix it")
    _fails(lambda: v("abc").opt_string(short), "f.json: top: expected a short string, got 'abc'; fix it")
    _fails(v(1).string, "f.json: top: expected a string, got int 1; fix it")
    _fails(v(None).string, "f.json: top: expected a string, got null; fix it")
    _fails(v([]).opt_string, "f.json: top: expected a string or null, got a list; fix it")


def test_reader_lists_and_maps() -> None:
    v = _doc().read
    assert v([1, 2]).list_of(Value.integer) == (1, 2)
    assert v([]).list_of(Value.integer, nullable=True) == ()
    assert list(v({"b": [1], "a": []}).dict_of(lambda x: x.list_of(Value.integer)).items()) == [
        ("b", (1,)),
        ("a", ()),
    ]
    _fails(lambda: v({"x": 1}).list_of(Value.integer), "f.json: top: expected a list, got an object; fix it")
    _fails(
        lambda: v(1).list_of(Value.integer, nullable=True),
        "f.json: top: expected a list or null, got int 1; fix it",
    )
    _fails(
        lambda: v([1, "2"]).list_of(Value.integer),
        "f.json: [1]: expected an integer, got string '2'; fix it",
    )
    _fails(
        lambda: v({"b": [1, None]}).dict_of(lambda x: x.list_of(Value.integer)),
        "f.json: b[1]: expected an integer, got null; fix it",
    )
    _fails(lambda: v([{}, 3]).objects(lambda f: f), "f.json: [1]: expected an object, got int 3; fix it")
    assert v([{"k": 1}]).objects(lambda f: f["k"].integer()) == (1,)
    assert v({"k": "x"}).object(lambda f: f["k"].string()) == "x"


@pytest.mark.parametrize(
    ("value", "described"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        ("s", "string 's'"),
        ([1], "a list"),
        ({"a": 1}, "an object"),
        (3, "int 3"),
        (2.5, "float 2.5"),
    ],
)
def test_describe(value: object, described: str) -> None:
    assert describe(value) == described


def test_reader_advice_can_be_replaced_for_one_fault() -> None:
    top = _doc().read({"a": 1}).fields()
    assert str(top["a"].fail("too big", "halve it")) == "f.json: a: too big; halve it"
    assert str(top.fail("empty", "add a key")) == "f.json: top: empty; add a key"
    assert str(_doc().fail("a", "too big")) == "f.json: a: too big; fix it"


def test_reader_need_names_the_missing_path_with_its_own_advice() -> None:
    f = _doc().read({"a": {"b": 1}}).fields()["a"].fields()
    assert f.need("b", "give b").integer() == 1
    _fails(lambda: f.need("c", "every a needs b and c"), "f.json: a.c: missing; every a needs b and c")


def test_reader_only_refuses_unknown_keys_with_a_suggestion() -> None:
    f = _doc().read({"devices": [], "lnks": []}).fields()
    assert f.only({"devices", "lnks"}) is f
    _fails(lambda: f.only({"devices", "links"}), "f.json: lnks: unknown key; did you mean 'links'?")
    inner = _doc().read({"a": {"zzz": 1}}).fields()["a"].fields()
    _fails(lambda: inner.only({"x", "y"}), "f.json: a.zzz: unknown key; allowed keys: x, y")


def test_reader_integer_with_its_own_words() -> None:
    v = _doc().read
    threads = "a whole number of threads >= 1"
    assert v(2).integer(1, expected=threads) == 2
    _fails(lambda: v(0).integer(1, expected=threads), f"f.json: top: expected {threads}, got int 0; fix it")
    _fails(lambda: v(True).integer(1, expected=threads), f"f.json: top: expected {threads}, got true; fix it")


@pytest.mark.parametrize(
    ("bad", "seen"),
    [(None, "null"), (True, "true"), ("1", "string '1'"), (math.nan, "float nan"), (math.inf, "float inf")],
)
def test_reader_finite_numbers(bad: object, seen: str) -> None:
    assert _doc().read(3).finite() == 3.0 and type(_doc().read(3).finite()) is float
    assert _doc().read(-0.5).finite() == -0.5
    _fails(_doc().read(bad).finite, f"f.json: top: expected a number, got {seen}; fix it")


def test_reader_finite_refuses_an_integer_beyond_any_float() -> None:
    with pytest.raises(_Bad, match="expected a number, got int 1000"):
        _doc().read(10**400).finite()


def test_reader_booleans_and_scalars() -> None:
    v = _doc().read
    assert v(True).boolean() is True and v(False).boolean() is False
    _fails(v(1).boolean, "f.json: top: expected true or false, got int 1; fix it")
    _fails(v("yes").boolean, "f.json: top: expected true or false, got string 'yes'; fix it")
    assert [v(x).scalar() for x in ("s", 1, 2.5, False)] == ["s", 1, 2.5, False]
    _fails(v(None).scalar, "f.json: top: expected a string, number or boolean, got null; fix it")
    _fails(v([]).scalar, "f.json: top: expected a string, number or boolean, got a list; fix it")


def test_reader_parsed_strings_say_how_to_write_them() -> None:
    def km(s: str) -> float:
        if not s.endswith(" km"):
            raise ValueError(s)
        return float(s[:-3]) * 1000

    def read(raw: object) -> float:
        return _doc().read(raw).parsed(km, what="a distance", advice='write e.g. "3 km"')

    assert read("2 km") == 2000.0
    _fails(lambda: read("far"), "f.json: top: 'far' is not a distance; write e.g. \"3 km\"")
    _fails(lambda: read(3), "f.json: top: expected a string, got int 3; fix it")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"a": "x', "Unterminated string starting at line 1 column 7"),  # json's message ends in "at"
        ('{"a" 1}', "Expecting ':' delimiter at line 1 column 6"),
        ("[1,\n]", "Expecting value at line 2 column 1"),
    ],
)
def test_a_syntax_error_says_where_once(text: str, says: str) -> None:
    """Regression: ``Unterminated string starting at at line 1``."""
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(text)
    assert syntax_error_text(info.value) == says


def test_parse_and_load_name_the_file_and_say_what_to_do(tmp_path: Path) -> None:
    assert _doc().parse('{"a": [1]}') == {"a": [1]}
    _fails(
        lambda: _doc().parse("[1,\n]"), "f.json: not valid JSON (Expecting value at line 2 column 1); fix it"
    )
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text("[true]", encoding="utf-8")
    bad.write_text("{", encoding="utf-8")
    assert Document(str(good), _Bad, "fix it").load(good) == [True]
    with pytest.raises(_Bad, match=r"bad\.json: not valid JSON \(.*line 1 column 2\); fix it$"):
        Document(str(bad), _Bad, "fix it").load(bad)
    missing = tmp_path / "missing.json"
    with pytest.raises(_Bad, match=r"missing\.json: cannot be read \(.*\); fix it$"):
        Document(str(missing), _Bad, "fix it").load(missing)
