"""How a split folder is verified (:class:`VerifyOptions`), apart from :mod:`onnxpipe.verification.verify`
(which loads onnxruntime) so that options objects are made without loading it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
class Tolerance:
    """An output matches when ``max|a-b| <= atol + rtol * max|a|`` (:mod:`onnxpipe.verification.compare`)."""

    rtol: float
    atol: float

    def describe(self) -> str:
        return f"|a-b| <= {self.atol:g} + {self.rtol:g}*max|a|"


_BY_DTYPE: dict[str, Tolerance] = {
    "float16": Tolerance(4e-3, 1e-3),
    "bfloat16": Tolerance(3e-2, 1e-2),
    "int8": Tolerance(0.0, 1.0),
    "uint8": Tolerance(0.0, 1.0),
}
"""A split runs each stage's graph through onnxruntime's optimizer apart, which fuses and orders its
arithmetic otherwise than in the whole model: the difference is a few units in the last place of the
output's type.  float16 keeps 11 bits (an ulp 2**-10 of the value), bfloat16 8 (2**-7); an 8-bit
quantized output can move by one step where a rounding falls the other way."""
QUANTIZED = Tolerance(1e-2, 1e-5)
"""A float output of a quantized model (QDQ, QLinear, integer or n-bit MatMul): a fusion that moves a
quantize-dequantize pair moves a value by up to one quantization step, about 1/127 of its range."""
QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "MatMulNBits",
    }
)


BY_BOUNDARY: dict[str, Tolerance] = {
    "float16": Tolerance(1e-2, 1e-3),
    "bfloat16": Tolerance(5e-2, 1e-2),
    "int8": Tolerance(1e-1, 1e-2),
}
"""The float outputs of a split whose boundaries cross compressed (``boundary_dtype``), relative to the
output's scale (``max|a|``): each cut rounds an activation to 11 bits (float16, ~5e-4 of it), 8 bits
(bfloat16, ~4e-3) or one step of 1/127 of its tensor's largest value (int8), and the layers after it carry
that error on; a compression that breaks these is refused (docs/cli.md, ``--boundary-dtype``)."""


def loosest_boundary(dtypes: Iterable[str]) -> str:
    """Of the boundary dtypes of a split's stages, the one whose tolerance is loosest (float32: none
    compressed)."""
    wire = [d for d in dtypes if d in BY_BOUNDARY]
    return max(wire, key=lambda d: BY_BOUNDARY[d].rtol, default="float32")


def defaults_text(which: str) -> str:
    """The default ``rtol`` or ``atol`` (``which``) of each type, for the CLI's help."""
    float32 = Tolerance(DEFAULT_RTOL, DEFAULT_ATOL)
    own = [("float32", float32), *_BY_DTYPE.items(), ("a quantized model's float", QUANTIZED)]
    return ", ".join(f"{name} {getattr(tol, which):g}" for name, tol in own if getattr(tol, which) > 0)


def tolerance_for(
    dtype: str, *, quantized: bool = False, computes_in: str | None = None, boundary: str = "float32"
) -> Tolerance:
    """The tolerance an output of element type ``dtype`` is verified at by default: its type's (float32's
    :data:`DEFAULT_RTOL` and :data:`DEFAULT_ATOL` for the others), or a quantized model's if looser;
    other integers and booleans must be equal.  A float output of a split with compressed boundaries
    (``boundary``: their narrowest dtype) gets :data:`BY_BOUNDARY`'s where looser.

    ``computes_in``: the float type most of the model's arithmetic is in.  A float16 model converted
    with float32 inputs and outputs (``keep_io_types``) rounds every intermediate to 11 bits, so its
    float32 outputs differ as float16 values do: they get the compute type's tolerance when it is looser.
    """
    if dtype in _BY_DTYPE:
        own = _BY_DTYPE[dtype]
    elif dtype.startswith(("int", "uint", "bool")):
        return Tolerance(0.0, 0.0)
    elif computes_in in ("float16", "bfloat16"):
        own = _BY_DTYPE[computes_in]
    else:
        own = QUANTIZED if quantized else Tolerance(DEFAULT_RTOL, DEFAULT_ATOL)
    wire = BY_BOUNDARY.get(boundary)
    if wire is None or not dtype.startswith(("float", "bfloat")):
        return own
    return Tolerance(max(own.rtol, wire.rtol), max(own.atol, wire.atol))


@dataclass(frozen=True)
class VerifyOptions:
    """What :func:`onnxpipe.verify` runs the original model and the chained stages on, and how it compares.

    ``model``: the source model (default: the path the manifest records; its sha256 must be the
    manifest's).  The inputs are the user's (``input_files``: one sample each; ``stacked_files``: a
    leading sample axis; ``samples``: already in memory) or ``runs`` sets of random values seeded from
    ``seed`` at the planned shapes, with ``shapes`` on top.  An output matches when
    ``max|a-b| <= atol + rtol * max|a|`` (:mod:`onnxpipe.verification.compare`), at ``rtol`` and ``atol``
    when given, else at its element type's tolerance (:func:`tolerance_for`).  ``runtime``: every
    stage on one runtime, or each on its device's (``devices``); None: onnxruntime on the CPU; the
    original always runs in onnxruntime on the CPU, and on the stages' runtime too where they share one
    (:class:`~onnxpipe.verification.verify.OnRuntime`).  ``record``: write the result into the folder's
    manifest, which marks a split verified (or not).
    """

    model: Path | None = None
    rtol: float | None = None
    atol: float | None = None
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
        self._check()

    def _check(self) -> None:
        """Refuse what cannot work together, before anything is loaded."""
        if self.runs < 1:
            raise UsageError(f"{opt('runs', self.runs)}: give a positive number of runs")
        if self.threads < 1:
            raise UsageError(f"{opt('threads', self.threads)}: give a positive number of threads")
        for name, value in (("rtol", self.rtol), ("atol", self.atol)):
            if value is not None and not value >= 0:  # NaN is not >= 0 either
                raise UsageError(f"{opt(name, value)}: tolerances must be numbers >= 0")
        given = self.samples is not None or bool(self.input_files or self.stacked_files)
        if given and self.shapes:
            raise UsageError(
                f"{opt('shapes')} and {opt('input_files')}: the inputs fix the shapes; "
                f"leave {opt('shapes')} out"
            )

    def tolerance(
        self,
        dtype: str,
        *,
        quantized: bool = False,
        computes_in: str | None = None,
        boundary: str = "float32",
    ) -> Tolerance:
        """The tolerance of an output of element type ``dtype``: the one given, else its type's (and the
        model's and the boundaries', :func:`tolerance_for`)."""
        own = tolerance_for(dtype, quantized=quantized, computes_in=computes_in, boundary=boundary)
        return Tolerance(
            own.rtol if self.rtol is None else self.rtol, own.atol if self.atol is None else self.atol
        )
