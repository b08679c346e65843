"""The CLI's one table per subcommand: its name and target, each flag and the options field it sets.

A :class:`Flag` names the field it sets as a dotted path into the subcommand's options object
(``plan.stages`` of :class:`~onnxpipe.api.SplitOptions`); its default is that field's default, read from
the options class, so that a default is defined once, where the library defines it; so are the values a
choice takes and a path's type, read from the field's annotation (:func:`_typed`).  The table makes the
argparse arguments (:meth:`Subcommand.add_arguments`), turns the parsed arguments into the options
object (:meth:`Subcommand.options`), and words an option named in a library message as its flag
(:func:`word`): the library says `` `stages=2` ``, the CLI ``--stages 2``.

A few flags set nothing in the options object (their field is None): ``--json`` and ``--quiet`` say how
the CLI prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.api import options as api_options
from onnxpipe.core.choices import values
from onnxpipe.core.options import OptionRef

_OPTION_CLASSES: dict[str, type] = {
    name: value
    for name, value in vars(api_options).items()
    if isinstance(value, type) and dataclasses.is_dataclass(value)
}
"""Every options class of the door, by name: what a field's annotation names."""
_CHOICES: dict[str, type[enum.StrEnum]] = {
    name: value
    for name, value in vars(api_options).items()
    if isinstance(value, type) and issubclass(value, enum.StrEnum)
}
"""Every choice an option takes, by name: a field so annotated is a flag of its values."""

_NO_DEFAULT = object()


@dataclass(frozen=True)
class Flag:
    """One flag: its names, the options field it sets (None for a flag of the CLI's own), its help and
    its argparse settings.  ``to_field`` turns the parsed value into the field's (a repeated flag's list:
    a tuple by default); ``from_field`` the field's value into the flag's (for the default shown and for
    wording a suggested value)."""

    names: tuple[str, ...]
    field: str | None
    help: str | None = None
    group: str | None = None
    to_field: Callable[[Any], Any] | None = None
    from_field: Callable[[Any], Any] | None = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.field.replace(".", "__") if self.field else _bare(self.names[0])

    @property
    def switch(self) -> bool:
        """A flag that takes no value (``--force``)."""
        return self.settings.get("action") in ("store_true", "store_false")


def flag(
    *names: str,
    field: str | None = None,
    help: str | None = None,
    to_field: Callable[[Any], Any] | None = None,
    from_field: Callable[[Any], Any] | None = None,
    **settings: Any,
) -> Flag:
    """A :class:`Flag` that sets ``field``, by default the field named as the flag is (``--max-new-tokens``
    sets ``max_new_tokens``, as argparse names a dest); ``settings`` are argparse's (``type``,
    ``metavar``, ``choices``, ``action``...)."""
    return Flag(tuple(names), field or _bare(names[0]), help, None, to_field, from_field, settings)


def _bare(name: str) -> str:
    """``--max-new-tokens`` as a name: ``max_new_tokens``."""
    return name.lstrip("-").replace("-", "_")


def negated(name: str, field: str, help: str) -> Flag:
    """``--no-verify``: a switch that turns off ``field``, an option that is on by default."""
    return flag(
        name, field=field, action="store_true", to_field=operator.not_, from_field=operator.not_, help=help
    )


def grouped(group: str, flags: Iterable[Flag], at: str = "") -> list[Flag]:
    """``flags`` under the heading ``group`` of the help, their fields those of the options object at
    ``at`` (``"plan.decoder."``: ``--phase`` sets ``plan.decoder.phase``)."""
    return [dataclasses.replace(f, group=group, field=f"{at}{f.field}" if f.field else None) for f in flags]


def _type_names(owner: type, name: str) -> list[str]:
    """The names the annotation of ``owner``'s field ``name`` is written with (``Path | None``: ``Path``,
    ``None``): the options modules postpone their annotations, whose types they import only to check."""
    f = next(f for f in dataclasses.fields(owner) if f.name == name)
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    return re.findall(r"[A-Za-z_]\w*", annotation)


def _nested_type(owner: type, name: str) -> type:
    """The options class of ``owner``'s field ``name`` (an options object inside another)."""
    for word in _type_names(owner, name):
        if word in _OPTION_CLASSES:
            return _OPTION_CLASSES[word]
    raise TypeError(f"{owner.__name__}.{name} is not an options object")


def _typed(options: type, path: str) -> dict[str, Any]:
    """The argparse settings the type of the field at ``path`` decides, so that a flag need not repeat
    them: a path for a ``Path`` field, the values of a choice (``CostSource``) for a choice's."""
    names = _type_names(*owner_of(options, path))
    if "Path" in names:
        return {"type": Path}
    choices = [_CHOICES[n] for n in names if n in _CHOICES]
    return {"choices": values(choices[0])} if choices else {}


def owner_of(options: type, path: str) -> tuple[type, str]:
    """The options class that holds the last field of ``path``, and that field's name."""
    *parents, leaf = path.split(".")
    owner = options
    for name in parents:
        owner = _nested_type(owner, name)
    return owner, leaf


def field_default(options: type, path: str) -> Any:
    """The default of the field at ``path`` of ``options`` (:data:`_NO_DEFAULT` for a required one)."""
    owner, leaf = owner_of(options, path)
    f = next(f for f in dataclasses.fields(owner) if f.name == leaf)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _NO_DEFAULT


def build(options: type, values: Mapping[str, Any]) -> Any:
    """An ``options`` object from ``values`` keyed by dotted field paths; nested options objects are
    made from their own paths, and fields no path names keep their defaults."""
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        head, _, rest = path.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, sub in nested.items():
        direct[head] = build(_nested_type(options, head), sub)
    return options(**direct)


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: its name, its line in ``onnxpipe --help``, the model or folder it is given (an
    argument named ``target``, with ``target_help``), the options object its flags make and its flags."""

    name: str
    help: str
    target: str
    options_type: type
    flags: Sequence[Flag]
    target_help: str | None = None

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Its target and its flags as ``parser``'s arguments, the flags in their groups (made as they
        come)."""
        parser.add_argument(self.target, type=Path, help=self.target_help)
        made: dict[str, argparse._ArgumentGroup] = {}
        for f in self.flags:
            where: Any = parser
            if f.group is not None:
                if f.group not in made:
                    made[f.group] = parser.add_argument_group(f.group)
                where = made[f.group]
            settings = dict(f.settings)
            if f.field is not None and not f.switch and not {"type", "choices"} & set(settings):
                settings.update(_typed(self.options_type, f.field))
            if f.field is not None and not f.switch and not {"metavar", "choices"} & set(settings):
                settings["metavar"] = _bare(f.names[0]).upper()  # argparse's own
            if f.field is not None and "default" not in settings:
                default = field_default(self.options_type, f.field)
                if default is _NO_DEFAULT:
                    settings.setdefault("required", True)
                else:
                    default = f.from_field(default) if f.from_field else default
                    appended = settings.get("action") == "append"
                    settings["default"] = list(default) if appended and default is not None else default
            where.add_argument(*f.names, dest=f.dest, help=f.help, **settings)

    def options(self, args: argparse.Namespace) -> Any:
        """The subcommand's options object from its parsed arguments."""
        values: dict[str, Any] = {}
        for f in self.flags:
            if f.field is not None:
                value = getattr(args, f.dest)
                to_field = f.to_field or (tuple if f.settings.get("action") == "append" else None)
                values[f.field] = to_field(value) if to_field and value is not None else value
        return build(self.options_type, values)

    def find(self, ref: OptionRef) -> Flag | None:
        """The flag that sets the option ``ref`` names, if this subcommand has one."""
        for f in self.flags:
            if f.field is None:
                continue
            owner, leaf = owner_of(self.options_type, f.field)
            if leaf == ref.field and ref.owner in (None, owner.__name__):
                return f
        return None


def word(ref: OptionRef, tables: Sequence[Subcommand]) -> str | None:
    """The option ``ref`` names as the flag of the first table that has one (``--stages 2``), or None."""
    for table in tables:
        f = table.find(ref)
        if f is not None:
            return _spelled(f, ref.value)
    return None


def _spelled(f: Flag, value: str | None) -> str:
    name = f.names[0]
    if value is None or f.switch:
        return name
    given: Any = {"True": True, "False": False}.get(value, value)
    shown = f.from_field(given) if f.from_field is not None else given
    return f"{name} {shown}"
