"""Concrete sizes for a model's symbolic and unknown input dims: the one rule every step uses.

Symbolic or unknown input dims get sizes that make typical models run:

* the first dim (batch) is 1;
* the spatial dims (2 and 3) of a rank-4, image-like input are 64, a multiple of 32 so that detectors
  with several stride-2 stages still line up;
* the channel dim (1) of a rank-4 input is 3;
* every other dim (sequence length, time steps, ...) is 16 (:data:`SEQUENCE_SIZE`; a measured profile
  that fails at it retries once at :data:`RETRY_SEQUENCE_SIZE`, :mod:`onnxpipe.cost.measure`);
* a decoder's past length, new tokens and mask length are sized together for one phase (a decode step
  by default), by :mod:`onnxpipe.ir.decoder_dims`.

Inputs that are not tensors (sequences, maps, optionals) have no shape and are left out: only real
inputs (``--inputs``, or arrays given to the API) can feed them.  When a run at the sizes chosen here
fails, :func:`failure_hint` says which input dims were guessed and the exact flags that set them.

The same symbolic name gets the same size everywhere, and a size given for it by an override is used for
every other input that names it.  Unnamed dims that the model shows must be equal (a state's batch and
its input's) are linked the same way (:func:`onnxpipe.ir.symbolic.linked_input_shapes`).
:func:`symbol_sizes` reads back which size each symbol took, so that the profiler, the planner, the
exporter and the verifier size a tensor alike.

"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from onnxpipe.core.errors import UsageError
from onnxpipe.core.options import opt
from onnxpipe.ir.decoder_dims import decoder_symbol_sizes, expression_size
from onnxpipe.ir.decoder_kinds import PhaseShape
from onnxpipe.ir.model import ModelView, dims_text
from onnxpipe.ir.symbolic import linked_input_shapes

BATCH_SIZE = 1
IMAGE_SIZE = 64
IMAGE_CHANNELS = 3
SEQUENCE_SIZE = 16
RETRY_SEQUENCE_SIZE = 512
"""The sequence size a measured profile retries at when the model fails at :data:`SEQUENCE_SIZE` (a
voice-activity detector's reflect pad of 64 samples needs more than 16; 512 is a common frame)."""


def resolve_input_shapes(
    view: ModelView,
    overrides: Mapping[str, Sequence[int]] | None = None,
    *,
    sequence_size: int = SEQUENCE_SIZE,
    phase: PhaseShape | None = None,
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for every tensor input of the model (see the module docstring for the defaults;
    ``sequence_size`` replaces :data:`SEQUENCE_SIZE`).

    A decoder's inputs (:mod:`onnxpipe.ir.decoder_dims`) are sized together for ``phase`` (default:
    a decode step), so that past, new tokens and mask agree; a dim written as a sum of symbols
    (``past_sequence_length + 1``) is their sum.

    Raises :class:`UsageError` when an override names no input, has the wrong rank, or contradicts a
    fixed dim of the model, and when an input of unknown rank has no override.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(view.inputs))
    if unknown:
        listed = ", ".join(view.inputs) if view.inputs else "(none)"
        raise UsageError(
            f"{opt('shapes')} names {unknown[0]!r}, which is not a model input; inputs are: {listed}"
        )

    symbols: dict[str, int] = {}
    linked = linked_input_shapes(view)
    # overrides first, so that the sizes they give to symbolic names reach every other input
    for name, given in overrides.items():
        shape = view.tensor(name).shape
        links = linked.get(name, shape)
        dims = tuple(int(d) for d in given)
        if shape is not None:
            if len(dims) != len(shape):
                raise UsageError(
                    f"{opt('shapes', name)}: the model's input {name!r} has rank {len(shape)} "
                    f"({dims_text(shape)}), the override gives {len(dims)} dims; give {len(shape)} dims"
                )
            for axis, (declared, value) in enumerate(zip(shape, dims, strict=True)):
                if isinstance(declared, int) and declared >= 0 and declared != value:
                    raise UsageError(
                        f"{opt('shapes', name)}: dim {axis} of input {name!r} is fixed at {declared} by "
                        "the model "
                        f"({dims_text(shape)}), the override gives {value}; give {declared} for dim {axis}"
                    )
                link = links[axis] if links is not None and axis < len(links) else declared
                if isinstance(link, str):
                    symbols.setdefault(link, value)

    for sym, size in decoder_symbol_sizes(view, symbols, phase).items():
        symbols.setdefault(sym, size)

    result: dict[str, tuple[int, ...]] = {}
    others = non_tensor_inputs(view)
    for name in view.inputs:
        if name in others:
            continue
        if name in overrides:
            result[name] = tuple(int(d) for d in overrides[name])
            continue
        shape = linked.get(name, view.tensor(name).shape)
        if shape is None:
            raise UsageError(
                f"input {name!r} has no known rank; give its shape with {opt('shapes', f'{name}=D1,D2,...')}"
            )
        resolved: list[int] = []
        for axis, d in enumerate(shape):
            if isinstance(d, int) and d >= 0:  # some exporters write -1 for "unknown"
                resolved.append(d)
            elif isinstance(d, str) and d in symbols:
                resolved.append(symbols[d])
            elif isinstance(d, str) and (summed := expression_size(d, symbols)) is not None:
                resolved.append(summed)
            else:
                size = _default_dim(axis, len(shape), sequence_size)
                if isinstance(d, str):
                    symbols[d] = size
                resolved.append(size)
        result[name] = tuple(resolved)
    return result


def symbol_sizes(view: ModelView, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The size each symbolic input dim (``"batch"``) takes in ``input_shapes``."""
    symbols: dict[str, int] = {}
    for name, dims in input_shapes.items():
        declared = view.tensor(name).shape
        if declared is not None and len(declared) == len(dims):
            for d, v in zip(declared, dims, strict=True):
                if isinstance(d, str):
                    symbols.setdefault(d, int(v))
    return symbols


def non_tensor_inputs(view: ModelView) -> frozenset[str]:
    """The model inputs that are sequences, maps or optionals: they have no shape to resolve."""
    return frozenset(
        vi.name
        for vi in view.proto.graph.input
        if vi.name in view.inputs and vi.type.WhichOneof("value") not in (None, "tensor_type")
    )


def guessed_dims(
    view: ModelView, overrides: Mapping[str, Sequence[int]] | None = None
) -> list[tuple[str, int, str | None]]:
    """The input dims :func:`resolve_input_shapes` chooses a size for: (input, axis, symbol or None),
    those of inputs ``overrides`` gives left out."""
    given = set(overrides or {})
    fixed = {d for n in given if n in view.inputs for d in (view.tensor(n).shape or ()) if isinstance(d, str)}
    others = non_tensor_inputs(view)
    return [
        (name, axis, d if isinstance(d, str) else None)
        for name in view.inputs
        if name not in given and name not in others
        for axis, d in enumerate(view.tensor(name).shape or ())
        if not (isinstance(d, int) and d >= 0) and d not in fixed
    ]


def is_sequence_dim(view: ModelView, name: str, axis: int) -> bool:
    """Whether a guessed dim got :data:`SEQUENCE_SIZE` (neither a batch dim nor an image's)."""
    shape = view.tensor(name).shape
    return shape is not None and _default_dim(axis, len(shape), -1) == -1


def failure_hint(
    view: ModelView,
    used: Mapping[str, Sequence[int]],
    overrides: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """What to say when the model fails at the sizes onnxpipe chose: which input dims were guessed,
    at what size, and the exact shapes that would give them (to edit), or real inputs; and the inputs
    whose random values may be what fails (:func:`valued_inputs`), which only real inputs set.

    An input whose shape the model fixes (a scalar ``sr``) is never offered to ``shapes``: no size given
    to it could differ."""
    guessed = guessed_dims(view, overrides)
    valued = _valued_note(view, used)
    files = opt("input_files", "FILE.npz")

    def flags(names: Iterable[str]) -> str:
        return " ".join(opt("shapes", f"{n}={','.join(str(int(d)) for d in used[n])}") for n in names)

    if not guessed:
        every = flags(n for n in used if not view.tensor(n).is_static)
        if not every:
            return f"give real inputs with {files} (one array per input, by name){valued}"
        return f"give the shapes the model runs at with {every} (edited), or real inputs with {files}{valued}"
    parts = [
        f"{name!r} dim {axis}" + (f" ({sym})" if sym else "") + f" = {used[name][axis]}"
        for name, axis, sym in guessed
        if name in used and axis < len(used[name])
    ]
    return (
        f"onnxpipe guessed the sizes of {', '.join(parts)}; give the sizes the model runs at with "
        f"{flags(n for n in dict.fromkeys(n for n, _, _ in guessed) if n in used)} (edited), or real inputs "
        f"with {files}{valued}"
    )


def valued_inputs(view: ModelView, used: Mapping[str, Sequence[int]]) -> list[str]:
    """The inputs of ``used`` whose shape the model fixes and whose values may steer it: integers and
    booleans (a sample rate, a flag, a count), which onnxpipe fills with small random values; no size
    sets them, only real inputs do."""
    return [
        n
        for n in used
        if view.tensor(n).is_static  # the model fixes every dim (a scalar has none to size)
        and (view.tensor(n).dtype.startswith(("int", "uint")) or view.tensor(n).dtype == "bool")
    ]


def _valued_note(view: ModelView, used: Mapping[str, Sequence[int]]) -> str:
    """`` (the only way to set the value of sr, an int64 scalar, which was random here)``, or nothing."""
    valued = valued_inputs(view, used)
    if not valued:
        return ""
    named = ", ".join(
        f"{n}, {'an' if t.dtype.startswith('int') else 'a'} {t.dtype} "
        + ("scalar" if not t.shape else f"of shape {dims_text(t.shape)}")
        for n in valued
        for t in [view.tensor(n)]
    )
    if len(valued) == 1:
        return f" (the only way to set the value of {named}, which was random here)"
    return f" (the only way to set the values of {named}, which were random here)"


def _default_dim(axis: int, rank: int, sequence_size: int = SEQUENCE_SIZE) -> int:
    if axis == 0:
        return BATCH_SIZE
    if rank == 4:
        return IMAGE_CHANNELS if axis == 1 else IMAGE_SIZE
    return sequence_size
