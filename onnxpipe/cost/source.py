"""Where a plan's costs come from, as one choice: a saved profile, a measurement, or static costs.

:class:`~onnxpipe.cost.options.ProfileOptions` says which; :func:`get_profile` obtains the profile.  A
saved profile fixes the threads and input shapes its costs were measured with, so asking for other ones
alongside it is refused rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.core.runtime_kinds import EngineConfig, kind_of
from onnxpipe.cost.measure import profile_model
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.runtime_profile import profile_on_runtime
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import load_samples


def get_profile(
    view: ModelView, options: ProfileOptions | None = None, *, progress: bool | str = False
) -> Profile:
    """A profile for ``view``: the saved one (checked to belong to it), a measured one (on
    ``options.runtime``), or static costs; ``progress`` draws a bar while measuring (a string: what is
    measured, named on the bar)."""
    opts = options or ProfileOptions()
    if opts.has_input_files:
        samples = load_samples(view, opts.input_files, stacked=opts.stacked_files)
        opts = dataclasses.replace(opts, inputs=samples, input_files=(), stacked_files=())
    if opts.saved is not None:
        return _saved(view, opts)
    threads = 1 if opts.threads is None else opts.threads
    if not kind_of(opts.runtime).reference:
        config = EngineConfig(runtime=opts.runtime, threads=threads, openvino_device=opts.openvino_device)
        return profile_on_runtime(view, config, runs=opts.runs, warmup=opts.warmup, shapes=opts.shapes)
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
        progress=progress,
        samples=opts.inputs,
    )


def _saved(view: ModelView, opts: ProfileOptions) -> Profile:
    assert opts.saved is not None
    prof = opts.saved if isinstance(opts.saved, Profile) else Profile.load(opts.saved)
    prof.check_matches(view)
    name = Path(prof.origin).name if prof.origin else "the profile"
    if opts.threads is not None and opts.threads != prof.threads:
        raise UsageError(
            f"{opt('threads', opts.threads)}: {name} was measured with {prof.threads} thread(s); "
            f"profile again with {opt('threads')} or leave {opt('threads')} out"
        )
    if opts.cost == CostSource.STATIC:
        raise UsageError(
            f"{opt('cost', CostSource.STATIC)}: {name} holds measured costs; give one or the other"
        )
    if opts.inputs is not None:
        for inp, dims in opts.inputs.shapes.items():
            if tuple(prof.input_shapes.get(inp, ())) != tuple(dims):
                raise UsageError(
                    f"{opt('input_files')}: {name} was measured at "
                    f"{inp}={list(prof.input_shapes.get(inp, ()))}, the inputs give {list(dims)}; profile "
                    f"again with these {opt('input_files')}"
                )
        prof = dataclasses.replace(prof, samples=opts.inputs)
    for inp, dims in opts.shapes.items():
        if tuple(prof.input_shapes.get(inp, ())) != tuple(dims):
            raise UsageError(
                f"{opt('shapes', inp)}: {name} was measured at {inp}={list(prof.input_shapes.get(inp, ()))}; "
                f"profile again with this {opt('shapes')} or leave it out"
            )
    return prof
