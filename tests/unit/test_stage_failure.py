"""A stage that fails says which micro-batch, where, and what it was fed, whatever its inputs are."""

from __future__ import annotations

import numpy as np

from onnxpipe.runtime.session import describe_failure
from onnxpipe.runtime.spec import WorkerSpec


def test_a_failure_on_a_sequence_input_names_its_type() -> None:
    """An ONNX sequence (a list), a map or an absent optional (None) is named by its type, not taken for
    an array (whose dtype and shape it has not)."""
    spec = WorkerSpec(1, "stage 1", "stage_1.onnx", ("s", "i"), ("s", "i"), ("y",), ("y",))
    feeds = {"s": [np.zeros(2, np.float32)], "i": np.array(5), "o": None}
    text = describe_failure(spec, 7, feeds, RuntimeError("index out of range"))  # type: ignore[arg-type]
    assert text == (
        "stage 1 failed on micro-batch 7: index out of range [inputs: s list, i int64[], o NoneType]"
    )
