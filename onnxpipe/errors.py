"""One exception hierarchy for everything onnxpipe refuses or fails at.

Every error a user can cause derives from :class:`OnnxpipeError` and carries a one-line message that names
the file, node or tensor at fault and says what to do.  The CLI maps each class to a documented exit code
(see ``docs/cli.md``), so scripts can tell a bad model from a failed verification without parsing text.
A bug in onnxpipe itself is *not* an ``OnnxpipeError``: it surfaces as an ordinary traceback.
"""

from __future__ import annotations


class OnnxpipeError(Exception):
    """Base class of all user-facing errors; ``exit_code`` is what the CLI returns for it."""

    exit_code: int = 2


class UsageError(OnnxpipeError):
    """Arguments that cannot work together (K out of range, a malformed ``--shape``...)."""

    exit_code = 2


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
    """No split fits the devices' memory; ``smallest_fit_bytes`` is the least memory per device that would."""

    exit_code = 5

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
