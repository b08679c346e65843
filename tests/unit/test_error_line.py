"""How onnxpipe quotes another library's error in its own one line (:func:`onnxpipe.core.errors.error_line`):
the reason, not the first line, which is often a source location; tract's cause chain; no backtrace."""

from __future__ import annotations

import pytest

from onnxpipe.core.errors import MAX_LINE, error_line

OPENVINO_UNSUPPORTED = (
    "Exception from src/inference/src/cpp/core.cpp:117:\n"
    "Exception from src/plugins/intel_cpu/src/node.cpp:1234:\n"
    "CPU plug-in doesn't support If operation with dynamic rank. Operation name: If_0\n"
)
OPENVINO_CONVERSION = (
    "Exception from src/inference/src/cpp/core.cpp:84:\n"
    "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
    "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted.\nSummary:\n"
    "-- No conversion rule found for operations: com.example.Frobnicate\n\n"
)
TRACT_CHAIN = (
    'Failed analyse for node #2 "y" Reshape\n\nCaused by:\n    0: Infering facts\n'
    "    1: Reshaping [Val(2)] to [Val(7)]\n    2: Reshape volume mismatch\n\n"
    "Stack backtrace:\n   0: <anyhow::Error>::msg::<alloc::string::String>\n   1: tract_hir::infer\n"
)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (
            OPENVINO_UNSUPPORTED,
            "CPU plug-in doesn't support If operation with dynamic rank. Operation name: If_0",
        ),
        (
            OPENVINO_CONVERSION,
            "FrontEnd API failed with OpConversionFailure: Model wasn't fully converted. Summary: -- No "
            "conversion rule found for operations: com.example.Frobnicate",
        ),
        (
            TRACT_CHAIN,
            'Failed analyse for node #2 "y" Reshape: Infering facts: Reshaping [Val(2)] to [Val(7)]: Reshape '
            "volume mismatch",
        ),
        (
            "[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:/onnxruntime_src/x.h:46 void "
            "f(int) "
            "Opset 29 is under development\nsecond line",
            "Opset 29 is under development",
        ),
        ("", "RuntimeError"),
    ],
)
def test_the_reason_is_kept(raw: str, said: str) -> None:
    assert error_line(RuntimeError(raw)) == said


def test_a_long_reason_is_cut_to_one_line() -> None:
    said = error_line(RuntimeError("x" * 1000 + "\nmore"))
    assert len(said) == MAX_LINE and said.endswith("...") and "\n" not in said
