"""Encoder-decoders as one family: the Whisper-shaped optimum folder ``tools/export_seq2seq.py`` makes from a
tiny random-weight ``WhisperConfig`` (no download), cached between sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tools import export_seq2seq as seq2seq


@pytest.fixture(scope="module")
def whisper() -> Path:
    return seq2seq.cached_export()


def test_folder_has_optimum_layout_and_its_cache_reproduces_the_whole_sequence(whisper: Path) -> None:
    """The with-past decoder's greedy tokens are the no-past decoder's over the whole sequence: the
    exported caches (self and cross) are the ones the model computes."""
    names = {p.name for p in whisper.iterdir()}
    assert {
        seq2seq.ENCODER,
        seq2seq.DECODER,
        seq2seq.WITH_PAST,
        "config.json",
        "generation_config.json",
    } <= names
    feats = seq2seq.features(2, seed=3)
    made = seq2seq.greedy(whisper, feats, max_new_tokens=6)
    enc = ort.InferenceSession(str(whisper / seq2seq.ENCODER))
    first = ort.InferenceSession(str(whisper / seq2seq.DECODER))
    start = int(seq2seq.CONFIG["decoder_start_token_id"])
    for row, tokens in zip(feats, made, strict=True):
        (encoded,) = enc.run(None, {"input_features": row[None]})
        ids = np.array([[start, *tokens[:-1]]])
        logits = first.run(["logits"], {"input_ids": ids, "encoder_hidden_states": encoded})[0]
        assert np.argmax(logits[0], axis=-1).tolist() == tokens
