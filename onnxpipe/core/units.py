"""Sizes and rates as people write them: ``"8 GiB"``, ``"512MB"``, ``"100 Mbit/s"``, ``"1.5 GB/s"``.

One parser for every place that reads one (devices files, the manifest's cluster), so that a spelling
accepted in one is accepted in all.  Decimal units are powers of 1000, binary ones (``KiB``...) of 1024;
``bit`` rates are divided by 8 into bytes per second.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE_UNITS = {"b": 1} | {prefix + "b": factor for prefix, factor in (_DECIMAL | _BINARY).items()}
# rates: every size unit but the tera ones per second, and bits per second (divided by 8 into bytes)
_RATE_UNITS = {unit + "/s": float(f) for unit, f in _SIZE_UNITS.items() if not unit.startswith("t")} | {
    prefix + "bit/s": f / 8 for prefix, f in {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}.items()
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def _quantity(text: str, units: Mapping[str, float], what: str) -> float:
    """The number in ``text`` times its unit's factor in ``units``; a ``ValueError`` naming ``what`` the
    text is not."""
    m = _QUANTITY.match(text)
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"not a {what}: {text!r}")
    return float(m.group(1)) * units[m.group(2).lower()]


def parse_bytes(text: str) -> int:
    """``"8 GiB"`` -> ``8589934592``; ``"512MB"`` -> ``512000000`` (decimal and binary units)."""
    return round(_quantity(text, _SIZE_UNITS, "size"))


def parse_rate(text: str) -> float:
    """``"100 Mbit/s"`` -> ``12500000.0`` bytes per second; ``"1.5 GB/s"`` -> ``1.5e9``."""
    return _quantity(text, _RATE_UNITS, "rate")
