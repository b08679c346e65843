"""An encoder-decoder's split folder as ``split --force`` sees it, how its stages are dealt, and how its
generation is timed: no model is made or run (the family's real splits are in
tests/integration/test_seq2seq.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxpipe.api.seq2seq import _encoder_stages
from onnxpipe.core.errors import ExportError, UsageError
from onnxpipe.export.outdir import check_replaceable, check_target
from onnxpipe.manifest.seq2seq import STEP_FILE, Seq2SeqRecord, write_seq2seq
from onnxpipe.runtime.generation.feeds import Step
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.generation.scheduler import Run
from onnxpipe.runtime.generation.seq2seq import encoder_mask, read_inputs
from onnxpipe.runtime.kvstate import Control, Row, StepFlags


def test_the_encoder_gets_the_count_whose_largest_stage_is_smallest() -> None:
    """Whisper-large-v3's proportions at K=6 (0.64 and 0.91 GB): rounding 6 x 0.41 gives the encoder 2
    (largest stage 0.32 GB), 3 gives 0.30 GB; each part keeps one stage at least."""
    assert _encoder_stages(6, (635, 907)) == 3
    assert _encoder_stages(2, (1, 1000)) == 1 and _encoder_stages(3, (1000, 1)) == 2
    assert _encoder_stages(4, (0, 0)) == 1


def _family(out: Path, encoder: str = "encoder") -> Path:
    """A hand-made encoder-decoder split: its record, two split folders of a manifest and a stage, the
    step graph and a copied config."""
    for part in ("encoder", "decoder"):
        (out / part).mkdir(parents=True)
        (out / part / "manifest.json").write_text("{}")
        (out / part / "stage_0.onnx").write_bytes(b"")
    (out / STEP_FILE).write_bytes(b"")
    (out / "config.json").write_text("{}")
    record = Seq2SeqRecord(encoder, "decoder", ("x",), "y", (1,), (2,), "", "/src", ("config.json",))
    write_seq2seq(out, record)
    return out


def test_an_encoder_decoder_split_is_replaceable_and_nothing_else_of_the_users(tmp_path: Path) -> None:
    out = _family(tmp_path / "out")
    check_replaceable(out)
    with pytest.raises(ExportError, match=r"holds an earlier split \(config.json, decoder, "):
        check_target(out, force=False)
    (out / "decoder" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"decoder: holds notes.txt, which no split wrote"):
        check_target(out, force=True)
    (out / "decoder" / "notes.txt").unlink()
    (out / "mydata").mkdir()
    with pytest.raises(ExportError, match=r"out: holds mydata, which no split wrote"):
        check_replaceable(out)


def test_a_record_naming_a_folder_outside_its_own_makes_no_split(tmp_path: Path) -> None:
    out = _family(tmp_path / "out", encoder="../elsewhere")
    with pytest.raises(ExportError, match=r"holds no earlier split \(manifest.json\)"):
        check_replaceable(out)


def test_the_splits_generation_is_timed_from_before_its_encoding() -> None:
    """The plain loop's clock starts before its encoder: the split's decoding gets its encoding's
    seconds added, its tokens/s and first-token times counted as the plain loop's are."""
    run = Run(tokens=((1, 2),), times=((0.5, 1.5),), seconds=2.0, steps=2, batch=1, rebuilt=0)
    timed = Generation.of(run, (1.0,), None, lead=2.0)
    assert timed.seconds == 4.0 and timed.first_token_seconds == (2.5,) and timed.busy_shares == (0.25,)
    assert timed.tokens_per_second == 0.5 and timed.tokens == run.tokens and timed.token_gaps == (1.0,)


def test_an_encoders_mask_left_out_is_ones(tmp_path: Path) -> None:
    """T5's ``--inputs`` may hold ``input_ids`` alone: its ``attention_mask`` is then ones; one holding
    neither is one line naming the input it lacks."""
    names = ("input_ids", "attention_mask")
    np.savez(tmp_path / "a.npz", input_ids=np.arange(6).reshape(2, 3))
    mask = np.array([[1, 1, 0]])
    np.savez(tmp_path / "b.npz", input_ids=np.ones((1, 3), np.int64), attention_mask=mask)
    rows = read_inputs([tmp_path / "a.npz", tmp_path / "b.npz"], names)
    assert [r["attention_mask"].tolist() for r in rows] == [[[1, 1, 1]], [[1, 1, 1]], [[1, 1, 0]]]
    assert rows[1]["input_ids"].tolist() == [[3, 4, 5]]
    with pytest.raises(UsageError, match=r"holds no 'input_ids'"):
        np.savez(tmp_path / "d.npz", attention_mask=mask)
        read_inputs([tmp_path / "d.npz"], names)


def test_the_encoders_mask_is_each_sequences_own_at_every_step() -> None:
    """The mask among a sequence's encoder inputs, else ones over its encoder output's frames."""
    rows = [
        {"input_ids": np.ones((1, 3)), "attention_mask": np.array([[1, 0, 0]])},
        {"input_features": np.ones((1, 2, 4))},
    ]
    encoded = [np.zeros((1, 3, 8), np.float32), np.zeros((1, 3, 8), np.float32)]
    build = encoder_mask(rows, encoded)
    later = Control((Row(1, StepFlags.NONE, 4), Row(0, StepFlags.NONE, 2)))
    assert build(Step(((5,), (6,)), later)).tolist() == [[1, 1, 1], [1, 0, 0]]
    assert build(Step(((0,),), Control.one(0, StepFlags.START, 0))).tolist() == [[1, 0, 0]]
