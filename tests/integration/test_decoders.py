"""Decoder LLMs with a KV cache (the committed tiny exports of ``tools/export_decoders.py``): found as
decoders, cut between layers only, sized without hints, greedy decoding through the stages equal to the
model's, the KV memory figure equal to the cache's real size, and the builder's format accepted."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_runner import preamble_only
from cli_runner import run as cli_run
from models import kv_split_layers
from paths import SAMPLE_MODELS

from onnxpipe import api
from onnxpipe.api import PlanOptions, SplitOptions, split
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.choices import CostSource, Ends
from onnxpipe.core.errors import MemoryFitError, UsageError
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.export.options import ExportOptions
from onnxpipe.ir import decoder as decoder_module
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.decoder_plan import foreign_pasts
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import DecoderOptions, PlanRequest
from onnxpipe.planning.stages import assign_stages
from onnxpipe.verification.chain import StageChain

DECODERS = SAMPLE_MODELS / "decoders"
MODELS = ("llama_gqa", "qwen2", "gpt2")


def _path(name: str) -> Path:
    return DECODERS / f"{name}.onnx"


def _cache_shape(view: ModelView, past: str, length: int) -> tuple[int, ...]:
    """A past tensor's shape for one sequence of ``length`` cached tokens."""
    declared = view.tensor(past).shape
    assert declared is not None
    return (1, *(d if isinstance(d, int) else length for d in declared[1:]))


@pytest.mark.parametrize("name", MODELS)
def test_each_layers_cache_lies_wholly_in_one_stage(name: str) -> None:
    view = load_model(_path(name))
    dec = find_decoder(view)
    assert dec is not None and dec.layers == 4
    prof = get_profile(view, ProfileOptions(cost="static"))  # where the cuts fall does not need timings
    for k in (2, 3, 4):
        for ends in (Ends.FREE, Ends.ATTACHED):
            p = plan(view, prof, PlanRequest(k, decoder=DecoderOptions(ends=ends)))
            assert p.k == k
            assert kv_split_layers(view, dec, p.stages) == []
            owned = [layer for st in p.stages for layer in st.kv_layers]
            assert owned == list(range(dec.layers))  # every layer once, in order
            for st in p.stages:
                # a stage reads as data and makes exactly its own layers' cache
                layers_here = set(st.kv_layers)
                for pair in dec.kv:
                    present_here = any(t in st.outputs for t in pair.presents)
                    assert present_here == (pair.layer in layers_here)
                    # ... and takes no other layer's past, not even for its shape (GenAI feeds a
                    # stage its own layers' cache only; a worker holds only its own)
                    past_here = {t for t in pair.pasts if t in st.inputs}
                    assert past_here == (set(pair.pasts) if pair.layer in layers_here else set())
    # the check can fail: a cut between layer 1's key and value caches is seen
    compute = view.compute_nodes
    key_at = next(p for p, n in enumerate(compute) if dec.kv[1].present_key in n.outputs)
    value_at = next(p for p, n in enumerate(compute) if dec.kv[1].present_value in n.outputs)
    cut = max(key_at, value_at)
    torn = assign_stages(view, (0, cut, len(compute)), {}, [0.0, 0.0], [0.0, 0.0])
    assert kv_split_layers(view, dec, torn) == [1]


def test_own_ends_put_embedding_and_head_in_stages_of_their_own() -> None:
    view = load_model(_path("llama_gqa"))
    dec = find_decoder(view)
    assert dec is not None
    prof = get_profile(view, ProfileOptions(cost="static"))
    p = plan(view, prof, PlanRequest(4, decoder=DecoderOptions(ends=Ends.OWN)))
    assert p.stages[0].kv_layers == () and p.stages[-1].kv_layers == ()
    # the embedding stage holds no cache: the past length it reads off a cache's shape cannot be made
    # of its own tensors, so it still takes those pasts (for their shape; a worker feeds zeros), and says so
    assert [bool(foreign_pasts(dec, st)) for st in p.stages] == [True, False, False, False]
    assert any("for their shape only" in n for n in p.notes)
    assert set(dec.embedding_nodes) <= set(p.stages[0].node_names)
    assert set(dec.lm_head_nodes) == set(p.stages[-1].node_names)


Step = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]


def _greedy(
    step: Step,
    feeds0: Mapping[str, np.ndarray],
    past: list[str],
    present: list[str],
    n: int,
    logits: list[np.ndarray] | None = None,
) -> list[int]:
    """Greedy decoding of ``n`` tokens, the presents fed back as pasts; ``step(feeds) -> outputs``.
    Each step's last logits are kept in ``logits`` when given."""
    feeds = dict(feeds0)
    tokens: list[int] = []
    for _ in range(n):
        out = step(feeds)
        if logits is not None:
            logits.append(np.asarray(out["logits"][0, -1]))
        token = int(np.argmax(out["logits"][0, -1]))
        tokens.append(token)
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {
            "input_ids": np.array([[token]], dtype=np.int64),
            "attention_mask": np.ones((1, total), dtype=np.int64),
            **{p: out[q] for p, q in zip(past, present, strict=True)},
        }
        if "position_ids" in feeds0:
            feeds["position_ids"] = np.array([[total - 1]], dtype=np.int64)
    return tokens


@pytest.mark.parametrize("name", MODELS)
def test_split_without_hints_decodes_the_models_tokens(name: str, tmp_path: Path) -> None:
    """``split MODEL --stages 3`` needs no --shape; the stages, chained with the cache fed back, decode
    the unsplit model's greedy tokens."""
    result = split(
        _path(name),
        SplitOptions(out=tmp_path / "out", plan=PlanRequest(3), profile=ProfileOptions(runs=3, warmup=1)),
    )
    assert result.report is not None and result.report.ok
    manifest = load_manifest(tmp_path / "out")
    view = load_model(_path(name))
    dec = find_decoder(view)
    assert dec is not None
    prompt = np.array([[3, 17, 42, 9, 77, 5]], dtype=np.int64)
    feeds0: dict[str, np.ndarray] = {
        "input_ids": prompt,
        "attention_mask": np.ones_like(prompt),
        **{t: np.zeros(_cache_shape(view, t, 0), dtype=np.float32) for t in dec.past_inputs},
    }
    if dec.positions_input:
        feeds0["position_ids"] = np.arange(prompt.shape[1], dtype=np.int64)[None]
    session = ort.InferenceSession(str(_path(name)), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def whole(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, dict(feeds)), strict=True))

    past, present = list(dec.past_inputs), list(dec.present_outputs)
    want_logits: list[np.ndarray] = []
    got_logits: list[np.ndarray] = []
    expected = _greedy(whole, feeds0, past, present, 12, want_logits)
    with StageChain.from_manifest(tmp_path / "out") as chain:
        got = _greedy(chain.run, feeds0, past, present, 12, got_logits)
    assert got == expected
    # tiny random models often repeat a token: every step's logits must agree as well
    np.testing.assert_allclose(np.stack(got_logits), np.stack(want_logits), rtol=1e-4, atol=1e-5)
    # the manifest records the decoder and each stage's cache (read back from the file)
    assert manifest.plan.decoder is not None and manifest.plan.decoder.layers == dec.layers
    assert [layer for st in manifest.stages for layer in st.kv_layers] == list(range(dec.layers))
    assert all(st.kv_cache_bytes > 0 for st in manifest.stages if st.kv_layers)
    # balanced for both phases by default, with both estimates per stage
    assert manifest.plan.decoder.phase == "both"
    assert [p for p, _, _ in manifest.plan.decoder.phase_shapes] == ["prefill", "decode"]
    assert all(dict(st.estimated_phase_seconds).keys() == {"prefill", "decode"} for st in manifest.stages)


@pytest.mark.parametrize("context", [64, 300])
def test_kv_memory_is_the_caches_real_size(context: int) -> None:
    view = load_model(_path("gpt2"))
    dec = find_decoder(view)
    assert dec is not None
    prof = get_profile(view, ProfileOptions(cost="static"))
    p = plan(view, prof, PlanRequest(3, decoder=DecoderOptions(max_context=context)))
    shapes = resolve_input_shapes(view, {t: _cache_shape(view, t, context) for t in dec.past_inputs})
    feeds = random_feeds(view, shapes)
    for st in p.stages:
        real = sum(feeds[t].nbytes for layer in st.kv_layers for t in dec.kv[layer].pasts)
        assert st.kv_cache_bytes == real > 0 or not st.kv_layers
    assert p.decoder is not None and p.decoder.max_context == context


def test_builder_format_is_accepted_with_a_note(tmp_path: Path) -> None:
    """GenAI's builder writes SimplifiedLayerNormalization in the default domain: the checker refuses
    it, onnxpipe notes that and splits it, and the stages keep those nodes."""
    path = _path("llama_gqa_builder")
    view = load_model(path)
    assert any("SimplifiedLayerNormalization" in n for n in view.notes)
    result = split(
        path,
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(2),
            profile=ProfileOptions(cost="static"),
            export=ExportOptions(),
        ),
    )
    assert result.report is not None and result.report.ok
    assert any("SimplifiedLayerNormalization" in n for n in result.plan.notes)
    assert kv_split_layers(view, find_decoder(view), result.plan.stages) == []  # type: ignore[arg-type]
    ops = {
        n.op_type
        for st in result.manifest.stages
        for n in onnx.load(str(tmp_path / "out" / st.file)).graph.node
    }
    assert "SimplifiedLayerNormalization" in ops
    # any plan of such a model repeats the note, not only a decoder's
    generic = plan(
        view,
        get_profile(view, ProfileOptions(cost="static")),
        PlanRequest(2, decoder=DecoderOptions(layer_cuts=False)),
    )
    assert any("SimplifiedLayerNormalization" in n for n in generic.notes)


def test_one_phase_is_profiled_at_its_shape(tmp_path: Path) -> None:
    request = PlanRequest(2, decoder=DecoderOptions(phase="prefill", prefill_tokens=12))
    result = split(
        _path("llama_gqa"),
        SplitOptions(
            out=tmp_path / "out",
            plan=request,
            profile=ProfileOptions(cost="static"),
            verify=False,
        ),
    )
    decoder = result.manifest.plan.decoder
    assert decoder is not None and decoder.phase == "prefill"
    assert decoder.phase_shapes == (("prefill", 12, 0),)
    assert result.plan.input_shapes["input_ids"] == (1, 12)


def test_kv_cache_counts_in_the_device_memory_check(tmp_path: Path) -> None:
    """On a devices file each device must hold its layers' cache at the maximum context: a context
    that fits at 2048 tokens does not at 8192, and the plan reports each device's cache."""
    path = tmp_path / "devices.json"
    devices = [
        {"name": n, "provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": 700000} for n in "abc"
    ]
    links = [{"bandwidth_bytes_per_s": 1000000000, "latency_s": 0}] * 2
    path.write_text(json.dumps({"devices": devices, "links": links}))
    view = load_model(_path("llama_gqa"))
    dec = find_decoder(view)
    assert dec is not None
    prof = get_profile(view, ProfileOptions(cost="static"))
    cluster = load_cluster(path)
    fits = plan(view, prof, PlanRequest(3, devices=cluster, decoder=DecoderOptions(max_context=2048)))
    assert kv_split_layers(view, dec, fits.stages) == []
    per_layer = 2 * 2 * 8 * 4 * 2048  # key and value, 2 KV heads of 8, float32, 2048 tokens
    assert [st.kv_cache_bytes for st in fits.stages] == [per_layer * len(st.kv_layers) for st in fits.stages]
    with pytest.raises(MemoryFitError):
        plan(view, prof, PlanRequest(3, devices=cluster, decoder=DecoderOptions(max_context=8192)))


@pytest.mark.parametrize("name", MODELS)
def test_an_interleaved_split_cuts_between_layers_too(name: str) -> None:
    """Stages dealt out to fewer workers (``--workers``) also start only between layers, each holding its
    own layers' cache and taking only their pasts; the plan says what each worker holds."""
    view = load_model(_path(name))
    dec = find_decoder(view)
    assert dec is not None
    prof = get_profile(view, ProfileOptions(cost="static"))
    for k, workers in ((4, 2), (6, 3), (6, 2)):
        p = plan(view, prof, PlanRequest(k, workers=workers))
        assert [st.worker for st in p.stages] == [i % workers for i in range(k)]
        assert kv_split_layers(view, dec, p.stages) == []
        assert sorted(layer for st in p.stages for layer in st.kv_layers) == list(range(dec.layers))
        for st in p.stages:  # a stage of no layer (the embedding alone) may read a past for its shape
            pasts = {t for t in st.inputs if t in dec.past_inputs} - set(foreign_pasts(dec, st))
            assert pasts <= {t for layer in st.kv_layers for t in dec.kv[layer].pasts}
        assert p.decoder is not None and p.decoder.layer_cuts and p.decoder.io is not None
        assert any("KV cache per worker" in n for n in p.notes)
    attached = plan(view, prof, PlanRequest(4, workers=2, decoder=DecoderOptions(ends=Ends.ATTACHED)))
    first, last = attached.stages[0], attached.stages[-1]
    assert set(dec.embedding_nodes) <= set(first.node_names) and 0 in first.kv_layers
    assert set(dec.lm_head_nodes) <= set(last.node_names) and dec.layers - 1 in last.kv_layers


def test_ends_own_is_refused_on_devices_and_workers(tmp_path: Path) -> None:
    view = load_model(_path("gpt2"))
    prof = get_profile(view, ProfileOptions(cost="static"))
    path = tmp_path / "devices.json"
    devices = [
        {"name": n, "provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": 10**9} for n in "abc"
    ]
    path.write_text(
        json.dumps({"devices": devices, "links": [{"bandwidth_bytes_per_s": 1e9, "latency_s": 0}] * 2})
    )
    own = DecoderOptions(ends=Ends.OWN)
    with pytest.raises(UsageError, match=r"`ends=own` with `devices`: .*give `ends=free` or attached"):
        plan(view, prof, PlanRequest(3, devices=load_cluster(path), decoder=own))
    with pytest.raises(UsageError, match=r"`ends=own` with `workers`: .*give `ends=free` or attached"):
        plan(view, prof, PlanRequest(4, workers=2, decoder=own))


def test_cli_inspect_names_the_decoder_and_split_needs_no_hints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli_run(["inspect", _path("llama_gqa_builder")], capfd)
    assert code == 0
    assert "decoder: 4 layers with a KV cache" in out and "SimplifiedLayerNormalization" in out
    code, out, err = cli_run(
        [
            "split",
            _path("gpt2"),
            "--stages",
            "3",
            "--out",
            tmp_path / "o",
            "--cost",
            "static",
            "--ends",
            "attached",
        ],
        capfd,
    )
    assert code == 0, err
    assert "KV layers" in out and "ends attached" in out


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["-k", "9"], 5, "gpt2.onnx: cannot make 9 stages cutting only between the decoder's 4 layers"),
        (["-k", "2", "--ends", "own"], 5, "choose --stages between 3 and 6"),
        (["-k", "6", "--ends", "attached"], 5, "choose --stages between 1 and 4"),
        (["-k", "4", "--workers", "2", "--ends", "own"], 2, "--ends own with --workers: "),
        (["-k", "3", "--order", "free", "--ends", "own"], 2, "--ends own with --order free: "),
        (["-k", "8", "--workers", "2"], 5, "choose --stages between 1 and 6"),
    ],
)
def test_impossible_decoder_requests_are_one_line(
    extra: list[str], code: int, message: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    got, out, err = cli_run(
        ["split", _path("gpt2"), "--out", tmp_path / "o", "--cost", "static", *extra], capfd
    )
    assert got == code and preamble_only(out)  # refused before any cost is measured
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "; " in lines[0]
    assert not (tmp_path / "o").exists()


def test_a_request_finds_the_decoder_once_at_its_door(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split (its checks, its phases, its plan, its export) and a plan of every stage count (``auto``)
    find the model's decoder once, at their door, and pass it down."""
    found: list[ModelView] = []
    real = decoder_module.find_decoder

    def counting(view: ModelView) -> decoder_module.DecoderInfo | None:
        found.append(view)
        return real(view)

    for module in list(sys.modules.values()):  # wherever it was imported, each call is counted
        if getattr(module, "find_decoder", None) is real:
            monkeypatch.setattr(module, "find_decoder", counting)
    static = ProfileOptions(cost=CostSource.STATIC)
    out = tmp_path / "out"
    split(_path("llama_gqa"), SplitOptions(out=out, plan=PlanRequest(2), profile=static, verify=False))
    assert len(found) == 1
    assert load_manifest(out).plan.decoder is not None  # planned and written as a decoder's split
    found.clear()
    made = api.plan(_path("llama_gqa"), PlanOptions(plan=PlanRequest("auto"), profile=static))
    assert len(found) == 1 and made.plan.decoder is not None and len(made.plan.stage_counts_tried) > 1
