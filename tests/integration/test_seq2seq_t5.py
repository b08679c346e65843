"""T5/Marian-style encoder-decoder folders: the encoder takes ``input_ids`` and ``attention_mask``, the
decoders ``encoder_attention_mask`` besides the encoder's output, at every step.  The tiny random-weight
T5 of ``tools/export_seq2seq.py`` (no download), committed in ``sample_models/seq2seq/``; the long lane
only."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from paths import SEQ2SEQ

from onnxpipe.api import SplitOptions, generate, split
from onnxpipe.core.choices import CostSource
from onnxpipe.core.iocontract import Role
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.seq2seq import ENCODER_OUTPUT, find_seq2seq, step_decoder
from onnxpipe.manifest import load_manifest
from onnxpipe.manifest.seq2seq import read_seq2seq
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import split_contract
from onnxpipe.runtime.options import GenerateOptions
from tools import export_seq2seq as seq2seq

pytestmark = pytest.mark.exhaustive

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def t5() -> Path:
    return SEQ2SEQ / seq2seq.T5_NAME


@pytest.fixture(scope="module")
def split2(t5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("t5") / "split"
    split(t5, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost=CostSource.STATIC)))
    return out


def test_its_cache_reproduces_the_whole_sequence(t5: Path) -> None:
    """The no-past decoder over the start token and the greedy tokens (the mask padding a row) picks
    those tokens again: the with-past decoder's caches, self and cross, are the ones the model makes."""
    ids = seq2seq.source_ids(2, 7, seed=4)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    enc = ort.InferenceSession(str(t5 / seq2seq.ENCODER))
    first = ort.InferenceSession(str(t5 / seq2seq.DECODER))
    for i, tokens in enumerate(seq2seq.t5_greedy(t5, ids, mask, NEW_TOKENS)):
        feeds = {"input_ids": ids[i : i + 1], "attention_mask": mask[i : i + 1]}
        (encoded,) = enc.run(None, feeds)
        whole = {"input_ids": np.array([[0, *tokens[:-1]]]), "encoder_attention_mask": mask[i : i + 1]}
        logits = first.run(["logits"], {**whole, "encoder_hidden_states": encoded})[0]
        assert np.argmax(logits[0], axis=-1).tolist() == tokens


def test_the_encoders_mask_has_a_role_of_its_own(split2: Path) -> None:
    """The step graph keeps ``encoder_attention_mask``; the contract binds it as the encoder's mask, not
    as the decoder's own attention mask, and the split records both encoder inputs."""
    record = read_seq2seq(split2)
    assert record is not None and record.encoder_inputs == ("input_ids", "attention_mask")
    assert record.start_ids == (0,) and record.eos_ids == (1,)
    contract = split_contract(load_manifest(split2 / "decoder"), split2 / "decoder")
    assert contract.one(Role.ENCODER_MASK) == "encoder_attention_mask"
    assert contract.one(Role.ENCODER_OUTPUT) == "encoder_hidden_states"
    assert contract.one(Role.ATTENTION_MASK) is None and contract.problem() is None


def test_step_graph_keeps_the_mask_and_reads_the_frames_off_the_encoders_output(t5: Path) -> None:
    """dynamo's export reads the batch and the frames of the cross cache's reshape off
    ``encoder_attention_mask``; the step graph's cross-cache nodes read them off the encoder's output
    (no frames at a later step), and the mask stays an input, fed at every step."""
    found = find_seq2seq(t5)
    assert found is not None
    step = step_decoder(found)
    assert {i.name for i in step.graph.input} >= {"encoder_attention_mask", ENCODER_OUTPUT, "input_ids"}
    cross = [n for n in step.graph.node if n.name.startswith("cross/")]
    rooted = [n for n in cross if n.op_type == "Shape" and n.input[0] == ENCODER_OUTPUT]
    assert rooted and not any("encoder_attention_mask" in n.input for n in cross)


@pytest.mark.parametrize("masked", [False, True])
def test_splits_at_2_and_generates_the_plain_loops_tokens(
    t5: Path, split2: Path, tmp_path: Path, masked: bool
) -> None:
    """``--inputs`` holding ``input_ids`` alone (the mask taken as ones) or with an ``attention_mask``
    padding a row: the split's tokens are the plain greedy loop's over the unsplit files, and
    ``--compare`` runs that loop too."""
    ids = seq2seq.source_ids(3, 7, seed=4)
    mask = None
    arrays = {"input_ids": ids}
    if masked:
        mask = np.ones_like(ids)
        mask[1, 4:] = 0
        arrays["attention_mask"] = mask
    np.savez(tmp_path / "ids.npz", **arrays)
    options = GenerateOptions(inputs=(tmp_path / "ids.npz",), max_new_tokens=NEW_TOKENS, compare=True)
    got = generate(split2, options)
    want = seq2seq.t5_greedy(t5, ids, mask, NEW_TOKENS)
    assert got.same and set(got.runs) == {"pipeline", "unsplit"}
    assert [list(t) for t in got.tokens] == want and got.prompts == ((0,),) * 3
    if masked:  # the padding changes what the padded row generates
        assert want[1] != seq2seq.t5_greedy(t5, ids[1:2], None, NEW_TOKENS)[0]


def _generates_the_plain_loops_tokens(out: Path, t5: Path, tmp_path: Path) -> None:
    """Two files of inputs of different lengths (5 and 9 tokens): each sequence's cross cache is as long
    as its own encoder output."""
    short, long = seq2seq.source_ids(2, 5, seed=9), seq2seq.source_ids(2, 9, seed=2)
    np.savez(tmp_path / "short.npz", input_ids=short)
    np.savez(tmp_path / "long.npz", input_ids=long)
    files = (tmp_path / "short.npz", tmp_path / "long.npz")
    got = generate(out, GenerateOptions(inputs=files, max_new_tokens=NEW_TOKENS, compare=True))
    want = [*seq2seq.t5_greedy(t5, short, None, NEW_TOKENS), *seq2seq.t5_greedy(t5, long, None, NEW_TOKENS)]
    assert got.same and [list(t) for t in got.tokens] == want


def test_splits_at_3_each_layers_caches_on_its_stage(t5: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    split(t5, SplitOptions(out=out, plan=PlanRequest(3), profile=ProfileOptions(cost=CostSource.STATIC)))
    encoder, decoder = load_manifest(out / "encoder"), load_manifest(out / "decoder")
    assert encoder.k + decoder.k == 3 and decoder.k == 2
    assert [layer for st in decoder.stages for layer in st.kv_layers] == [0, 1]
    _generates_the_plain_loops_tokens(out, t5, tmp_path)


def test_a_merged_decoder_folder_splits_and_generates_the_same_tokens(t5: Path, tmp_path: Path) -> None:
    """``decoder_model_merged.onnx`` in place of the two decoders: both branches take the mask."""
    folder = tmp_path / "merged"
    shutil.copytree(t5, folder)
    seq2seq.merged(folder)
    folder = seq2seq.merged_only(folder, tmp_path / "merged_only")
    found = find_seq2seq(folder)
    assert found is not None and found.merged
    out = tmp_path / "split"
    split(folder, SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost=CostSource.STATIC)))
    _generates_the_plain_loops_tokens(out, t5, tmp_path)


def test_the_cli_generates_from_input_ids_and_compares(
    t5: Path, split2: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``onnxpipe generate SPLIT --inputs FILE.npz --compare`` on the T5 split: exit 0, each sequence's
    tokens printed, the same as the plain loop's."""
    ids = seq2seq.source_ids(2, 6, seed=11)
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    args = ["generate", split2, "--inputs", tmp_path / "ids.npz", "--max-new-tokens", "6", "--compare"]
    code, printed, err = cli_run(args, capfd)
    assert code == 0, err
    for i, tokens in enumerate(seq2seq.t5_greedy(t5, ids, None, 6)):
        assert (
            f"sequence {i}: 1 prompt token(s) -> {len(tokens)} new: {' '.join(map(str, tokens))}" in printed
        )
