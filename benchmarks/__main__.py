"""``python -m benchmarks NAME [ARGS...]`` runs benchmark NAME; ``--list`` (or nothing) lists them.

NAME is a module ``benchmarks/bench_<NAME>.py`` (``partition-speed`` and ``partition_speed`` alike); its
``main(ARGS)`` runs and its return value is the exit status.  The list reads each module's docstring
without importing it, so it is instant and works where a benchmark's own imports would not.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from benchmarks import DETERMINISTIC

HERE = Path(__file__).resolve().parent
PREFIX = "bench_"


def benchmarks() -> dict[str, Path]:
    """Every benchmark by name, in name order."""
    return {p.stem.removeprefix(PREFIX): p for p in sorted(HERE.glob(f"{PREFIX}*.py"))}


def summary_line(path: Path) -> str:
    """The first line of the module docstring of ``path``: the benchmark's one-line description."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return doc.splitlines()[0] if doc else ""


def listing() -> str:
    found = benchmarks()
    width = max(map(len, found))
    lines = [
        "python -m benchmarks NAME [ARGS...]   (python -m benchmarks NAME --help: its arguments)",
        "[ci]: deterministic, runs anywhere (CI on small inputs); [by hand]: machine-bound, run by hand",
    ]
    for name, path in found.items():
        kind = "[ci]" if name in DETERMINISTIC else "[by hand]"
        lines.append(f"  {name:{width}}  {kind:9}  {summary_line(path)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("--list", "-l", "list"):
        print(listing())
        return 0
    if argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + listing())
        return 0
    name = argv[0].replace("-", "_")
    if name not in benchmarks():
        print(
            f"python -m benchmarks: unknown benchmark {argv[0]!r}; choose from {', '.join(benchmarks())}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"benchmarks.{PREFIX}{name}")
    status: int = module.main(argv[1:])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
