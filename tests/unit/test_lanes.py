"""The two test lanes are wired as the README says: ``pytest`` runs the fast lane (the ``exhaustive`` marker
left out by pytest's own configuration), ``pytest -m exhaustive`` the rest, CI (``.ci/run``) runs both
lines as the README prints them, and the tests' caches go where the README says."""

from __future__ import annotations

import re
import shlex
import tomllib

from paths import REPO_ROOT

PYTEST = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
README = (REPO_ROOT / "README.md").read_text()
FAST = "pytest"
EXHAUSTIVE = "pytest -m exhaustive"


def _lane_lines() -> list[str]:
    """The commands ``.ci/lanes`` runs, in order (its ``lane CMD`` lines)."""
    text = (REPO_ROOT / ".ci" / "lanes").read_text()
    return [m.group(1) for m in re.finditer(r"^lane (.+)$", text, re.M)]


def test_the_exhaustive_marker_is_registered_and_strict() -> None:
    names = [m.split(":", 1)[0] for m in PYTEST["markers"]]
    assert "exhaustive" in names
    assert "--strict-markers" in shlex.split(PYTEST["addopts"])


def test_plain_pytest_leaves_the_exhaustive_lane_out() -> None:
    args = shlex.split(PYTEST["addopts"])
    assert args[args.index("-m") + 1] == "not exhaustive"
    # a later `-m exhaustive` on the command line replaces it: the second line runs only that lane
    assert args.count("-m") == 1


def test_ci_runs_the_readme_s_two_lines_in_turn() -> None:
    run = (REPO_ROOT / ".ci" / "run").read_text()
    assert "pip install '.[test]'" in run
    assert re.search(r"^exec \.ci/lanes$", run, re.M), ".ci/run must end by running .ci/lanes"
    assert _lane_lines() == [FAST, EXHAUSTIVE]


def test_the_readme_gives_both_lines_and_the_cache_folder() -> None:
    first_block = README.split("```", 2)[1]
    assert "pip install '.[test]' && pytest\n" in first_block
    assert f"`{EXHAUSTIVE}`" in README
    assert "`.cache/`" in README and "ONNXPIPE_CORPUS_CACHE" in README


def test_pytest_s_own_cache_goes_under_the_named_folder() -> None:
    assert PYTEST["cache_dir"].startswith(".cache/")


def test_the_benchmarks_the_tests_run_keep_their_profiles_under_the_named_folder() -> None:
    from benchmarks import common

    assert common.PROFILES == REPO_ROOT / ".cache" / "bench-profiles"


def test_hypothesis_stores_under_the_named_folder() -> None:
    from hypothesis.configuration import storage_directory

    assert (
        storage_directory("examples", intent_to_write=False).path
        == REPO_ROOT / ".cache" / "hypothesis" / "examples"
    )
