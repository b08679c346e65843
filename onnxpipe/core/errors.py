"""One exception hierarchy for everything onnxpipe refuses or fails at.

Every error a user can cause derives from :class:`OnnxpipeError` and carries a one-line message that names
the file, node or tensor at fault and says what to do.  The CLI maps each class to a documented exit code
(see ``docs/cli.md``), so scripts can tell a bad model from a failed verification without parsing text.
A bug in onnxpipe itself is *not* an ``OnnxpipeError``: it surfaces as an ordinary traceback.

An error about an option names it as a field (:mod:`onnxpipe.core.options`): :attr:`OnnxpipeError.options`
reads it back as data, and the CLI words it as its flag.
"""

from __future__ import annotations

import re

from onnxpipe.core.options import OptionRef, option_refs


class OnnxpipeError(Exception):
    """Base class of all user-facing errors; ``exit_code`` is what the CLI returns for it."""

    exit_code: int = 2

    @property
    def options(self) -> tuple[OptionRef, ...]:
        """The options the message names, the ones to change first: ``force``, ``SplitOptions.force``."""
        return option_refs(str(self))

    @property
    def field(self) -> str | None:
        """The first option the message names (``"force"``, ``"SplitOptions.force"``), or None."""
        refs = self.options
        return refs[0].key if refs else None


class UsageError(OnnxpipeError):
    """Arguments that cannot work together (K out of range, a malformed ``--shape``...): exit code 2."""


class ModelLoadError(OnnxpipeError):
    """The model file is missing, not ONNX, truncated, or fails the checker."""

    exit_code = 3


class ProfileError(OnnxpipeError):
    """Profiling failed, or a saved profile does not belong to the model."""

    exit_code = 4


class PartitionError(OnnxpipeError):
    """No partition satisfies the request (too many stages, memory that cannot fit...)."""

    exit_code = 5


class MemoryFitError(PartitionError):
    """No split fits the devices' memory; ``smallest_fit_bytes`` is the least memory per device that would
    (exit code 5, a :class:`PartitionError`'s)."""

    def __init__(self, message: str, smallest_fit_bytes: float) -> None:
        super().__init__(message)
        self.smallest_fit_bytes = smallest_fit_bytes


class ExportError(OnnxpipeError):
    """A stage could not be written (output folder exists, disk full, invalid stage)."""

    exit_code = 6


class ManifestError(OnnxpipeError):
    """A manifest is malformed, of an unknown schema version, or does not match its files."""

    exit_code = 7


class VerificationError(OnnxpipeError):
    """The chained stages do not reproduce the original model's outputs."""

    exit_code = 1


class RuntimeStageError(OnnxpipeError):
    """A stage failed while running a pipeline; the message names the stage and tensor."""

    exit_code = 8


class CacheLost(RuntimeStageError):
    """A generation step lost the KV caches of its sequences with a stage's worker (its Ray node died,
    or a restarted worker never held them): that step alone fails, the pipeline goes on, and the
    generation loop rebuilds each sequence's cache by a prefill of its tokens so far."""


MAX_LINE = 300

_ORT_STATUS = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_LOAD_FAILED = re.compile(r"^Load model from .*? failed:")
_SOURCE_LOCATION = re.compile(r"^\s*\S*onnxruntime_src/\S*:\d+ ")


def error_line(e: BaseException) -> str:
    """One line of an error: its reason, without onnxruntime's status prefix, source locations, C++
    signatures and backtraces.

    The one way onnxpipe quotes an exception it did not raise itself (onnxruntime's, OpenVINO's, tract's,
    onnx's, Ray's) inside its own one-line messages; over :data:`MAX_LINE` characters it is cut.

    * ``[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:/onnxruntime_src/x.h:46 void f(int)
      Opset 29 is ...`` becomes ``Opset 29 is ...``;
    * OpenVINO's lines of source locations (``Exception from src/inference/src/cpp/core.cpp:117:``, ``Check
      'false' failed at src/...:151:``) are skipped and the reason after them kept, its lines joined;
    * tract's ``Caused by:`` chain is joined to its first line with ``: ``, its backtrace dropped.
    """
    line = _reason(e)
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


_BACKTRACE = re.compile(r"\n\s*(Stack backtrace|Backtrace):", re.IGNORECASE)
_LOCATION_LINE = re.compile(
    r"^(Exception from |Check '.*' failed at )?\S+\.(c|cc|cpp|cxx|h|hpp|rs|py):\d+(:\d+)?:?$"
)
_CHAIN_ITEM = re.compile(r"^\d+:\s*")


def _reason(e: BaseException) -> str:
    text = _BACKTRACE.split(str(e), maxsplit=1)[0].strip()
    if not text:
        return type(e).__name__
    head, _, chain = text.partition("Caused by:")
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    while len(lines) > 1 and _LOCATION_LINE.match(lines[0]):
        lines.pop(0)
    first = _clean_first(lines[0]) if lines else type(e).__name__
    if first.endswith(":") or _LOCATION_LINE.match(lines[0] if lines else ""):
        first = " ".join([first, *lines[1:]])  # a header: the reason follows on the next lines
    causes = [_CHAIN_ITEM.sub("", ln.strip()) for ln in chain.splitlines() if ln.strip()]
    return ": ".join([first, *causes]) if causes else first


def _clean_first(line: str) -> str:
    """``line`` without onnxruntime's status prefix, and without its source location and C++ signature."""
    line = _LOAD_FAILED.sub("", _ORT_STATUS.sub("", line)).strip()
    location = _SOURCE_LOCATION.match(line)
    if location is None:
        return line
    rest = line[location.end() :]
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")" and depth > 0:
            depth -= 1
            if depth == 0:  # the end of the function signature
                message = re.sub(r"^\s*const\b", "", rest[i + 1 :]).strip()
                return message or line
    return rest.strip() or line
