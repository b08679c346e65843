"""Text through a decoder's split: ``generate --prompt`` encodes with the model's tokenizer (found beside
the split or its source model), streams the answer as text, stops at the model's end ids by default, and
gives the tokens the same prompt gives as ids; chat templates; refusals before any work."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from cli_runner import run as cli_run
from paths import SAMPLE_MODELS
from text_models import word_tokenizer

from onnxpipe.api import GenerateOptions, SplitOptions, generate, split
from onnxpipe.core.choices import CostSource
from onnxpipe.core.errors import UsageError
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator

MODEL = SAMPLE_MODELS / "decoders" / "llama_gqa.onnx"
PROMPT = "w3 w17 w42 w9"


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The decoder with its tokenizer files beside it, as a Hugging Face or GenAI folder has them."""
    folder = tmp_path_factory.mktemp("model")
    shutil.copy(MODEL, folder / "model.onnx")
    word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def stages(model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("split") / "stages"
    profile = ProfileOptions(cost=CostSource.STATIC)
    split(
        model_folder / "model.onnx", SplitOptions(out=out, plan=PlanRequest(2), profile=profile, verify=False)
    )
    return out


def test_a_text_prompt_streams_its_answer_and_equals_the_ids_prompt(
    stages: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli_run(["generate", stages, "--prompt", PROMPT, "--max-new-tokens", "12"], capfd)
    assert code == 0, err
    lines = out.splitlines()
    assert "prompts: 1, of 5 token(s)" in lines  # the tokenizer adds its BOS
    assert any(x.startswith("stops at end id(s) 1 (from") and "tokenizer_config.json" in x for x in lines)
    at = next(i for i, x in enumerate(lines) if x.startswith("... generating"))
    streamed, listed = lines[at + 1 : at + 3]
    tokens = [int(t) for t in listed.split("new: ")[1].split()]
    code, out2, err = cli_run(
        ["generate", stages, "--prompt-ids", "0,3,17,42,9", "--eos-token-id", "1", "--max-new-tokens", "12"],
        capfd,
    )
    assert code == 0, err
    assert f"new: {' '.join(map(str, tokens))}" in out2
    words = [f"w{t}" for t in tokens if t not in (0, 1)]  # the decoder leaves special tokens out
    assert streamed == " ".join(words)


def test_the_split_carries_the_tokenizer_or_one_is_given(
    stages: Path, model_folder: Path, tmp_path: Path
) -> None:
    assert (stages / "tokenizer.json").is_file()  # the split copied its model's tokenizer files
    options = GenerateOptions(prompts=(PROMPT, "w5"), max_new_tokens=6, ignore_eos=True)
    own = generate(stages, options)
    bare = tmp_path / "deeper" / "stages"  # the source path is relative: moved, the model's folder is lost
    shutil.copytree(stages, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match=r"no tokenizer \(tokenizer\.json.*\) in .*stages.*`tokenizer`"):
        generate(bare, options)
    given = generate(bare, dataclasses.replace(options, tokenizer=model_folder))
    assert given.tokens == own.tokens and given.texts == own.texts
    assert own.texts is not None and len(own.texts) == 2
    assert all(len(t) == 6 for t in own.tokens)


def test_the_models_end_id_stops_a_sequence_by_default(
    stages: Path, model_folder: Path, tmp_path: Path
) -> None:
    free = generate(stages, GenerateOptions(prompts=(PROMPT,), max_new_tokens=10, ignore_eos=True))
    third = free.tokens[0][2]
    model = tmp_path / "model"
    shutil.copytree(model_folder, model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [third]}))
    out = tmp_path / "stages"
    profile = ProfileOptions(cost=CostSource.STATIC)
    split(model / "model.onnx", SplitOptions(out=out, plan=PlanRequest(2), profile=profile, verify=False))
    stopped = generate(out, GenerateOptions(prompts=(PROMPT,), max_new_tokens=10))
    cut = free.tokens[0].index(third) + 1
    assert stopped.tokens[0] == free.tokens[0][:cut]


def test_chat_and_system_prompts_through_the_api_and_the_pipeline(stages: Path) -> None:
    chat = GenerateOptions(prompts=("w5",), chat=True, system="w9", max_new_tokens=5, ignore_eos=True)
    result = generate(stages, chat)
    assert result.prompts == ((126, 9, 125, 5, 127),)  # [system] w9 [user] w5 [assistant], no BOS added
    with Generator.open(stages) as pipe:
        made = pipe.generate(["w5 w6"], 5, eos_token_ids=())
        by_ids = pipe.generate([(0, 5, 6)], 5, eos_token_ids=())
    assert made.tokens == by_ids.tokens and made.texts is not None and by_ids.texts is None


def test_compare_with_text_prompts_gives_the_same_tokens(stages: Path) -> None:
    result = generate(stages, GenerateOptions(prompts=(PROMPT,), max_new_tokens=6, compare=True))
    assert result.same and set(result.runs) == {"pipeline", "unsplit", "replicas"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prompt", "w3", "--prompt-ids", "3"], "--prompt and --prompt-ids: give the prompts as text or"),
        (["--prompt-ids", "3", "--chat"], "--chat wraps text prompts: give them as --prompt"),
        (["--prompt", "w3", "--system", "w9"], "--system is the chat's first message: add --chat"),
        (["--prompt-ids", "3", "--ignore-eos", "--eos-token-id", "1"], "--ignore-eos and --eos-token-id"),
        (["--prompt", "w3", "--tokenizer", "{nowhere}"], "holds no tokenizer.json; give the folder"),
        (["--prompt", "", "--tokenizer", "{tok}"], "prompt 0 (''): the tokenizer in "),
        (["--prompt", "", "--tokenizer", "{tok}"], "made no token of this text; give text it has tokens for"),
        (["--prompt", "w3", "--chat", "--tokenizer", "{plain}"], "has no chat template"),
        (["--prompt-ids", "3,200"], "prompt 0 holds id 200, beyond the model's vocabulary of 128"),
        (["--prompt", "w3 w150", "--tokenizer", "{big}"], "its tokenizer makes id 150, beyond the model's"),
        (
            ["--prompt-ids", "3,2", "--max-new-tokens", "5000"],
            "2 token(s) and --max-new-tokens 5000 need 5002",
        ),
    ],
)
def test_refusals_are_one_line_before_any_work(
    stages: Path, tmp_path: Path, args: list[str], says: str, capfd: pytest.CaptureFixture[str]
) -> None:
    folders = {
        "{nowhere}": str(tmp_path),
        "{tok}": str(word_tokenizer(tmp_path / "tok", bos=False)),
        "{plain}": str(word_tokenizer(tmp_path / "plain", chat=None)),
        "{big}": str(word_tokenizer(tmp_path / "big", words=200)),
    }
    code, out, err = cli_run(["generate", stages, *[folders.get(a, a) for a in args]], capfd)
    assert code == 2 and out == ""
    (line,) = [x for x in err.splitlines() if x.startswith("onnxpipe generate: error:")]
    assert says in line and "Traceback" not in err
    assert "generating" not in err  # refused before any worker ran


def test_the_onnx_layout_finds_the_config_and_tokenizer_one_folder_up(tmp_path: Path) -> None:
    """onnx-community's repositories: ``repo/onnx/model_q4.onnx``, with ``config.json``,
    ``generation_config.json`` and the tokenizer at ``repo/``."""
    repo = tmp_path / "repo"
    (repo / "onnx").mkdir(parents=True)
    shutil.copy(MODEL, repo / "onnx" / "model_q4.onnx")
    word_tokenizer(repo)
    config = {
        "model_type": "llama",
        "vocab_size": 128,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    (repo / "config.json").write_text(json.dumps(config))
    (repo / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    out = tmp_path / "stages"
    profile = ProfileOptions(cost=CostSource.STATIC)
    result = split(
        repo / "onnx" / "model_q4.onnx",
        SplitOptions(out=out, plan=PlanRequest(2), profile=profile, verify=False),
    )
    record = result.manifest.plan.decoder
    assert record is not None and record.model is not None
    assert record.model.eos_token_ids == (1, 7) and record.model.context_length == 256
    assert record.model.config == "config.json" and "tokenizer.json" in record.model.files
    assert any(f"from one folder up ({repo})" in n for n in result.manifest.plan.notes)
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert (genai["bos_token_id"], genai["eos_token_id"], genai["context_length"]) == (0, [1, 7], 256)
    (out / "tokenizer.json").unlink()  # the text prompt finds the tokenizer beside the source's onnx/ folder
    own = generate(out, GenerateOptions(prompts=(PROMPT,), max_new_tokens=4, ignore_eos=True))
    ids = generate(out, GenerateOptions(prompt_ids=((0, 3, 17, 42, 9),), max_new_tokens=4, ignore_eos=True))
    assert own.tokens == ids.tokens and own.texts is not None
    (repo / "tokenizer.json").unlink()
    with pytest.raises(UsageError) as refused:
        generate(out, GenerateOptions(prompts=(PROMPT,), max_new_tokens=4))
    says = str(refused.value)
    assert "no tokenizer (tokenizer.json" in says and "neither" not in says
    assert f"in {out}, {repo / 'onnx'} or {repo};" in says
