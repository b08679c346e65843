"""How a model's costs are obtained (:class:`ProfileOptions`), apart from :mod:`onnxpipe.cost.source` (which
loads onnxruntime) so that options objects are made, and the CLI reads their defaults, without loading it.

A saved profile fixes the threads and input shapes its costs were measured with, so asking for other ones
alongside it is refused rather than silently ignored (:mod:`onnxpipe.cost.source`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from onnxpipe.core.choices import CostSource, Runtime, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import DEFAULT_OPENVINO_DEVICE, kind_of

if TYPE_CHECKING:
    from onnxpipe.cost.profile import Profile
    from onnxpipe.ir.samples import Samples

DEFAULT_RUNS = 30
"""Timed runs whose median is a node's cost."""
DEFAULT_WARMUP = 3
"""Untimed runs first: the first runs of a session allocate and fill caches."""


def frozen_shapes(shapes: Mapping[str, Sequence[int]]) -> Mapping[str, tuple[int, ...]]:
    """Input name -> dims, read-only, every dim an int: what an options object holds."""
    return MappingProxyType({name: tuple(int(d) for d in dims) for name, dims in shapes.items()})


@dataclass(frozen=True)
class ProfileOptions:
    """How to obtain a profile: the options of :func:`onnxpipe.profile`, and of the costs that
    :func:`onnxpipe.plan` and :func:`onnxpipe.split` partition by.

    ``saved`` (a :class:`~onnxpipe.cost.profile.Profile` or its file) if given; else measured
    (``cost="profile"``: ``runs`` timed runs after ``warmup``, on ``runtime``) or counted
    (``cost="static"``), with ``threads`` intra-op threads (default 1, or each device's with a devices
    file) at ``shapes`` (input name -> dims; the others guessed, :mod:`onnxpipe.ir.shapes`).
    ``input_files`` / ``stacked_files``: the user's sample inputs (one sample per file / a leading
    sample axis, :mod:`onnxpipe.ir.samples`), which fix the shapes and are what the model runs on
    instead of random values; ``inputs``: such samples already in memory.  ``out``: where the profile is
    saved (replacing a file there only with ``force``); None: not saved.
    """

    cost: CostSource = CostSource.PROFILE
    saved: Profile | Path | None = None
    threads: int | None = None
    runs: int = DEFAULT_RUNS
    warmup: int = DEFAULT_WARMUP
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    input_files: tuple[Path, ...] = ()
    stacked_files: tuple[Path, ...] = ()
    inputs: Samples | None = None
    runtime: Runtime = Runtime.ONNXRUNTIME
    """Measure on this runtime: OpenVINO and tract time the whole model and map their per-layer reports
    back to nodes where they name them (docs/runtimes.md)."""
    openvino_device: str = DEFAULT_OPENVINO_DEVICE
    out: Path | None = None
    force: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", choice(CostSource, self.cost, "cost"))
        object.__setattr__(self, "runtime", choice(Runtime, self.runtime, "runtime"))
        saved: object = self.saved  # a path may come as text
        if isinstance(saved, str):
            object.__setattr__(self, "saved", Path(saved))
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "shapes", frozen_shapes(self.shapes))
        object.__setattr__(self, "input_files", tuple(Path(p) for p in self.input_files))
        object.__setattr__(self, "stacked_files", tuple(Path(p) for p in self.stacked_files))
        self._check()

    @property
    def has_input_files(self) -> bool:
        return bool(self.input_files or self.stacked_files)

    @property
    def measured(self) -> bool:
        """Whether obtaining the profile runs the model (not a saved profile, not static costs)."""
        return self.saved is None and self.cost == CostSource.PROFILE

    def _check(self) -> None:
        """Refuse what cannot work together, before anything is loaded."""
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"{opt('threads', self.threads)}: give a positive number of intra-op threads")
        if self.runs < 1:
            raise UsageError(f"{opt('runs', self.runs)}: give 1 or more timed runs")
        if self.warmup < 0:
            raise UsageError(f"{opt('warmup', self.warmup)}: give 0 or more warm-up runs")
        if (self.inputs is not None or self.has_input_files) and self.shapes:
            raise UsageError(
                f"{opt('shapes')} and {opt('input_files')}: the inputs fix the shapes; "
                f"leave {opt('shapes')} out"
            )
        if self.inputs is not None and self.has_input_files:
            raise UsageError(f"{opt('inputs')}: give samples in memory or input files, not both")
        kind = kind_of(self.runtime)
        if not kind.reference and self.cost != CostSource.PROFILE:
            raise UsageError(f"{opt('runtime', self.runtime)} measures; leave out {opt('cost', self.cost)}")
        if not kind.takes_openvino_device and self.openvino_device != DEFAULT_OPENVINO_DEVICE:
            raise UsageError(
                f"{opt('openvino_device')} is for {opt('runtime', Runtime.OPENVINO)}, not {self.runtime}"
            )
