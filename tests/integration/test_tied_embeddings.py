"""A tied token embedding and LM head (issue 37, item 5): one table both the first and the last stage read.

``llama_tied`` (tools/export_decoders.py) holds its 128 x 32 float32 table once: the embedding's
``Gather`` and the LM head's ``Transpose`` -> ``MatMul`` read the same initializer.  A split into K stages
on K workers holds it on two workers; ``--stages V*W+1 --workers W`` deals the last stage back to worker
0 with the first, which holds it once, and the tokens stay the unsplit model's.  A plain ``--stages K``
makes that layout by itself, K + 1 stages on K workers, where the memory it saves is worth its time
(:mod:`onnxpipe.planning.tied`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from cli_runner import run as cli_run
from paths import SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.cli.tables import format_manifest_table
from onnxpipe.core.choices import CostSource
from onnxpipe.core.text import human_bytes
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.decoder import tied_tables
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import load_manifest
from onnxpipe.planning import tied as tied_module
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.planning.tied import worth_it
from onnxpipe.planning.workers import worker_weights
from onnxpipe.runtime.generation.generator import Generator
from tests.integration.test_builder_decoders import greedy
from tests.integration.test_generate import PROMPTS, reference

MODEL = SAMPLE_MODELS / "decoders" / "llama_tied.onnx"
TABLE = "model.lm_head.weight"
TABLE_BYTES = 128 * 32 * 4


def _split(out: Path, request: PlanRequest) -> Path:
    options = partial(SplitOptions, profile=ProfileOptions(cost=CostSource.STATIC), verify=False)
    split(MODEL, options(out=out, plan=request))
    return out


def test_the_model_holds_one_table_for_embedding_and_head() -> None:
    view = load_model(MODEL)
    readers = {view.nodes[i].op_type for i in view.consumers[TABLE]}
    assert readers == {"Gather", "Transpose"} and view.weights[TABLE] == TABLE_BYTES


def test_the_table_is_held_twice_on_two_workers_and_once_when_first_and_last_share_one(
    tmp_path: Path,
) -> None:
    before = load_manifest(_split(tmp_path / "k2", PlanRequest(2, workers=2)))  # a stage per worker
    after = load_manifest(_split(tmp_path / "k3w2", PlanRequest(3, workers=2)))
    interleaved = load_manifest(_split(tmp_path / "k4w2", PlanRequest(4, workers=2)))
    print(
        f"worker_param_bytes: 4 stages on 2 workers {interleaved.plan.worker_param_bytes}, "
        f"3 stages on 2 workers {after.plan.worker_param_bytes}; "
        f"duplicated_param_bytes: 2 stages {before.plan.duplicated_param_bytes}, "
        f"4 stages on 2 workers {interleaved.plan.duplicated_param_bytes}, "
        f"3 stages on 2 workers {after.plan.duplicated_param_bytes}"
    )
    assert [after.worker_of(s) for s in range(3)] == [0, 1, 0]
    # a worker's weights: each tensor of its stages once; over the workers, the model's and what is
    # held twice
    held = after.plan.worker_param_bytes
    assert held is not None and before.plan.worker_param_bytes is None  # a worker per stage: the stages'
    assert after.stages[0].param_bytes + after.stages[2].param_bytes - held[0] >= TABLE_BYTES
    assert "worker 0: stages 0, 2, " in format_manifest_table(after)
    (worker_1,) = [line for line in format_manifest_table(after).splitlines() if line.startswith("worker 1")]
    assert worker_1.endswith(f"params {human_bytes(held[1])}")
    assert f"), params {human_bytes(held[0])}\nworker 1" in format_manifest_table(after)
    view = load_model(MODEL)
    weights = view.param_bytes
    planned = plan(view, get_profile(view, ProfileOptions(cost="static")), PlanRequest(3, workers=2))
    assert planned.worker_param_bytes == held  # the planner's figure, as the stage files hold them
    for m in (after, interleaved):
        assert sum(m.plan.worker_param_bytes or ()) == weights + m.plan.duplicated_param_bytes
    assert before.plan.duplicated_param_bytes - after.plan.duplicated_param_bytes == TABLE_BYTES
    assert interleaved.plan.duplicated_param_bytes == before.plan.duplicated_param_bytes
    twice = next(n for n in before.plan.notes if n.startswith(f"weight {TABLE}"))
    assert twice == (
        f"weight {TABLE} (16.0 KiB) is read by stages 0, 1 on workers 0, 1: held 2 times (16.0 KiB more), "
        "each worker loading its own stages; `stages=3` `workers=2` deals the last stage back to worker 0 "
        "with the first, which then holds it once"
    )
    assert f"weight {TABLE} (16.0 KiB) is read by stages 0, 2, all on worker 0: held once" in after.plan.notes
    with Generator.open(tmp_path / "k3w2") as pipe:
        got = pipe.generate(PROMPTS, 16)
    assert got.tokens == tuple(reference("llama_tied", p)[:16] for p in PROMPTS)


def test_inspect_counts_a_shared_table_once(capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli_run(["inspect", str(MODEL)], capfd)
    assert code == 0, err
    lines = out.splitlines()
    first = lines[2 : next(i for i, line in enumerate(lines) if line.startswith("input "))]  # the op table
    table = {r[0]: r for r in map(str.split, first)}
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    total = sum(float(r[2]) * units[r[3]] for r in table.values())
    assert abs(total - load_model(MODEL).param_bytes) < 0.05 * 2**10 * len(table)
    assert table["Gather"][2:4] == ["16.0", "KiB"] and table["Transpose"][2:4] == ["0", "B"]
    args = ["plan", MODEL, "-k", "3", "--workers", "2", "--cost", "static", "--json"]
    code, out, err = cli_run(args, capfd)
    assert code == 0, err
    planned = json.loads(out)["plan"]
    stages = [s["param_bytes"] for s in planned["stages"]]
    held = planned["worker_param_bytes"]  # worker 0 (stages 0 and 2) holds the table once
    assert len(held) == 2 and stages[0] + stages[2] - held[0] >= TABLE_BYTES and held[1] == stages[1]


@pytest.mark.slow
@pytest.mark.exhaustive
def test_a_builder_int4_table_shared_by_gather_and_matmulnbits_is_held_once(
    genai_builder: Callable[..., Path], tmp_path: Path
) -> None:
    """ONNX Runtime GenAI's builder ties an int4 model's embedding to its LM head: ``GatherBlockQuantized``
    reads the ``MatMulNBits`` head's own 4-bit blocks and scales.  3 stages on 2 workers hold them once."""
    folder = genai_builder("qwen2", "int4", True)
    model = folder / "model.onnx"
    view = load_model(model)
    table = next(t for t in view.weights if t.endswith("weight_Q4") and "lm_head" in t)
    scales = table.replace("weight_Q4", "weight_scales")
    readers = {view.nodes[i].op_type for t in (table, scales) for i in view.consumers[t]}
    assert {"GatherBlockQuantized", "MatMulNBits"} <= readers  # the blocks also through a Reshape
    options = partial(SplitOptions, profile=ProfileOptions(cost=CostSource.STATIC), verify=False)
    split(model, options(out=tmp_path / "k2", plan=PlanRequest(2, workers=2)))
    split(model, options(out=tmp_path / "k3w2", plan=PlanRequest(3, workers=2)))
    before, after = load_manifest(tmp_path / "k2"), load_manifest(tmp_path / "k3w2")
    tied = view.weights[table] + view.weights[scales]
    print(
        f"int4 tied table {tied} B; duplicated_param_bytes {before.plan.duplicated_param_bytes} at 2 "
        f"stages, {after.plan.duplicated_param_bytes} at 3 stages on 2 workers"
    )
    assert before.plan.duplicated_param_bytes - after.plan.duplicated_param_bytes == tied
    assert any(n.startswith(f"weight {table}") and n.endswith("held once") for n in after.plan.notes)
    prompt = (5, 17, 3, 99, 42, 8)
    with Generator.open(tmp_path / "k3w2") as pipe:
        got = pipe.generate([prompt], 12)
    assert list(got.tokens[0]) == greedy(folder, prompt, 12)


@pytest.fixture(scope="module")
def costed() -> tuple[ModelView, Profile]:
    view = load_model(MODEL)
    return view, get_profile(view, ProfileOptions(cost="static"))


SHARE_NOTE = f"the token embedding and the LM head share {TABLE} (16.0 KiB)"


def test_a_plain_stage_count_puts_the_first_and_last_stage_on_one_worker(
    costed: tuple[ModelView, Profile], tmp_path: Path
) -> None:
    """``--stages K`` alone: K + 1 stages on K workers, the LM head's stage back on worker 0 with the
    embedding's, where the memory it saves is worth the time it costs; the manifest counts the table once
    on worker 0, and the tokens stay the unsplit model's."""
    view, profile = costed
    for k in (2, 3):
        got = plan(view, profile, PlanRequest(k))
        forced = plan(view, profile, PlanRequest(k, workers=k))  # a stage per worker, as the user asked
        assert (got.k, got.workers, forced.k, forced.workers) == (k + 1, k, k, None)
        assert [s.worker for s in got.stages] == [*range(k), 0]
        (note,) = [n for n in got.notes if n.startswith(SHARE_NOTE)]
        assert f"{k + 1} stages on {k} workers, the last on worker 0 with the first, hold it once" in note
        assert note.endswith(f"`workers={k}` keeps a stage per worker")
        assert not any(n.startswith("the token embedding") for n in forced.notes)
        held, plain = sum(got.worker_param_bytes or ()), sum(worker_weights(view, forced.stages, k))
        slower = got.bottleneck_seconds / forced.bottleneck_seconds - 1
        print(f"K={k}: weights over the workers {plain} B plain, {held} B tied; bottleneck {slower:+.2%}")
        assert plain - held >= TABLE_BYTES and worth_it(forced, got, plain, held)
    m = load_manifest(_split(tmp_path / "k2", PlanRequest(2)))
    assert [m.worker_of(s) for s in range(3)] == [0, 1, 0] and m.plan.worker_param_bytes is not None
    assert f"weight {TABLE} (16.0 KiB) is read by stages 0, 2, all on worker 0: held once" in m.plan.notes
    with Generator.open(tmp_path / "k2") as pipe:
        got_tokens = pipe.generate(PROMPTS, 16)
    assert got_tokens.tokens == tuple(reference("llama_tied", p)[:16] for p in PROMPTS)


def test_the_plain_split_stays_where_the_tied_layout_costs_more_than_it_saves(
    costed: tuple[ModelView, Profile], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule, :func:`worth_it`: a share of the workers' weights saved buys at most as large a share of
    bottleneck.  Where it does not (the rule made to refuse here), the plan is a stage per worker and
    its note names the figures and the flags that ask for the tied layout."""
    view, profile = costed
    plain, tied = (
        plan(view, profile, PlanRequest(2, workers=2)),
        plan(view, profile, PlanRequest(3, workers=2)),
    )
    a, b = sum(worker_weights(view, plain.stages, 2)), sum(worker_weights(view, tied.stages, 2))
    saved = 1 - b / a
    assert worth_it(
        plain, replace(tied, bottleneck_seconds=plain.bottleneck_seconds * (1 + saved * 0.99)), a, b
    )
    assert not worth_it(
        plain, replace(tied, bottleneck_seconds=plain.bottleneck_seconds * (1 + saved * 1.01)), a, b
    )
    assert not worth_it(plain, plain, a, a)  # nothing saved: nothing to buy
    monkeypatch.setattr(tied_module, "worth_it", lambda *_: False)
    got = plan(view, profile, PlanRequest(2))
    assert (got.k, got.workers) == (2, None)
    (note,) = [n for n in got.notes if n.startswith(SHARE_NOTE)]
    assert "3 stages on 2 workers would hold it once" in note and note.endswith(
        "`stages=3` `workers=2` asks for it"
    )


def test_a_stage_count_with_no_stage_to_spare_says_why_the_table_is_held_twice(
    costed: tuple[ModelView, Profile],
) -> None:
    """Six stages of a 4-layer decoder leave no seventh to deal back to worker 0: a stage per worker, and
    a note that says so (and no partitioner's advice to ask for fewer), as for a plan off identical
    workers or with ``ends="own"``; one stage, or a model with no tied table, plans as before, with no
    such note."""
    view, profile = costed
    got = plan(view, profile, PlanRequest(6))
    assert (got.k, got.workers) == (6, None)
    (note,) = [n for n in got.notes if n.startswith(SHARE_NOTE)]
    assert note.endswith("7 stages on 6 workers cannot be made")
    attached = plan(view, profile, PlanRequest(4, decoder=DecoderOptions(ends="attached")))
    (note,) = [n for n in attached.notes if n.startswith(SHARE_NOTE)]
    assert note.endswith("5 stages on 4 workers cannot be made")  # not the partitioner's "use k <= 4"
    own = plan(view, profile, PlanRequest(3, decoder=DecoderOptions(ends="own")))
    (note,) = [n for n in own.notes if n.startswith(SHARE_NOTE)]
    assert own.workers is None and note.endswith("are not planned with `ends=own`")
    assert not any(n.startswith("the token embedding") for n in plan(view, profile, PlanRequest(1)).notes)
    latency = plan(view, profile, PlanRequest(2, objective="latency"))  # a chain for one request at a time
    (note,) = [n for n in latency.notes if n.startswith(SHARE_NOTE)]
    assert (latency.k, latency.workers) == (2, None)
    assert note.endswith("are planned on identical workers only, not with `objective=latency`")
    untied = load_model(SAMPLE_MODELS / "decoders" / "llama_gqa.onnx")
    assert tied_tables(untied) == () and tied_tables(view) == (TABLE,)
    other = plan(untied, get_profile(untied, ProfileOptions(cost="static")), PlanRequest(2))
    assert (other.k, other.workers) == (2, None)
    assert not any(n.startswith("the token embedding") for n in other.notes)
