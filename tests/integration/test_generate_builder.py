"""Generation through the split of a model made by ONNX Runtime GenAI's own builder (GroupQueryAttention,
which reads each sequence's length off the mask): sequences batched with their caches padded at the end
give the tokens each gives alone; text in and out through the tokenizer the builder wrote beside it,
stopping at the end id of its genai_config.json."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from onnxpipe.api import GenerateOptions, SplitOptions, generate, split
from onnxpipe.core.choices import CostSource
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.kvstate import PadSide

PROMPTS = ((3, 17, 42, 9, 77, 5), (101, 2), (64,), (7, 7, 19, 120, 33), (11, 12, 13))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stages(genai_builder: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = genai_builder("llama", "fp32")
    out = tmp_path_factory.mktemp("split") / "stages"
    profile = ProfileOptions(cost=CostSource.STATIC)
    split(model / "model.onnx", SplitOptions(out=out, plan=PlanRequest(2), profile=profile, verify=False))
    return out


def test_batched_steps_pad_at_the_end_and_give_each_sequences_tokens(stages: Path) -> None:
    with Generator.open(stages) as pipe:
        batching = pipe.batching(GenerateOptions(PROMPTS))
        assert batching.side == PadSide.RIGHT and batching.size == 3
        alone = pipe.generate(PROMPTS, 16, eos_token_ids=(), batch=1)
        batched = pipe.generate(PROMPTS, 16, eos_token_ids=())
        three = pipe.generate(PROMPTS, 16, eos_token_ids=(), batch=3, in_flight=4)
    assert batched.tokens == alone.tokens == three.tokens
    assert batched.steps < alone.steps
    assert len({t for seq in alone.tokens for t in seq}) > 4  # not one token repeated


class Lines:
    """A listener that keeps the lines said before the work."""

    progress = False

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    def step(self, what: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass


def test_text_through_the_builders_tokenizer_stops_at_its_end_id(stages: Path) -> None:
    said = Lines()
    made = generate(stages, GenerateOptions(prompts=("w3 w4 w5", "w9"), max_new_tokens=12), listener=said)
    (stops,) = [x for x in said.lines if x.startswith("stops at")]
    assert (
        stops
        == "stops at end id(s) 1 (from genai_config.json, as the split recorded it), else after 12 new tokens"
    )
    free = generate(stages, GenerateOptions(prompts=("w3 w4 w5", "w9"), max_new_tokens=12, ignore_eos=True))
    assert made.texts is not None and free.texts is not None
    for stopped, whole in zip(made.tokens, free.tokens, strict=True):
        cut = whole.index(1) + 1 if 1 in whole else len(whole)  # the builder's eos_token_id is 1
        assert stopped == whole[:cut]
