"""Options named in messages (:mod:`onnxpipe.core.options`): written as fields, read back as data,
worded by whoever prints them."""

from __future__ import annotations

from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.core.options import OptionRef, opt, option_refs, render


def test_opt_writes_the_field_and_the_value() -> None:
    assert opt("force") == "`force`"
    assert opt("force", True) == "`force=True`"
    assert opt("stages", 2) == "`stages=2`"
    assert opt("SplitOptions.force", True) == "`SplitOptions.force=True`"


def test_an_error_carries_the_options_it_names() -> None:
    e = ExportError(f"out: exists and is not empty; choose another {opt('out')} or pass {opt('force', True)}")
    assert e.options == (OptionRef("out"), OptionRef("force", value="True"))
    assert e.field == "out"
    assert UsageError("nothing to change").field is None


def test_qualified_options_keep_their_class() -> None:
    (ref,) = option_refs(f"give {opt('ScheduleRequest.kind', 'gpipe')}")
    assert (ref.owner, ref.field, ref.value, ref.key) == (
        "ScheduleRequest",
        "kind",
        "gpipe",
        "ScheduleRequest.kind",
    )


def test_render_words_known_options_and_leaves_the_rest() -> None:
    text = f"use {opt('stages', 2)} or fewer; see `onnxpipe verify` and {opt('unknown_thing')}"

    def word(ref: OptionRef) -> str | None:
        return f"--stages {ref.value}" if ref.field == "stages" else None

    assert render(text, word) == "use --stages 2 or fewer; see `onnxpipe verify` and `unknown_thing`"
