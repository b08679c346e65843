"""Running the CLI in-process for tests: exit code and captured output, argparse exits included."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

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


REPO_ROOT = Path(__file__).resolve().parent.parent


def run_with_file_size_limit(
    limit: int, args: Sequence[object], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``onnxpipe ARGS`` in a child process that cannot write more than ``limit`` bytes to any file
    (a full disk, half-way through a write)."""
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "from onnxpipe.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
