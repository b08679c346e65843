"""Running the CLI in-process for tests: exit code and captured output, argparse exits included."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from paths import REPO_ROOT

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


PREAMBLE = ("input ", "  the guessed sizes", "warning: ", "... ")
"""How the lines a command prints before its work begin (:mod:`onnxpipe.api.preamble`)."""


def preamble_only(out: str) -> bool:
    """Whether ``out`` holds nothing but the preamble: a command that failed during its work printed
    what it was about to do, and no result."""
    return all(line.startswith(PREAMBLE) for line in out.splitlines())


def one_line_error(err: str, command: str, *, says_what_to_do: bool = True) -> str:
    """The documented error shape: one line, ``onnxpipe <command>: error: <where>: <what>; <what to do>``.

    Checked: exactly one line, the prefix, and (unless told otherwise) a ``; <what to do>`` part.
    ``command`` "" is the top-level parser (``onnxpipe: error: ...``).
    """
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    prefix = f"onnxpipe {command}: error: " if command else "onnxpipe: error: "
    assert line.startswith(prefix) and len(line) > len(prefix)
    if says_what_to_do:
        assert re.match(rf"^{re.escape(prefix)}.+; \S.*$", line), f"no '; what to do' in: {line}"
    return line


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (hidden ones included) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def no_leftovers(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*") if "onnxpipe-tmp" in p.name or "onnxpipe-old" in p.name]
    left += [p.name for p in folder.rglob("*.tmp")]
    assert not left, f"half-written files left behind: {left}"
