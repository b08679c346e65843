"""The tolerance a verification holds each output to: its element type's unless given
(:mod:`onnxpipe.verification.options`)."""

from __future__ import annotations

import pytest

from onnxpipe.core.errors import UsageError
from onnxpipe.verification.options import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    QUANTIZED,
    Tolerance,
    VerifyOptions,
    tolerance_for,
)


def test_each_type_has_its_own_tolerance() -> None:
    assert tolerance_for("float32") == Tolerance(DEFAULT_RTOL, DEFAULT_ATOL)
    assert tolerance_for("float16").rtol > 10 * DEFAULT_RTOL  # 11 bits against 24
    assert tolerance_for("bfloat16").rtol > tolerance_for("float16").rtol  # 8 bits
    assert tolerance_for("int8") == tolerance_for("uint8") == Tolerance(0.0, 1.0)  # one quantization step
    assert tolerance_for("int64") == tolerance_for("bool") == Tolerance(0.0, 0.0)  # equal
    assert tolerance_for("float32", quantized=True) == QUANTIZED
    assert tolerance_for("float16", quantized=True) == tolerance_for("float16")


def test_a_given_tolerance_holds_for_every_type() -> None:
    opts = VerifyOptions(rtol=0.5)
    assert opts.tolerance("float16") == Tolerance(0.5, tolerance_for("float16").atol)
    assert opts.tolerance("float32") == Tolerance(0.5, DEFAULT_ATOL)
    with pytest.raises(UsageError, match=r"`atol=-1\.0`"):
        VerifyOptions(atol=-1.0).check()
