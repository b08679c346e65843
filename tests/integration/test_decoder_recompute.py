"""A decoder's rotary tables and masks made in each stage of the model inputs instead of sent
(:mod:`onnxpipe.planning.decoder_recompute`), on the committed tiny exports: they stop crossing the cuts
when the plan's rule finds copies cheaper, still cross when it does not, and the stages so made verify
and decode the model's tokens (prompt and generation steps, the mask and positions growing)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from models import kv_split_layers
from paths import SAMPLE_MODELS

from onnxpipe.api import SplitOptions, split
from onnxpipe.cluster.devicesfile import load_cluster
from onnxpipe.core.choices import CostSource, Ends, Phase
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import Profile
from onnxpipe.ir.decoder import DecoderInfo, find_decoder
from onnxpipe.ir.decoder_kinds import phase_shape
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapevalues import value_kinds
from onnxpipe.partition import Partition, evaluate
from onnxpipe.planning.decoder import layer_sequences
from onnxpipe.planning.decoder_kinds import DecoderOptions
from onnxpipe.planning.decoder_plan import decoder_stages, split_layers
from onnxpipe.planning.decoder_recompute import InputCopies, PhaseCosts, input_derived, priced_cuts
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.runtime.generation.generator import Generator
from onnxpipe.verification.chain import StageChain

DECODERS = SAMPLE_MODELS / "decoders"
PROMPT = (3, 17, 42, 9, 77, 5)
MODELS = ("llama_gqa", "qwen2", "gpt2")
LANES = ["llama_gqa", *(pytest.param(n, marks=pytest.mark.exhaustive) for n in MODELS[1:])]
"""The decoders of the fast lane (the first) and of the exhaustive lane (all)."""
SLOW_LINK = 1_000_000.0
"""8 Mbit/s: at the static costs every rotary table and mask of the tiny models is cheaper to make at
both phases (at a generation step the rotary tables are 32 bytes)."""


def _load(name: str) -> tuple[ModelView, DecoderInfo]:
    view = load_model(DECODERS / f"{name}.onnx")
    dec = find_decoder(view)
    assert dec is not None
    return view, dec


def _input_made(view: ModelView, dec: DecoderInfo) -> set[str]:
    """The data tensors made of the model inputs (not the cache) alone: rotary tables, masks."""
    kinds = value_kinds(view)
    return {o for p in input_derived(view, dec) for o in view.nodes[p].outputs if not kinds.recomputable(o)}


def _static(view: ModelView) -> dict[Phase, Profile]:
    return phase_profiles(
        view, ProfileOptions(cost=CostSource.STATIC), [phase_shape(Phase.PREFILL), phase_shape(Phase.DECODE)]
    )


@pytest.mark.parametrize("name", LANES)
def test_an_interleaved_split_makes_its_tables_too(name: str, tmp_path: Path) -> None:
    """Stages dealt out to fewer workers make their rotary tables and masks where that is cheaper, as a
    chain's do; the split still computes the model's outputs."""
    view, dec = _load(name)
    made = _input_made(view, dec)
    profiles = _static(view)
    for bandwidth, crosses in ((SLOW_LINK, False), (1e15, True)):
        request = PlanRequest(4, workers=2, bandwidth_bytes_per_s=bandwidth)
        p = plan(view, profiles[Phase.DECODE], request)
        received = {t for st in p.stages[1:] for t in st.inputs}
        assert bool(received & made) == crosses, (bandwidth, received & made)
        assert kv_split_layers(view, dec, p.stages) == []
        if not crosses:
            assert any("made of the model inputs in each stage" in n for n in p.notes)
            assert p.bottleneck_seconds == pytest.approx(
                max(sum(st.cost_seconds for st in p.stages if st.worker == w) for w in range(2))
            )
    options = partial(SplitOptions, profile=ProfileOptions(cost=CostSource.STATIC))
    result = split(
        SAMPLE_MODELS / "decoders" / f"{name}.onnx",
        options(out=tmp_path / "out", plan=PlanRequest(4, workers=2, bandwidth_bytes_per_s=SLOW_LINK)),
    )
    assert result.report is not None and result.report.ok


@pytest.mark.parametrize("name", LANES)
def test_rotary_and_masks_stop_crossing_when_cheaper(name: str) -> None:
    view, dec = _load(name)
    made = _input_made(view, dec)
    profiles = _static(view)
    for k in (2, 3):
        for bandwidth, crosses in ((SLOW_LINK, False), (1e15, True)):
            p = plan(
                view,
                profiles[Phase.DECODE],
                # every cut between two layers, where they read the tables (the head alone reads none)
                PlanRequest(k, bandwidth_bytes_per_s=bandwidth, decoder=DecoderOptions(ends=Ends.ATTACHED)),
                phase_profiles=profiles,
            )
            received = {t for st in p.stages[1:] for t in st.inputs}
            # on a link so fast that sending costs less than the copies, the rule says send
            assert bool(received & made) == crosses, (k, bandwidth, received & made)
            # the cache stays whole, each stage taking only its own layers' past
            assert kv_split_layers(view, dec, p.stages) == []
            for st in p.stages:
                pasts = {t for t in st.inputs if t in dec.past_inputs}
                assert pasts == {t for layer in st.kv_layers for t in dec.kv[layer].pasts}
            if not crosses:  # made again where read, said in a note
                assert all(set(st.recomputed_tensors) & made for st in p.stages[1:])
                assert any("less crossing each cut" in n for n in p.notes)


def _layer_split(
    view: ModelView, profile: Profile, dec: DecoderInfo, options: DecoderOptions, bandwidth: float
) -> Partition:
    """The exact 3-stage split between layers, its stages as the partitioner scored them (no copies)."""
    sent = dataclasses.replace(options, copy_inputs=False)
    return split_layers(view, [(Phase.DECODE, profile)], 3, dec, sent, bandwidth)[0].parts[0]


def test_copies_are_charged_to_the_stage_and_spare_its_link() -> None:
    """The copies' profiled seconds are added to the stage's compute, and the bytes that no longer
    cross come off its transfer time and its link bytes; with no bandwidth a share of 0 sends all."""
    view, dec = _load("llama_gqa")
    profile = _static(view)[Phase.DECODE]
    layers = layer_sequences(view, profile, dec)
    options = DecoderOptions(ends=Ends.ATTACHED)  # every cut between two layers, where both are read
    made = _input_made(view, dec)

    def stages(bandwidth: float, share: float | None) -> tuple[InputCopies, list[float], list[int]]:
        part = _layer_split(view, profile, dec, options, bandwidth)
        phases = (PhaseCosts("decode", profile.node_seconds, layers.seq.sizes, part.compute),)
        copies = InputCopies(view, dec, phases, bandwidth, layers.seq.classes, share=share)
        specs = decoder_stages(view, dec, layers.seq, part, options, profile, copies=copies)
        received = [sum(layers.seq.sizes[t] for t in st.inputs if t in made) for st in specs]
        return copies, list(part.compute), received

    copies, _, received = stages(math.inf, 0.0)
    assert all(not c.tensors for c in copies.chosen.values()) and all(received[1:])
    copies, _, received = stages(math.inf, 1.0)
    assert all(copies.chosen[s].tensors for s in (1, 2)) and received[1:] == [0, 0]
    # the plan's numbers: compute grows by the copies, the link loses their bytes
    p = plan(view, profile, PlanRequest(3, bandwidth_bytes_per_s=SLOW_LINK, decoder=options))
    at = {n.name: i for i, n in enumerate(layers.seq.compute)}
    bounds = [at[st.node_names[0]] for st in p.stages] + [len(layers.seq.compute)]
    base = evaluate(layers.seq.costs, bounds, cut_bytes=layers.seq.cut_bytes, bandwidth=SLOW_LINK)
    for st in p.stages[1:]:
        spared = sum(layers.seq.sizes[t] for t in st.recomputed_tensors if t in made)
        assert spared > 0
        assert st.compute_seconds > base.compute[st.index]
        assert st.link_bytes_in == layers.seq.cut_bytes[base.bounds[st.index]] - spared
        assert st.transfer_seconds == pytest.approx(base.transfer[st.index] - spared / SLOW_LINK)
    assert p.bottleneck_seconds == max(st.cost_seconds for st in p.stages)
    # turned off, they cross, the stage costs the partitioner's (on cuts chosen counting their bytes)
    off = plan(
        view,
        profile,
        PlanRequest(
            3, bandwidth_bytes_per_s=SLOW_LINK, decoder=dataclasses.replace(options, copy_inputs=False)
        ),
    )
    assert {t for st in off.stages[1:] for t in st.inputs} & made
    plain = _layer_split(view, profile, dec, options, SLOW_LINK)
    assert [st.cost_seconds for st in off.stages] == list(plain.stage_costs)


Step = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def _greedy(run: Step, view: ModelView, dec: DecoderInfo, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decoding of ``n`` tokens after a 6-token prompt, the presents fed back as pasts."""
    prompt = np.array([PROMPT], dtype=np.int64)
    feeds: dict[str, np.ndarray] = {"input_ids": prompt, "attention_mask": np.ones_like(prompt)}
    for t in dec.past_inputs:
        declared = view.tensor(t).shape
        assert declared is not None
        feeds[t] = np.zeros((1, *(d if isinstance(d, int) else 0 for d in declared[1:])), dtype=np.float32)
    if dec.positions_input:
        feeds["position_ids"] = np.arange(prompt.shape[1], dtype=np.int64)[None]
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for _ in range(n):
        out = run(feeds)
        logits.append(np.asarray(out["logits"][0, -1]))
        tokens.append(int(np.argmax(logits[-1])))
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {
            "input_ids": np.array([[tokens[-1]]], dtype=np.int64),
            "attention_mask": np.ones((1, total), dtype=np.int64),
            **{p: out[q] for p, q in zip(dec.past_inputs, dec.present_outputs, strict=True)},
        }
        if dec.positions_input:
            feeds["position_ids"] = np.array([[total - 1]], dtype=np.int64)
    return tokens, logits


@pytest.mark.parametrize("name", LANES)
def test_stages_that_make_their_rotary_and_masks_verify_and_decode(name: str, tmp_path: Path) -> None:
    view, dec = _load(name)
    result = split(
        DECODERS / f"{name}.onnx",
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(3, bandwidth_bytes_per_s=SLOW_LINK, decoder=DecoderOptions(ends=Ends.ATTACHED)),
            profile=ProfileOptions(cost=CostSource.STATIC),
        ),
    )
    assert result.report is not None and result.report.ok
    made = _input_made(view, dec)
    for st in result.manifest.stages[1:]:
        assert not {i.name for i in st.inputs} & made
        assert st.recomputed_node_count > 0
    session = ort.InferenceSession(str(DECODERS / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def whole(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, dict(feeds)), strict=True))

    want, want_logits = _greedy(whole, view, dec, 6)
    with StageChain.from_manifest(tmp_path / "out") as chain:
        got, got_logits = _greedy(chain.run, view, dec, 6)
    assert got == want
    np.testing.assert_allclose(np.stack(got_logits), np.stack(want_logits), rtol=1e-4, atol=1e-5)
    # generation through the pipeline feeds each stage the mask and positions it makes them of
    with Generator.open(tmp_path / "out") as pipe:
        assert pipe.generate([PROMPT], 6).tokens == (tuple(want),)


def test_devices_file_prices_copies_on_each_device_and_link(tmp_path: Path) -> None:
    """On a devices file the copies are priced on the stage's device and the link in front of it: a
    slow link makes them, a fast one sends; the stages verify either way.  (One phase is planned here:
    at decode the rotary tables are a few bytes, so the slow link is slower still.)"""
    view, dec = _load("llama_gqa")
    made = _input_made(view, dec)
    profile = _static(view)[Phase.DECODE]
    for bandwidth, crosses in ((SLOW_LINK / 10, False), (1e15, True)):
        path = tmp_path / f"devices_{bandwidth:.0f}.json"
        devices = [
            {"name": n, "provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": 1 << 30}
            for n in "abc"
        ]
        links = [{"bandwidth_bytes_per_s": bandwidth, "latency_s": 0}] * 2
        path.write_text(json.dumps({"devices": devices, "links": links}))
        request = PlanRequest(3, devices=load_cluster(path), decoder=DecoderOptions(ends=Ends.ATTACHED))
        p = plan(view, profile, request)
        received = {t for st in p.stages[1:] for t in st.inputs}
        assert bool(received & made) == crosses, received & made
        assert kv_split_layers(view, dec, p.stages) == []
        assert p.timeline is not None
        assert p.bottleneck_seconds == max(max(st.compute_seconds, st.transfer_seconds) for st in p.stages)
        result = split(
            DECODERS / "llama_gqa.onnx",
            SplitOptions(
                out=tmp_path / f"out_{bandwidth:.0f}",
                plan=request,
                profile=ProfileOptions(cost=CostSource.STATIC),
            ),
        )
        assert result.report is not None and result.report.ok


def test_the_cuts_are_chosen_knowing_what_stages_will_copy() -> None:
    """With a bandwidth the partitioner weighs a copied tensor as its copies' seconds, not its bytes:
    less in front of every layer where it crosses, nothing changed where copies are dearer at a phase
    or links are free."""
    view, dec = _load("llama_gqa")
    profiles = _static(view)
    seqs = [layer_sequences(view, profiles[p], dec).seq for p in (Phase.PREFILL, Phase.DECODE)]
    seconds = [profiles[p].node_seconds for p in (Phase.PREFILL, Phase.DECODE)]
    raw = [[float(b) for b in s.cut_bytes] for s in seqs]
    assert priced_cuts(view, dec, seqs, seconds, math.inf) == raw
    slow = priced_cuts(view, dec, seqs, seconds, SLOW_LINK)
    for phase in range(2):
        assert all(a <= b for a, b in zip(slow[phase], raw[phase], strict=True))
        assert any(a < b for a, b in zip(slow[phase], raw[phase], strict=True))
    # so fast a link that no copy is cheaper at a generation step: as sent
    assert priced_cuts(view, dec, seqs, seconds, 1e15) == raw


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_onnxruntime_genai_runs_stages_that_make_their_masks(name: str, tmp_path: Path) -> None:
    """GenAI's ``decoder-pipeline`` feeds each stage the model inputs it lists (the mask, the positions),
    so stages that make their rotary tables and masks generate the unsplit model's tokens there too."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from onnxpipe.export.genai import DEFAULT_EOS

    view, dec = _load(name)
    out = tmp_path / "out"
    result = split(
        DECODERS / f"{name}.onnx",
        SplitOptions(
            out=out,
            plan=PlanRequest(3, bandwidth_bytes_per_s=SLOW_LINK, decoder=DecoderOptions(ends=Ends.ATTACHED)),
            profile=ProfileOptions(cost=CostSource.STATIC),
            verify=False,
        ),
    )
    assert all(set(st.recomputed_tensors) & _input_made(view, dec) for st in result.plan.stages[1:])
    session = ort.InferenceSession(str(DECODERS / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want, _ = _greedy(lambda f: dict(zip(names, session.run(None, dict(f)), strict=True)), view, dec, 12)
    if DEFAULT_EOS in want:
        want = want[: want.index(DEFAULT_EOS) + 1]
    model = og.Model(str(out))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(PROMPT) + 12, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([PROMPT], dtype=np.int32))
    got: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        got.append(int(generator.get_next_tokens()[0]))
    assert got == want
