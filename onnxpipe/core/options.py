"""Naming an option inside a message: the library speaks of option fields, the CLI of flags.

A message that tells the user what to change names the option as a field of the options objects
(``force``, ``SplitOptions.force``), written by :func:`opt` as a marked-up word: `` `force=True` ``,
`` `stages=2` ``, `` `PlanRequest.order=free` ``.  The mark-up is the text a Python user reads (the
field, and the value to give it), and it is data: :func:`option_refs` reads the options back out of any
message, so an error carries the options it is about (:attr:`OnnxpipeError.options
<onnxpipe.core.errors.OnnxpipeError.options>`) without a second channel.  The CLI words each one as its
flag (``--force``, ``--stages 2``, ``--order free``) through its table of flags and fields, with
:func:`render`; nothing below the CLI names a flag (a test reads the source for it).

A field is named bare where several options objects share it (``shapes``: the ``--shape`` of ``plan``,
``split``, ``verify`` and ``run``), or with its class where the bare name would be ambiguous in one
command.  Plan notes written into a manifest keep the mark-up: it reads as plain text there too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

_MARK = re.compile(r"`(?:(?P<owner>[A-Z][A-Za-z0-9]*)\.)?(?P<field>[a-z][a-z0-9_]*)(?:=(?P<value>[^`]*))?`")


@dataclass(frozen=True)
class OptionRef:
    """One option named in a message: its ``field``, the options class that holds it when the message
    says (``owner``), and the value the message suggests or quotes (as text), if any."""

    field: str
    owner: str | None = None
    value: str | None = None

    @property
    def key(self) -> str:
        """``owner.field`` where the owner is named, else the bare field."""
        return f"{self.owner}.{self.field}" if self.owner else self.field

    def __str__(self) -> str:
        value = "" if self.value is None else f"={self.value}"
        return f"`{self.key}{value}`"


def opt(field: str, value: object = None) -> str:
    """The mark-up naming option ``field`` (``"force"`` or ``"SplitOptions.force"``), with the ``value``
    a message suggests or quotes: ``opt("stages", 2)`` is `` `stages=2` ``; ``opt("force", True)``,
    which the CLI words as the bare flag ``--force``."""
    owner, _, name = field.rpartition(".")
    shown = None if value is None else _text(value)
    return str(OptionRef(name, owner or None, shown))


def _text(value: object) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return repr(value)
    return str(value)


def option_refs(message: str) -> tuple[OptionRef, ...]:
    """The options a message names, in order (each once)."""
    found: list[OptionRef] = []
    for m in _MARK.finditer(message):
        ref = OptionRef(m["field"], m["owner"], m["value"])
        if ref not in found:
            found.append(ref)
    return tuple(found)


def render(message: str, word: Callable[[OptionRef], str | None]) -> str:
    """``message`` with every option named in it worded by ``word`` (the CLI's flag); an option that
    ``word`` does not know (None) keeps its mark-up."""

    def one(m: re.Match[str]) -> str:
        worded = word(OptionRef(m["field"], m["owner"], m["value"]))
        return m[0] if worded is None else worded

    return _MARK.sub(one, message)
