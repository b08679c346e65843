"""A decoder's cache bytes per token for every layout exporters use, against the real cache arrays
onnxruntime makes (the hand-built decoders of ``tests/decoder_models.py``)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from decoder_models import HEAD_DIM, HEADS, concat_decoder

from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import kv_bytes_per_token
from onnxpipe.ir.load import view_from_proto


@pytest.mark.parametrize("symbolic_head", [False, True])
@pytest.mark.parametrize("layout", ["bnsh", "bsnh", "packed"])
def test_kv_bytes_are_the_real_cache_arrays_for_every_layout(layout: str, symbolic_head: bool) -> None:
    proto = concat_decoder(layout, symbolic_head=symbolic_head)
    view = view_from_proto(proto)
    dec = find_decoder(view)
    assert dec is not None
    batch, past, new = 3, 5, 2
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.ones((batch, new), dtype=np.int64),
        "attention_mask": np.ones((batch, past + new), dtype=np.int64),
    }
    for t in dec.past_inputs:
        shape = {"bnsh": (batch, HEADS, past, HEAD_DIM), "bsnh": (batch, past, HEADS, HEAD_DIM)}.get(
            layout, (2, batch, HEADS, past, HEAD_DIM)
        )
        feeds[t] = np.zeros(shape, dtype=np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    for pair in dec.kv:
        real = sum(out[t].nbytes for t in pair.presents)
        assert kv_bytes_per_token(view, pair, batch) * (past + new) == real
        shapes = {t: feeds[t].shape for t in pair.pasts}  # a profile's shapes settle the same
        assert kv_bytes_per_token(view, pair, batch, shapes) * (past + new) == real
