"""Where a plan's costs come from, as one choice: a saved profile, a measurement, or static costs.

:class:`ProfileOptions` is what the API, the CLI and ``split`` say about it; :func:`get_profile` obtains
the profile.  A saved profile fixes the threads and input shapes its costs were measured with, so asking
for other ones alongside it is refused rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from onnxpipe.core.choices import CostSource, choice
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import Samples, load_samples

DEFAULT_RUNS = 30
DEFAULT_WARMUP = 3


@dataclass(frozen=True)
class ProfileOptions:
    """How to obtain a profile: ``saved`` (a :class:`Profile` or its file) if given, else measured
    (``cost="profile"``: ``runs`` timed runs after ``warmup``) or counted (``cost="static"``), with
    ``threads`` intra-op threads (default 1) at ``shapes`` (input name -> dims; the others guessed,
    :mod:`onnxpipe.ir.shapes`).  ``inputs``: the user's sample inputs (``--inputs``,
    :mod:`onnxpipe.ir.samples`), which fix the shapes and are what the model runs on instead of random
    values.  ``progress`` draws a bar while measuring."""

    cost: CostSource = CostSource.PROFILE
    saved: Profile | Path | None = None
    threads: int | None = None
    runs: int = DEFAULT_RUNS
    warmup: int = DEFAULT_WARMUP
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    progress: bool = False
    inputs: Samples | None = None
    input_files: tuple[Path, ...] = ()
    """``--inputs`` files (one sample each), read and checked against the model by :func:`get_profile`."""
    stacked_files: tuple[Path, ...] = ()
    """``--inputs-stacked`` files (``.npz`` with a leading sample axis)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", choice(CostSource, self.cost, "cost"))
        if isinstance(self.saved, str):
            object.__setattr__(self, "saved", Path(self.saved))
        object.__setattr__(
            self, "shapes", MappingProxyType({n: tuple(int(d) for d in v) for n, v in self.shapes.items()})
        )
        object.__setattr__(self, "input_files", tuple(Path(p) for p in self.input_files))
        object.__setattr__(self, "stacked_files", tuple(Path(p) for p in self.stacked_files))
        files = bool(self.input_files or self.stacked_files)
        if (self.inputs is not None or files) and self.shapes:
            raise UsageError("--shape and --inputs: the inputs fix the shapes; leave --shape out")
        if self.inputs is not None and files:
            raise UsageError("inputs: give samples in memory or input files, not both")


def get_profile(view: ModelView, options: ProfileOptions | None = None) -> Profile:
    """A profile for ``view``: the saved one (checked to belong to it), a measured one, or static costs."""
    opts = options or ProfileOptions()
    if opts.input_files or opts.stacked_files:
        samples = load_samples(view, opts.input_files, stacked=opts.stacked_files)
        opts = dataclasses.replace(opts, inputs=samples, input_files=(), stacked_files=())
    if opts.saved is not None:
        return _saved(view, opts)
    threads = 1 if opts.threads is None else opts.threads
    if threads < 1:
        raise UsageError(f"--threads {threads}: give a positive number of intra-op threads")
    if opts.cost == CostSource.STATIC:
        # static costs do not depend on threads, but the plan records what the stages will run with
        shapes = opts.inputs.shapes if opts.inputs is not None else opts.shapes
        prof = static_profile(view, shapes=shapes)
        records = opts.inputs.records if opts.inputs is not None else ()
        return dataclasses.replace(prof, threads=threads, inputs=records, samples=opts.inputs)
    return profile_model(
        view,
        threads=threads,
        runs=opts.runs,
        warmup=opts.warmup,
        shapes=opts.shapes,
        progress=opts.progress,
        samples=opts.inputs,
    )


def _saved(view: ModelView, opts: ProfileOptions) -> Profile:
    assert opts.saved is not None
    prof = opts.saved if isinstance(opts.saved, Profile) else Profile.load(opts.saved)
    prof.check_matches(view)
    name = Path(prof.origin).name if prof.origin else "the profile"
    if opts.threads is not None and opts.threads != prof.threads:
        raise UsageError(
            f"--threads {opts.threads}: {name} was measured with {prof.threads} thread(s); "
            "profile again with --threads or leave --threads out"
        )
    if opts.cost == CostSource.STATIC:
        raise UsageError(f"--cost static: {name} holds measured costs; give one or the other")
    if opts.inputs is not None:
        for inp, dims in opts.inputs.shapes.items():
            if tuple(prof.input_shapes.get(inp, ())) != tuple(dims):
                raise UsageError(
                    f"--inputs: {name} was measured at {inp}={list(prof.input_shapes.get(inp, ()))}, the "
                    f"inputs give {list(dims)}; profile again with these --inputs"
                )
        prof = dataclasses.replace(prof, samples=opts.inputs)
    for inp, dims in opts.shapes.items():
        if tuple(prof.input_shapes.get(inp, ())) != tuple(dims):
            raise UsageError(
                f"--shape {inp}: {name} was measured at {inp}={list(prof.input_shapes.get(inp, ()))}; "
                "profile again with this --shape or leave it out"
            )
    return prof
