"""A tiny progress bar on stderr, with no dependencies.

>>> with Progress(3, "profiling", enabled=False) as bar:
...     for _ in range(3):
...         bar.advance()

On a terminal the bar redraws itself in place; when stderr is a file or a pipe it writes one line when
the work is done, so that logs stay readable.  A disabled bar writes nothing.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

_WIDTH = 30


class Progress:
    """``with Progress(total, label, enabled) as bar: ... bar.advance()``."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.enabled = enabled
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._interactive = bool(getattr(self._stream, "isatty", lambda: False)())
        self._start = time.perf_counter()
        self._last_draw = 0.0

    def __enter__(self) -> Progress:
        self._start = time.perf_counter()
        if self.enabled and self._interactive:
            self._draw()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.enabled:
            return
        if exc_type is None:
            self.done = max(self.done, self.total)
        if self._interactive:
            self._draw(force=True)
            self._stream.write("\n")
        elif exc_type is None:
            self._stream.write(self._line() + "\n")
        self._stream.flush()

    def set_label(self, label: str) -> None:
        """Say what the current step is; the bar keeps its count."""
        self.label = label
        if self.enabled and self._interactive:
            self._draw(force=True)

    def advance(self, steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps) if self.total else self.done + steps
        if self.enabled and self._interactive:
            self._draw()

    def _line(self) -> str:
        elapsed = time.perf_counter() - self._start
        if self.total:
            filled = int(_WIDTH * self.done / self.total)
            bar = "#" * filled + "." * (_WIDTH - filled)
            return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s"
        return f"{self.label} {self.done} {elapsed:5.1f}s"

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_draw < 0.1 and self.done < self.total:
            return
        self._last_draw = now
        self._stream.write("\r" + self._line().ljust(_WIDTH + 40))
        self._stream.flush()
