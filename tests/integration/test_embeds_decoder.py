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
import onnx
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from onnx import numpy_helper
from paths import SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.core.choices import CostSource, Ends
from onnxpipe.core.iocontract import Role
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_dims
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.planning.request import DecoderOptions, PlanRequest
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


def embedding_split(models: tuple[Path, Path], out: Path, k: int, ends: Ends = Ends.FREE) -> Manifest:
    """The split of the text model with its embedding model joined ahead (``split --embedding``)."""
    plan = PlanRequest(k, decoder=DecoderOptions(ends=ends))
    profile = ProfileOptions(cost=CostSource.STATIC)
    split(models[0], SplitOptions(out=out, plan=plan, profile=profile, embedding=models[1]))
    return load_manifest(out)


@pytest.mark.parametrize(
    ("k", "ends"), [(2, Ends.FREE), pytest.param(3, Ends.OWN, marks=pytest.mark.exhaustive)]
)
def test_a_split_with_its_embedding_model_takes_token_ids_and_generates_the_whole_models_tokens(
    models: tuple[Path, Path], tmp_path: Path, k: int, ends: Ends
) -> None:
    out = tmp_path / "split"
    manifest = embedding_split(models, out, k, ends)
    assert manifest.source.embedding is not None and manifest.k == k
    assert (out / manifest.source.embedding).resolve() == models[1].resolve()
    assert Manifest.from_json(manifest.to_json()) == manifest
    io = manifest.plan.decoder.io if manifest.plan.decoder is not None else None
    assert (
        io is not None and io.named(Role.TOKEN_IDS) == ("input_ids",) and io.one(Role.INPUTS_EMBEDS) is None
    )
    first = manifest.stages[0]
    assert "input_ids" in {i.name for i in first.inputs} and manifest.worker_of(0) == 0
    where = "a stage of its own: as" if ends == Ends.OWN else "with layers 0-1: where the balance"
    assert any(f"runs in stage 0 on worker 0, {where}" in n for n in manifest.plan.notes)
    assert first.kv_layers == (() if ends == Ends.OWN else (0, 1))
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["type"] == "decoder-pipeline" and "embedding" not in config
    assert "input_ids" in config["decoder"]["pipeline"][0]["stage_0"]["inputs"]
    expected = tuple(whole_model_tokens(models, p) for p in PROMPTS)
    with Generator.open(out) as pipe:  # no embedding model given: the split holds it
        assert pipe.generate(PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens == expected
    with Generator.plain(out) as whole:  # the source and its embedding model, joined as the split was
        assert whole.generate(PROMPTS[:1], NEW_TOKENS, eos_token_ids=()).tokens == expected[:1]


def test_cli_split_with_embedding_verifies_again_and_refuses_one_that_does_not_fit(
    models: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "split"
    code, text, err = cli_run(
        ["split", models[0], "--embedding", models[1], "--stages", "2", "-o", out], capfd
    )
    assert code == 0, err
    assert "verify: 9 output(s) match the original" in text and "input_ids=1x1" in text
    code, text, err = cli_run(["plan", models[0], "--embedding", models[1], "--stages", "2"], capfd)
    assert code == 0 and "runs in stage 0 on worker 0, with layers 0-1" in text, err  # as split places it
    code, text, err = cli_run(["verify", out], capfd)  # the source joined again from the manifest
    assert code == 0 and "9 output(s) match" in text, err
    args = ["generate", out, "--prompt-ids", "3,17", "--max-new-tokens", "3"]
    code, _, err = cli_run([*args, "--embedding", models[1]], capfd)
    assert code == 2 and "takes token ids, not inputs_embeds; leave it out" in err
    wide = onnx.load(str(models[1]))
    table, name = numpy_helper.to_array(wide.graph.initializer[0]), wide.graph.initializer[0].name
    wide.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.hstack([table, table]), name))
    wide.graph.output[0].type.tensor_type.shape.dim[-1].dim_value = 64
    onnx.save(wide, str(tmp_path / "wide.onnx"))
    code, _, err = cli_run(
        ["split", models[0], "--embedding", tmp_path / "wide.onnx", "--stages", "2", "-o", tmp_path / "no"],
        capfd,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "wide.onnx: its output 'inputs_embeds' is 64 wide, but " in err
    assert f"{models[0]} takes 'inputs_embeds' 32 wide" in err


@pytest.mark.exhaustive
def test_the_builders_exclude_embeds_model_splits_with_its_embedding_model_and_generates_in_genai(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """GenAI's builder with ``exclude_embeds=true`` (GroupQueryAttention, a symbolic ``kv_cache_dim``,
    the attention mask its only integer input; ``tools/make_genai_builder_model.py``): split with no
    ``--shape`` at K=2 and K=3 (``--ends own``), the embedding model its ``genai_config.json`` names is
    joined ahead (no ``--embedding``), and the split generates from token ids the whole model's tokens,
    in onnxpipe and in ONNX Runtime GenAI on the split folder."""
    og = pytest.importorskip("onnxruntime_genai", reason="the builder is onnxruntime-genai's")
    folder = exclude_embeds_build(tmp_path / "model")
    models = (folder / "model.onnx", folder / "embedding.onnx")
    expected = tuple(whole_model_tokens(models, p, head=16) for p in PROMPTS)
    assert len({t for seq in expected for t in seq}) > 4
    eos = json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]
    for k, more, where in ((2, [], "with layers 0-1"), (3, ["--ends", "own"], "a stage of its own")):
        out = tmp_path / f"split{k}"
        code, text, err = cli_run(["split", models[0], "--stages", str(k), "-o", out, *more], capfd)
        assert code == 0, err
        assert "past_key_values.0.key=1x2x255x16" in text and "input_ids=1x1" in text
        assert f"the embedding model embedding.onnx runs in stage 0 on worker 0, {where}" in text
        assert "verify: 9 output(s) match the original" in text and "--shape" not in text
        with Generator.open(out) as pipe:
            assert pipe.generate(PROMPTS, NEW_TOKENS, eos_token_ids=()).tokens == expected
        model = og.Model(str(out))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPTS[0]) + NEW_TOKENS, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([PROMPTS[0]], dtype=np.int32))
        got: list[int] = []
        while not generator.is_done():
            generator.generate_next_token()
            got.append(int(generator.get_next_tokens()[0]))
        want = list(expected[0])
        assert got == (want[: want.index(eos) + 1] if eos in want else want)
