"""How ``verify --runtime R`` judges an output from its three comparisons: the stages against onnxruntime,
against the whole model on R, and the whole model on R against onnxruntime
(:class:`onnxpipe.verification.verify.OnRuntime`)."""

from __future__ import annotations

import numpy as np

from onnxpipe.verification.compare import OutputComparison, compare
from onnxpipe.verification.verify import OnRuntime, VerifyReport


def _diff(name: str, by: float) -> OutputComparison:
    base = np.linspace(1.0, 2.0, 8, dtype=np.float32)
    return compare(name, base, base + np.float32(by), rtol=1e-4, atol=1e-5)


def _report(outputs: tuple[OutputComparison, ...], on: OnRuntime | None) -> VerifyReport:
    return VerifyReport(outputs, rtol=1e-4, atol=1e-5, seed=0, runs=1, on_runtime=on)


def passes(reference: OutputComparison, on: OnRuntime | None, i: int) -> bool:
    """Whether ``reference`` passes as output ``i`` of a report whose other outputs match."""
    outputs = tuple(reference if j == i else _diff(f"o{j}", 0.0) for j in range(i + 1))
    return _report(outputs, on).passes(i)


def test_an_output_passes_against_onnxruntime_or_the_whole_model_on_its_runtime() -> None:
    on = OnRuntime("openvino (CPU)", stages=(_diff("y", 0.0), _diff("z", 0.5)), whole=(_diff("y", 0.1),) * 2)
    y, z = _diff("y", 0.1), _diff("z", 0.5)
    assert passes(y, on, 0)  # the split adds nothing to openvino's own difference
    assert not passes(z, on, 1)  # differs from both: the split is at fault
    assert passes(_diff("z", 0.0), on, 1)  # matches onnxruntime whatever the whole model on openvino gives
    assert not passes(y, None, 0) and not passes(y, OnRuntime("tract", not_run="no Loop"), 0)
    assert (
        _report((y,), on).verdict
        == "1 output(s) match the whole model on openvino (CPU), which differs from onnxruntime by itself"
    )
    assert (
        _report((y, z), on).verdict
        == "2 output(s) DO NOT match the original, nor the whole model on openvino (CPU)"
    )
    assert _report((_diff("y", 0.0),), on).verdict == "1 output(s) match the original"
    (note,) = _report((y, z), on).notes
    assert note.startswith(
        "openvino (CPU) differs from onnxruntime by itself: the whole model on it gives y by max abs diff "
        "0.1 "
    )
    assert "z" not in note.split(";")[0]


def test_each_comparison_is_named_where_the_stages_differ_from_onnxruntime() -> None:
    on = OnRuntime("tract", stages=(_diff("y", 0.0),), whole=(_diff("y", 0.25),))
    assert _report((_diff("y", 0.25),), on).output_line(0) == (
        "y: ok (stages against the whole model, both on tract: max abs diff 0, max rel diff 0; stages "
        "against onnxruntime: max abs diff 0.25, max rel diff 0.125; the whole model on tract against "
        "onnxruntime: max abs diff 0.25, max rel diff 0.125)"
    )
    assert _report((_diff("y", 0.0),), on).output_line(0) == "y: ok (max abs diff 0, max rel diff 0)"


def test_a_whole_model_the_runtime_cannot_run_leaves_onnxruntime_as_the_only_reference() -> None:
    on = OnRuntime("tract", not_run="Loop is not supported")
    assert not on.ran
    assert _report((_diff("y", 0.0),), on).notes == [
        "the whole model does not run on tract (Loop is not supported): the stages were held to onnxruntime "
        "alone"
    ]
    assert (
        _report((_diff("y", 0.5),), on).output_line(0) == "y: MISMATCH (max abs diff 0.5, max rel diff 0.25)"
    )
    assert _report((_diff("y", 0.0),), None).notes == []
