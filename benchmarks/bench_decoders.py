"""Decoder LLMs: stage balance at prefill and decode, splits balanced for either, both, or equal layers.

Each model (``tools/export_decoders.py``: random-weight Llama with grouped-query attention, Qwen2 and
GPT-2 with a KV cache, 8 layers; the ``*_small`` ones, about 25 MB of weights, can stay in a server
CPU's last-level cache when run back to back, ``llama_gqa_medium``'s 250 MB cannot, as a real LLM's
cannot) is profiled at the prefill shape
(``--prefill-tokens`` prompt tokens, no cache) and at the decode shape (one token after
``--decode-past`` cached ones).  For each K it is split five ways, all cutting only between layers:

* ``prefill``: balanced for the prefill profile; ``decode``: for the decode profile;
* ``both``: onnxpipe's default, the worse phase as close as possible to its own best split
  (:mod:`onnxpipe.planning.decoder_plan`);
* ``calibrated``: ``both`` after ``--calibrate`` (its stages timed at both shapes and each phase's costs
  corrected by them, :func:`onnxpipe.calibrate.loop.calibrate_phases`);
* ``equal``: equal layer counts, the embedding with the first layers and the LM head with the last: what
  Olive's SplitModel and ONNX Runtime GenAI's ``decoder-pipeline`` users get today.

Every split is exported and each stage is timed alone, at both shapes, in one run: every round runs each
stage of all the splits of a model and K once, in a new random order, for about a quarter of a second of
each stage in all (:func:`onnxpipe.calibrate.timing.timed_runs` rounds); the figure is max/mean of the
stages' median times (1.00 is perfect balance).  The ``both`` split is opened twice and its twin timed
with the rest: ``twin_spread`` (the largest difference between the two timings of one stage) is the
floor under any difference between splits this run can show.

The goal: ``both`` within 1.10 at each phase where layer granularity allows.  With K stages over L
layers it cannot always: 8 near-equal layers over 3 stages put 3 layers where the mean is 2.67 (1.125
before the embedding and the LM head even it out).  ``floor`` is what granularity allows, by the
calibrated costs: over every layer-aligned split, the least max/mean at prefill, at decode, and of the
worse of the two (``floor_both``); the goal applies where ``floor_both`` is within 1.10.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.common import (
    add_phase_arguments,
    benchmark_parser,
    median,
    params_of,
    phase_shapes,
    print_table,
    session,
    shown,
    time_interleaved,
    write_result,
)
from onnxpipe.calibrate.loop import calibrate_phases
from onnxpipe.calibrate.timing import timed_runs
from onnxpipe.core.choices import Ends, Phase
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.cost.profile import Profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.decoder import DecoderInfo, find_decoder
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest
from onnxpipe.partition import evaluate
from onnxpipe.planning.decoder_plan import decoder_stages, layer_plan, layer_sequences
from onnxpipe.planning.request import DecoderOptions
from onnxpipe.planning.stages import plan_from
from onnxpipe.planning.types import Plan
from tools import export_decoders

NAME = "decoders"
MODELS = ("llama_gqa_small", "qwen2_small", "gpt2_small", "llama_gqa_medium")
KINDS = ("prefill", "decode", "both", "calibrated", "equal")
GOAL = 1.10


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
    stages = decoder_stages(view, dec, layers.seq, part, options, prof)
    return plan_from(view, prof, part, stages, layers.seq.sizes, float("inf"))


def plans(view: ModelView, profiles: Mapping[Phase, Any], dec: DecoderInfo, k: int) -> dict[str, Plan]:
    options = DecoderOptions()
    pre, dec_prof = profiles[Phase.PREFILL], profiles[Phase.DECODE]
    return {
        "prefill": layer_plan(view, [(Phase.PREFILL, pre)], k, dec, options),
        "decode": layer_plan(view, [(Phase.DECODE, dec_prof)], k, dec, options),
        "both": layer_plan(view, [(Phase.PREFILL, pre), (Phase.DECODE, dec_prof)], k, dec, options),
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


def calibrated_plan(
    view: ModelView, profiles: Mapping[Phase, Profile], dec: DecoderInfo, k: int, rounds: int
) -> tuple[Plan, dict[Phase, Profile]]:
    """The ``both`` plan after ``rounds`` of calibration at both phases, and the corrected profiles."""

    def make(ps: Mapping[Phase | None, Profile]) -> Plan:
        both = [(Phase.PREFILL, ps[Phase.PREFILL]), (Phase.DECODE, ps[Phase.DECODE])]
        return layer_plan(view, both, k, dec, DecoderOptions())

    start: dict[Phase | None, Profile] = dict(profiles.items())
    done = calibrate_phases(view, start, make, rounds=rounds)
    return done.plan, {p: q for p, q in done.profiles.items() if p is not None}


def granularity_floor(
    view: ModelView, profiles: Mapping[Phase, Profile], dec: DecoderInfo, k: int
) -> dict[str, float]:
    """The least max/mean any layer-aligned ``k``-stage split reaches by ``profiles``' costs: at prefill,
    at decode, and of the worse phase (every split tried: a decoder has tens of layers, K a few)."""
    costs = {p.value: layer_sequences(view, q, dec).coarse_costs for p, q in profiles.items()}
    n = len(next(iter(costs.values())))
    floor = {"prefill": math.inf, "decode": math.inf, "both": math.inf}
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        worst = 0.0
        for phase, c in costs.items():
            stage = [sum(c[a:b]) for a, b in itertools.pairwise(bounds)]
            ratio = max(stage) / (sum(stage) / k)
            floor[phase] = min(floor[phase], ratio)
            worst = max(worst, ratio)
        floor["both"] = min(floor["both"], worst)
    return floor


TWIN = "twin"
"""The ``both`` split's files opened a second time and timed with the rest (see the module)."""


def time_splits(
    folders: Mapping[str, Path], feeds: Mapping[str, np.ndarray], rounds: int
) -> dict[str, list[float]]:
    """Median seconds of every stage of every split in ``folders`` at ``feeds``: each round runs every
    stage once, in a new random order."""
    variants: dict[str, Callable[[], object]] = {}
    for key, folder in folders.items():
        manifest = load_manifest(folder)
        sessions = [session(folder / st.file, 1) for st in manifest.stages]
        for i, (sess, x) in enumerate(zip(sessions, stage_feeds(folder, feeds, sessions), strict=True)):
            variants[f"{key}#{i}"] = functools.partial(sess.run, None, x)
    times = time_interleaved(variants, rounds=rounds)
    return {
        key: [median(times[f"{key}#{i}"]) for i in range(load_manifest(folder).k)]
        for key, folder in folders.items()
    }


def twin_spread(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest difference between two timings of one stage, over their mean."""
    return max(abs(x - y) / ((x + y) / 2) for x, y in zip(a, b, strict=True))


def split_key(plan: Plan) -> SplitKey:
    """What tells two splits apart: each stage's node count and layers (equal splits are timed once)."""
    return tuple((len(st.node_names), st.kv_layers) for st in plan.stages)


def layer_counts(plan: Plan) -> str:
    return "/".join(str(len(st.kv_layers)) for st in plan.stages)


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(export_decoders.SPECS))
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 3, 4])
    add_phase_arguments(parser)
    parser.add_argument("--runs", type=int, default=20, help="profiling runs per phase")
    parser.add_argument("--calibrate", type=int, default=2, help="calibration rounds of the calibrated split")
    args: argparse.Namespace = parser.parse_args(argv)
    shapes = phase_shapes(args)
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
                made["calibrated"], fixed = calibrated_plan(view, profiles, dec, k, args.calibrate)
                made = {kind: made[kind] for kind in KINDS}
                floor = granularity_floor(view, fixed, dec, k)
                exported: dict[SplitKey, Path] = {}
                for kind, plan in made.items():
                    bounds = split_key(plan)
                    if bounds not in exported:
                        exported[bounds] = Path(tmp) / f"{model}-{k}-{kind}"
                        export_stages(view, plan, exported[bounds])
                folders = {str(key): folder for key, folder in exported.items()}
                folders[TWIN] = exported[split_key(made["both"])]
                timed = {
                    phase: time_splits(folders, feeds[phase], timed_runs(profiles[phase].total_seconds / k))
                    for phase in shapes
                }
                both_key = str(split_key(made["both"]))
                spread = {p.value: twin_spread(t[both_key], t[TWIN]) for p, t in timed.items()}
                for kind, plan in made.items():
                    bounds = split_key(plan)
                    row: dict[str, Any] = {
                        "model": model,
                        "k": k,
                        "split": kind,
                        "layers": layer_counts(plan),
                        **{f"floor_{name}": value for name, value in floor.items()},
                        **{f"twin_spread_{name}": value for name, value in spread.items()},
                    }
                    for phase in shapes:
                        stage = timed[phase][str(bounds)]
                        row[f"{phase.value}_max_over_mean"] = max(stage) / (sum(stage) / len(stage))
                        row[f"{phase.value}_stage_ms"] = [round(t * 1e3, 4) for t in stage]
                    rows.append(row)
                print(
                    f"{model} K={k}: timed {len(exported)} distinct splits; the same stage twice differed "
                    f"by up to {spread['prefill']:.0%} at prefill, {spread['decode']:.0%} at decode",
                    flush=True,
                )
    print_table(
        "max/mean of the stages' measured times (1.00 = perfect balance); floor: what layer cuts allow",
        ["model", "K", "split", "layers", "prefill", "decode", "floor p/d/both"],
        [
            [
                r["model"],
                r["k"],
                r["split"],
                r["layers"],
                f"{r['prefill_max_over_mean']:.2f}",
                f"{r['decode_max_over_mean']:.2f}",
                f"{r['floor_prefill']:.2f}/{r['floor_decode']:.2f}/{r['floor_both']:.2f}",
            ]
            for r in rows
        ],
    )
    summary: dict[str, Any] = {
        kind: {
            phase: max(r[f"{phase}_max_over_mean"] for r in rows if r["split"] == kind)
            for phase in ("prefill", "decode")
        }
        for kind in KINDS
    }
    summary_rows = [[k, f"{v['prefill']:.2f}", f"{v['decode']:.2f}"] for k, v in summary.items()]
    print_table("worst max/mean over the models and K", ["split", "prefill", "decode"], summary_rows)
    goal = goal_cases(rows)
    for kind, cases in goal.items():
        met = sum(1 for c in cases if c["met"])
        print(
            f"goal ({kind} within {GOAL} at each phase where floor_both <= {GOAL}): {met}/{len(cases)} cases"
        )
    written = write_result(
        NAME,
        params_of(args, shapes={p.value: dataclasses.asdict(s) for p, s in shapes.items()}),
        rows,
        summary={"worst_max_over_mean": summary, "goal": goal},
        out=args.out,
    )
    print(f"wrote {shown(written)}")
    return 0


def goal_cases(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """For ``both`` and ``calibrated``: each model and K where layer granularity allows the goal, and
    whether the measured split met it at both phases."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in ("both", "calibrated"):
        out[kind] = [
            {
                "model": r["model"],
                "k": r["k"],
                "met": max(r["prefill_max_over_mean"], r["decode_max_over_mean"]) <= GOAL,
            }
            for r in rows
            if r["split"] == kind and r["floor_both"] <= GOAL
        ]
    return out
