"""Sizes and rates as people write them: ``"8 GiB"``, ``"512MB"``, ``"100 Mbit/s"``, ``"1.5 GB/s"``.

One parser for every place that reads one (devices files, the manifest's cluster), so that a spelling
accepted in one is accepted in all.  Decimal units are powers of 1000, binary ones (``KiB``...) of 1024;
``bit`` rates are divided by 8 into bytes per second.
"""

from __future__ import annotations

import re

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_RATE_UNITS = {
    "b/s": 1.0,
    "kb/s": 1e3,
    "mb/s": 1e6,
    "gb/s": 1e9,
    "kib/s": 2.0**10,
    "mib/s": 2.0**20,
    "gib/s": 2.0**30,
    "bit/s": 1 / 8,
    "kbit/s": 1e3 / 8,
    "mbit/s": 1e6 / 8,
    "gbit/s": 1e9 / 8,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def parse_bytes(text: str) -> int:
    """``"8 GiB"`` -> ``8589934592``; ``"512MB"`` -> ``512000000`` (decimal and binary units)."""
    m = _QUANTITY.match(text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return round(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_rate(text: str) -> float:
    """``"100 Mbit/s"`` -> ``12500000.0`` bytes per second; ``"1.5 GB/s"`` -> ``1.5e9``."""
    m = _QUANTITY.match(text)
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"not a rate: {text!r}")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
