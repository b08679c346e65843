"""The tolerance a verification holds each output to: its element type's unless given
(:mod:`onnxpipe.verification.options`)."""

from __future__ import annotations

import pytest
from models import fp16_keep_io_model, make, vi
from onnx import TensorProto, helper

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.load import view_from_proto
from onnxpipe.verification.options import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    QUANTIZED,
    Tolerance,
    VerifyOptions,
    tolerance_for,
)
from onnxpipe.verification.verify import narrower_compute_type


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
        VerifyOptions(atol=-1.0)


def test_a_model_computing_in_float16_holds_its_float32_outputs_to_float16s_tolerance() -> None:
    fp16 = tolerance_for("float16")
    assert tolerance_for("float32", computes_in="float16") == fp16
    assert tolerance_for("float32", computes_in="bfloat16") == tolerance_for("bfloat16")
    assert tolerance_for("float32", computes_in="float32") == Tolerance(DEFAULT_RTOL, DEFAULT_ATOL)
    assert tolerance_for("int64", computes_in="float16") == Tolerance(0.0, 0.0)
    assert VerifyOptions(rtol=1e-6).tolerance("float32", computes_in="float16") == Tolerance(1e-6, fp16.atol)


def test_the_compute_type_is_what_most_float_tensors_are() -> None:
    assert narrower_compute_type(view_from_proto(fp16_keep_io_model())) == "float16"
    one_cast = make(
        [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["h"], ["c"], to=TensorProto.FLOAT),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Tanh", ["r"], ["y"]),
        ],
        [vi("x", [2])],
        [vi("y", [2])],
    )
    assert narrower_compute_type(view_from_proto(one_cast)) is None  # float32 arithmetic, one float16 step
