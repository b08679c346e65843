"""optimum's merged decoder (``decoder_model_merged.onnx``: one ``If`` on ``use_cache_branch`` between the
no-past and the with-past decoders; made by ``tools/export_decoders.py`` from two exports of the Llama
config of ``llama_gqa``) is unwrapped on load to its with-past branch: recognised as a decoder, split by
layers, generating the with-past model's greedy tokens."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from paths import SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.core.choices import CostSource
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.genai import DEFAULT_EOS
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator

MERGED = SAMPLE_MODELS / "decoders" / "llama_gqa_merged.onnx"
WITH_PAST = SAMPLE_MODELS / "decoders" / "llama_gqa.onnx"
PROMPTS = ((3, 17, 42, 9, 77, 5), (101, 2), (64,))
NEW_TOKENS = 16


@cache
def with_past_tokens(prompt: tuple[int, ...], n: int = NEW_TOKENS) -> tuple[int, ...]:
    """The unsplit with-past model's greedy tokens: one onnxruntime session, an empty past first, the
    cache fed back by hand."""
    session = ort.InferenceSession(str(WITH_PAST), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    past = {
        f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 8), np.float32)
        for i in range(4)
        for kv in ("key", "value")
    }
    step, cached, new = list(prompt), 0, []
    while len(new) < n:
        feeds = {
            "input_ids": np.array([step], dtype=np.int64),
            "attention_mask": np.ones((1, cached + len(step)), dtype=np.int64),
            "position_ids": np.arange(cached, cached + len(step), dtype=np.int64)[None],
            **past,
        }
        out = dict(zip(outputs, session.run(None, feeds), strict=True))
        new.append(int(np.argmax(out["logits"][0, -1])))
        cached += len(step)
        past = {p: out[p.replace("past_key_values", "present")] for p in past}
        step = [new[-1]]
    return tuple(new)


def test_the_file_is_optimums_merged_layout() -> None:
    """What the loader unwraps: one If on the boolean ``use_cache_branch``, weights in the outer graph."""
    proto = onnx.load(str(MERGED))
    (node,) = proto.graph.node
    assert node.op_type == "If" and list(node.input) == ["use_cache_branch"]
    assert proto.graph.input[-1].name == "use_cache_branch"
    assert all(t.name.endswith("_merged_1") for t in proto.graph.initializer)
    branches = {a.name: a.g.name for a in node.attribute}
    assert branches == {"then_branch": "with_past", "else_branch": "no_past"}


def test_loading_unwraps_the_with_past_branch_and_says_so(capfd: pytest.CaptureFixture[str]) -> None:
    view, plain = load_model(MERGED), load_model(WITH_PAST)
    assert view.rewritten and not plain.rewritten
    assert "use_cache_branch" not in view.inputs and view.inputs == plain.inputs
    assert view.outputs == plain.outputs and len(view.nodes) == len(plain.nodes)
    assert any(n.startswith("merged decoder unwrapped") and "use_cache_branch" in n for n in view.notes)
    dec, dec_plain = find_decoder(view), find_decoder(plain)
    assert dec is not None and dec_plain is not None
    assert dec.layers == 4 and dec.past_inputs == dec_plain.past_inputs
    code, out, _ = cli_run(["inspect", MERGED], capfd)
    assert code == 0
    assert "note: merged decoder unwrapped" in out and "decoder: 4 layers with a KV cache" in out
    assert "control flow: none" in out


@pytest.mark.parametrize("k", [2, 3])
def test_split_balances_its_layers_and_generates_the_with_past_models_tokens(tmp_path: Path, k: int) -> None:
    out = tmp_path / "split"
    split(
        MERGED,
        SplitOptions(
            out=out, plan=PlanRequest(k), profile=ProfileOptions(cost=CostSource.STATIC), verify=k == 2
        ),
    )
    manifest = load_manifest(out)
    assert manifest.plan.decoder is not None and manifest.plan.decoder.layers == 4
    owned = [st.kv_layers for st in manifest.stages]
    assert [layer for layers in owned for layer in layers] == [0, 1, 2, 3]
    assert max(len(layers) for layers in owned) == -(-4 // k)  # layers balanced: 2+2, or 2+1+1 / 1+2+1
    assert any("merged decoder unwrapped" in n for n in manifest.plan.notes)
    assert "use_cache_branch" not in {t.name for t in manifest.model_inputs}
    assert (out / "genai_config.json").is_file()
    with Generator.open(out) as pipe:
        got = pipe.generate(PROMPTS, NEW_TOKENS)
    assert got.tokens == tuple(with_past_tokens(p) for p in PROMPTS)
    assert len({t for seq in got.tokens for t in seq}) > 4
    if k == 2:  # the unsplit model as a plain loop (generate --compare's baseline) runs it unwrapped too
        with Generator.plain(out) as whole:
            assert whole.generate(PROMPTS[:1], NEW_TOKENS).tokens == got.tokens[:1]
    if k == 3:
        _genai_generates_the_with_past_models_tokens(out)


def _genai_generates_the_with_past_models_tokens(folder: Path) -> None:
    """ONNX Runtime GenAI on the split folder (its genai_config.json) decodes the same greedy tokens,
    up to its default end id."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    prompt = PROMPTS[0]
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    expected = with_past_tokens(prompt)
    end = expected.index(DEFAULT_EOS) + 1 if DEFAULT_EOS in expected else len(expected)
    assert tokens == list(expected[:end]) and len(tokens) > 4
