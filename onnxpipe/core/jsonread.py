"""Typed reading of parsed JSON: one call per field, one-line errors naming the file and the JSON path.

Why a module of its own: every document onnxpipe reads back needs the same checks (is the key there, is
it the JSON type we want, is it in range) and the same message shape,
``<file>: <json path>: expected <what>, got <what it is>; <what to do>``.  Spelled out per field, those
checks buried a format's few real rules under plumbing and let messages drift apart.  Here each check is
written once.  A file whose records are dataclasses (the manifest, a profile) is read by
:mod:`onnxpipe.core.codec`, which calls these readers from the fields' types; a hand-written file (a
devices file, a model's config) reads one declarative line per field::

    def _link(f: Fields) -> Link:
        return Link(latency_s=f["latency_s"].finite(), ...)

:class:`Document` says which file is read and which exception to raise, :class:`Value` is any JSON value
at a known path, :class:`Fields` a JSON object (``f[key]`` is a :class:`Value`, and a missing key is an
error naming its path).  Unknown keys are ignored, so that formats add fields without breaking older
readers, unless a format refuses them with :meth:`Fields.only` (a hand-written file, where a misspelled
optional key would otherwise pass silently).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def syntax_error_text(e: json.JSONDecodeError) -> str:
    """Where and what a JSON syntax error is: ``Expecting value at line 3 column 5``.  Some of json's
    messages end in "at" themselves (``Unterminated string starting at``), which a plain
    ``f"{e.msg} at line ..."`` would double."""
    where = f"line {e.lineno} column {e.colno}"
    return f"{e.msg} {where}" if e.msg.endswith(" at") else f"{e.msg} at {where}"


@dataclass(frozen=True)
class Rule(Generic[T]):
    """A check beyond the JSON type (a plain file name, a hash) and what a passing value is called.

    A value rather than code at each call site, so that a field's reader stays one line and every rule
    fails with the same message: ``expected <expected>, got <the value>``.
    """

    ok: Callable[[T], bool]
    expected: str


@dataclass(frozen=True)
class Document:
    """One JSON document being read: the file named in messages, and the errors it raises.

    ``error`` builds the exception the caller's users expect (``ManifestError`` for a manifest);
    ``advice`` ends every message with what to do; ``root`` names the top level, whose path is empty.
    """

    source: str
    error: Callable[[str], Exception]
    advice: str
    root: str = "top level"

    def read(self, value: Any) -> Value:
        """The whole parsed document, at the empty path."""
        return Value(value, "", self)

    def load(self, path: Path) -> Any:
        """The JSON text of the file at ``path``, parsed (:meth:`parse`); one that cannot be read fails as
        ``<path>: cannot be read (...)``, then the advice."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise self.error(f"{path}: cannot be read ({e}); {self.advice}") from e
        return self.parse(text)

    def parse(self, text: str) -> Any:
        """``text`` parsed as JSON; text that is not fails as ``<file>: not valid JSON (<where>)``, then
        the advice."""
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise self.error(f"{self.source}: not valid JSON ({syntax_error_text(e)}); {self.advice}") from e

    def fail(self, path: str, what: str, advice: str | None = None) -> Exception:
        """``<file>: <path>: <what>; <advice>``: returned, not raised, so that callers write ``raise``.

        ``advice`` replaces the document's for a fault that has a more precise remedy ("did you mean ...").
        """
        return self.error(
            f"{self.source}: {path or self.root}: {what}; {self.advice if advice is None else advice}"
        )


@dataclass(frozen=True)
class Value:
    """A JSON value at ``path`` (``stages[0].inputs[1].shape``) in a document, read as the type wanted.

    Each reader returns the value as a Python type or raises the document's error naming ``path``.
    ``raw`` is the value as parsed, for the rare check no reader here covers (see :meth:`expected`).
    """

    raw: Any
    path: str
    doc: Document

    def fail(self, what: str, advice: str | None = None) -> Exception:
        return self.doc.fail(self.path, what, advice)

    def expected(self, what: str) -> Exception:
        """The error for a value of the wrong kind: ``expected <what>, got <a description of it>``."""
        return self.fail(f"expected {what}, got {describe(self.raw)}")

    def string(self, rule: Rule[str] | None = None) -> str:
        if not isinstance(self.raw, str):
            raise self.expected("a string")
        return self._checked(self.raw, rule)

    def opt_string(self, rule: Rule[str] | None = None) -> str | None:
        """A string, or ``None`` for ``null``; ``rule`` applies to a string only."""
        if self.raw is None:
            return None
        if not isinstance(self.raw, str):
            raise self.expected("a string or null")
        return self._checked(self.raw, rule)

    def integer(self, minimum: int | None = 0, *, expected: str | None = None) -> int:
        """An integer (``true`` is not one, although Python says so), ``>= minimum`` unless that is None.

        ``expected`` names what the field holds (``"a whole number of threads >= 1"``) in every failure.
        """
        v = self.raw
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.expected(expected or "an integer")
        if minimum is not None and v < minimum:
            if expected is not None:
                raise self.expected(expected)
            raise self.fail(f"expected an integer >= {minimum}, got {v}")
        return v

    def number(self, minimum: float = 0.0) -> float:
        """A float ``>= minimum``; ``null`` reads as ``+inf`` because JSON cannot write infinity.

        NaN (which Python's json module parses from ``NaN``) fails the minimum: no field means "unknown"
        by NaN, and letting one through would poison every comparison made with it.
        """
        v = self.raw
        if v is None:
            return math.inf
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.expected("a number or null (infinity)")
        if not v >= minimum:
            raise self.fail(f"expected a number >= {minimum:g}, got {v}")
        return float(v)

    def finite(self) -> float:
        """A number as a float, neither NaN nor infinite (``null`` is not one either, unlike :meth:`number`).

        The range is the caller's to check, in its own words.
        """
        v = self.raw
        if not isinstance(v, bool) and isinstance(v, int | float):
            try:
                f = float(v)
            except OverflowError:  # an integer beyond any float
                f = math.inf
            if math.isfinite(f):
                return f
        raise self.expected("a number")

    def boolean(self) -> bool:
        if not isinstance(self.raw, bool):
            raise self.expected("true or false")
        return self.raw

    def scalar(self) -> str | int | float | bool:
        """A string, number or boolean as parsed (an option passed on as is): not null, a list, an object."""
        v = self.raw
        if not isinstance(v, str | int | float | bool):
            raise self.expected("a string, number or boolean")
        return v

    def parsed(self, parse: Callable[[str], T], *, what: str, advice: str) -> T:
        """A string in a notation of its own (a size such as ``"8 GiB"``), turned into ``T`` by ``parse``.

        A ``ValueError`` from ``parse`` fails as ``'<the string>' is not <what>; <advice>``, the advice
        saying how such a value is written.
        """
        s = self.string()
        try:
            return parse(s)
        except ValueError:
            raise self.fail(f"{s!r} is not {what}", advice) from None

    def fields(self) -> Fields:
        """This value as a JSON object, read key by key."""
        if not isinstance(self.raw, dict):
            raise self.expected("an object")
        return Fields(self.raw, self.path, self.doc)

    def object(self, read: Callable[[Fields], T]) -> T:
        """A JSON object turned into ``T`` by ``read`` (a dataclass's reader)."""
        return read(self.fields())

    def list_of(self, item: Callable[[Value], T], *, nullable: bool = False) -> tuple[T, ...]:
        """A list, each element read by ``item`` at path ``<path>[i]``; ``nullable``: the list of an
        ``X | None`` whose ``null`` was read already (a shape of unknown rank), named so in messages."""
        if not isinstance(self.raw, list):
            raise self.expected("a list or null" if nullable else "a list")
        return tuple(item(Value(v, f"{self.path}[{i}]", self.doc)) for i, v in enumerate(self.raw))

    def objects(self, read: Callable[[Fields], T]) -> tuple[T, ...]:
        """A list of JSON objects, each turned into ``T`` by ``read``."""
        return self.list_of(lambda v: v.object(read))

    def dict_of(self, item: Callable[[Value], T], *, subscript: bool = False) -> dict[str, T]:
        """A JSON object used as a map (any keys), each value read by ``item`` at path ``<path>.<key>``.

        ``subscript`` names a value ``<path>['<key>']`` instead: for maps keyed by node or tensor names,
        which hold dots and slashes of their own.
        """
        fields = self.fields()
        if not subscript:
            return {key: item(v) for key, v in fields.items()}
        return {key: item(Value(v, f"{self.path}[{key!r}]", self.doc)) for key, v in fields.raw.items()}

    def _checked(self, s: str, rule: Rule[str] | None) -> str:
        if rule is not None and not rule.ok(s):
            raise self.fail(f"expected {rule.expected}, got {s!r}")
        return s


@dataclass(frozen=True)
class Fields:
    """A JSON object at ``path``: ``fields[key]`` is the :class:`Value` of a key that must be there."""

    raw: Mapping[str, Any]
    path: str
    doc: Document

    def __getitem__(self, key: str) -> Value:
        if key not in self.raw:
            raise self.doc.error(f"{self.doc.source}: missing field '{self._path(key)}'; {self.doc.advice}")
        return Value(self.raw[key], self._path(key), self.doc)

    def need(self, key: str, advice: str) -> Value:
        """Like ``fields[key]``, but a missing key fails as ``<path>: missing; <advice>`` with a format's own
        advice (which keys every such object needs)."""
        if key not in self.raw:
            raise self.doc.fail(self._path(key), "missing", advice)
        return Value(self.raw[key], self._path(key), self.doc)

    def only(self, allowed: Collection[str]) -> Fields:
        """This object, refused if it has a key outside ``allowed``: ``<path>.<key>: unknown key; did you mean
        '<the closest allowed key>'?`` (or, with none close, the allowed keys)."""
        names = sorted(allowed)
        for key in self.raw:
            if key not in allowed:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(names)}"
                raise self.doc.fail(self._path(key), "unknown key", hint)
        return self

    def get(self, key: str, default: Any) -> Value:
        """The value of an optional key, ``default`` (a JSON value, read like one) when it is absent."""
        return Value(self.raw.get(key, default), self._path(key), self.doc)

    def items(self) -> list[tuple[str, Value]]:
        """Every key and its value, in document order."""
        return [(key, Value(v, self._path(key), self.doc)) for key, v in self.raw.items()]

    def fail(self, what: str, advice: str | None = None) -> Exception:
        return self.doc.fail(self.path, what, advice)

    def _path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key


def describe(v: Any) -> str:
    """A JSON value as a message shows it: its kind, and the value itself unless it is a list or object."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"string {v!r}"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return f"{type(v).__name__} {v!r}"
