"""Decoders as GenAI and Olive users have them: ONNX Runtime GenAI's model builder's int4, fp32 and fp16
CPU models of the Llama, Qwen2, Phi-3, Mistral and Gemma families (``tools/make_genai_builder_model.py``,
random weights, built once per machine into the corpus cache).

Each is recognised from its graph (``MatMulNBits``, ``GatherBlockQuantized`` of a tied 4-bit embedding,
``GroupQueryAttention`` with a head size named ``kv_cache_dim``, ``SkipSimplifiedLayerNormalization``);
split between its layers at K = 2 and 3; and the tokens of ``Generator.generate`` and of GenAI on the split
folder are those of a plain greedy onnxruntime loop over the unsplit model (no onnxpipe code in it: the
cache's head size comes from the builder's own ``genai_config.json``).  The split folder carries the
builder's config (its search options and token ids) and the tokenizer files; the KV cache is counted at
the model's own context and its bytes are those of the real cache arrays.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run

from onnxpipe.api import SplitOptions, inspect, split
from onnxpipe.api.results import ModelInspection
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import MemoryFitError
from onnxpipe.core.model_config import GENAI_CONFIG_NAME
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.genai import DEFAULT_EOS
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.decoder_dims import kv_bytes_per_token
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import decoder_limits, load_manifest
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator

BUILDS: dict[str, tuple[str, str, bool]] = {
    "llama-int4": ("llama", "int4", False),
    "qwen2-int4-tied": ("qwen2", "int4", True),
    "llama-fp32": ("llama", "fp32", False),
    "qwen2-fp32": ("qwen2", "fp32", False),
    "llama-fp32-tied": ("llama", "fp32", True),
    "phi3-int4": ("phi3", "int4", False),
    "mistral-int4": ("mistral", "int4", False),
    "gemma-int4": ("gemma", "int4", False),  # Gemma ties its embeddings itself
    "llama-fp16": ("llama", "fp16", False),
}
FAST_BUILDS = ("llama-int4", "qwen2-int4-tied")
"""The builds the fast lane tests every family-wide check on (an untied and a tied int4, the builder's
usual output); the other families and precisions run in the exhaustive lane: a cold build costs ~6 s."""


def lanes(names: Iterable[str]) -> list[Any]:
    """``names`` as parameters, those outside :data:`FAST_BUILDS` in the exhaustive lane."""
    return [n if n in FAST_BUILDS else pytest.param(n, marks=pytest.mark.exhaustive) for n in names]


RUNNABLE = [n for n in BUILDS if n != "llama-fp16"]
"""onnxruntime's CPU provider fails the builder's fp16 model past its first run (the builder makes fp16
for GPUs: "Shape mismatch attempting to re-use buffer"), so it is recognised, planned and its cache
measured on one run only."""
CONTEXT = {"qwen2": 512}
"""The families' ``max_position_embeddings`` where not 1024 (``tools/make_genai_builder_model.py``)."""
PROMPTS = ((5, 17, 3, 99, 42, 8), (101, 2, 64))
NEW_TOKENS = 16
FAST = ProfileOptions(cost=CostSource.STATIC)

Built = Callable[[str], Path]


@pytest.fixture(scope="module")
def built(genai_builder: Callable[..., Path]) -> Built:
    """``built(name)``: the builder's folder of :data:`BUILDS` ``[name]``."""
    return lambda name: genai_builder(*BUILDS[name])


def _context(name: str) -> int:
    return CONTEXT.get(BUILDS[name][0], 1024)


# ----------------------------------------------------------------------------------- the reference


def _config(folder: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((folder / GENAI_CONFIG_NAME).read_text())["model"]  # type: ignore[no-any-return]


def greedy(folder: Path, prompt: Sequence[int], n: int = NEW_TOKENS) -> list[int]:
    """The unsplit model's greedy tokens by onnxruntime alone: each step's presents fed back as pasts,
    the cache's head size (``kv_cache_dim``) from the builder's ``genai_config.json``."""
    return list(_greedy(folder, tuple(prompt), n))


@cache
def _greedy(folder: Path, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    config = _config(folder)
    decoder = config["decoder"]
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    layers = decoder["num_hidden_layers"]
    pasts = [decoder["inputs"][k] % i for i in range(layers) for k in ("past_key_names", "past_value_names")]
    presents = [
        decoder["outputs"][k] % i for i in range(layers) for k in ("present_key_names", "present_value_names")
    ]
    dtype = np.float16 if "float16" in inputs[pasts[0]].type else np.float32
    heads = decoder["num_key_value_heads"]
    cache_ = {p: np.zeros((1, heads, 0, decoder["head_size"]), dtype=dtype) for p in pasts}
    step, cached, new = list(prompt), 0, []
    while len(new) < n:
        feeds = {
            "input_ids": np.array([step], dtype=np.int64),
            "attention_mask": np.ones((1, cached + len(step)), dtype=np.int64),
            **cache_,
        }
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(cached, cached + len(step), dtype=np.int64)[None]
        out = dict(zip(names, session.run(None, feeds), strict=True))
        token = int(np.argmax(out["logits"][0, -1]))
        new.append(token)
        cached += len(step)
        step = [token]
        cache_ = {p: out[q] for p, q in zip(pasts, presents, strict=True)}
    return tuple(new)


def genai_tokens(folder: Path, prompt: Sequence[int], n: int = NEW_TOKENS) -> list[int]:
    """Greedy tokens by ONNX Runtime GenAI on ``folder`` (it stops at the config's eos, which it emits)."""
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + n, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def until(tokens: Sequence[int], eos: Sequence[int]) -> list[int]:
    """What a generator that stops at any of ``eos`` (and emits it) yields of ``tokens``."""
    out: list[int] = []
    for t in tokens:
        out.append(t)
        if t in eos:
            break
    return out


# ---------------------------------------------------------------------------------------- the tests


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    lanes(BUILDS),
)
def test_a_builder_model_is_recognised_from_its_graph(built: Built, name: str) -> None:
    """Every layer's cache pair, the token input (a ``GatherBlockQuantized`` one for the tied int4
    models), the dims GenAI sizes its buffers with and the context, whatever the family and precision."""
    found = inspect(built(name) / "model.onnx")
    assert isinstance(found, ModelInspection)
    dec, facts = found.decoder, found.facts
    assert dec is not None and facts is not None
    assert dec.layers == 4 and dec.ids_input == "input_ids" and dec.mask_input == "attention_mask"
    assert [p.past_key for p in dec.kv] == [f"past_key_values.{i}.key" for i in range(4)]
    dims = facts.dims
    assert (dims.attention_heads, dims.kv_heads, dims.head_size) == (
        4 if name != "llama-fp16" else None,
        2,
        16,
    )
    assert (dims.vocab_size, dims.hidden_size) == (160, 64)
    assert facts.context is not None and facts.context.tokens == _context(name)
    assert facts.config.config is not None and facts.config.config.tokens is not None
    assert facts.config.config.tokens.eos == (1,)


@pytest.mark.slow
def test_inspect_prints_the_int4_qwen2s_decoder_line(built: Built, capfd: pytest.CaptureFixture[str]) -> None:
    """The model of the issue: the builder's int4 Qwen2 with tied embeddings."""
    code, out, _ = cli_run(["inspect", built("qwen2-int4-tied") / "model.onnx"], capfd)
    assert code == 0
    assert "decoder: 4 layers with a KV cache" in out
    assert "model: vocabulary 160, context 512 (genai_config.json), heads 4, KV heads 2, head size 16" in out


@pytest.mark.slow
@pytest.mark.parametrize("name", lanes(BUILDS))
def test_kv_bytes_are_the_real_cache_arrays(built: Built, name: str) -> None:
    """A prompt of T tokens for 2 sequences: each layer's presents hold exactly T times the bytes a
    token adds (read off the graph alone: the head size the builder names ``kv_cache_dim`` comes from its
    attention node or the ``Concat`` that grows the cache)."""
    folder = built(name)
    view = load_model(folder / "model.onnx")
    dec = find_decoder(view)
    assert dec is not None
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    tokens, batch = 7, 2
    dtype = np.float16 if "float16" in inputs[dec.kv[0].past_key].type else np.float32
    feeds = {
        "input_ids": np.arange(tokens * batch, dtype=np.int64).reshape(batch, tokens),
        "attention_mask": np.ones((batch, tokens), dtype=np.int64),
        **{t: np.zeros((batch, 2, 0, 16), dtype=dtype) for t in dec.past_inputs},
    }
    if "position_ids" in inputs:
        feeds["position_ids"] = np.tile(np.arange(tokens, dtype=np.int64), (batch, 1))
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, feeds), strict=True))
    for pair in dec.kv:
        real = sum(out[t].nbytes for t in pair.presents)
        assert kv_bytes_per_token(view, pair, batch) * tokens == real
    assert kv_bytes_per_token(view, dec.kv[0]) == 2 * 2 * 16 * np.dtype(dtype).itemsize  # K and V, 2 heads


def _split(model: Path, out: Path, k: int, **decoder: int) -> Path:
    options = DecoderOptions(**decoder) if decoder else DecoderOptions()
    split(model, SplitOptions(out=out, plan=PlanRequest(k, decoder=options), profile=FAST, verify=False))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, pytest.param(3, marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("name", lanes(RUNNABLE))
def test_a_builder_split_keeps_each_layers_cache_and_generates_the_unsplit_tokens(
    built: Built, name: str, k: int, tmp_path: Path
) -> None:
    folder = built(name)
    out = _split(folder / "model.onnx", tmp_path / "split", k)
    manifest = load_manifest(out)
    record = manifest.plan.decoder
    assert record is not None and record.io is not None
    # each layer's cache in one stage, the stage that holds it alone taking its pasts and making its presents
    assert [layer for st in manifest.stages for layer in st.kv_layers] == [0, 1, 2, 3]
    # (the tied table's layout, K + 1 stages on K workers, may leave the embedding a stage of its own)
    assert all(st.kv_layers for st in manifest.stages if st.index > 0 or manifest.plan.workers is None)
    for st in manifest.stages:
        ins, outs = {i.name for i in st.inputs}, {o.name for o in st.outputs}
        for pair in record.io.kv:
            assert set(pair.pasts) <= ins if pair.layer in st.kv_layers else not set(pair.pasts) & ins
            assert set(pair.presents) <= outs if pair.layer in st.kv_layers else not set(pair.presents) & outs
    # the cache counted at the model's own context: K and V of 2 heads of 16 floats a token, each layer
    assert record.max_context == _context(name)
    assert [st.kv_cache_bytes for st in manifest.stages] == [
        len(st.kv_layers) * 2 * 2 * 16 * 4 * _context(name) for st in manifest.stages
    ]
    want = [greedy(folder, p) for p in PROMPTS]
    with Generator.open(out) as pipe:
        got = pipe.generate(PROMPTS, NEW_TOKENS)
    assert [list(t) for t in got.tokens] == want
    assert len({t for seq in want for t in seq}) > 2  # random weights that do not repeat one token only
    eos = _config(folder)["eos_token_id"]
    assert genai_tokens(out, PROMPTS[0]) == until(want[0], eos if isinstance(eos, list) else [eos])


@pytest.mark.slow
def test_the_split_folder_carries_the_builders_config_and_tokenizer(
    built: Built, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The int4 Qwen2: ``onnxpipe generate`` on its split gives the unsplit model's tokens; its
    ``genai_config.json`` is the builder's (search options, token ids, context) with the pipeline for a
    decoder; its tokenizer and chat template are copied; the manifest says what a generator checks
    before work (:func:`decoder_limits`)."""
    folder = built("qwen2-int4-tied")
    out = _split(folder / "model.onnx", tmp_path / "split", 3)
    ids = ",".join(map(str, PROMPTS[0]))
    code, said, _ = cli_run(["generate", out, "--prompt-ids", ids, "--max-new-tokens", NEW_TOKENS], capfd)
    assert code == 0
    line = next(x for x in said.splitlines() if x.startswith("sequence 0:"))
    assert [int(t) for t in line.split("new:")[1].split()] == greedy(folder, PROMPTS[0])
    builder = json.loads((folder / GENAI_CONFIG_NAME).read_text())
    written = json.loads((out / GENAI_CONFIG_NAME).read_text())
    assert written["search"] == builder["search"]  # past_present_share_buffer and all, as the builder wrote
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "context_length", "vocab_size"):
        assert written["model"][key] == builder["model"][key], key
    assert written["model"]["decoder"]["head_size"] == builder["model"]["decoder"]["head_size"] == 16
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    tokenizers = pytest.importorskip("tokenizers")
    assert tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).encode("w5 w17 </s>").ids == [5, 17, 1]
    limits = decoder_limits(out)
    assert (limits.vocab_size, limits.context, limits.eos_ids) == (160, 512, (1,))
    assert (limits.bos_id, limits.pad_id, limits.tokenizer_dir) == (0, 1, out)
    assert limits.chat_template == (folder / "chat_template.jinja").read_text()
    model = load_manifest(out).plan.decoder.model  # type: ignore[union-attr]
    assert model is not None and model.config == GENAI_CONFIG_NAME
    assert model.files == ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    notes = load_manifest(out).plan.notes
    assert any("token ids from genai_config.json" in n for n in notes)
    assert not any("default token ids" in n for n in notes)
    # a --max-context below the model's own counts
    small = _split(folder / "model.onnx", tmp_path / "small", 2, max_context=256)
    assert decoder_limits(small).context == 256
    assert json.loads((small / GENAI_CONFIG_NAME).read_text())["model"]["context_length"] == 256


@pytest.mark.slow
def test_a_builder_model_without_its_config_gets_one_from_the_graph(built: Built, tmp_path: Path) -> None:
    """The fp32 Llama with tied embeddings, alone in a folder: the head size comes from its
    GroupQueryAttention (``num_heads`` 4, ``kv_num_heads`` 2) and the 128-wide q/k/v projection, the
    context from the rotary table; no token ids are guessed for a generator (GenAI's config gets the
    documented defaults, and says so)."""
    folder = built("llama-fp32-tied")
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(folder / name, bare / name)
    out = _split(bare / "model.onnx", tmp_path / "split", 2)
    decoder = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["decoder"]
    assert (decoder["head_size"], decoder["num_key_value_heads"], decoder["num_attention_heads"]) == (
        16,
        2,
        4,
    )
    assert decoder["hidden_size"] == 64
    limits = decoder_limits(out)
    assert (limits.vocab_size, limits.context, limits.eos_ids) == (160, 1024, ())
    assert (limits.tokenizer_dir, limits.chat_template) == (None, None)
    assert any("default token ids" in n for n in load_manifest(out).plan.notes)
    assert genai_tokens(out, PROMPTS[0]) == until(greedy(folder, PROMPTS[0]), (DEFAULT_EOS,))


def _devices(tmp_path: Path, memory: int) -> Path:
    device = {"provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": memory}
    path = tmp_path / "devices.json"
    path.write_text(
        json.dumps(
            {
                "devices": [{"name": "a", **device}, {"name": "b", **device}],
                "links": [{"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5}],
            }
        )
    )
    return path


@pytest.mark.slow
def test_the_devices_memory_holds_the_cache_at_the_models_context(built: Built, tmp_path: Path) -> None:
    """Two devices of 1.5 MiB: the int4 Qwen2's cache at its 512 positions (512 KiB in all) fits; counted
    at 4096 (4 MiB) it would not."""
    from onnxpipe.api import PlanOptions, plan

    cluster = load_cluster(_devices(tmp_path, 3 * 2**19))
    model = built("qwen2-int4-tied") / "model.onnx"
    result = plan(model, PlanOptions(plan=PlanRequest(2, devices=cluster), profile=FAST))
    assert sum(st.kv_cache_bytes for st in result.plan.stages) == 4 * 256 * 512
    assert any(
        "512 tokens of context (the model's own, from genai_config.json" in n for n in result.plan.notes
    )
    with pytest.raises(MemoryFitError, match="memory"):  # less than a stage's cache at 512 tokens
        plan(
            model,
            PlanOptions(
                plan=PlanRequest(2, devices=load_cluster(_devices(tmp_path, 200 * 2**10))), profile=FAST
            ),
        )
