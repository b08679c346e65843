"""What a long request says while it works: steps, lines before the work, warnings.

The library prints nothing; each options object of a long request takes a :class:`Listener`, which the
CLI implements by printing (to stderr with ``--json``), a notebook by showing, a service by logging.  The
texts name options as fields (:mod:`onnxpipe.core.options`): the listener words them.
"""

from __future__ import annotations

from typing import Protocol


class Listener(Protocol):
    """Told what a request is doing, as it does it."""

    progress: bool
    """Whether a long measurement draws a bar on stderr (a line now and then when stderr is a log)."""

    def line(self, text: str) -> None:
        """A line about the work before it starts: the input shapes it will use, the threads it runs."""
        ...

    def step(self, what: str) -> None:
        """A step begins: ``profiling``, ``exporting 4 stages``, ``verifying``."""
        ...

    def warn(self, text: str) -> None:
        """Something that may make the result wrong or slow: a busy machine, more threads than CPUs."""
        ...


class Silent:
    """The listener that hears nothing: what a request without one is told to."""

    progress = False

    def line(self, text: str) -> None:
        pass

    def step(self, what: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass


SILENT = Silent()
