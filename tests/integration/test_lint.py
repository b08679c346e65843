"""The code base stays ruff- and mypy-clean: checked here so that CI's one test line enforces it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO_ROOT

ROOT = REPO_ROOT
PATHS = ["onnxpipe", "tests", "benchmarks", "tools"]


def _tool(name: str) -> list[str]:
    exe = Path(sys.executable).with_name(name)
    if exe.exists():
        return [str(exe)]
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; pip install '.[test]'")
    return [found]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    # their caches go under .cache/ with the tests' others (the README names that folder)
    caches = {
        "MYPY_CACHE_DIR": str(ROOT / ".cache" / "mypy"),
        "RUFF_CACHE_DIR": str(ROOT / ".cache" / "ruff"),
    }
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **caches}
    )


def test_ruff_check() -> None:
    proc = _run([*_tool("ruff"), "check", *PATHS])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = _run([*_tool("ruff"), "format", "--check", *PATHS])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.exhaustive
def test_mypy_strict() -> None:
    proc = _run([*_tool("mypy")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
