"""Encoder-decoders as one family: the Whisper-shaped optimum folder ``tools/export_seq2seq.py`` makes from a
tiny random-weight ``WhisperConfig`` (no download), cached between sessions."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxpipe.core.errors import UsageError
from onnxpipe.ir.seq2seq import ENCODER_OUTPUT, Seq2SeqFolder, find_seq2seq, step_decoder
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


def _step_greedy(
    model: Path, found: Seq2SeqFolder, feats: np.ndarray, max_new_tokens: int
) -> list[list[int]]:
    """Greedy tokens of the one-graph step decoder: the encoder's output and empty pasts on the first step,
    an empty encoder output and the grown caches after."""
    sess, enc = ort.InferenceSession(str(model)), ort.InferenceSession(str(found.encoder))
    names = [o.name for o in sess.get_outputs()]
    made = []
    for row in feats:
        (encoded,) = enc.run(None, {"input_features": row[None]})
        past = {
            i.name: np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
            for i in sess.get_inputs()
            if i.name.startswith("past_key_values")
        }
        tokens = [found.start_ids[-1]]
        while len(tokens) <= max_new_tokens:
            feeds = {"input_ids": np.array([[tokens[-1]]]), ENCODER_OUTPUT: encoded, **past}
            out = dict(zip(names, sess.run(None, feeds), strict=True))
            tokens.append(int(np.argmax(out["logits"][0, -1])))
            past = {n.replace("present", "past_key_values"): v for n, v in out.items() if n != "logits"}
            encoded = encoded[:, :0]
            if tokens[-1] in found.eos_ids:
                break
        made.append(tokens[1:])
    return made


def test_step_decoder_grows_the_cross_cache_once_and_reproduces_the_plain_loop(
    whisper: Path, tmp_path: Path
) -> None:
    found = find_seq2seq(whisper)
    assert found is not None and found.start_ids == (90,) and found.eos_ids == (91,)
    model = step_decoder(found)
    onnx.save(model, str(tmp_path / "step.onnx"))
    outputs = {o.name for o in model.graph.output}
    assert {"present.0.encoder.key", "present.2.decoder.value"} <= outputs
    feats = seq2seq.features(3, seed=5)
    assert _step_greedy(tmp_path / "step.onnx", found, feats, 12) == seq2seq.greedy(whisper, feats, 12)


def test_folder_without_its_encoder_is_refused_naming_it(whisper: Path, tmp_path: Path) -> None:
    for name in (seq2seq.DECODER, seq2seq.WITH_PAST, "generation_config.json"):
        shutil.copy(whisper / name, tmp_path / name)
    with pytest.raises(UsageError, match=r"no encoder_model\.onnx"):
        find_seq2seq(tmp_path)
    assert find_seq2seq(whisper.parent) is None
