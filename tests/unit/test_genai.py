"""Unit tests of the ``genai_config.json`` writer (:mod:`onnxpipe.export.genai`): reading ``--genai-config``
and its one-line errors, the cache names as ``%d`` templates, the dims read off a decoder's graph, session
options from devices, and the document written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import SAMPLE_MODELS

from onnxpipe.cli import main
from onnxpipe.cluster.model import Device
from onnxpipe.core.choices import Runtime
from onnxpipe.core.errors import UsageError
from onnxpipe.core.kv import KVPair
from onnxpipe.core.model_config import ModelDims, SourceConfig, SourceKind, TokenIds, read_source_config
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.export.genai import (
    DEFAULT_SEARCH,
    ConfigDims,
    GenAIConfig,
    PipelineModel,
    ProviderOptions,
    SessionOptions,
    TensorNames,
    Unsupported,
    check_source_fits,
    layer_template,
    model_facts,
    session_options_of,
    tensor_names,
)
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import DecoderDims
from onnxpipe.ir.load import load_model

DECODERS = SAMPLE_MODELS / "decoders"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a decoder config"),
        ('{"hello": 1}', "not a decoder config"),
        ('{"model": {"type": "whisper", "encoder": {}}}', "model.decoder: missing"),
        ('{"model_type": "llama", "eos_token_id": "two"}', "eos_token_id: expected a token id"),
        ('{"model_type": "llama", "num_hidden_layers": 0}', "num_hidden_layers: expected an integer >= 1"),
    ],
)
def test_a_bad_genai_config_is_one_line_naming_the_file(tmp_path: Path, text: str | None, said: str) -> None:
    path = tmp_path / "cfg.json" if text is None else _write(tmp_path, "cfg.json", text)
    with pytest.raises(UsageError) as e:
        read_source_config(path)
    message = str(e.value)
    assert message.startswith(str(path)) and said in message and "\n" not in message
    assert e.value.exit_code == 2


def test_the_cli_refuses_a_bad_genai_config_before_loading_the_model(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    bad = _write(tmp_path, "genai_config.json", "{oops")
    code = main(
        [
            "split",
            str(DECODERS / "llama_gqa.onnx"),
            "--stages",
            "2",
            "--out",
            str(tmp_path / "o"),
            "--genai-config",
            str(bad),
        ]
    )
    err = capfd.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and str(bad) in err and "not valid JSON" in err
    assert not (tmp_path / "o").exists()


def test_a_hugging_face_config_gives_tokens_heads_and_context(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "config.json",
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 4,
                "n_head": 4,
                "n_embd": 32,
                "vocab_size": 128,
                "n_positions": 1024,
                "bos_token_id": 0,
                "eos_token_id": [1, 5],
                "pad_token_id": None,
            }
        ),
    )
    source = read_source_config(path)
    assert source.kind == SourceKind.HF
    dims = source.dims
    assert (dims.layers, dims.attention_heads, dims.kv_heads, dims.head_size) == (4, 4, 4, 8)
    assert (dims.hidden_size, dims.vocab_size, source.context_length) == (32, 128, 1024)
    assert source.tokens == TokenIds(
        bos=0, eos=(1, 5), pad=1
    )  # no pad: the first eos, as GenAI's builder does


def test_a_genai_config_is_kept_whole(tmp_path: Path) -> None:
    doc = {
        "model": {
            "decoder": {"head_size": 8, "num_key_value_heads": 2},
            "eos_token_id": 3,
            "vocab_size": 128,
        },
        "search": {"top_k": 5},
    }
    source = read_source_config(_write(tmp_path, "genai_config.json", json.dumps(doc)))
    assert source.kind == SourceKind.GENAI
    dims = source.dims
    assert (dims.head_size, dims.kv_heads, dims.vocab_size, dims.layers) == (8, 2, 128, None)
    assert source.tokens == TokenIds(bos=3, eos=(3,), pad=3)
    assert source.document == doc


@pytest.mark.parametrize(
    ("names", "template"),
    [
        ([f"past_key_values.{i}.key" for i in range(12)], "past_key_values.%d.key"),
        ([f"present_{i}_k" for i in range(3)], "present_%d_k"),
        ([f"l0.past.{i}.key" for i in range(3)], "l0.past.%d.key"),  # the second 0 is the layer
        (["a.0.k", "a.1.k", "a.3.k"], None),  # a layer missing
        (["x%0", "x%1"], None),  # GenAI would read the % as a format
        (["k_cache", "v_cache"], None),
    ],
)
def test_cache_names_as_layer_templates(names: list[str], template: str | None) -> None:
    assert layer_template(names) == template


def test_names_genai_cannot_express_are_unsupported() -> None:
    joint = [KVPair(i, f"past.{i}", None, f"present.{i}", None) for i in range(2)]
    found = tensor_names("input_ids", "attention_mask", None, "logits", joint)
    assert isinstance(found, Unsupported) and "one cache tensor" in found.reason
    assert isinstance(tensor_names("input_ids", None, None, None, []), Unsupported)
    pairs = [KVPair(i, f"pk{i}", f"pv{i}", f"qk{i}", f"qv{i}") for i in range(2)]
    names = tensor_names("input_ids", None, None, "logits", pairs)
    assert names == TensorNames("input_ids", None, None, "pk%d", "pv%d", "logits", "qk%d", "qv%d")
    cross = [*pairs, *(KVPair(i, f"ck{i}", f"cv{i}", f"dk{i}", f"dv{i}", cross=True) for i in range(2))]
    found = tensor_names("input_ids", None, None, "logits", cross)
    assert isinstance(found, Unsupported) and found.reason.startswith("its cross-attention cache")


@pytest.mark.parametrize(("name", "kv_heads", "positions"), [("llama_gqa", 2, None), ("gpt2", 4, 1024)])
def test_dims_come_from_the_graph(name: str, kv_heads: int, positions: int | None) -> None:
    view = load_model(DECODERS / f"{name}.onnx")
    dec = find_decoder(view)
    assert dec is not None
    facts = model_facts(view, dec)
    assert not isinstance(facts, Unsupported)
    names, dims = facts
    assert dims == DecoderDims(
        layers=4, kv_heads=kv_heads, head_size=8, vocab_size=128, hidden_size=32, position_rows=positions
    )
    assert (names.past_key, names.present_value, names.logits) == (
        "past_key_values.%d.key",
        "present.%d.value",
        "logits",
    )
    assert (names.position_ids is None) == (name == "gpt2")


def test_a_config_of_another_model_is_refused(tmp_path: Path) -> None:
    dims = DecoderDims(layers=4, kv_heads=2, head_size=8, vocab_size=128, hidden_size=32, position_rows=None)
    path = tmp_path / "config.json"
    check_source_fits(
        SourceConfig(path, SourceKind.HF, dims=ModelDims(layers=4, head_size=8)), dims
    )  # agrees
    with pytest.raises(UsageError, match=r"config.json: num_key_value_heads is 8, but the model has 2"):
        check_source_fits(SourceConfig(path, SourceKind.HF, dims=ModelDims(kv_heads=8)), dims)
    with pytest.raises(UsageError, match=r"vocab_size is 32000, but the model has 128"):
        check_source_fits(SourceConfig(path, SourceKind.GENAI, dims=ModelDims(vocab_size=32000)), dims)
    with pytest.raises(
        UsageError, match=r"config.json: eos_token_id 151645 is outside the model's vocabulary"
    ):
        check_source_fits(SourceConfig(path, SourceKind.HF, tokens=TokenIds(0, (1, 151645), 0)), dims)
    open_head = DecoderDims(
        layers=4, kv_heads=2, head_size=None, vocab_size=128, hidden_size=64, position_rows=None
    )
    check_source_fits(
        SourceConfig(path, SourceKind.GENAI, dims=ModelDims(head_size=16)), open_head
    )  # the config says it
    with pytest.raises(UsageError, match=r"head_size: missing, and the model's past tensors leave it open"):
        check_source_fits(SourceConfig(path, SourceKind.HF), open_head)


def test_session_options_from_devices() -> None:
    assert session_options_of(Device("cpu0", engine=EngineConfig(threads=3))) == SessionOptions(3)
    cuda = session_options_of(
        Device(
            "gpu",
            engine=EngineConfig(provider="CUDAExecutionProvider", provider_options=(("device_id", "1"),)),
        )
    )
    assert cuda == SessionOptions(1, (ProviderOptions("cuda", (("device_id", "1"),)),))
    vino = session_options_of(
        Device("npu", engine=EngineConfig(runtime=Runtime.OPENVINO, openvino_device="NPU"))
    )
    assert vino == SessionOptions(1, (ProviderOptions("OpenVINO", (("device_type", "NPU"),)),))
    tract = session_options_of(Device("edge", engine=EngineConfig(runtime=Runtime.TRACT)))
    assert isinstance(tract, Unsupported) and "tract" in tract.reason
    assert SessionOptions(2, (ProviderOptions("cuda", (("device_id", "0"),)),)).to_json() == {
        "log_id": "onnxruntime-genai",
        "intra_op_num_threads": 2,
        "provider_options": [{"cuda": {"device_id": "0"}}],
    }


def _config(base: dict[str, object], context: int = 512) -> GenAIConfig:
    names = TensorNames("input_ids", "attention_mask", None, "pk.%d", "pv.%d", "logits", "qk.%d", "qv.%d")
    stage = PipelineModel("stage_0", "stage_0.onnx", ("input_ids",), ("logits",), is_lm_head=True)
    return GenAIConfig(
        dims=ConfigDims(4, 2, 8, 128, None),
        names=names,
        tokens=TokenIds(1, (2, 7), 0),
        context_length=context,
        attention_heads=None,
        pipeline=(stage,),
        base=base,
    )


def test_the_document_replaces_the_decoder_and_keeps_the_rest() -> None:
    base = {
        "model": {
            "type": "llama",
            "decoder": {"filename": "model.onnx", "session_options": {"log_id": "x"}},
            "custom": 5,
        },
        "search": {"max_length": 4096, "top_p": 0.5},
        "extra": [1],
    }
    doc = _config(base).to_json()
    model, decoder = doc["model"], doc["model"]["decoder"]
    assert (model["type"], model["custom"], model["eos_token_id"], model["context_length"]) == (
        "decoder-pipeline",
        5,
        [2, 7],
        512,
    )
    assert "filename" not in decoder and "hidden_size" not in decoder and "num_attention_heads" not in decoder
    assert decoder["session_options"] == {"log_id": "x"}  # the source's own, without devices
    assert decoder["inputs"] == {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "past_key_names": "pk.%d",
        "past_value_names": "pv.%d",
    }
    assert decoder["pipeline"] == [
        {
            "stage_0": {
                "filename": "stage_0.onnx",
                "inputs": ["input_ids"],
                "outputs": ["logits"],
                "run_on_prompt": True,
                "run_on_token_gen": True,
                "is_lm_head": True,
            }
        }
    ]
    assert doc["search"] == {"max_length": 512, "top_p": 0.5}  # capped at the context
    assert doc["extra"] == [1] and base["model"]["type"] == "llama"  # the source is not changed
    derived = _config({}).to_json()
    assert derived["search"] == {**DEFAULT_SEARCH, "max_length": 512}
    assert derived["model"]["decoder"]["session_options"] == {
        "log_id": "onnxruntime-genai",
        "provider_options": [],
    }


def test_a_config_contradicts_the_graph_only_where_both_say() -> None:
    """The first size a config states that the graph shows otherwise, named by its config key; a size
    either leaves open is no contradiction."""
    graph = DecoderDims(layers=4, kv_heads=2, head_size=None, vocab_size=128)
    assert ModelDims(head_size=64, hidden_size=32).contradicted(graph) is None
    assert ModelDims(layers=4, kv_heads=8, vocab_size=7).contradicted(graph) == ("num_key_value_heads", 8, 2)
    assert ModelDims().contradicted(graph) is None
