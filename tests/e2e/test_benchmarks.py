"""The benchmarks stay runnable: one entry point, every command line parses, the deterministic ones run.

``python -m benchmarks NAME`` is how every benchmark runs (from the repository root).  The machine-bound
ones run for minutes on corpus models and are run by hand (their results are in ``benchmarks/results/``):
here only their imports and command lines are checked, so that they do not rot as the package changes
under them.  The deterministic ones (``benchmarks.CI_RUNS``) run on small inputs, into a temporary folder
so that the committed results stay as they are, and their result must be in the one schema.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

import benchmarks as package
from benchmarks import CI_RUNS, DETERMINISTIC
from benchmarks.__main__ import benchmarks
from benchmarks.bench_pipeline import result_name
from benchmarks.common import ROOT, SCHEMA, schema_problems
from onnxpipe.runtime.report.ceiling import balanced_ceiling
from onnxpipe.runtime.session import Record, WorkerStats

NAMES = sorted(benchmarks())
COMMITTED = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
FAST_RUNS = ("partition_speed", "order")
"""The deterministic benchmarks the fast lane runs small (seconds each); the exhaustive lane runs them all."""


def entry(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` from the repository root, as the benchmarks are documented to run."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_there_are_benchmarks() -> None:
    assert len(NAMES) >= 10
    assert set(DETERMINISTIC) <= set(NAMES)


def test_the_list_names_every_benchmark_once() -> None:
    proc = entry("--list")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert listed == NAMES
    assert entry().stdout == proc.stdout  # no argument lists them too


def test_the_package_docstring_lists_every_benchmark() -> None:
    assert package.__doc__ is not None
    for name in NAMES:
        assert f"* ``{name}`` — " in package.__doc__, name


def test_an_unknown_benchmark_is_one_line_and_exit_2() -> None:
    proc = entry("no_such_benchmark")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no_such_benchmark" in proc.stderr and "scale" in proc.stderr


@pytest.mark.parametrize(  # one in the fast lane, every one in the exhaustive lane (a process each)
    "name", [pytest.param(n, marks=() if n == "partition" else pytest.mark.exhaustive) for n in NAMES]
)
def test_a_benchmark_parses_its_command_line(name: str) -> None:
    proc = entry(name, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: python -m benchmarks {name} ")
    assert "--out DIR" in proc.stdout


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks").glob("*.py")), ids=lambda p: p.name)
def test_no_benchmark_edits_sys_path(path: Path) -> None:
    # they run as a package from the repository root (children too, started there): nothing to patch
    assert "sys.path.insert" not in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_a_committed_result_is_in_the_schema(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert schema_problems(doc) == []
    assert doc["name"] == path.stem
    assert any(doc["name"].startswith(n) for n in NAMES)  # a benchmark's name, or a variant of it


def test_a_variant_is_named_after_its_arguments() -> None:
    assert result_name("pipeline", Namespace(pin=False, calibrate=0)) == "pipeline"
    assert result_name("pipeline", Namespace(pin=True, calibrate=2, calibrate_in="alone")) == (
        "pipeline_pinned_calibrated"
    )
    assert result_name("pipeline", Namespace(pin=True, calibrate=2, calibrate_in="pipeline")) == (
        "pipeline_pinned_calibrated_in_pipeline"
    )
    assert result_name("interleave", Namespace(calibrate=2)) == "interleave_calibrated"
    assert result_name("overhead", Namespace(rounds=8)) == "overhead"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "args"),
    [pytest.param(n, a, marks=() if n in FAST_RUNS else pytest.mark.exhaustive) for n, a in CI_RUNS],
    ids=[" ".join((n, *a))[:60] for n, a in CI_RUNS],
)
def test_a_deterministic_benchmark_runs_small(name: str, args: tuple[str, ...], tmp_path: Path) -> None:
    proc = entry(name, *args, "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1, written
    doc = json.loads(written[0].read_text(encoding="utf-8"))
    assert schema_problems(doc) == []
    assert doc["schema"] == SCHEMA
    assert doc["name"] == written[0].stem and doc["name"].startswith(name)
    assert isinstance(doc["git_sha"], str) and len(doc["git_sha"]) == 40
    assert {"platform", "python", "cpus", "onnxruntime", "date"} <= set(doc["machine"])
    assert "out" not in doc["params"] and doc["params"]
    assert doc["rows"] and all(isinstance(r, dict) and r for r in doc["rows"])
    if name == "scale":  # the networkx figure, side by side in the same run
        for row in doc["rows"]:
            assert row["order_ours_seconds"] > 0 and row["order_networkx_seconds"] > 0
            assert row["dag_check_networkx_seconds"] > 0
            assert row["order_networkx_over_ours"] == pytest.approx(
                row["order_networkx_seconds"] / row["order_ours_seconds"]
            )


def _records(durations: list[float], gap: float = 0.0) -> tuple[Record, ...]:
    out, t = [], 0.0
    for i, d in enumerate(durations):
        out.append(Record(i, t, t, t + d, t + d, t + d))
        t += d + gap
    return tuple(out)


def test_the_balanced_ceiling_is_the_slowest_cpus_pace_against_the_sum() -> None:
    def stats(*workers: tuple[Record, ...]) -> list[WorkerStats]:
        return [WorkerStats(i, f"w{i}", r, None, 0.0, None, None, None) for i, r in enumerate(workers)]

    same = stats(_records([0.01] * 400), _records([0.01] * 400, gap=0.001))  # waiting is not slowness
    assert balanced_ceiling(same) == pytest.approx(1.0)
    half = stats(_records([0.01] * 400), _records([0.02] * 200))
    assert balanced_ceiling(half) == pytest.approx(2 * 50 / 150, rel=1e-3)
    # as fast on average, but never at once: each CPU fast while the other is slow
    turns = stats(_records([0.01] * 200 + [0.02] * 100), _records([0.02] * 100 + [0.01] * 200))
    assert balanced_ceiling(turns) == pytest.approx(2 * 50 / 150, rel=0.05)
    assert math.isnan(balanced_ceiling(stats(_records([0.01] * 10))))
    assert math.isnan(balanced_ceiling(same, min_run_seconds=0.02))  # runs of 10 ms: too short here
