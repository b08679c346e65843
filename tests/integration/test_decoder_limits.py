"""What a generator checks before any work, read back from a split folder (:func:`decoder_limits`), for
decoders with and without a config of their own, and for a folder that holds no decoder.  (The builder's
models, with a config and a tokenizer beside them: ``test_builder_decoders.py``.)"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from paths import SAMPLE_MODELS

from onnxpipe.api import ExportOptions, SplitOptions, split
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.manifest import MANIFEST_NAME, decoder_limits, load_manifest, write_manifest
from onnxpipe.planning.request import DEFAULT_MAX_CONTEXT, PlanRequest

DECODERS = SAMPLE_MODELS / "decoders"
FAST = ProfileOptions(cost=CostSource.STATIC)


def _split(model: Path, out: Path, config: Path | None = None) -> Path:
    export = ExportOptions(genai_config=config)
    split(model, SplitOptions(out=out, plan=PlanRequest(2), profile=FAST, verify=False, export=export))
    return out


def test_a_decoder_without_a_config_says_no_token_ids(tmp_path: Path) -> None:
    """GPT-2 alone: its position table bounds the context; no id is guessed for a generator."""
    limits = decoder_limits(_split(DECODERS / "gpt2.onnx", tmp_path / "gpt2"))
    assert (limits.vocab_size, limits.context, limits.eos_ids) == (128, 1024, ())
    assert (limits.tokenizer_dir, limits.chat_template, limits.bos_id) == (None, None, None)
    limits = decoder_limits(_split(DECODERS / "llama_gqa.onnx", tmp_path / "llama"))
    assert (limits.vocab_size, limits.context) == (128, DEFAULT_MAX_CONTEXT)  # nothing bounds its context


def test_a_config_beside_the_model_gives_its_ids_context_and_tokenizer(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(DECODERS / "qwen2.onnx", folder / "model.onnx")
    hf = {"model_type": "qwen2", "vocab_size": 128, "num_hidden_layers": 4, "max_position_embeddings": 300}
    (folder / "config.json").write_text(json.dumps(hf | {"eos_token_id": 7}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "notes.txt").write_text("not the model's")
    out = _split(folder / "model.onnx", tmp_path / "split")
    limits = decoder_limits(out)
    assert (limits.vocab_size, limits.context, limits.eos_ids, limits.bos_id) == (128, 300, (7, 9), 7)
    assert (limits.tokenizer_dir, limits.chat_template) == (out, "{{ messages }}")
    assert not (out / "notes.txt").exists()
    model = load_manifest(out).plan.decoder.model  # type: ignore[union-attr]
    assert (
        model is not None and model.config == "config.json" and model.chat_template == "tokenizer_config.json"
    )
    assert set(model.files) == {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "config.json",
    }
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert (genai["eos_token_id"], genai["context_length"]) == ([7, 9], 300)
    # the split's own files: --force replaces the folder
    split(
        folder / "model.onnx",
        SplitOptions(
            out=out, plan=PlanRequest(3), profile=FAST, verify=False, export=ExportOptions(force=True)
        ),
    )
    assert len(load_manifest(out).stages) == 3


def test_a_named_config_without_ids_is_said_so(tmp_path: Path) -> None:
    """``--genai-config`` with a Hugging Face config that states no eos: the note says the defaults were
    written because it states none (not that a config should be given)."""
    config = tmp_path / "cfg" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 128, "num_hidden_layers": 4}))
    out = _split(DECODERS / "llama_gqa.onnx", tmp_path / "split", config)
    notes = [n for n in load_manifest(out).plan.notes if n.startswith("genai_config.json")]
    assert len(notes) == 1 and "config.json states none" in notes[0] and "give" not in notes[0]
    assert decoder_limits(out).eos_ids == ()


def test_limits_of_an_older_split_and_of_a_model_that_is_no_decoder(tmp_path: Path) -> None:
    out = _split(DECODERS / "llama_gqa.onnx", tmp_path / "old")
    manifest = load_manifest(out)
    assert manifest.plan.decoder is not None
    older = dataclasses.replace(
        manifest,
        plan=dataclasses.replace(
            manifest.plan, decoder=dataclasses.replace(manifest.plan.decoder, model=None)
        ),
    )
    write_manifest(out / MANIFEST_NAME, older)
    limits = decoder_limits(out)
    assert (limits.vocab_size, limits.context, limits.eos_ids) == (None, DEFAULT_MAX_CONTEXT, ())
    plain = _split(SAMPLE_MODELS / "mlp.onnx", tmp_path / "mlp")
    with pytest.raises(UsageError, match=r"mlp: was not split as a decoder LLM with a KV cache"):
        decoder_limits(plain)
