"""Plain text for people: sizes at a glance and aligned tables.  Formatting only: callers print."""

from __future__ import annotations

from collections.abc import Sequence


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: sizes people can compare at a glance."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 link``, ``2 links``: a count with its noun in the right number (``plural`` where adding an
    "s" is wrong: ``counted(2, "worker process", "worker processes")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def names_text(names: Sequence[str], limit: int = 8) -> str:
    """``a, b, c and 2 more``: the first ``limit`` of ``names``, and how many more there are."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns (left-aligned first column) with a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out)
