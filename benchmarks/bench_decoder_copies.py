"""Decoders: bytes crossing each cut with rotary tables and masks made in each stage, against sent.

Each model (the tiny exports in ``sample_models/decoders/`` by default) is profiled at the prefill shape
(``--prefill-tokens`` prompt tokens, no cache) and at the decode shape (one token after ``--decode-past``
cached), and split with the default two-phase balance at each K and each ``--bandwidths`` (``inf``: no
bandwidth given) twice, in one run, on the same profiles: with the stages
making their rotary tables and masks of the model inputs where the plan's rule finds that cheaper
(:mod:`onnxpipe.planning.decoder_recompute`, the default) and with them sent (``copy_inputs=False``, what
onnxpipe did before).  With a bandwidth the two may cut at different layers (the partitioner knows what
the stages will copy); the layers per stage are reported.  Per cut: the bytes of the tensors made before
it and read after it (model inputs and the cache never cross), at each phase's shapes; per stage, the
plan's estimated time at each phase, and the plan's estimated bottleneck.

With ``--time`` both splits are exported and each stage is timed alone at both shapes, the stages of
the two splits interleaved in a random order each round (``--rounds``): the measured stage times
before and after (the copies' cost, where it shows).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from collections.abc import Mapping, Sequence
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
from onnxpipe.core.choices import Phase
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.phases import phase_profiles
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.decoder import find_decoder
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.decoder_plan import layer_plan
from onnxpipe.planning.request import DecoderOptions
from onnxpipe.planning.sequences import tensor_sizes
from onnxpipe.planning.types import Plan
from tools import export_decoders

NAME = "decoder_copies"
ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama_gqa", "qwen2", "gpt2")


def crossing_bytes(view: ModelView, plan: Plan, sizes: Mapping[str, int]) -> list[int]:
    """Per cut (in front of stages 1 .. K-1): bytes of the tensors an earlier stage makes and a stage
    at or after the cut receives, each counted once."""
    stage_of = {n: st.index for st in plan.stages for n in st.node_names}

    def made_in(t: str) -> int:
        pos = view.producer.get(t)
        return stage_of.get(view.nodes[pos].name, -1) if pos is not None else -1

    out: list[int] = []
    for c in range(1, plan.k):
        crossing = {t for st in plan.stages[c:] for t in st.inputs if 0 <= made_in(t) < c}
        out.append(sum(int(sizes.get(t, 0)) for t in crossing))
    return out


def stage_feeds(
    folder: Path, feeds: Mapping[str, np.ndarray], sessions: Sequence[ort.InferenceSession]
) -> list[dict[str, np.ndarray]]:
    """Each stage's inputs for ``feeds``, from running the stages once in order."""
    values: dict[str, Any] = dict(feeds)
    out: list[dict[str, np.ndarray]] = []
    for sess in sessions:
        mine = {i.name: values[i.name] for i in sess.get_inputs()}
        out.append(mine)
        values.update(zip([o.name for o in sess.get_outputs()], sess.run(None, mine), strict=True))
    return out


def _model_path(model: str) -> Path:
    """A file, a tiny sample decoder by name, or a ``tools/export_decoders.py`` model (``*_small``) from
    the corpus cache (exported there if missing)."""
    if model.endswith(".onnx"):
        return Path(model)
    sample = ROOT / "sample_models" / "decoders" / f"{model}.onnx"
    return sample if sample.is_file() else export_decoders.decoder(model)


def _label(bandwidth: float) -> str:
    return "free" if math.isinf(bandwidth) else f"{bandwidth * 8 / 1e6:g} Mbit/s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchmark_parser(__name__, __doc__)
    parser.add_argument(
        "--models", nargs="+", default=list(MODELS), help="names in sample_models/decoders, or .onnx files"
    )
    parser.add_argument("--stages", nargs="+", type=int, default=[3])
    parser.add_argument(
        "--bandwidths", nargs="+", type=float, default=[math.inf, 125_000_000.0, 12_500_000.0]
    )
    add_phase_arguments(parser)
    parser.add_argument("--runs", type=int, default=10, help="profiling runs per phase")
    parser.add_argument("--time", action="store_true", help="also time each exported stage alone")
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds per stage and phase")
    args: argparse.Namespace = parser.parse_args(argv)
    shapes = phase_shapes(args)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-decoder-copies-") as tmp:
        for model in args.models:
            path = _model_path(model)
            view = load_model(path)
            model = path.stem
            dec = find_decoder(view)
            assert dec is not None, f"{model} is no decoder"
            profiles = phase_profiles(
                view, ProfileOptions(runs=args.runs, warmup=3, threads=1), list(shapes.values())
            )
            sizes = {p: tensor_sizes(view, profiles[p]) for p in shapes}
            feeds = {p: random_feeds(view, resolve_input_shapes(view, phase=s)) for p, s in shapes.items()}
            for k in args.stages:
                for bandwidth in args.bandwidths:
                    made = {
                        way: layer_plan(
                            view,
                            [
                                (Phase.PREFILL, profiles[Phase.PREFILL]),
                                (Phase.DECODE, profiles[Phase.DECODE]),
                            ],
                            k,
                            dec,
                            DecoderOptions(copy_inputs=way == "copied"),
                            bandwidth_bytes_per_s=bandwidth,
                        )
                        for way in ("sent", "copied")
                    }
                    measured = _timed(view, made, feeds, Path(tmp) / f"{model}-{k}-{bandwidth:g}", args)
                    row: dict[str, Any] = {"model": model, "k": k, "bandwidth": _label(bandwidth)}
                    for way, plan in made.items():
                        row[f"layers_{way}"] = "/".join(str(len(st.kv_layers)) for st in plan.stages)
                        row[f"estimated_bottleneck_ms_{way}"] = round(plan.bottleneck_seconds * 1e3, 4)
                    for phase in shapes:
                        for way, plan in made.items():
                            row[f"{phase.value}_cut_bytes_{way}"] = crossing_bytes(view, plan, sizes[phase])
                            row[f"{phase.value}_estimated_stage_ms_{way}"] = [
                                round(dict(st.phase_seconds)[phase.value] * 1e3, 4) for st in plan.stages
                            ]
                            if measured:
                                row[f"{phase.value}_measured_stage_ms_{way}"] = [
                                    round(t * 1e3, 4) for t in measured[way][phase]
                                ]
                    row["copied_tensors"] = [list(st.recomputed_tensors) for st in made["copied"].stages]
                    rows.append(row)
    table: list[list[object]] = []
    for r in rows:
        for c in range(r["k"] - 1):
            line: list[object] = [
                r["model"],
                r["k"],
                r["bandwidth"],
                f"{r['layers_sent']} {r['layers_copied']}",
            ]
            line.append(c + 1)
            for name in ("prefill", "decode"):
                before, after = r[f"{name}_cut_bytes_sent"][c], r[f"{name}_cut_bytes_copied"][c]
                ratio = f" ({after / before:.2f})" if before else ""
                line.append(f"{before} -> {after}{ratio}")
            table.append(line)
    print_table(
        "bytes crossing each cut per step: sent -> made in each stage (after/before)",
        ["model", "K", "bandwidth", "layers", "cut", f"prefill {args.prefill_tokens} tokens", "decode"],
        table,
    )
    worst = {
        name: max(
            r[f"{name}_cut_bytes_copied"][c] / r[f"{name}_cut_bytes_sent"][c]
            for r in rows
            for c in range(r["k"] - 1)
            if r[f"{name}_cut_bytes_sent"][c]
        )
        for name in ("prefill", "decode")
    }
    written = write_result(
        NAME,
        params_of(args, shapes={p.value: dataclasses.asdict(s) for p, s in shapes.items()}),
        rows,
        summary={"worst_cut_bytes_after_over_before": worst},
        out=args.out,
    )
    print(f"wrote {shown(written)}")
    return 0


def _timed(
    view: ModelView,
    made: Mapping[str, Plan],
    feeds: Mapping[Phase, Mapping[str, np.ndarray]],
    folder: Path,
    args: argparse.Namespace,
) -> dict[str, dict[Phase, list[float]]]:
    """Each split's stages timed alone at each phase, all of them interleaved (empty without --time)."""
    if not args.time:
        return {}
    sessions: dict[str, list[ort.InferenceSession]] = {}
    folders: dict[str, Path] = {}
    for way, plan in made.items():
        folders[way] = folder / way
        export_stages(view, plan, folders[way])
        manifest = load_manifest(folders[way])
        sessions[way] = [session(folders[way] / st.file, 1) for st in manifest.stages]
    out: dict[str, dict[Phase, list[float]]] = {way: {} for way in made}
    for phase, phase_feeds in feeds.items():
        variants = {}
        for way, ss in sessions.items():
            inputs = stage_feeds(folders[way], phase_feeds, ss)
            for i, (s, x) in enumerate(zip(ss, inputs, strict=True)):
                variants[f"{way}{i}"] = lambda s=s, x=x: s.run(None, x)
        times = time_interleaved(variants, rounds=args.rounds)
        for way, ss in sessions.items():
            out[way][phase] = [median(times[f"{way}{i}"]) for i in range(len(ss))]
    return out
