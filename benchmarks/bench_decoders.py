"""Decoder LLMs: stage balance at prefill and decode, splits balanced for either, both, or equal layers.

Each model (``tools/export_decoders.py``: random-weight Llama with grouped-query attention, Qwen2 and
GPT-2 with a KV cache) is profiled at the prefill shape (``--prefill-tokens`` prompt tokens, no cache)
and at the decode shape (one token after ``--decode-past`` cached ones).  For each K it is split four
ways, all cutting only between layers:

* ``prefill``: balanced for the prefill profile; ``decode``: for the decode profile;
* ``both``: onnxpipe's default, the worse phase as close as possible to its own best split
  (:mod:`onnxpipe.plan.phases`);
* ``equal``: equal layer counts, the embedding with the first layers and the LM head with the last: what
  Olive's SplitModel and ONNX Runtime GenAI's ``decoder-pipeline`` users get today.

Every split is exported and each stage is timed alone, at both shapes, in one run, the stages of all the
splits of a model and K interleaved in a random order each round; the figure is max/mean of the stages'
median times (1.00 is perfect balance).  The goal: ``both`` within 1.10 at each phase where layer
granularity allows (with K stages over L layers it cannot always).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.common import (
    benchmark_parser,
    median,
    params_of,
    print_table,
    session,
    shown,
    time_interleaved,
    write_result,
)
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.source import ProfileOptions
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.decoder import DecoderInfo, find_decoder
from onnxpipe.ir.decoder_kinds import Phase, phase_shape
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest
from onnxpipe.partition import evaluate
from onnxpipe.plan.decoder import layer_sequences
from onnxpipe.plan.decoder_kinds import DecoderOptions, Ends
from onnxpipe.plan.decoder_plan import decoder_stages, make_decoder_plan
from onnxpipe.plan.phases import make_two_phase_plan
from onnxpipe.plan.stages import plan_from
from onnxpipe.plan.types import Plan
from tools import export_decoders

NAME = "decoders"
MODELS = ("llama_gqa_small", "qwen2_small", "gpt2_small")
KINDS = ("prefill", "decode", "both", "equal")


def equal_layers_plan(view: ModelView, profiles: Mapping[Phase, Any], dec: DecoderInfo, k: int) -> Plan:
    """Olive's assignment: ``ceil``/``floor`` equal layer counts, the embedding with the first stage and
    the LM head with the last, costed with the decode profile."""
    prof = profiles[Phase.DECODE]
    layers = layer_sequences(view, prof, dec)
    groups = layers.groups
    first = 1 if groups[0] == -1 else 0
    sizes = [dec.layers // k + (1 if s < dec.layers % k else 0) for s in range(k)]
    coarse = [0]
    at = first
    for size in sizes[:-1]:
        at += size
        coarse.append(at)
    coarse.append(len(groups))
    fine = layers.fine_bounds(coarse)
    part = evaluate(layers.seq.costs, fine, cut_bytes=layers.seq.cut_bytes)
    options = DecoderOptions(ends=Ends.ATTACHED)
    stages = decoder_stages(view, dec, layers, part, options, prof)
    return plan_from(view, prof, part, stages, layers.seq.sizes, float("inf"))


def plans(view: ModelView, profiles: Mapping[Phase, Any], dec: DecoderInfo, k: int) -> dict[str, Plan]:
    options = DecoderOptions()
    pre, dec_prof = profiles[Phase.PREFILL], profiles[Phase.DECODE]
    return {
        "prefill": make_decoder_plan(view, pre, k, dec, options, phase="prefill"),
        "decode": make_decoder_plan(view, dec_prof, k, dec, options, phase="decode"),
        "both": make_two_phase_plan(view, pre, dec_prof, k, dec, options),
        "equal": equal_layers_plan(view, profiles, dec, k),
    }


def stage_feeds(
    folder: Path, feeds: Mapping[str, np.ndarray], sessions: Sequence[ort.InferenceSession]
) -> list[dict[str, np.ndarray]]:
    """Each stage's inputs for ``feeds``, from running the stages once in order."""
    manifest = load_manifest(folder)
    values: dict[str, Any] = dict(feeds)
    out: list[dict[str, np.ndarray]] = []
    for sess in sessions[: manifest.k]:
        mine = {i.name: values[i.name] for i in sess.get_inputs()}
        out.append(mine)
        values.update(zip([o.name for o in sess.get_outputs()], sess.run(None, mine), strict=True))
    return out


SplitKey = tuple[tuple[int, tuple[int, ...]], ...]


def split_key(plan: Plan) -> SplitKey:
    """What tells two splits apart: each stage's node count and layers (equal splits are timed once)."""
    return tuple((len(st.node_names), st.kv_layers) for st in plan.stages)


def layer_counts(plan: Plan) -> str:
    return "/".join(str(len(st.kv_layers)) for st in plan.stages)


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(export_decoders.SPECS))
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--prefill-tokens", type=int, default=64)
    parser.add_argument("--decode-past", type=int, default=255)
    parser.add_argument("--runs", type=int, default=20, help="profiling runs per phase")
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds per stage and phase")
    args: argparse.Namespace = parser.parse_args(argv)
    shapes = {
        Phase.PREFILL: phase_shape(Phase.PREFILL, prefill_tokens=args.prefill_tokens),
        Phase.DECODE: phase_shape(Phase.DECODE, decode_past=args.decode_past),
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-decoders-") as tmp:
        for model in args.models:
            path = export_decoders.decoder(model)
            view = load_model(path)
            dec = find_decoder(view)
            assert dec is not None, f"{model} is no decoder"
            profiles = phase_profiles(
                view, ProfileOptions(runs=args.runs, warmup=3, threads=1), list(shapes.values())
            )
            feeds = {p: random_feeds(view, resolve_input_shapes(view, phase=s)) for p, s in shapes.items()}
            for k in args.stages:
                made = plans(view, profiles, dec, k)
                folders: dict[SplitKey, Path] = {}
                for kind, plan in made.items():
                    bounds = split_key(plan)
                    if bounds not in folders:
                        folders[bounds] = Path(tmp) / f"{model}-{k}-{kind}"
                        export_stages(view, plan, folders[bounds])
                timed: dict[SplitKey, dict[Phase, list[float]]] = {}
                for bounds, folder in folders.items():
                    manifest = load_manifest(folder)
                    sessions = [session(folder / st.file, 1) for st in manifest.stages]
                    timed[bounds] = {}
                    for phase in shapes:
                        inputs = stage_feeds(folder, feeds[phase], sessions)
                        variants = {
                            f"s{i}": (lambda s=s, x=x: s.run(None, x))
                            for i, (s, x) in enumerate(zip(sessions, inputs, strict=True))
                        }
                        times = time_interleaved(variants, rounds=args.rounds)
                        timed[bounds][phase] = [median(times[f"s{i}"]) for i in range(len(sessions))]
                for kind, plan in made.items():
                    bounds = split_key(plan)
                    row: dict[str, Any] = {
                        "model": model,
                        "k": k,
                        "split": kind,
                        "layers": layer_counts(plan),
                    }
                    for phase in shapes:
                        stage = timed[bounds][phase]
                        row[f"{phase.value}_max_over_mean"] = max(stage) / (sum(stage) / len(stage))
                        row[f"{phase.value}_stage_ms"] = [round(t * 1e3, 4) for t in stage]
                    rows.append(row)
    print_table(
        "max/mean of the stages' measured times (1.00 = perfect balance)",
        ["model", "K", "split", "layers", "prefill", "decode"],
        [
            [
                r["model"],
                r["k"],
                r["split"],
                r["layers"],
                f"{r['prefill_max_over_mean']:.2f}",
                f"{r['decode_max_over_mean']:.2f}",
            ]
            for r in rows
        ],
    )
    summary = {
        kind: {
            phase: max(r[f"{phase}_max_over_mean"] for r in rows if r["split"] == kind)
            for phase in ("prefill", "decode")
        }
        for kind in KINDS
    }
    summary_rows = [[k, f"{v['prefill']:.2f}", f"{v['decode']:.2f}"] for k, v in summary.items()]
    print_table("worst max/mean over the models and K", ["split", "prefill", "decode"], summary_rows)
    written = write_result(
        NAME,
        params_of(args, shapes={p.value: dataclasses.asdict(s) for p, s in shapes.items()}),
        rows,
        summary={"worst_max_over_mean": summary},
        out=args.out,
    )
    print(f"wrote {shown(written)}")
    return 0
