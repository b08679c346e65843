"""``.ci/lanes``, the part of CI that runs the README's two test lines, run against a stand-in ``pytest``
that records its arguments and exits as told: both lanes always run, in order, and CI fails when either
fails or collects no tests (pytest's exit 5), saying which."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from paths import REPO_ROOT

LANES = REPO_ROOT / ".ci" / "lanes"
STAND_IN = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
code=$(head -n 1 "$CODES"); sed -i 1d "$CODES"
exit "$code"
"""


def _ci(tmp_path: Path, fast: int, exhaustive: int) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``.ci/lanes`` with a ``pytest`` that exits ``fast``, then ``exhaustive``; its result and the argument
    lines the stand-in was called with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pytest").write_text(STAND_IN)
    (bin_dir / "pytest").chmod(0o755)
    (tmp_path / "codes").write_text(f"{fast}\n{exhaustive}\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls"),
        "CODES": str(tmp_path / "codes"),
    }
    proc = subprocess.run([str(LANES)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return proc, calls


def test_both_lanes_pass_ci_passes(tmp_path: Path) -> None:
    proc, calls = _ci(tmp_path, 0, 0)
    assert proc.returncode == 0, proc.stderr
    assert calls == ["", "-m exhaustive"]


@pytest.mark.parametrize(
    ("fast", "exhaustive", "named"), [(1, 0, "'pytest' failed"), (0, 1, "'pytest -m exhaustive' failed")]
)
def test_either_lane_failing_fails_ci_after_both_ran(
    tmp_path: Path, fast: int, exhaustive: int, named: str
) -> None:
    proc, calls = _ci(tmp_path, fast, exhaustive)
    assert proc.returncode == 1
    assert calls == ["", "-m exhaustive"]
    assert f"{named} (exit 1)" in proc.stderr


@pytest.mark.parametrize(
    ("fast", "exhaustive", "named"), [(5, 0, "'pytest'"), (0, 5, "'pytest -m exhaustive'")]
)
def test_a_lane_that_collects_no_tests_fails_ci(
    tmp_path: Path, fast: int, exhaustive: int, named: str
) -> None:
    proc, calls = _ci(tmp_path, fast, exhaustive)
    assert proc.returncode == 1
    assert calls == ["", "-m exhaustive"]
    assert f"{named} collected no tests: failing CI" in proc.stderr
