"""Progress of a long step on stderr: a tqdm bar on a terminal, plain lines in a log.

>>> with Progress(3, "profiling", enabled=False) as bar:
...     for _ in range(3):
...         bar.advance()

On a terminal the bar is tqdm's when it is installed (``pip install 'onnxpipe[progress]'``): counts with
their unit, elapsed time, rate and time left, redrawn in place, the one maintained library for this
(rich would also do, but draws whole screens and weighs ten times more for one bar).  Otherwise (a file,
a pipe, a terminal without tqdm) nothing is redrawn: a line says where the step is every
:data:`LOG_EVERY_SECONDS` and when it is done, so that a log shows progress and its pace.  A disabled
bar writes nothing; the API's steps leave it disabled unless asked.
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Self, TextIO

LOG_EVERY_SECONDS = 5.0
"""How often a step writes a line of progress when stderr is not a terminal."""


class ClosesOnExit(ABC):
    """A ``with`` block around a runner of workers closes it on the way out: gracefully (what was
    submitted finishes first) after a normal exit, at once after an exception or Ctrl-C, when waiting
    for the rest would only delay the error."""

    @abstractmethod
    def close(self, graceful: bool = True) -> None:
        """Stop the runner: ``graceful``, after what was submitted finished; else at once."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(graceful=exc_type is None)


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """``with Progress(total, label, enabled, unit="runs") as bar: ... bar.advance()``."""

    def __init__(
        self,
        total: int,
        label: str,
        enabled: bool = True,
        stream: TextIO | None = None,
        *,
        unit: str = "steps",
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.unit = unit
        self.enabled = enabled
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._interactive = bool(getattr(self._stream, "isatty", lambda: False)())
        self._start = time.perf_counter()
        self._last_line = self._start
        self._bar: Any = None
        self.done_text: str | None = None
        """What the line that ends the step says instead of the count (set before the block ends)."""

    def __enter__(self) -> Progress:
        self._start = self._last_line = time.perf_counter()
        tqdm = _tqdm() if self.enabled and self._interactive else None
        if tqdm is not None:
            self._bar = tqdm(
                total=self.total or None, desc=self.label, unit=f" {self.unit}", file=self._stream, leave=True
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.enabled:
            return
        if exc_type is None and self.total:
            self.advance(self.total - self.done)
        if self._bar is not None:
            self._bar.close()
        if exc_type is None and (self._bar is None or self.done_text is not None):
            self._stream.write(self._line(done=True) + "\n")
        self._stream.flush()

    def set_label(self, label: str) -> None:
        """Say what the current step is; the bar keeps its count."""
        self.label = label
        if self._bar is not None:
            self._bar.set_description(label)

    def advance(self, steps: int = 1) -> None:
        before = self.done
        self.done = min(self.total, self.done + steps) if self.total else self.done + steps
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self.done - before)
        else:
            now = time.perf_counter()
            if now - self._last_line >= LOG_EVERY_SECONDS and self.done < self.total:
                self._last_line = now
                self._stream.write(self._line() + "\n")
                self._stream.flush()

    def _line(self, *, done: bool = False) -> str:
        elapsed = time.perf_counter() - self._start
        if done and self.done_text is not None:
            return f"{self.done_text} ({elapsed:.1f} s)"
        count = f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}"
        return f"{self.label}: {count} {'in' if done else 'after'} {elapsed:.1f} s"
