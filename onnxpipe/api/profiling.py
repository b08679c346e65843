"""``profile``: measure (or count) every node's cost, and save the profile where asked."""

from __future__ import annotations

from pathlib import Path

from onnxpipe.api.paths import check_output_file, writing
from onnxpipe.api.preamble import before_work, busy_watch
from onnxpipe.core.errors import UsageError
from onnxpipe.core.events import SILENT, Listener
from onnxpipe.core.options import opt
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import get_profile
from onnxpipe.export.checks import check_runtime_opsets
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView


def profile(
    model: str | Path | ModelView, options: ProfileOptions | None = None, *, listener: Listener | None = None
) -> Profile:
    """``model``'s profile as ``options`` say (measured on onnxruntime by default), saved to
    ``options.out`` when given: a file there is replaced only with ``options.force``, and one that cannot
    be written is refused before anything is measured."""
    say = listener or SILENT
    opts = options or ProfileOptions()
    check_profile_target(opts)
    view = model if isinstance(model, ModelView) else load_model(model)
    check_runtime_opsets(view)
    if opts.measured:
        before_work(say, view, opts)
    with busy_watch(say, "profiling", measuring=opts.measured):
        prof = get_profile(view, opts, progress=say.progress)
    save_profile(prof, opts)
    return prof


def check_profile_target(options: ProfileOptions) -> None:
    """Refuse, before any work, a profile file that exists (without ``force``) or cannot be written."""
    out = options.out
    if out is None:
        return
    if out.exists() and not options.force:
        raise UsageError(
            f"{out}: exists; choose another {opt('ProfileOptions.out')} or pass {opt('force', True)}"
        )
    check_output_file(out, "ProfileOptions.out")


def save_profile(prof: Profile, options: ProfileOptions) -> None:
    """Write ``prof`` to ``options.out`` when given."""
    if options.out is not None:
        with writing(options.out, "ProfileOptions.out"):
            prof.save(options.out)
