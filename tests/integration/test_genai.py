"""ONNX Runtime GenAI runs a decoder's split folder as a ``decoder-pipeline`` (the ``genai_config.json``
``split`` writes) and generates exactly the unsplit model's greedy tokens.

The reference tokens come from a plain onnxruntime greedy loop over the source model (each step's
presents fed back as the next step's pasts); GenAI is given only the split folder.  Splits use static
costs and skip verification: where the cuts fall does not matter here, only that GenAI runs the stages.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from paths import DEVICES, SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.choices import Ends
from onnxpipe.core.model_config import GENAI_CONFIG_NAME
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.genai import DEFAULT_EOS
from onnxpipe.export.options import ExportOptions
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.request import PlanRequest

og = pytest.importorskip(
    "onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install '.[genai]')"
)

DECODERS = SAMPLE_MODELS / "decoders"
PROMPT = (5, 17, 3, 99, 42, 8)
NEW_TOKENS = 24
FAST = partial(SplitOptions, profile=ProfileOptions(cost="static"), verify=False)


def _model(name: str) -> Path:
    return DECODERS / f"{name}.onnx"


@functools.cache
def _reference(name: str) -> tuple[int, ...]:
    """The source model's greedy tokens after :data:`PROMPT`, by onnxruntime alone."""
    session = ort.InferenceSession(str(_model(name)), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    pasts = [n for n in inputs if n.startswith("past_key_values.")]
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.array([PROMPT], dtype=np.int64),
        "attention_mask": np.ones((1, len(PROMPT)), dtype=np.int64),
    }
    if "position_ids" in inputs:
        feeds["position_ids"] = np.arange(len(PROMPT), dtype=np.int64)[None]
    for p in pasts:
        dims = [d if isinstance(d, int) else 0 for d in inputs[p].shape[1:]]
        feeds[p] = np.zeros([1, *dims], dtype=np.float32)
    tokens: list[int] = []
    for _ in range(NEW_TOKENS):
        out = dict(zip(outputs, session.run(None, feeds), strict=True))
        token = int(np.argmax(out["logits"][0, -1]))
        tokens.append(token)
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {
            "input_ids": np.array([[token]], dtype=np.int64),
            "attention_mask": np.ones((1, total), dtype=np.int64),
            **{p: out[p.replace("past_key_values.", "present.")] for p in pasts},
        }
        if "position_ids" in inputs:
            feeds["position_ids"] = np.array([[total - 1]], dtype=np.int64)
    return tuple(tokens)


def _generate(folder: Path) -> list[int]:
    """Greedy tokens after :data:`PROMPT` by ONNX Runtime GenAI on the split folder (stops at its eos)."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + NEW_TOKENS, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT], dtype=np.int32))
    tokens: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def _until(tokens: tuple[int, ...], eos: int) -> list[int]:
    """What a generator that stops at ``eos`` (and emits it) yields of ``tokens``."""
    return list(tokens[: tokens.index(eos) + 1]) if eos in tokens else list(tokens)


CASES = [
    pytest.param(name, k, marks=() if k == 2 else pytest.mark.exhaustive)
    for name in ("llama_gqa", "qwen2", "gpt2")
    for k in (2, 3)
] + [("llama_gqa_builder", 3)]


@pytest.mark.parametrize(("name", "k"), CASES)
def test_genai_generates_the_unsplit_models_tokens(name: str, k: int, tmp_path: Path) -> None:
    out = tmp_path / "split"
    result = split(_model(name), FAST(out=out, plan=PlanRequest(k)))
    config = json.loads((out / GENAI_CONFIG_NAME).read_text())
    model = config["model"]
    decoder = model["decoder"]
    assert model["type"] == "decoder-pipeline"
    # the dims GenAI sizes its buffers with, as tools/export_decoders.py configured the model
    assert (decoder["num_hidden_layers"], decoder["head_size"], model["vocab_size"]) == (4, 8, 128)
    assert decoder["num_key_value_heads"] == (4 if name == "gpt2" else 2)
    assert (decoder["hidden_size"], decoder["num_attention_heads"]) == (32, 4)
    assert ("position_ids" in decoder["inputs"]) == (name != "gpt2")
    # GPT-2's position table (1024 rows) bounds the context below the plan's 4096
    assert model["context_length"] == (1024 if name == "gpt2" else result.manifest.plan.decoder.max_context)
    stages = [next(iter(p.values())) for p in decoder["pipeline"]]
    assert [s["filename"] for s in stages] == [s.file for s in result.manifest.stages]
    assert not any(s["is_lm_head"] for s in stages)  # the head shares its stage with layers
    assert all(s["run_on_prompt"] and s["run_on_token_gen"] for s in stages)
    expected = _until(_reference(name), DEFAULT_EOS)
    assert len(expected) > 4  # the comparison says something
    assert _generate(out) == expected


def test_an_interleaved_split_is_a_chain_to_genai(tmp_path: Path) -> None:
    """Four stages dealt to two workers (``--workers 2``) cut between layers: GenAI runs them in order."""
    out = tmp_path / "split"
    result = split(_model("llama_gqa"), FAST(out=out, plan=PlanRequest(4, workers=2)))
    assert result.manifest.plan.workers == 2
    assert _generate(out) == _until(_reference("llama_gqa"), DEFAULT_EOS)


def test_a_head_of_its_own_is_the_lm_head_stage(tmp_path: Path) -> None:
    """``--ends own``: the last stage holds only the LM head (``is_lm_head``), the first only the embedding
    (it takes other layers' pasts for their shape, which GenAI feeds as it feeds any managed input)."""
    out = tmp_path / "split"
    request = PlanRequest(3, decoder=DecoderOptions(ends=Ends.OWN))
    result = split(_model("llama_gqa"), FAST(out=out, plan=request))
    assert result.manifest.stages[-1].kv_layers == ()
    config = json.loads((out / GENAI_CONFIG_NAME).read_text())
    flags = [next(iter(p.values()))["is_lm_head"] for p in config["model"]["decoder"]["pipeline"]]
    assert flags == [False, False, True]
    assert _generate(out) == _until(_reference("llama_gqa"), DEFAULT_EOS)


def test_a_models_own_config_gives_its_token_ids_and_keeps_its_search(tmp_path: Path) -> None:
    """``--genai-config config.json`` (Hugging Face's): its eos id is GenAI's; a GenAI config's search
    options and extra keys stay, its single-file decoder becomes the pipeline."""
    reference = _reference("qwen2")
    eos = next(t for t in reference[4:] if t not in reference[:4])  # a token first generated 5th or later
    hf = tmp_path / "config.json"
    hf.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "vocab_size": 128,
                "hidden_size": 32,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 512,
                "bos_token_id": 0,
                "eos_token_id": eos,
            }
        )
    )
    out = tmp_path / "split"
    split(
        _model("qwen2"),
        SplitOptions(
            out=out,
            plan=PlanRequest(2),
            profile=FAST.keywords["profile"],
            verify=False,
            export=ExportOptions(genai_config=hf),
        ),
    )
    config = json.loads((out / GENAI_CONFIG_NAME).read_text())
    assert (config["model"]["eos_token_id"], config["model"]["pad_token_id"]) == (eos, eos)
    assert config["model"]["context_length"] == 512
    assert _generate(out) == _until(reference, eos)

    genai = tmp_path / "genai_config.json"
    genai.write_text(
        json.dumps(
            {
                "model": {
                    "bos_token_id": 0,
                    "context_length": 300,
                    "decoder": {"filename": "model.onnx", "head_size": 8, "num_hidden_layers": 4},
                    "eos_token_id": [eos, 127],
                    "pad_token_id": 0,
                    "type": "qwen2",
                    "vocab_size": 128,
                },
                "search": {"max_length": 2000, "top_k": 1, "repetition_penalty": 1.0},
            }
        )
    )
    out2 = tmp_path / "split2"
    split(
        _model("qwen2"),
        SplitOptions(
            out=out2,
            plan=PlanRequest(3),
            profile=FAST.keywords["profile"],
            verify=False,
            export=ExportOptions(genai_config=genai),
        ),
    )
    config = json.loads((out2 / GENAI_CONFIG_NAME).read_text())
    assert config["model"]["eos_token_id"] == [eos, 127]
    assert "filename" not in config["model"]["decoder"]
    assert config["search"] == {"max_length": 300, "top_k": 1, "repetition_penalty": 1.0}
    assert _generate(out2) == _until(reference, eos)


def test_session_options_come_from_the_devices(tmp_path: Path) -> None:
    """Planned for two CPU devices of 4 threads each: each stage's session says so, and GenAI runs it;
    for a CPU and a CUDA device the CUDA stage names GenAI's ``cuda`` provider with its options, and the
    cache stays on the CPU, where both stages can read it (not run: no CUDA here)."""
    out = tmp_path / "cpus"
    split(
        _model("gpt2"),
        FAST(out=out, plan=PlanRequest(2, devices=load_cluster(DEVICES / "two_cpus.json"))),
    )
    decoder = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["decoder"]
    options = [next(iter(p.values()))["session_options"] for p in decoder["pipeline"]]
    assert [o["intra_op_num_threads"] for o in options] == [4, 4]
    assert all(o["provider_options"] == [] for o in options)
    assert _generate(out) == _until(_reference("gpt2"), DEFAULT_EOS)

    out = tmp_path / "gpu"
    split(
        _model("gpt2"),
        FAST(out=out, plan=PlanRequest(2, devices=load_cluster(DEVICES / "cpu_gpu.json"))),
    )
    decoder = json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["decoder"]
    options = [next(iter(p.values()))["session_options"] for p in decoder["pipeline"]]
    assert options[0]["provider_options"] == []
    assert options[1]["provider_options"] == [
        {"cuda": {"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}}
    ]
    assert decoder["session_options"]["provider_options"] == []


def test_no_config_for_a_model_that_is_not_a_decoder(tmp_path: Path) -> None:
    out = tmp_path / "split"
    result = split(SAMPLE_MODELS / "resnet_tiny.onnx", FAST(out=out, plan=PlanRequest(2)))
    assert not (out / GENAI_CONFIG_NAME).exists()
    assert not any(GENAI_CONFIG_NAME in n for n in result.manifest.plan.notes)


def test_the_cli_takes_a_config_and_never_deletes_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "eos_token_id": 1}))
    out = tmp_path / "stages"
    args = ["split", _model("llama_gqa"), "--stages", "2", "--out", out, "--cost", "static", "--no-verify"]
    code, stdout, _ = cli_run([*args, "--genai-config", hf], capfd)
    assert code == 0 and "genai_config.json: an ONNX Runtime GenAI decoder-pipeline of 2 stages" in stdout
    assert json.loads((out / GENAI_CONFIG_NAME).read_text())["model"]["eos_token_id"] == 1
    # the written config given back for a --force split into the same folder: it would be deleted
    code, _, err = cli_run([*args, "--force", "--genai-config", out / GENAI_CONFIG_NAME], capfd)
    assert code == 6 and "(--genai-config), which the split would replace" in err
    assert (out / GENAI_CONFIG_NAME).is_file()


@pytest.fixture(scope="module")
def builder_model(genai_builder: Callable[..., Path]) -> Path:
    """A decoder made by GenAI's own model builder (``tools/make_genai_builder_model.py``, offline, built
    once per machine into the corpus cache)."""
    return genai_builder("llama", "fp32")


@pytest.mark.slow
def test_a_genai_builder_model_splits_and_generates_as_it_does_whole(
    builder_model: Path, tmp_path: Path
) -> None:
    """The format GenAI users have (GroupQueryAttention, external weights, a shared past/present buffer, a
    head size named ``kv_cache_dim``): split with its own ``genai_config.json`` at K = 2 and 3, verified,
    and GenAI generates from the stages what it generates from the builder's folder; and without the
    option, from the builder's config beside the model all the same."""
    whole = _generate(builder_model)
    assert len(whole) == NEW_TOKENS
    source = json.loads((builder_model / GENAI_CONFIG_NAME).read_text())
    assert source["search"]["past_present_share_buffer"] is True
    past = {"past_key_values.0.key": (1, 2, 255, 16)}  # kv_cache_dim: the graph does not say it
    for k in (2, 3):
        out = tmp_path / f"k{k}"
        options = partial(
            SplitOptions,
            profile=ProfileOptions(cost="static", shapes=past),
            export=ExportOptions(genai_config=builder_model / GENAI_CONFIG_NAME),
        )
        result = split(builder_model / "model.onnx", options(out=out, plan=PlanRequest(k)))
        assert result.report is not None and result.report.ok
        config = json.loads((out / GENAI_CONFIG_NAME).read_text())
        assert config["search"] == source["search"]  # kept as the builder wrote it
        assert config["model"]["decoder"]["head_size"] == 16
        assert _generate(out) == whole
    # without the option the builder's config beside the model is read all the same (its search and
    # sizes); a model alone in its folder: tests/integration/test_builder_decoders.py
    split(builder_model / "model.onnx", FAST(out=tmp_path / "bare", plan=PlanRequest(2)))
    config = json.loads((tmp_path / "bare" / GENAI_CONFIG_NAME).read_text())
    assert config["search"] == source["search"]
    decoder = config["model"]["decoder"]
    assert (decoder["head_size"], decoder["num_key_value_heads"], decoder["num_attention_heads"]) == (
        16,
        2,
        4,
    )
    assert config["model"]["context_length"] == 1024
    assert _generate(tmp_path / "bare") == whole


@pytest.mark.slow
def test_a_genai_builder_model_splits_with_no_hints_and_generates_through_the_pipeline(
    builder_model: Path, tmp_path: Path
) -> None:
    """The default split (measured costs at both phases) needs no ``--shape``: the head size the builder
    leaves symbolic (``kv_cache_dim``) is read off its GroupQueryAttention; ``Generator.generate`` then
    gives the tokens GenAI gives on the builder's own folder (until GenAI's eos)."""
    from onnxpipe.runtime.generation.generator import Generator

    out = tmp_path / "default"
    result = split(
        builder_model / "model.onnx",
        SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(runs=2, warmup=1)),
    )
    assert result.report is not None and result.report.ok
    eos = json.loads((builder_model / GENAI_CONFIG_NAME).read_text())["model"]["eos_token_id"]
    eos_ids = eos if isinstance(eos, list) else [eos]
    with Generator.open(out) as pipe:
        got = pipe.generate([list(PROMPT)], NEW_TOKENS, eos_token_ids=eos_ids)
    assert list(got.tokens[0]) == _generate(builder_model)


def _generate_batch(folder: Path, prompts: list[tuple[int, ...]], n: int = 16) -> list[list[int]]:
    """Greedy tokens of several prompts at once, left-padded with the pad id (GenAI masks it)."""
    model = og.Model(str(folder))
    longest = max(len(p) for p in prompts)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=longest + n, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    pad = json.loads((folder / GENAI_CONFIG_NAME).read_text())["model"]["pad_token_id"]
    generator.append_tokens(np.array([[pad] * (longest - len(p)) + list(p) for p in prompts], dtype=np.int32))
    tokens: list[list[int]] = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in zip(tokens, generator.get_next_tokens(), strict=True):
            row.append(int(token))
    return tokens


def test_a_padded_batch_generates_as_the_whole_model_does_in_genai(tmp_path: Path) -> None:
    """Two prompts of different lengths at once (GenAI pads, masks and positions them): the stages give
    the tokens GenAI gives on the unsplit model (a one-file config made from the split's)."""
    out = tmp_path / "split"
    split(_model("llama_gqa"), FAST(out=out, plan=PlanRequest(3)))
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "model.onnx").write_bytes(_model("llama_gqa").read_bytes())
    config = json.loads((out / GENAI_CONFIG_NAME).read_text())
    del config["model"]["decoder"]["pipeline"]
    config["model"]["decoder"]["filename"] = "model.onnx"
    config["model"]["type"] = "llama"
    (whole / GENAI_CONFIG_NAME).write_text(json.dumps(config))
    prompts = [PROMPT, (7, 9, 11)]
    expected = _generate_batch(whole, prompts)
    assert expected[0] == list(_reference("llama_gqa")[:16])  # GenAI on the whole model: the plain loop's
    assert expected[0] != expected[1]
    assert _generate_batch(out, prompts) == expected
