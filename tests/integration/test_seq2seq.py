"""Encoder-decoders as one family: the Whisper-shaped optimum folder ``tools/export_seq2seq.py`` makes from a
tiny random-weight ``WhisperConfig`` (no download), committed in ``sample_models/seq2seq/``.  The long lane
only: its splits and generation loops take a minute together (the fast lane is at its limit)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from paths import SEQ2SEQ

from onnxpipe.api import SplitOptions, generate, split
from onnxpipe.api.seq2seq import split_folder
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import ExportError, ModelLoadError
from onnxpipe.core.events import SILENT
from onnxpipe.core.iocontract import Role
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.options import ExportOptions
from onnxpipe.ir.decoder import find_decoder, io_contract
from onnxpipe.ir.load import load_model
from onnxpipe.ir.seq2seq import ENCODER_OUTPUT, Seq2SeqFolder, find_seq2seq, step_decoder
from onnxpipe.manifest import load_manifest
from onnxpipe.manifest.seq2seq import read_seq2seq
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.options import GenerateOptions
from tools import export_seq2seq as seq2seq

pytestmark = pytest.mark.exhaustive


@pytest.fixture(scope="module")
def whisper() -> Path:
    return SEQ2SEQ / seq2seq.NAME


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


def _signature(path: Path) -> list[tuple[str, list[int | str]]]:
    """A file's inputs and outputs: each name with its dims (a number or a symbol)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [
        (vi.name, [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim])
        for vi in [*graph.input, *graph.output]
    ]


def _settings(path: Path) -> dict[str, object]:
    settings: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    settings.pop("transformers_version", None)  # the version installed, not the model
    return settings


def test_the_exporter_writes_the_committed_folder(whisper: Path, tmp_path: Path) -> None:
    """``tools/export_seq2seq.py --out`` writes the committed folder again: the same files, settings and
    tensors in and out, and the same model (the encoder's output, the greedy tokens).  The one test that
    exports (a minute; the other tests read ``sample_models/seq2seq/``)."""
    assert seq2seq.main(["--out", str(tmp_path)]) == 0
    made = tmp_path / seq2seq.NAME
    hint = f"{whisper} is not what tools/export_seq2seq.py writes: regenerate it as its docstring says"
    assert sorted(p.name for p in made.iterdir()) == sorted(p.name for p in whisper.iterdir()), hint
    for name in ("config.json", "generation_config.json"):
        assert _settings(made / name) == _settings(whisper / name), hint
    for path in made.glob("*.onnx"):
        assert _signature(path) == _signature(whisper / path.name), hint
    feats = seq2seq.features(2, seed=11)
    encoded = [
        ort.InferenceSession(str(f / seq2seq.ENCODER)).run(None, {"input_features": feats})[0]
        for f in (made, whisper)
    ]
    np.testing.assert_allclose(*encoded, rtol=1e-5, atol=1e-6, err_msg=hint)
    assert seq2seq.greedy(made, feats, 12) == seq2seq.greedy(whisper, feats, 12), hint


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
    with pytest.raises(ModelLoadError, match=r"no encoder_model\.onnx"):
        find_seq2seq(tmp_path)
    assert find_seq2seq(whisper.parent) is None


def test_step_decoder_is_a_decoder_with_both_caches_in_its_contract(whisper: Path, tmp_path: Path) -> None:
    """Each layer has two cache pairs, its self-attention cache (``kv[layer]``) and its cross-attention
    one; the contract binds the encoder's output and the cross caches by their own roles and reads both
    pairs back."""
    found = find_seq2seq(whisper)
    assert found is not None
    view = load_model(_saved(step_decoder(found), tmp_path), check=False)
    dec = find_decoder(view)
    assert dec is not None and dec.layers == 3
    assert "; and a cross-attention cache each (an encoder-decoder's)" in dec.describe()
    assert [(p.layer, p.cross) for p in dec.kv] == [
        (0, False),
        (1, False),
        (2, False),
        (0, True),
        (1, True),
        (2, True),
    ]
    contract = io_contract(view, dec)
    assert contract.one(Role.ENCODER_OUTPUT) == ENCODER_OUTPUT
    assert contract.named(Role.CROSS_PAST_KEY)[0] == "past_key_values.0.encoder.key"
    assert contract.problem() is None and contract.kv == dec.kv
    assert contract.past_to_present()["past_key_values.2.encoder.value"] == "present.2.encoder.value"


def _saved(model: onnx.ModelProto, folder: Path) -> Path:
    onnx.save(model, str(folder / "step.onnx"))
    return folder / "step.onnx"


# ------------------------------------------------------------------------------ the family split, generating

NEW_TOKENS = 12


def _split(whisper: Path, out: Path, k: int) -> Path:
    options = SplitOptions(out=out, plan=PlanRequest(k), profile=ProfileOptions(cost=CostSource.STATIC))
    split(whisper, options)
    return out


@pytest.fixture(scope="module")
def split2(whisper: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _split(whisper, tmp_path_factory.mktemp("whisper") / "split", 2)


def _inputs(folder: Path, rows: int = 3) -> tuple[Path, np.ndarray]:
    feats = seq2seq.features(rows, seed=7)
    np.savez(folder / "feats.npz", input_features=feats)
    return folder / "feats.npz", feats


def _generates_the_plain_loops_tokens(out: Path, whisper: Path, tmp_path: Path) -> None:
    file, feats = _inputs(tmp_path)
    got = generate(out, GenerateOptions(inputs=(file,), max_new_tokens=NEW_TOKENS, compare=True))
    assert got.same and set(got.runs) == {"pipeline", "unsplit"}
    assert [list(t) for t in got.tokens] == seq2seq.greedy(whisper, feats, NEW_TOKENS)
    assert got.prompts == ((90,),) * 3


def test_folder_splits_at_2_as_one_family_and_generates_the_plain_loops_tokens(
    split2: Path, whisper: Path, tmp_path: Path
) -> None:
    """The encoder and the decoder deal the 2 stages (1 + 1 by weight bytes); each decoder layer's both
    caches on its stage, counted in its KV figure: the self cache at the context, the cross one at the
    encoder's 16 frames (4 heads of 8 float32, key and value: 256 bytes a token per layer)."""
    record = read_seq2seq(split2)
    assert record is not None and record.encoder_inputs == ("input_features",) and record.start_ids == (90,)
    encoder, decoder = load_manifest(split2 / "encoder"), load_manifest(split2 / "decoder")
    assert (encoder.k, decoder.k) == (1, 1)
    assert decoder.plan.decoder is not None
    context = decoder.plan.decoder.max_context
    assert sum(st.kv_cache_bytes for st in decoder.stages) == 3 * 256 * (context + 16)
    assert record.balance.startswith("2 stages dealt by weight bytes: the encoder")
    _generates_the_plain_loops_tokens(split2, whisper, tmp_path)


def test_folder_splits_at_3_each_layers_caches_on_its_stage(whisper: Path, tmp_path: Path) -> None:
    out = _split(whisper, tmp_path / "split", 3)
    encoder, decoder = load_manifest(out / "encoder"), load_manifest(out / "decoder")
    assert encoder.k + decoder.k == 3 and decoder.k == 2
    assert [layer for st in decoder.stages for layer in st.kv_layers] == [0, 1, 2]
    for st in decoder.stages:  # a stage takes the self and the cross pasts of its own layers only
        pasts = {t.name for t in st.inputs if t.name.startswith("past_key_values.")}
        assert pasts == {
            f"past_key_values.{i}.{a}.{k}"
            for i in st.kv_layers
            for a in ("decoder", "encoder")
            for k in ("key", "value")
        }
    _generates_the_plain_loops_tokens(out, whisper, tmp_path)


@pytest.mark.parametrize("merged", [False, True])
def test_a_torchscript_export_splits_and_generates_the_same_tokens(
    whisper: Path, tmp_path: Path, merged: bool
) -> None:
    """optimum's exporter (TorchScript) reshapes the cross cache with ``Shape`` of the decoder's own
    hidden states, leading back to the token ids: the step graph reads that batch off the encoder's
    output instead, and the split generates the dynamo export's tokens (the same weights).  The merged
    file's with-past branch declares its empty cross outputs' shapes ([0]), as a shape-inferred file
    does: the step graph, which makes them anew, drops those."""
    folder = SEQ2SEQ / seq2seq.folder_name(dynamo=False)
    if merged:
        folder = seq2seq.merged_only(folder, tmp_path / "merged")
        proto = onnx.load(str(folder / seq2seq.MERGED))
        branch = next(a.g for a in proto.graph.node[0].attribute if a.name == "then_branch")  # with past
        empty = [o.name for o in proto.graph.output if ".encoder." in o.name]
        branch.value_info.extend(
            onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [0]) for n in empty
        )
        onnx.save(proto, str(folder / seq2seq.MERGED))
    found = find_seq2seq(folder)
    assert found is not None and found.merged == merged
    step = step_decoder(found)
    rooted = [n for n in step.graph.node if n.op_type == "Shape" and n.name.startswith("cross/")]
    assert rooted and all(n.input[0] == ENCODER_OUTPUT for n in rooted)
    out = _split(folder, tmp_path / "split", 2)
    file, feats = _inputs(tmp_path)
    got = generate(out, GenerateOptions(inputs=(file,), max_new_tokens=NEW_TOKENS, compare=True))
    assert got.same and [list(t) for t in got.tokens] == seq2seq.greedy(whisper, feats, NEW_TOKENS)


def test_a_merged_decoder_file_alone_is_pointed_at_its_folder(
    whisper: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """One ``If`` no cut divides: the message says to split the folder as one family (exit 5)."""
    code, _, err = cli_run(
        ["split", whisper / seq2seq.MERGED, "--stages", "2", "--out", tmp_path / "m"], capfd
    )
    assert code == 5 and f"(an encoder-decoder's merged decoder: split its folder {whisper})" in err


def test_bad_folder_and_inputs_are_one_line_errors(
    whisper: Path, split2: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "no_encoder"
    folder.mkdir()
    for name in (seq2seq.DECODER, seq2seq.WITH_PAST):
        shutil.copy(whisper / name, folder / name)
    code, _, err = cli_run(["split", folder, "--stages", "2", "--out", tmp_path / "out"], capfd)
    assert code == 3 and "no encoder_model.onnx" in err and len(err.strip().splitlines()) == 1
    np.savez(tmp_path / "bad.npz", mel=seq2seq.features(1))
    code, _, err = cli_run(["generate", split2, "--inputs", tmp_path / "bad.npz"], capfd)
    assert code == 2 and "holds no 'input_features', the encoder's input (it holds mel)" in err
    assert "Traceback" not in err
    file, _ = _inputs(tmp_path, rows=1)
    code, _, err = cli_run(["generate", split2, "--inputs", file, "--do-sample"], capfd)
    assert code == 2 and "--do-sample: an encoder-decoder split generates greedily" in err
    code, _, err = cli_run(["generate", split2, "--prompt-ids", "1,2"], capfd)
    assert code == 2 and "generates from its encoder's inputs (--inputs), not from prompts" in err
    code, _, err = cli_run(["inspect", split2], capfd)
    assert code == 7 and "is an encoder-decoder's split: give its encoder/ or decoder/ folder" in err
    code, _, err = cli_run(["split", whisper, "--stages", "2", "--out", split2], capfd)
    assert code == 6 and "holds an earlier split (config.json, decoder, decoder_step_model.onnx and" in err
    assert "pass --force to replace it" in err
    np.save(tmp_path / "feats.npy", seq2seq.features(1))
    code, _, err = cli_run(["generate", split2, "--inputs", tmp_path / "feats.npy"], capfd)
    assert code == 2 and "feats.npy: not a .npz; save the encoder's inputs by name" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    args = ["split", whisper, "--stages", "2", "--out", tmp_path / "shaped", "--shape", "mel=1,2"]
    code, _, err = cli_run(args, capfd)
    assert code == 2 and "--shape mel" in err and "names no input of the encoder (input_features)" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "shaped").exists()


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_force_never_removes_what_the_user_had(
    whisper: Path,
    split2: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--force`` replaces an earlier encoder-decoder split only: one holding a file no split wrote, or
    run from inside it (``--out .``), is refused in one line (exit 6) with every file left; a failure
    half-way leaves the earlier split as it was and no temporary folder."""
    earlier = tmp_path / "earlier"
    shutil.copytree(split2, earlier)
    (earlier / "notes.txt").write_text("mine")
    (earlier / "mydata").mkdir()
    before = _listing(earlier)
    code, _, err = cli_run(["split", whisper, "--stages", "2", "--out", earlier, "--force"], capfd)
    assert code == 6 and "holds mydata, notes.txt, which no split wrote" in err
    assert len(err.strip().splitlines()) == 1 and _listing(earlier) == before
    (earlier / "notes.txt").unlink()
    (earlier / "mydata").rmdir()
    monkeypatch.chdir(earlier)
    code, _, err = cli_run(["split", whisper, "--stages", "2", "--out", ".", "--force"], capfd)
    assert code == 6 and "is the current folder; --force would delete it" in err
    assert read_seq2seq(earlier) is not None
    monkeypatch.chdir(tmp_path)
    before = _listing(earlier)

    def failing(model: Path, options: SplitOptions, listener: object = None) -> object:
        if model.name == seq2seq.ENCODER:
            return split(model, options)
        raise ExportError(f"{model}: failed on purpose")

    options = SplitOptions(out=earlier, plan=PlanRequest(2), profile=ProfileOptions(cost=CostSource.STATIC))
    with pytest.raises(ExportError, match="failed on purpose"):
        split_folder(whisper, dataclasses.replace(options, export=ExportOptions(force=True)), SILENT, failing)
    assert _listing(earlier) == before and sorted(p.name for p in tmp_path.iterdir()) == ["earlier"]
    with pytest.raises(ExportError, match="failed on purpose"):
        split_folder(whisper, dataclasses.replace(options, out=tmp_path / "new"), SILENT, failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier"]


def test_force_replaces_an_earlier_split_carrying_the_users_template(
    whisper: Path, split2: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    earlier = tmp_path / "earlier"
    shutil.copytree(split2, earlier)
    (earlier / "decoder" / "chat_template.jinja").write_text("{{ messages }}")
    code, printed, err = cli_run(
        [
            "split",
            whisper,
            "--stages",
            "3",
            "--out",
            earlier,
            "--force",
            "--cost",
            "static",
            "--shape",
            "input_features=3,8,32",
        ],
        capfd,
    )
    assert code == 0, err
    assert (earlier / "decoder" / "chat_template.jinja").read_text() == "{{ messages }}"
    assert load_manifest(earlier / "encoder").k + load_manifest(earlier / "decoder").k == 3
    record = read_seq2seq(earlier)
    assert record is not None and set(record.files) == {"config.json", "generation_config.json"}
    assert "wrote 3 stages (1 in encoder/, 2 in decoder/, the decoder's shown)" in printed
    shapes = load_manifest(earlier / "encoder").plan.profiled_input_shapes  # --shape goes to its part
    assert tuple(shapes["input_features"]) == (3, 8, 32)


def test_end_ids_settled_once_for_the_split_and_the_plain_loop(
    whisper: Path, split2: Path, tmp_path: Path
) -> None:
    """``--eos-token-id`` stops both generators at the ids given; ``--ignore-eos`` at none."""
    file, feats = _inputs(tmp_path, rows=2)
    greedy = seq2seq.greedy(whisper, feats, NEW_TOKENS)
    stop = greedy[0][2]
    got = generate(
        split2,
        GenerateOptions(inputs=(file,), max_new_tokens=NEW_TOKENS, compare=True, eos_token_ids=(stop,)),
    )
    assert got.same and list(got.tokens[0]) == greedy[0][: greedy[0].index(stop) + 1]
    got = generate(
        split2, GenerateOptions(inputs=(file,), max_new_tokens=NEW_TOKENS, compare=True, ignore_eos=True)
    )
    assert got.same and [len(t) for t in got.tokens] == [NEW_TOKENS, NEW_TOKENS]
    assert got.runs["pipeline"].seconds > 0 and got.runs["unsplit"].seconds > 0


def test_a_folder_with_a_tokenizer_prints_its_text(
    whisper: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A ``tokenizer.json`` beside the files (a word per id here) goes with the split; ``generate
    --inputs`` prints each sequence's text, the tokenizer's decoding of its new tokens."""
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path / "whisper"
    shutil.copytree(whisper, folder)
    vocab = {f"w{i}": i for i in range(int(seq2seq.CONFIG["vocab_size"]))}
    model = tokenizers.models.WordLevel(vocab, unk_token="w0")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    tokenizer.save(str(folder / "tokenizer.json"))
    out = _split(folder, tmp_path / "split", 2)
    file, feats = _inputs(tmp_path, rows=2)
    code, printed, err = cli_run(["generate", out, "--inputs", file, "--max-new-tokens", "6"], capfd)
    assert code == 0, err
    for i, tokens in enumerate(seq2seq.greedy(whisper, feats, 6)):
        assert f"sequence {i}: {tokenizer.decode(tokens)}\n" in printed
        assert (
            f"sequence {i}: 1 prompt token(s) -> {len(tokens)} new: {' '.join(map(str, tokens))}" in printed
        )
    other = tmp_path / "other"  # --tokenizer is used over the split's own
    other.mkdir()
    renamed = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({f"v{i}": i for i in vocab.values()}, unk_token="v0")
    )
    renamed.decoder = tokenizers.decoders.WordPiece()
    renamed.save(str(other / "tokenizer.json"))
    args = ["generate", out, "--inputs", file, "--max-new-tokens", "6", "--tokenizer", other]
    code, printed, err = cli_run(args, capfd)
    assert code == 0, err
    assert f"sequence 0: {renamed.decode(seq2seq.greedy(whisper, feats, 6)[0])}\n" in printed


def test_a_merged_decoder_folder_splits_and_generates_the_same_tokens(whisper: Path, tmp_path: Path) -> None:
    """``decoder_model_merged.onnx`` in place of the two decoders (its with-past branch gives the cross
    cache as empty tensors): each branch taken as its decoder, the same step graph, the same tokens;
    ``--compare`` runs the merged file itself as the plain loop."""
    folder = seq2seq.merged_only(whisper, tmp_path / "merged")
    found = find_seq2seq(folder)
    assert found is not None and found.merged and not (folder / seq2seq.DECODER).exists()
    out = _split(folder, tmp_path / "split", 2)
    file, feats = _inputs(tmp_path)
    got = generate(out, GenerateOptions(inputs=(file,), max_new_tokens=NEW_TOKENS, compare=True))
    assert got.same and [list(t) for t in got.tokens] == seq2seq.greedy(whisper, feats, NEW_TOKENS)


def test_weights_in_external_data_are_counted_and_a_large_step_graph_saved_beside_its_data(
    whisper: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An encoder whose weights are external data weighs what it holds (its file alone is a few KiB);
    a step graph over protobuf's limit (here made 0) is saved with its weights in
    ``decoder_step_model.onnx.data``, and the split still generates the plain loop's tokens."""
    folder = tmp_path / "external"
    shutil.copytree(whisper, folder)
    encoder = onnx.load(str(folder / seq2seq.ENCODER))
    onnx.save(encoder, str(folder / seq2seq.ENCODER), save_as_external_data=True)
    monkeypatch.setattr("onnxpipe.api.seq2seq.PROTOBUF_LIMIT", 0)
    out = _split(folder, tmp_path / "split", 2)
    plain = read_seq2seq(_split(whisper, tmp_path / "plain", 2))
    record = read_seq2seq(out)
    assert record is not None and plain is not None and record.balance == plain.balance
    assert (out / "decoder_step_model.onnx.data").stat().st_size > (
        out / "decoder_step_model.onnx"
    ).stat().st_size
    _generates_the_plain_loops_tokens(out, whisper, tmp_path)
