"""Every benchmark script still starts: its imports resolve and its command line parses (``--help``).

The benchmarks themselves run for minutes on corpus models and are run by hand (their results are in
``benchmarks/results/``); this only keeps them from rotting as the package changes under them.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_parses_its_command_line(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def _records(durations: list[float], gap: float = 0.0) -> tuple:
    from onnxpipe.runtime.session import Record

    out, t = [], 0.0
    for i, d in enumerate(durations):
        out.append(Record(i, t, t, t + d, t + d, t + d))
        t += d + gap
    return tuple(out)


def test_the_balanced_ceiling_is_the_slowest_cpus_pace_against_the_sum() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_pipeline import balanced_ceiling
    from onnxpipe.runtime.session import WorkerStats

    def stats(*workers: tuple) -> list[WorkerStats]:
        return [WorkerStats(i, f"w{i}", r, None, 0.0, None, None, None) for i, r in enumerate(workers)]

    same = stats(_records([0.01] * 400), _records([0.01] * 400, gap=0.001))  # waiting is not slowness
    assert balanced_ceiling(same) == pytest.approx(1.0)
    half = stats(_records([0.01] * 400), _records([0.02] * 200))
    assert balanced_ceiling(half) == pytest.approx(2 * 50 / 150, rel=1e-3)
    # as fast on average, but never at once: each CPU fast while the other is slow
    turns = stats(_records([0.01] * 200 + [0.02] * 100), _records([0.02] * 100 + [0.01] * 200))
    assert balanced_ceiling(turns) == pytest.approx(2 * 50 / 150, rel=0.05)
    assert balanced_ceiling(half, versus=0) == pytest.approx(1.0, rel=1e-3)  # two stages at the slow pace
    assert balanced_ceiling(half, versus=1) == pytest.approx(2.0, rel=1e-3)
    assert math.isnan(balanced_ceiling(stats(_records([0.01] * 10))))
    assert math.isnan(balanced_ceiling(same, min_run_seconds=0.02))  # runs of 10 ms: too short here
