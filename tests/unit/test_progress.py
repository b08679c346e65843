"""Progress on stderr: plain lines with units and elapsed time when it is not a terminal."""

from __future__ import annotations

import io

import pytest

import onnxpipe.core.progress as progress
from onnxpipe.core.progress import ClosesOnExit, Progress


def test_lines_in_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0.0)
    with Progress(3, "profiling m", stream=log, unit="runs") as bar:
        bar.advance()
        bar.advance()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("profiling m: 1/3 runs after ") and lines[0].endswith(" s")
    assert lines[-1].startswith("profiling m: 3/3 runs in ")
    assert "\r" not in log.getvalue()


def test_disabled_and_failed_steps_write_nothing() -> None:
    log = io.StringIO()
    with Progress(3, "x", enabled=False, stream=log) as bar:
        bar.advance()
    with pytest.raises(RuntimeError), Progress(3, "x", stream=log) as bar:
        raise RuntimeError
    assert log.getvalue() == ""


def test_a_terminal_gets_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    with Progress(4, "profiling m", stream=screen, unit="runs") as bar:
        bar.advance(4)
    text = screen.getvalue()
    assert "profiling m" in text and "4/4" in text and "runs" in text and "00:0" in text  # elapsed


def test_a_step_may_end_with_its_own_words() -> None:
    log = io.StringIO()
    with Progress(2, "profiling m", stream=log, unit="runs") as bar:
        bar.advance(2)
        bar.done_text = "profiled m: 2 runs timed twice"
    (line,) = log.getvalue().splitlines()
    assert line.startswith("profiled m: 2 runs timed twice (") and line.endswith(" s)")


class _Runner(ClosesOnExit):
    def __init__(self) -> None:
        self.closed: list[bool] = []

    def close(self, graceful: bool = True) -> None:
        self.closed.append(graceful)


def test_a_with_block_closes_its_runner_gracefully_unless_an_exception_leaves_it() -> None:
    with _Runner() as runner:
        pass
    assert runner.closed == [True]
    failing = _Runner()
    with pytest.raises(KeyboardInterrupt), failing:
        raise KeyboardInterrupt
    assert failing.closed == [False]
