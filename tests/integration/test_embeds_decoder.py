"""A text decoder that takes ``inputs_embeds`` (ONNX Runtime GenAI's ``exclude_embeds`` layout of a
vision-language model's text part, and optimum/transformers exports with ``inputs_embeds``), made by
``tools/export_decoders.py``'s :func:`exclude_embeds` from the Llama sample (its head size symbolic,
``kv_cache_dim``, as the builder writes it), with its embedding model (token ids in, ``inputs_embeds``
out): recognised as a decoder and sized from its graph with no ``--shape``, split by layers and verified,
and generating from token ids, through the embedding model (``--embedding`` or the one a
``genai_config.json`` names), the whole model's greedy tokens; the same for the builder's own
``exclude_embeds`` model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from paths import SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.core.choices import CostSource
from onnxpipe.core.iocontract import Role
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_dims
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator
from tools.export_decoders import exclude_embeds
from tools.make_genai_builder_model import exclude_embeds_build

TOKEN_MODEL = SAMPLE_MODELS / "decoders" / "llama_gqa.onnx"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the decoder taking ``inputs_embeds``, its embedding model)."""
    return exclude_embeds(TOKEN_MODEL, tmp_path_factory.mktemp("embeds"))


def test_recognised_and_sized_from_the_graph(
    models: tuple[Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    view = load_model(models[0])
    assert "input_ids" not in view.inputs and view.tensor("past_key_values.0.key").shape[-1] == "kv_cache_dim"
    dec = find_decoder(view)
    assert dec is not None and dec.layers == 4
    assert dec.tokens == Role.INPUTS_EMBEDS and dec.ids_input == "inputs_embeds" and not dec.embedding_nodes
    dims = decoder_dims(view, dec)
    assert (dims.kv_heads, dims.head_size, dims.hidden_size, dims.vocab_size) == (2, 8, 32, 128)
    code, out, _ = cli_run(["inspect", models[0]], capfd)
    assert code == 0
    assert "decoder: 4 layers with a KV cache" in out and "takes inputs_embeds" in out
    assert "KV heads 2, head size 8" in out


def test_split_with_no_shape_runs_its_stages_and_verifies(
    models: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "split"
    code, text, err = cli_run(["split", models[0], "--stages", "2", "-o", out], capfd)
    assert code == 0, err
    assert "verify: 9 output(s) match the original" in text
    assert "past_key_values.0.key=1x2x255x8" in text and "--shape" not in text
    manifest = load_manifest(out)
    assert [st.kv_layers for st in manifest.stages] == [(0, 1), (2, 3)]
    io = manifest.plan.decoder.io if manifest.plan.decoder is not None else None
    assert io is not None and io.problem() is None
    assert io.named(Role.INPUTS_EMBEDS) == ("inputs_embeds",) and io.one(Role.TOKEN_IDS) is None
    written = json.loads((out / "manifest.json").read_text())
    assert {"tensor": "inputs_embeds", "role": "inputs_embeds"} in written["plan"]["decoder"]["io"]["inputs"]
    assert not (out / "genai_config.json").exists()
    assert "the model takes 'inputs_embeds'" in text


PROMPTS = ((3, 17, 42, 9, 77, 5), (101, 2), (64,))
NEW_TOKENS = 12


def whole_model_tokens(models: tuple[Path, Path], prompt: tuple[int, ...], head: int = 8) -> tuple[int, ...]:
    """The whole model's greedy tokens as a plain loop: the embedding model, then the unsplit decoder on
    its embeddings (4 layers, 2 KV heads of ``head``), the cache fed back by hand."""
    decoder = ort.InferenceSession(str(models[0]), providers=["CPUExecutionProvider"])
    embedding = ort.InferenceSession(str(models[1]), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in decoder.get_outputs()]
    takes = {i.name for i in decoder.get_inputs()}
    past = {
        f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, head), np.float32)
        for i in range(4)
        for kv in ("key", "value")
    }
    step, cached, new = list(prompt), 0, []
    while len(new) < NEW_TOKENS:
        (embeds,) = embedding.run(None, {"input_ids": np.array([step], dtype=np.int64)})
        feeds = {
            "inputs_embeds": embeds,
            "attention_mask": np.ones((1, cached + len(step)), dtype=np.int64),
            "position_ids": np.arange(cached, cached + len(step), dtype=np.int64)[None],
            **past,
        }
        out = dict(
            zip(outputs, decoder.run(None, {k: v for k, v in feeds.items() if k in takes}), strict=True)
        )
        new.append(int(np.argmax(out["logits"][0, -1])))
        cached += len(step)
        past = {p: out[p.replace("past_key_values", "present")] for p in past}
        step = [new[-1]]
    return tuple(new)


@pytest.fixture(scope="module")
def split_folder(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embeds_split") / "split"
    split(
        models[0], SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost=CostSource.STATIC))
    )
    return out


def test_generates_the_whole_models_tokens_through_its_embedding_model(
    models: tuple[Path, Path], split_folder: Path
) -> None:
    expected = tuple(whole_model_tokens(models, p) for p in PROMPTS)
    assert len({t for seq in expected for t in seq}) > 4  # a random model that says more than one token
    with Generator.open(split_folder, embedding=models[1]) as pipe:
        assert pipe.generate(PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens == expected
    with Generator.plain(split_folder, embedding=models[1]) as whole:
        assert whole.generate(PROMPTS[:1], NEW_TOKENS, eos_token_ids=()).tokens == expected[:1]


def test_the_embedding_model_a_genai_config_names_is_used(
    models: tuple[Path, Path], split_folder: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "split"
    shutil.copytree(split_folder, folder)
    shutil.copy(models[1], folder / "text_embedding.onnx")
    section = {"filename": "text_embedding.onnx", "inputs": {"input_ids": "input_ids"}}
    (folder / "genai_config.json").write_text(json.dumps({"model": {"embedding": section}}))
    with Generator.open(folder) as pipe:
        got = pipe.generate(PROMPTS[:1], NEW_TOKENS, eos_token_ids=()).tokens
    assert got == (whole_model_tokens(models, PROMPTS[0]),)


def test_cli_generate_with_embedding_compares_and_refuses_without_one(
    models: tuple[Path, Path], split_folder: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", split_folder, "--prompt-ids", "3,17,42", "--max-new-tokens", "6", "--ignore-eos"]
    code, out, err = cli_run([*args, "--embedding", models[1], "--compare"], capfd)
    assert code == 0, err
    assert " ".join(map(str, whole_model_tokens(models, (3, 17, 42))[:6])) in out
    code, _, err = cli_run(args, capfd)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "the model takes 'inputs_embeds'" in err and "--embedding FILE.onnx" in err
    code, _, err = cli_run([*args, "--embedding", SAMPLE_MODELS / "decoders" / "llama_gqa.onnx"], capfd)
    assert code == 2 and "an embedding model takes the token ids" in err


@pytest.mark.exhaustive
def test_the_builders_exclude_embeds_model_splits_and_generates_through_its_embedding_model(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """GenAI's builder with ``exclude_embeds=true`` (GroupQueryAttention, a symbolic ``kv_cache_dim``,
    the attention mask its only integer input; ``tools/make_genai_builder_model.py``): split with no
    ``--shape``, it generates from token ids, through the embedding model its ``genai_config.json``
    names, the whole model's tokens."""
    pytest.importorskip("onnxruntime_genai", reason="the builder is onnxruntime-genai's")
    folder = exclude_embeds_build(tmp_path / "model")
    models = (folder / "model.onnx", folder / "embedding.onnx")
    out = tmp_path / "split"
    code, text, err = cli_run(["split", models[0], "--stages", "2", "-o", out], capfd)
    assert code == 0, err
    assert "past_key_values.0.key=1x2x255x16" in text and "takes inputs_embeds" in text
    assert "verify: 9 output(s) match the original" in text and "--shape" not in text
    expected = tuple(whole_model_tokens(models, p, head=16) for p in PROMPTS)
    assert len({t for seq in expected for t in seq}) > 4
    with Generator.open(out) as pipe:  # the embedding model named in the source folder's genai_config.json
        assert pipe.generate(PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens == expected
