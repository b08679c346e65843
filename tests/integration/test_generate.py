"""Generation through a decoder's split (``Generator.generate``, ``onnxpipe generate``): each worker keeps
its own layers' KV cache, and the tokens equal the unsplit model's greedy tokens computed here by a plain
onnxruntime loop that feeds the presents back as pasts (no onnxpipe code in the reference)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from functools import cache, partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from cli_runner import run as cli_run
from manifest_edits import sealed
from paths import SAMPLE_MODELS

from onnxpipe.api import GenerateOptions, SplitOptions, generate, split
from onnxpipe.core.choices import CostSource, Ends
from onnxpipe.core.errors import CacheLost, UsageError
from onnxpipe.core.iocontract import Binding, Role
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.request import DecoderOptions, PlanRequest
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.runtime.generation.scheduler import draw, generator
from onnxpipe.runtime.options import Sampling
from onnxpipe.verification.verify import source_model_path

DECODERS = SAMPLE_MODELS / "decoders"
MODELS = ("llama_gqa", "qwen2", "gpt2", "llama_gqa_builder")
NEW_TOKENS = 32
PROMPTS = ((3, 17, 42, 9, 77, 5), (101, 2), (64,), (7, 7, 19, 120, 33))


@cache
def reference(
    name: str, prompt: tuple[int, ...], n: int = NEW_TOKENS, sampling: Sampling | None = None, index: int = 0
) -> tuple[int, ...]:
    """The unsplit model's greedy tokens: one onnxruntime session, the cache fed back by hand; with
    ``sampling``, each token drawn with the generator of prompt ``index`` instead."""
    rng = generator(sampling, index) if sampling is not None else None
    path = DECODERS / f"{name}.onnx"
    dec = find_decoder(load_model(path))
    assert dec is not None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    cache_ = {
        t: np.zeros(
            [
                1 if i == 0 else (0 if isinstance(d, str) or d is None else d)
                for i, d in enumerate(inputs[t].shape)
            ],
            dtype=np.float32,
        )
        for t in dec.past_inputs
    }
    tokens = list(prompt)
    new: list[int] = []
    cached = 0
    step = list(prompt)
    while len(new) < n:
        feeds = {
            dec.ids_input: np.array([step], dtype=np.int64),
            "attention_mask": np.ones((1, cached + len(step)), dtype=np.int64),
            **cache_,
        }
        if dec.positions_input:
            feeds[dec.positions_input] = np.arange(cached, cached + len(step), dtype=np.int64)[None]
        out = dict(zip(outputs, session.run(None, feeds), strict=True))
        last = out["logits"][0, -1]
        token = int(np.argmax(last)) if sampling is None or rng is None else draw(sampling, last, rng)
        cached += len(step)
        cache_ = {p: out[q] for p, q in zip(dec.past_inputs, dec.present_outputs, strict=True)}
        new.append(token)
        tokens.append(token)
        step = [token]
    return tuple(new)


Splits = Callable[..., Path]


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> Splits:
    """``splits(name, k, ends)``: a split folder of the tools-made decoder ``name``, made once per module
    (cut by static costs: where the cuts fall does not matter to what the stages compute)."""
    made: dict[tuple[str, int, Ends], Path] = {}

    def get(name: str, k: int, ends: Ends = Ends.FREE) -> Path:
        if (name, k, ends) not in made:
            out = tmp_path_factory.mktemp(f"{name}-{k}-{ends.value}") / "out"
            options = partial(SplitOptions, profile=ProfileOptions(cost=CostSource.STATIC), verify=False)
            split(
                DECODERS / f"{name}.onnx",
                options(out=out, plan=PlanRequest(k, decoder=DecoderOptions(ends=ends))),
            )
            made[(name, k, ends)] = out
        return made[(name, k, ends)]

    return get


@pytest.mark.parametrize(
    "k", [2, pytest.param(3, marks=pytest.mark.exhaustive), pytest.param(4, marks=pytest.mark.exhaustive)]
)
@pytest.mark.parametrize("name", MODELS)
def test_generate_gives_the_unsplit_models_tokens(splits: Splits, name: str, k: int) -> None:
    folder = splits(name, k)
    manifest = load_manifest(folder)
    io = manifest.plan.decoder.io if manifest.plan.decoder else None
    assert io is not None and len(io.kv) == 4
    with Generator.open(folder) as pipe:
        one = pipe.generate([PROMPTS[0]], NEW_TOKENS)
        several = pipe.generate(PROMPTS, NEW_TOKENS, batch=1)  # four sequences in flight through k stages
        batched = pipe.generate(PROMPTS, NEW_TOKENS, batch=None if name == "gpt2" else 2)
        # each worker's caches were dropped at each sequence's last step
        assert all(not r.kv.caches for r, _ in pipe.steps.backend._stages)  # type: ignore[attr-defined]
    assert one.tokens == (reference(name, PROMPTS[0]),)
    assert several.tokens == tuple(reference(name, p) for p in PROMPTS)
    assert several.steps == len(PROMPTS) * NEW_TOKENS
    # two sequences a decode step (gpt2 takes no positions: a step each), the same tokens
    assert batched.tokens == several.tokens
    assert batched.batch == (1 if name == "gpt2" else 2)
    assert batched.steps == several.steps if name == "gpt2" else batched.steps < several.steps
    # random weights that do not just repeat one token (a tiny model often repeats within one sequence)
    assert len({t for seq in several.tokens for t in seq}) > 4


SAMPLING = Sampling(temperature=0.8, top_k=50, top_p=0.95, seed=7)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_sampled_generation_gives_the_unsplit_models_tokens(splits: Splits, name: str) -> None:
    """Sampling is seeded per sequence: through 3 stages, with every prompt in flight or one at a time,
    the tokens are those the unsplit model draws with the same generators."""
    n = 24
    want = tuple(reference(name, p, n, SAMPLING, i) for i, p in enumerate(PROMPTS))
    with Generator.open(splits(name, 3)) as pipe:
        together = pipe.generate(PROMPTS, n, sampling=SAMPLING)
        one_by_one = pipe.generate(PROMPTS, n, in_flight=1, sampling=SAMPLING)
    assert together.tokens == want and one_by_one.tokens == want
    assert want != tuple(reference(name, p, n) for p in PROMPTS)  # sampled, not greedy


def test_the_cache_never_crosses_a_link(splits: Splits) -> None:
    """A generating worker receives and sends no past or present tensor: the cache is its own."""
    folder = splits("llama_gqa", 3)
    manifest = load_manifest(folder)
    assert manifest.plan.decoder is not None and manifest.plan.decoder.io is not None
    cache_names = {t for r in manifest.plan.decoder.io.kv for t in (*r.pasts, *r.presents)}
    with Generator.open(folder) as pipe:
        for spec in pipe.steps.lanes[0]:
            assert not cache_names & set(spec.receives) and not cache_names & set(spec.sends)
            owned = {
                t
                for r in manifest.plan.decoder.io.kv
                if r.layer in manifest.stages[spec.index].kv_layers
                for t in r.pasts
            }
            assert {s.past for s in spec.caches} == owned
        assert set(pipe.feeds.input_types) == {
            "input_ids",
            "attention_mask",
            "position_ids",
            "onnxpipe::generation",
        }


def test_processes_and_early_stop_at_an_end_token(splits: Splits) -> None:
    """Worker processes keep their caches too; a sequence that meets its end token stops there, and its
    caches are dropped (the pipeline serves the next generation with the same workers)."""
    folder = splits("qwen2", 3)
    want = reference("qwen2", PROMPTS[1])
    eos = want[5]
    cut = want.index(eos) + 1
    with Generator.open(folder, LocalConfig(mode="processes")) as pipe:
        got = pipe.generate(PROMPTS[:2], NEW_TOKENS, eos_token_ids=[eos], in_flight=1)
        again = pipe.generate([PROMPTS[2]], 8)
    assert got.tokens[1] == want[:cut]
    first = reference("qwen2", PROMPTS[0])
    assert got.tokens[0] == (first[: first.index(eos) + 1] if eos in first else first)
    assert again.tokens == (reference("qwen2", PROMPTS[2])[:8],)


def test_embedding_stage_without_cache_reads_the_past_length_from_zeros(splits: Splits) -> None:
    """With ``--ends own`` the embedding stage holds no cache but reads the past length off a past's
    shape: its worker feeds zeros of that shape, and the tokens are still the model's."""
    folder = splits("llama_gqa", 4, Ends.OWN)
    with Generator.open(folder) as pipe:
        shaped = [s for s in pipe.steps.lanes[0][0].caches if s.present is None]
        assert shaped  # the case this test is about
        got = pipe.generate(PROMPTS[:2], 16)
    assert got.tokens == tuple(reference("llama_gqa", p)[:16] for p in PROMPTS[:2])


def test_an_interleaved_split_generates_the_unsplit_models_tokens(tmp_path: Path) -> None:
    """Four stages on two workers (``--workers 2``): each stage's worker keeps that stage's layers' cache."""
    out = tmp_path / "interleaved"
    options = partial(SplitOptions, profile=ProfileOptions(cost=CostSource.STATIC), verify=False)
    split(DECODERS / "llama_gqa.onnx", options(out=out, plan=PlanRequest(4, workers=2)))
    assert load_manifest(out).plan.workers == 2
    with Generator.open(out) as pipe:
        got = pipe.generate(PROMPTS, 16)
    assert got.tokens == tuple(reference("llama_gqa", p)[:16] for p in PROMPTS)


def test_replicas_generate_the_same_tokens(splits: Splits) -> None:
    folder = splits("gpt2", 2)
    with Generator.replicas(folder, 2) as pipe:
        assert len(pipe.steps.lanes) == 2
        got = pipe.generate(PROMPTS, 12)
    assert got.tokens == tuple(reference("gpt2", p)[:12] for p in PROMPTS)


def test_steps_that_lost_their_caches_are_rebuilt_by_a_prefill_and_the_tokens_are_the_same(
    splits: Splits, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a lost Ray actor does to a generation, here: steps that ran (every stage grew its caches)
    come back as :class:`CacheLost`; each of their sequences is rebuilt by a prefill of its tokens so far,
    the stages' stale caches started again, and the tokens are the unsplit model's."""
    folder = splits("llama_gqa", 2)
    with Generator.open(folder) as pipe:
        real = pipe.steps.submit
        calls: list[int] = []

        def losing(feeds: dict[str, np.ndarray], lane: int | None = None) -> Future[dict[str, np.ndarray]]:
            calls.append(1)
            ran = real(feeds, lane)
            if len(calls) not in (6, 11, 12):
                return ran
            lost: Future[dict[str, np.ndarray]] = Future()
            ran.add_done_callback(lambda _: lost.set_exception(CacheLost("the stage's actor was lost")))
            return lost

        monkeypatch.setattr(pipe.steps, "submit", losing)
        got = pipe.generate(PROMPTS, 12, eos_token_ids=())
    assert got.tokens == tuple(reference("llama_gqa", p)[:12] for p in PROMPTS)
    assert got.rebuilt >= 3  # a step of several sequences rebuilds each


def test_generate_refuses_what_it_cannot_run(splits: Splits) -> None:
    with Generator.open(splits("gpt2", 2)) as pipe:
        with pytest.raises(UsageError, match="prompt 1 holds no token id: give at least one"):
            pipe.generate([PROMPTS[0], ()], 4)
        with pytest.raises(UsageError, match="`max_new_tokens=0`"):
            pipe.generate([PROMPTS[0]], 0)


def test_a_contract_whose_logits_no_stage_makes_is_refused_before_any_worker_starts(splits: Splits) -> None:
    """Regression: with stage_specs' check of the outputs removed (as unreachable after load_manifest), a
    contract given to Generator.open whose logits no stage of the split makes started the workers, and
    the first step hung: the driver lost the step it could not read the logits of."""
    folder = splits("gpt2", 2)
    contract = load_manifest(folder).plan.decoder.io  # type: ignore[union-attr]
    assert contract is not None
    outputs = tuple(Binding("nope", b.role) if b.role == Role.LOGITS else b for b in contract.outputs)
    threads_before = threading.active_count()
    with pytest.raises(UsageError, match="model output 'nope' is produced by no stage of the manifest"):
        Generator.open(folder, contract=replace(contract, outputs=outputs))
    assert threading.active_count() == threads_before


def test_the_contract_is_written_in_the_manifest_by_the_split(splits: Splits) -> None:
    """The split records its IO contract (``plan.decoder.io``: each tensor and its role) and reads it
    back; the generator drives the workers by it."""
    folder = splits("llama_gqa", 2)
    written = json.loads((folder / "manifest.json").read_text())["plan"]["decoder"]["io"]
    roles = {b["tensor"]: b["role"] for b in written["inputs"]}
    assert roles["input_ids"] == "token_ids" and roles["attention_mask"] == "attention_mask"
    assert roles["position_ids"] == "positions"
    assert {b["role"] for b in written["outputs"]} == {"logits", "present_key", "present_value"}
    contract = load_manifest(folder).plan.decoder.io  # type: ignore[union-attr]
    assert contract is not None and contract.one(Role.TOKEN_IDS) == "input_ids" and len(contract.kv) == 4
    with Generator.open(folder) as gen:
        assert gen.feeds.contract == contract


def test_a_manifest_without_the_contract_still_generates(splits: Splits, tmp_path: Path) -> None:
    """A manifest written before ``plan.decoder.io`` gets its contract from its source model, by the
    planner's own logic: the same contract, the same tokens; without the source model, a fresh split is
    asked for, naming the folder."""
    folder = splits("gpt2", 2)
    manifest = load_manifest(folder)
    old = tmp_path / "old"
    old.mkdir()
    for f in folder.iterdir():
        (old / f.name).write_bytes(f.read_bytes())
    obj = json.loads((old / "manifest.json").read_text())
    del obj["plan"]["decoder"]["io"]
    obj["source"]["path"] = str(source_model_path(folder, manifest, None).resolve())
    (old / "manifest.json").write_text(sealed(obj))
    assert load_manifest(old).plan.decoder.io is None  # type: ignore[union-attr]
    with Generator.open(old) as gen:
        assert gen.feeds.contract == manifest.plan.decoder.io  # type: ignore[union-attr]
        got = gen.generate(PROMPTS[:2], 8)
    assert got.tokens == tuple(reference("gpt2", p)[:8] for p in PROMPTS[:2])
    options = GenerateOptions(prompt_ids=PROMPTS[:2], max_new_tokens=8, compare=True)
    compared = generate(old, options)  # the split, the unsplit loop and its replicas: one contract
    assert compared.same and compared.tokens == got.tokens
    obj["source"]["path"] = None
    (old / "manifest.json").write_text(sealed(obj))
    with pytest.raises(UsageError, match=r"old.*predates plan\.decoder\.io.*re-run onnxpipe split"):
        Generator.open(old)


def test_cli_generate_compares_with_the_unsplit_model(
    splits: Splits, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = splits("llama_gqa", 2)
    args = [
        "generate",
        folder,
        "--prompt-ids",
        "3,17,42,9,77,5",
        "--prompt-ids",
        "101 2",
        "--max-new-tokens",
        "8",
    ]
    code, out, err = cli_run([*args, "--compare", "--json"], capfd)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["sequences"] == [list(reference("llama_gqa", p)[:8]) for p in PROMPTS[:2]]
    assert doc["same"] and set(doc["runs"]) == {"pipeline", "unsplit", "replicas"}
    assert doc["sampling"] is None  # greedy
    assert all(run["same_tokens"] and run["tokens_per_second"] > 0 for run in doc["runs"].values())
    sampled = ["--do-sample", "--temperature", "0.8", "--top-k", "50", "--top-p", "0.95", "--seed", "7"]
    code, out, err = cli_run([*args, *sampled, "--compare", "--json"], capfd)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["same"] and doc["sequences"] == [
        list(reference("llama_gqa", p, 8, SAMPLING, i)) for i, p in enumerate(PROMPTS[:2])
    ]
    assert doc["sampling"] == {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "seed": 7}
    code, out, _ = cli_run(["generate", folder, "--prompt-ids", "64", "--max-new-tokens", "4"], capfd)
    assert code == 0 and "\n... generating 1 sequence(s) through 2 stage(s)" in out
    shown = " ".join(map(str, reference("llama_gqa", (64,))[:4]))
    assert f"sequence 0: 1 prompt token(s) -> 4 new: {shown}\n" in out
    assert "\n  up to 1 sequence a step; first token " in out  # not "up to 1 a step"


def test_cli_generate_bad_input_is_one_line(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    not_decoder = tmp_path / "mlp"
    split(
        SAMPLE_MODELS / "mlp.onnx",
        SplitOptions(out=not_decoder, plan=PlanRequest(2), profile=ProfileOptions(cost=CostSource.STATIC)),
    )
    code, _, err = cli_run(["generate", not_decoder, "--prompt-ids", "1"], capfd)
    assert code == 2 and err.strip().count("\n") == 0
    assert "was not split as a decoder LLM" in err and str(not_decoder) in err
    code, _, err = cli_run(["generate", not_decoder, "--prompt-ids", "1,-2"], capfd)
    assert code == 2 and "-2 is not a token id" in err
    code, _, err = cli_run(["generate", not_decoder], capfd)
    assert code == 2 and "--prompt-ids" in err
    code, _, err = cli_run(["generate", not_decoder, "--prompt-ids", "1", "--temperature", "0.5"], capfd)
    assert code == 2 and err.strip().count("\n") == 0
    assert "--temperature is for sampling: add --do-sample" in err
    code, _, err = cli_run(
        ["generate", not_decoder, "--prompt-ids", "1", "--do-sample", "--top-p", "0"], capfd
    )
    assert code == 2 and "must be above 0 and at most 1" in err
