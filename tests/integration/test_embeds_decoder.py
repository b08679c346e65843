"""A text decoder that takes ``inputs_embeds`` (ONNX Runtime GenAI's ``exclude_embeds`` layout of a
vision-language model's text part, and optimum/transformers exports with ``inputs_embeds``), made by
``tools/export_decoders.py``'s :func:`exclude_embeds` from the Llama sample (its head size symbolic,
``kv_cache_dim``, as the builder writes it), with its embedding model (token ids in, ``inputs_embeds``
out): recognised as a decoder and sized from its graph with no ``--shape``, split by layers and verified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run as cli_run
from paths import SAMPLE_MODELS

from onnxpipe.core.iocontract import Role
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import decoder_dims
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from tools.export_decoders import exclude_embeds

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
