"""argparse value types shared by every subcommand, so ``--threads 0`` reads the same everywhere, and the
flags' values turned into the options' (``--shape x=1,3`` into ``{"x": (1, 3)}``).

>>> shapes(["x=1,3,224,224"])
{'x': (1, 3, 224, 224)}
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

from onnxpipe.core.errors import UsageError
from onnxpipe.core.units import parse_bytes, parse_rate


def whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"{value} must be at least {minimum}" if minimum else f"{value} must be 0 or more"
        )
    return value


def positive_int(text: str) -> int:
    """1 or more: stage, thread, run and micro-batch counts."""
    return whole_number(text, 1)


def count(text: str) -> int:
    """0 or more: warm-up runs."""
    return whole_number(text, 0)


def _number(text: str, fits: Callable[[float], bool], must: str) -> float:
    """``text`` as a number that ``fits``, else an argparse error saying what it ``must`` be."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not fits(value):
        raise argparse.ArgumentTypeError(f"{text} must be {must}")
    return value


def positive_number(text: str) -> float:
    """A finite number above 0 (``nan`` and ``inf`` refused)."""
    return _number(text, lambda v: v > 0 and math.isfinite(v), "a positive finite number")


def nonnegative_number(text: str) -> float:
    """A finite number of 0 or more: a tolerance, a share (``--time-slack 0.01`` is 1%)."""
    return _number(text, lambda v: v >= 0 and math.isfinite(v), "a finite number of 0 or more")


def probability(text: str) -> float:
    """A number above 0 and at most 1: ``--top-p``."""
    return _number(text, lambda v: 0 < v <= 1, "above 0 and at most 1")


def bandwidth(text: str) -> float:
    """Bytes per second above 0, as a number or spelled as devices files spell it (``"1 Gbit/s"``,
    ``"100 MB/s"``), so that one link reads the same on the command line and in a file."""
    try:
        value, what = float(text), "number"
    except ValueError:
        try:
            value, what = parse_rate(text), "rate"
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a rate; give bytes per second (125000000) or e.g. '1 Gbit/s'"
            ) from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a positive finite {what}")
    return value


def byte_sizes(text: str) -> tuple[int, ...]:
    """Sizes of 1 byte or more, comma-separated, each in bytes or spelled as a devices file spells a size
    (``"4 MiB"``): ``--bytes 65536,1MiB``."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part) if part.isdigit() else parse_bytes(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a size; give bytes (65536) or e.g. '1 MiB'"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{part} must be 1 byte or more")
        sizes.append(value)
    return tuple(sizes)


def token_ids(text: str) -> tuple[int, ...]:
    """A prompt's token ids: whole numbers >= 0 separated by commas or spaces (``"1,2,3"``)."""
    parts = [p for p in text.replace(",", " ").split() if p]
    if not parts:
        raise argparse.ArgumentTypeError("give at least one token id (e.g. 1,2,3)")
    ids: list[int] = []
    for p in parts:
        try:
            value = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{p!r} is not a token id (a whole number)") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{value} is not a token id: ids are 0 or more")
        ids.append(value)
    return tuple(ids)


def stages_arg(text: str) -> int | str:
    """``--stages``: a number of stages, or ``auto``."""
    return "auto" if text == "auto" else positive_int(text)


def shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``--shape`` given as ``["name=1,3,224,224", ...]`` (``x`` also separates dims; ``name=`` is a scalar).

    The name is everything before the last ``=``, so names holding ``=`` still work.
    """
    result: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims_text = item.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--shape {item!r}: expected NAME=D1,D2,...; write it like input=1,3,224,224")
        text = dims_text.strip().replace("x", ",").replace("X", ",")
        dims: list[int] = []
        if text:
            for part in text.split(","):
                part = part.strip()
                try:
                    value = int(part)
                except ValueError:
                    raise UsageError(
                        f"--shape {item!r}: {part!r} is not a whole number; write NAME=D1,D2,..."
                    ) from None
                if value < 0:
                    raise UsageError(
                        f"--shape {item!r}: dims must be >= 0, got {value}; give sizes like NAME=1,3,224,224"
                    )
                dims.append(value)
        if name in result:
            raise UsageError(f"--shape {item!r}: input {name!r} is given twice; give each input once")
        result[name] = tuple(dims)
    return result
