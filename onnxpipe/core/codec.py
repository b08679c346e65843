"""One generic codec between frozen dataclasses and JSON values, driven by the classes' own type hints.

Why: a record written to a file (the manifest's stages, its plan, a decoder's dimensions) was declared
once as a dataclass and then spelled out twice more, a writer line and a reader line per field, so a new
field meant three edits and a forgotten one was a silent loss.  Here a record's fields *are* its format:
:meth:`Codec.encode` writes a dataclass as a JSON object of its fields, :meth:`Codec.decode` reads one
back, checking every value against the field's type with :mod:`onnxpipe.core.jsonread`, whose messages
name the file and the JSON path (``m.json: stages[0].index: expected an integer, got string '3'; ...``).

What each type reads and writes as:

* a dataclass or a ``NamedTuple``: an object of its fields.  A field with a default may be absent (it
  reads as the default), and one whose value is its ``None`` or empty default is left out when written,
  so that an optional field costs a file nothing until it says something.  A field outside the
  record's value (``compare=False``: a cache, the file it was read from) is neither written nor read;
* ``int`` (>= 0 unless :class:`Minimum` says otherwise; ``true`` is not one), ``bool``, ``str``;
* ``float``: a number >= 0, ``null`` standing for ``+inf`` (JSON has no infinity; NaN is refused both
  ways); with :class:`Finite`, a finite number (of any sign, or from its ``least``);
* a ``StrEnum`` or ``Literal`` of strings: one of its values; a union of scalars (``int | Literal["model"]``,
  a dim ``int | str | None``): any member, named in messages by its :class:`Expected`;
* ``X | None``: ``null`` or an ``X``; ``tuple[X, ...]``: a list; ``tuple[X, Y]``: a list of two;
  ``Mapping[str, X]``: an object (read as a read-only mapping; a value is named ``shapes['x.1']``, since
  its keys are names such as a tensor's, which hold dots of their own);
* ``tuple[tuple[K, V], ...]`` whose ``K`` is a string or a ``StrEnum``: an object (pairs sorted or in
  order, as the record keeps them), since JSON has no pairs and an object says what each number is for.

``Annotated`` metadata adds checks a type cannot say: :class:`Minimum`, :class:`Finite`, :class:`Expected`
and :class:`~onnxpipe.core.jsonread.Rule` (a plain file name, a sha256).  A record's ``__post_init__``
may refuse values that disagree with each other by raising :class:`FieldError`, which the codec reports
at that field's path.  Types with a format of their own (a devices file, a timeline) are passed to
:class:`Codec` as :class:`Special` converters.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

from onnxpipe.core.jsonread import Rule, Value


@dataclass(frozen=True)
class Minimum:
    """The least value of an ``int`` field (0 when none is given); ``Minimum(None)``: any integer."""

    value: int | None


@dataclass(frozen=True)
class Finite:
    """A ``float`` field that is a finite number (``null`` does not mean infinity there), of any sign
    unless ``least`` is given."""

    least: float | None = None


@dataclass(frozen=True)
class Expected:
    """What a union of scalars is called in a message: ``a stage index or "model"``."""

    what: str


class FieldError(ValueError):
    """A record's values disagree: raised by its ``__post_init__`` naming the field at fault, which the
    codec reports at that field's JSON path (and a program that built the record wrongly sees as a bug)."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")
        self.field = field
        self.what = what


@dataclass(frozen=True)
class Special:
    """How a type with a format of its own is written (``encode``) and read back (``decode``)."""

    encode: Callable[[Any], Any]
    decode: Callable[[Value], Any]


@dataclass(frozen=True)
class _Checks:
    """The ``Annotated`` metadata of one type, gathered."""

    minimum: int | None = 0
    finite: bool = False
    least: float | None = None
    expected: str | None = None
    rule: Rule[Any] | None = None


def _unwrap(hint: Any, checks: _Checks | None = None) -> tuple[Any, _Checks]:
    """``hint`` without ``Annotated``, and the checks its metadata asks for (added to ``checks``)."""
    checks = checks or _Checks()
    if get_origin(hint) is not Annotated:
        return hint, checks
    base, *extras = get_args(hint)
    for x in extras:
        if isinstance(x, Minimum):
            checks = dataclasses.replace(checks, minimum=x.value)
        elif isinstance(x, Finite):
            checks = dataclasses.replace(checks, finite=True, least=x.least)
        elif isinstance(x, Expected):
            checks = dataclasses.replace(checks, expected=x.what)
        elif isinstance(x, Rule):
            checks = dataclasses.replace(checks, rule=x)
    return base, checks


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def _is_union(hint: Any) -> bool:
    return get_origin(hint) in (types.UnionType, typing.Union)


def _is_named_tuple(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields")


def _pair_types(hint: Any) -> tuple[Any, Any] | None:
    """``(K, V)`` when ``hint`` is ``tuple[tuple[K, V], ...]`` with a string key (written as an object)."""
    args = get_args(hint)
    if get_origin(hint) is not tuple or len(args) != 2 or args[1] is not Ellipsis:
        return None
    pair = _unwrap(args[0])[0]
    if get_origin(pair) is not tuple or len(get_args(pair)) != 2:
        return None
    key, value = get_args(pair)
    key_type = _unwrap(key)[0]
    keyed = isinstance(key_type, type) and issubclass(key_type, str) and value is not Ellipsis
    return (key, value) if keyed else None


def _record_fields(cls: type) -> list[tuple[str, Any, Any]]:
    """``(name, type, default)`` of each field of a dataclass or ``NamedTuple`` (its name is its JSON key);
    the default is ``dataclasses.MISSING`` for a field that must be given."""
    hints = _hints(cls)
    if dataclasses.is_dataclass(cls):
        return [(f.name, hints[f.name], f.default) for f in dataclasses.fields(cls) if f.init and f.compare]
    defaults = getattr(cls, "_field_defaults", {})
    return [(n, hints[n], defaults.get(n, dataclasses.MISSING)) for n in cls._fields]  # type: ignore[attr-defined]


def _left_out(value: Any, default: Any) -> bool:
    """Whether a field is left out when written: its value is its default, and that says nothing."""
    return default is not dataclasses.MISSING and (default is None or default == ()) and value == default


def number(x: float | None) -> float | None:
    """A float as JSON writes it: ``+inf`` (and None, nothing known) as ``null``; NaN and ``-inf`` are
    refused (no field means them)."""
    if x is None:
        return None
    if math.isnan(x):
        raise ValueError("NaN cannot be written to a JSON file of onnxpipe's")
    if math.isinf(x):
        if x < 0:
            raise ValueError("-inf cannot be written to a JSON file of onnxpipe's")
        return None
    return float(x)


class Codec:
    """Writes and reads records as JSON values; ``special`` converts the types with formats of their own."""

    def __init__(self, special: Mapping[type, Special] | None = None) -> None:
        self.special = dict(special or {})

    # ---------------------------------------------------------------------------------------------
    # writing

    def encode(self, hint: Any, value: Any) -> Any:
        """``value``, of type ``hint``, as a JSON value (dicts, lists, strings, numbers, None)."""
        hint, _ = _unwrap(hint)
        if value is None:
            return None
        if isinstance(hint, type) and hint in self.special:
            return self.special[hint].encode(value)
        if _is_union(hint):
            return self.encode(_member_of(hint, value), value)
        if dataclasses.is_dataclass(hint) or _is_named_tuple(hint):
            return self._record_obj(hint, value)
        origin, args = get_origin(hint), get_args(hint)
        pair = _pair_types(hint)
        if pair is not None:
            return {self.encode(pair[0], k): self.encode(pair[1], v) for k, v in value}
        if origin is tuple:
            repeated = len(args) == 2 and args[1] is Ellipsis
            return [self.encode(args[0] if repeated else args[i], v) for i, v in enumerate(value)]
        if origin in (Mapping, dict) or hint in (Mapping, dict):
            value_t = args[1] if args else Any
            return {str(k): self.encode(value_t, v) for k, v in value.items()}
        if hint is float:
            return number(value)
        return value.value if isinstance(value, enum.Enum) else value

    def _record_obj(self, cls: Any, value: Any) -> dict[str, Any]:
        """A dataclass or ``NamedTuple`` as an object of its fields, those that say nothing left out."""
        fields = _record_fields(cls)
        if _is_named_tuple(cls):  # by position: a plain tuple of the same values writes the same
            values = dict(zip((name for name, *_ in fields), value, strict=True))
        else:
            values = {name: getattr(value, name) for name, *_ in fields}
        return {
            name: self.encode(t, values[name])
            for name, t, default in fields
            if not _left_out(values[name], default)
        }

    # ---------------------------------------------------------------------------------------------
    # reading

    def decode(self, hint: Any, v: Value, *, nullable: bool = False, checks: _Checks | None = None) -> Any:
        """The JSON value ``v`` read as ``hint``; a value that is not one fails naming ``v``'s path.

        ``nullable``: ``hint`` is the ``X`` of an ``X | None`` (its messages say "or null");
        ``checks``: the ``Annotated`` metadata around that union, which applies to ``X``."""
        hint, checks = _unwrap(hint, checks)
        if isinstance(hint, type) and hint in self.special:
            return self.special[hint].decode(v)
        if _is_union(hint):
            return self._union(hint, v, checks)
        if dataclasses.is_dataclass(hint) or _is_named_tuple(hint):
            return self._record(hint, v)
        origin, args = get_origin(hint), get_args(hint)
        pair = _pair_types(hint)
        if pair is not None:
            key_t, value_t = pair
            items = v.fields().items()
            return tuple(
                (self.decode(key_t, Value(k, x.path, v.doc)), self.decode(value_t, x)) for k, x in items
            )
        if origin is tuple:
            return self._tuple(args, v, nullable, checks.expected)
        if origin in (Mapping, dict) or hint in (Mapping, dict):
            value_t = args[1] if args else Any
            return types.MappingProxyType(v.dict_of(lambda x: self.decode(value_t, x), subscript=True))
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return self._choice(hint, [m.value for m in hint], v)
        if origin is Literal:
            return self._choice(None, list(args), v)
        return self._scalar(hint, v, checks, nullable)

    def _record(self, cls: type, v: Value) -> Any:
        f = v.fields()
        given: dict[str, Any] = {}
        for name, t, default in _record_fields(cls):
            if name in f.raw:
                given[name] = self.decode(t, f[name])
            elif default is dataclasses.MISSING:
                f[name]  # raises: missing field '<path>.<name>'
        try:
            return cls(**given)
        except FieldError as e:
            raise f.get(e.field, None).fail(e.what) from None

    def _union(self, hint: Any, v: Value, checks: _Checks) -> Any:
        members = [m for m in get_args(hint) if m is not type(None)]
        if v.raw is None and len(members) < len(get_args(hint)):
            return None
        if len(members) == 1:
            return self.decode(members[0], v, nullable=True, checks=checks)
        for m in members:
            m, _ = _unwrap(m)
            if get_origin(m) is Literal and v.raw in get_args(m):
                return v.raw
            if m is int and isinstance(v.raw, int) and not isinstance(v.raw, bool) and v.raw >= 0:
                return v.raw
            if m is str and isinstance(v.raw, str):
                return v.raw
        raise v.expected(checks.expected or " or ".join(_name(m) for m in get_args(hint)))

    def _tuple(
        self, args: tuple[Any, ...], v: Value, nullable: bool, expected: str | None
    ) -> tuple[Any, ...]:
        if len(args) == 2 and args[1] is Ellipsis:
            return v.list_of(lambda x: self.decode(args[0], x), nullable=nullable)
        items = v.list_of(lambda x: x)
        if len(items) != len(args):  # a fixed list is named by its Expected where it has one
            raise v.fail(
                f"expected {expected}"
                if expected
                else f"expected a list of {len(args)}, got {len(items)} items"
            )
        return tuple(self.decode(t, x) for t, x in zip(args, items, strict=True))

    def _choice(self, kind: type[enum.Enum] | None, allowed: list[Any], v: Value) -> Any:
        text = v.string()
        if text not in allowed:
            raise v.fail(f"expected one of {', '.join(map(str, allowed))}, got {text!r}")
        return kind(text) if kind is not None else text

    def _scalar(self, hint: Any, v: Value, checks: _Checks, nullable: bool) -> Any:
        value: Any
        if hint is bool:
            value = v.boolean()
        elif hint is int:
            value = v.integer(checks.minimum)
        elif hint is float:
            value = v.finite() if checks.finite else v.number()
            if checks.least is not None and value < checks.least:
                raise v.fail(f"expected a finite number >= {checks.least:g}, got {value}")
        elif hint is str:
            return v.opt_string(checks.rule) if nullable else v.string(checks.rule)
        elif hint is Any:
            return v.raw
        else:
            raise TypeError(f"the codec cannot read a {hint!r}")
        if checks.rule is not None and not checks.rule.ok(value):
            raise v.fail(f"expected {checks.rule.expected}, got {value!r}")
        return value


def _member_of(hint: Any, value: Any) -> Any:
    """The member of union ``hint`` that ``value`` belongs to, for writing it."""
    for m in get_args(hint):
        base = _unwrap(m)[0]
        if base is type(None):
            continue
        if get_origin(base) is Literal:
            if value in get_args(base):
                return base
            continue
        check = get_origin(base) or base
        if isinstance(check, type) and isinstance(value, check):
            return m
    return Any


def _name(hint: Any) -> str:
    hint = _unwrap(hint)[0]
    if hint is type(None):
        return "null"
    if get_origin(hint) is Literal:
        return " or ".join(f'"{a}"' for a in get_args(hint))
    return {int: "an integer", str: "a string", float: "a number", bool: "true or false"}.get(hint, str(hint))
