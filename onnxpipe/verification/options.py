"""How a split folder is verified (:class:`VerifyOptions`), apart from :mod:`onnxpipe.verification.verify`
(which loads onnxruntime) so that options objects are made without loading it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from onnxpipe.core.choices import VerifyRuntime, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.cost.options import frozen_shapes

if TYPE_CHECKING:
    from onnxpipe.ir.samples import Samples

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`onnxpipe.verify` runs the original model and the chained stages on, and how it compares.

    ``model``: the source model (default: the path the manifest records; its sha256 must be the
    manifest's).  The inputs are the user's (``input_files``: one sample each; ``stacked_files``: a
    leading sample axis; ``samples``: already in memory) or ``runs`` sets of random values seeded from
    ``seed`` at the planned shapes, with ``shapes`` on top.  An output matches when
    ``max|a-b| <= atol + rtol * max|a|`` (:mod:`onnxpipe.verification.compare`).  ``runtime``: every
    stage on one runtime, or each on its device's (``devices``); None: onnxruntime on the CPU; the
    original always runs in onnxruntime on the CPU.  ``record``: write the result into the folder's
    manifest, which marks a split verified (or not).
    """

    model: Path | None = None
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    seed: int = 0
    runtime: VerifyRuntime | None = None
    threads: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    input_files: tuple[Path, ...] = ()
    stacked_files: tuple[Path, ...] = ()
    samples: Samples | None = None
    runs: int = 1
    record: bool = True

    def __post_init__(self) -> None:
        if self.model is not None:
            object.__setattr__(self, "model", Path(self.model))
        if self.runtime is not None:
            object.__setattr__(self, "runtime", choice(VerifyRuntime, self.runtime, "runtime"))
        object.__setattr__(self, "shapes", frozen_shapes(self.shapes))
        object.__setattr__(self, "input_files", tuple(Path(p) for p in self.input_files))
        object.__setattr__(self, "stacked_files", tuple(Path(p) for p in self.stacked_files))

    def check(self) -> None:
        """Refuse what cannot work together, before anything is loaded."""
        if self.runs < 1:
            raise UsageError(f"{opt('runs', self.runs)}: give a positive number of runs")
        if self.threads < 1:
            raise UsageError(f"{opt('threads', self.threads)}: give a positive number of threads")
        for name, value in (("rtol", self.rtol), ("atol", self.atol)):
            if not (value >= 0 and not math.isnan(value)):
                raise UsageError(f"{opt(name, value)}: tolerances must be numbers >= 0")
        given = self.samples is not None or bool(self.input_files or self.stacked_files)
        if given and self.shapes:
            raise UsageError(
                f"{opt('shapes')} and {opt('input_files')}: the inputs fix the shapes; "
                f"leave {opt('shapes')} out"
            )
