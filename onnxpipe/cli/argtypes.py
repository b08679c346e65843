"""argparse value types shared by every subcommand, so ``--threads 0`` reads the same everywhere."""

from __future__ import annotations

import argparse
import math


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


def positive_number(text: str, what: str = "a number") -> float:
    """A finite number above 0 (``nan`` and ``inf`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a positive finite number")
    return value


def bandwidth(text: str) -> float:
    """Bytes per second, above 0."""
    return positive_number(text, "a number of bytes per second")


def fraction(text: str) -> float:
    """A finite number of 0 or more, as a share (``0.01`` is 1%): ``--time-slack``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of 0 or more")
    return value
