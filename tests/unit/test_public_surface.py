"""What users see changes only on purpose.

``tests/data/public_surface.json`` holds the names of ``onnxpipe.__all__`` and the text of ``onnxpipe
--help`` and of every subcommand's ``--help`` at a 100-column terminal.  A change to either is a change
of the public surface: make it on purpose, write the file again (``python tools/public_surface.py``)
and say in the commit what changed.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from paths import DATA

import onnxpipe
from onnxpipe.cli import main

SURFACE = json.loads((DATA / "public_surface.json").read_text(encoding="utf-8"))


def _help(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return buf.getvalue()


def test_the_public_names_are_those_recorded() -> None:
    assert sorted(onnxpipe.__all__) == SURFACE["all"]
    for name in onnxpipe.__all__:
        assert getattr(onnxpipe, name) is not None


@pytest.mark.parametrize("command", sorted(SURFACE["help"]), ids=lambda c: c or "onnxpipe")
def test_every_help_text_is_the_one_recorded(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert _help([command] if command else []) == SURFACE["help"][command]
