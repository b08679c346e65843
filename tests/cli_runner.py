"""Running the CLI in-process for tests: exit code and captured output, argparse exits included."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from onnxpipe.cli import main


def run(args: Sequence[object], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main(args)`` -> (exit code, stdout, stderr); argparse's SystemExit counts as an exit code."""
    capfd.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capfd.readouterr()
    return code, out, err
