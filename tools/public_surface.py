"""Write ``tests/data/public_surface.json``: the names of ``onnxpipe.__all__`` and the text of ``onnxpipe
--help`` and of every subcommand's ``--help`` at a 100-column terminal.

The test ``tests/unit/test_public_surface.py`` holds the package to that file; run this when the public
surface changes on purpose, and say what changed in the commit.

    python tools/public_surface.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import onnxpipe
from onnxpipe.cli import main
from onnxpipe.cli.parsers import SUBCOMMANDS

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "public_surface.json"


def help_text(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    return buf.getvalue()


def surface() -> dict[str, object]:
    os.environ["COLUMNS"] = "100"
    commands = ["", *(c.name for c in SUBCOMMANDS)]
    return {
        "all": sorted(onnxpipe.__all__),
        "help": {c: help_text([c] if c else []) for c in sorted(commands)},
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(surface(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
