"""The input sizes a model runs at: the guessed ones, or its sequence dims at a larger size where a run at
the guess fails.  One rule for every step that chooses sizes by itself.

Why: a guessed sequence length of :data:`~onnxpipe.ir.shapes.SEQUENCE_SIZE` is too short for some models
(a voice-activity detector's reflect pad of 64 samples fails on 16).  A measured profile finds out when
its first run fails and measures again at :data:`~onnxpipe.ir.shapes.RETRY_SEQUENCE_SIZE`
(:mod:`onnxpipe.cost.measure`); a split that measures nothing first (``split --static``, which freezes
the sizes before any run, or static costs) asks :func:`runnable_shapes`, which runs the model once at
the guess, and once more at the larger size if that failed.  Sizes the user gave are never changed, and
a model that fails at both keeps the guess: the step that runs it next says why, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from onnxpipe.core.errors import error_line
from onnxpipe.core.options import opt
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import RETRY_SEQUENCE_SIZE, guessed_dims, is_sequence_dim, resolve_input_shapes

RETRY_NOTE = "the model failed on random inputs at the guessed sizes"
"""How the note on a retry at larger sequence sizes starts (``split`` copies a profile's into the plan's
notes, so that the manifest says which sizes were finally used)."""

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class RunnableShapes:
    """The sizes chosen, and the note that says they are not the guessed ones (None when they are)."""

    shapes: Shapes
    note: str | None = None


def retry_shapes(view: ModelView, shapes: Mapping[str, Sequence[int]] | None) -> Shapes | None:
    """The sizes with every guessed sequence dim at :data:`RETRY_SEQUENCE_SIZE`; None when no sequence
    dim was guessed (nothing to retry: the user gave them, or the model fixes them)."""
    if not any(is_sequence_dim(view, n, a) for n, a, _ in guessed_dims(view, shapes)):
        return None
    return resolve_input_shapes(view, shapes, sequence_size=RETRY_SEQUENCE_SIZE)


def retry_note(why: str, used: Mapping[str, Sequence[int]]) -> str:
    """The note on a retry: why the guess failed, and the sizes used instead."""
    shown = ", ".join(f"{n}={list(v)}" for n, v in used.items())
    return (
        f"{RETRY_NOTE} ({why}); run at {shown}, its sequence dims at {RETRY_SEQUENCE_SIZE}: give the sizes "
        f"you deploy with {opt('shapes')} or real inputs with {opt('input_files')}"
    )


def runnable_shapes(view: ModelView, shapes: Mapping[str, Sequence[int]] | None = None) -> RunnableShapes:
    """:func:`~onnxpipe.ir.shapes.resolve_input_shapes`'s sizes where the model runs on random inputs
    there (or no sequence dim was guessed: then it is not run), else those of :func:`retry_shapes` where
    it runs at them, with the note that says so; else the guessed sizes."""
    first = resolve_input_shapes(view, shapes)
    larger = retry_shapes(view, shapes)
    if larger is None or larger == first:
        return RunnableShapes(first)
    why = _failure(view, first)
    if why is None or _failure(view, larger) is not None:
        return RunnableShapes(first)
    return RunnableShapes(larger, retry_note(why, larger))


def _failure(view: ModelView, shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """onnxruntime's reason when one run of the model on random inputs at ``shapes`` fails; None when it
    runs, or when the model cannot even be loaded (no size helps: the next step says so)."""
    options = session_options(level="ORT_DISABLE_ALL", log_severity=4, external_dir=view.base_dir)
    try:
        session = open_session(view.proto.SerializeToString(), options)
    except Exception:  # noqa: BLE001 - a model that does not load is refused by the step that loads it
        return None
    try:
        session.run(None, random_feeds(view, shapes))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for a failed kernel
        return error_line(e)
    return None


__all__ = ["RETRY_NOTE", "RunnableShapes", "retry_note", "retry_shapes", "runnable_shapes"]
