"""Every stage of every corpus split runs on tract and on OpenVINO wherever the whole model does, and no
value made of shapes alone crosses a cut unless the plan's notes name it (issue 31).

The sweep: each corpus model split into 2 to 6 stages with static costs, and into 2 and 4 with costs
measured once (one timed run: the costs only place the cuts; not for the three :data:`STATIC_ONLY` models);
the :data:`HEAVY` CNNs into 2 and 5 with static costs and 2 with measured ones.  Exported without
verification.  The model runs whole once per runtime at small inputs (the sizes a split chooses: batch 1,
sequences of 16, images of 64, or what the model runs at, :func:`onnxpipe.cost.runnable.runnable_shapes`);
where it runs, each split's stages are chained on that runtime, every stage run once, and the chain's
outputs are held to the whole model's on the same runtime where that agrees with onnxruntime (tract's and
OpenVINO's resize differ on the OCR detector, and a cut can move tract's result there too: there the stages
must run).  A stage file that two splits share (the same bytes, as the first stages of two counts often are)
is run once.  What crosses a cut is read off the manifests and held to a test's own analysis of what is made
of shapes (:func:`other_runtimes.made_of_shapes`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from other_runtimes import (
    Runner,
    made_of_shapes,
    onnxruntime_runner,
    openvino_runner,
    relative_error,
    tract_runner,
)

from onnxpipe.api import PlanRequest, SplitOptions, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.runnable import runnable_shapes
from onnxpipe.cost.source import get_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.static import freeze_shapes
from onnxpipe.manifest import Manifest, load_manifest
from tools import corpus

pytest.importorskip("openvino", reason="openvino is not installed (pip install -e '.[test]')")
pytest.importorskip("tract", reason="tract is not installed (pip install -e '.[test]')")

pytestmark = [pytest.mark.corpus, pytest.mark.slow]

STATIC_COUNTS = (2, 3, 4, 5, 6)
MEASURED_COUNTS = (2, 4)
STATIC_ONLY = frozenset({"light_vgg19", "light_zfnet512", "light_bvlc_alexnet"})
"""Split with static costs only: profiling them alone takes 5-17 s (fully connected layers of up to 400 MB
made by ``ConstantOfShape`` at 224x224), and they are plain chains of layers with nothing made of shapes,
so a measured cut exercises nothing a static one does not."""
HEAVY = frozenset({*STATIC_ONLY, "light_densenet121", "light_inception_v2", "light_resnet50"})
"""The corpus's heaviest CNNs (each whole run on tract or OpenVINO takes seconds at 224x224, and a split
runs the whole model again stage by stage): split at :data:`HEAVY_COUNTS` only.  Their layers are plain
chains or blocks whose cuts carry activations alone, so each further count repeats a boundary of a kind
already run; the lighter CNNs and the other models take every count."""
HEAVY_COUNTS = (2, 5)
TOLERANCE = 1e-4
RUNNERS: dict[str, Callable[[], Runner]] = {"tract": tract_runner, "openvino": openvino_runner}

TORCH = ("gpt2_tiny", "gpt2_tiny_mask", "bert_tiny", "minilm_l6")
MODELS = [
    *(f"light_{n}" for n in corpus.onnx_light_names()),
    "iris",
    "rapidocr_det",
    "rapidocr_rec",
    "rapidocr_cls",
    "nudenet",
    "silero_vad",
    *(f"{n}{d}" for n in TORCH for d in ("", "_dynamo")),
]

FAST = frozenset({"light_squeezenet", "silero_vad"})
"""The models of the fast lane (a CNN on both runtimes; Silero VAD's static split); the exhaustive lane runs
every one."""


def _lanes(names: Iterable[str]) -> list[object]:
    return [pytest.param(n, marks=() if n in FAST else pytest.mark.exhaustive) for n in names]


def _model(name: str, request: pytest.FixtureRequest) -> Path:
    if name.startswith("light_"):
        light: Callable[[str], Path] = request.getfixturevalue("light_model")
        return light(name.removeprefix("light_"))
    path: Path = request.getfixturevalue("iris_path" if name == "iris" else f"{name}_path")
    return path


@dataclass
class _Runtime:
    """One runtime's chain over every split of a model: the stages it ran, by file hash."""

    name: str
    run: Runner
    whole: Mapping[str, np.ndarray] | None
    """The whole model's outputs there, which the chain must give; None where they differ from
    onnxruntime's already (tract's and OpenVINO's resize on the OCR detector): the stages must run."""
    done: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def chain(self, folder: Path, manifest: Manifest, feeds: Mapping[str, np.ndarray]) -> Iterator[str]:
        """Run the split's stages in turn; yield what went wrong (nothing when all ran and agree)."""
        values: dict[str, np.ndarray] = dict(feeds)
        for st in manifest.stages:
            if st.sha256 not in self.done:
                try:
                    self.done[st.sha256] = self.run(folder / st.file, [values[i.name] for i in st.inputs])
                except Exception as e:  # noqa: BLE001 - the failure is the finding
                    why = str(e).splitlines()[0][:300]
                    yield f"{folder.name} stage {st.index} fails in {self.name}: {why}"
                    return
            values.update(zip((o.name for o in st.outputs), self.done[st.sha256], strict=True))
        for name, expected in (self.whole or {}).items():
            error = relative_error(expected, values[name])
            if not error <= TOLERANCE:
                yield f"{folder.name}: {name} differs from the whole model in {self.name} by {error:.2g}"


def _runtimes(model: Path, feeds: Mapping[str, np.ndarray]) -> list[_Runtime]:
    """The runtimes that run the whole model, with its outputs there where they agree with onnxruntime's."""
    proto = onnx.load(model, load_external_data=False)
    inputs = [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}]
    outputs = [o.name for o in proto.graph.output]
    reference = onnxruntime_runner()(model, [feeds[i] for i in inputs])
    found = []
    for name, make in RUNNERS.items():
        run = make()
        try:
            whole = run(model, [feeds[i] for i in inputs])
        except Exception:  # noqa: BLE001 - the whole model does not run there: nothing to hold stages to
            continue
        agrees = all(relative_error(r, w) <= TOLERANCE for r, w in zip(reference, whole, strict=True))
        found.append(_Runtime(name, run, dict(zip(outputs, whole, strict=True)) if agrees else None))
    return found


def _named(notes: tuple[str, ...]) -> set[tuple[int, str]]:
    """``(stage, tensor)`` for each value the plan's notes say still crosses a cut ("stage 3 receives a,
    b; stage 5 receives c (why ...)")."""
    found: set[tuple[int, str]] = set()
    for note in notes:
        if "still cross a cut: " not in note:
            continue
        listed = note.split("still cross a cut: ", 1)[1].split(" (", 1)[0]
        for part in listed.split("; "):
            stage, _, names = part.removeprefix("stage ").partition(" receives ")
            found.update((int(stage), n) for n in names.split(", "))
    return found


def _crossing(manifest: Manifest, shaped: frozenset[str], notes: tuple[str, ...]) -> Iterator[str]:
    """Values made of shapes that a stage receives and no note names."""
    named = _named(notes)
    for st in manifest.stages:
        for t in st.inputs:
            if t.name in shaped and (st.index, t.name) not in named:
                yield f"stage {st.index} of {manifest.plan.k} receives {t.name}, made of shapes, unnamed"


@pytest.mark.parametrize("name", _lanes(MODELS))
def test_every_stage_runs_where_the_model_does(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model = _model(name, request)
    view = load_model(model)
    shapes = runnable_shapes(view).shapes
    feeds = random_feeds(view, shapes, seed=0)
    runtimes = _runtimes(model, feeds)
    shaped = made_of_shapes(onnx.load(model, load_external_data=False))
    problems: list[str] = []
    counts = HEAVY_COUNTS if name in HEAVY else STATIC_COUNTS
    splits = [(ProfileOptions(cost="static", shapes=shapes), k) for k in counts]
    if name not in STATIC_ONLY:
        measured = get_profile(view, ProfileOptions(cost="profile", shapes=shapes, runs=1, warmup=0))
        splits += [
            (ProfileOptions(saved=measured), k) for k in MEASURED_COUNTS[: 1 if name in HEAVY else None]
        ]
    for costs, k in splits:
        if k > len(view.compute_nodes):
            continue
        out = tmp_path / f"{costs.cost}-{k}"
        result = split(view, SplitOptions(out=out, plan=PlanRequest(k), profile=costs, verify=False))
        manifest = load_manifest(out)
        problems += _crossing(manifest, shaped, result.plan.notes)
        for runtime in runtimes:
            problems += runtime.chain(out, manifest, feeds)
        shutil.rmtree(out)
    assert not problems, "\n".join(problems)


FROZEN = ("silero_vad", "nudenet", *(f"{n}_dynamo" for n in TORCH))
"""The models tract or OpenVINO cannot run whole at dynamic shapes (control flow on shapes, dims their
inference cannot follow): their static splits (``split --static``) are held to the frozen model."""
FROZEN_COUNTS = (2, 4, 6)


@pytest.mark.parametrize("name", _lanes(FROZEN))
def test_static_split_stages_run_where_the_frozen_model_does(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Silero VAD's static stages (its ``If`` nodes on shapes replaced by their branches) and the
    dynamo exports' run on both runtimes, as their frozen models do."""
    model = _model(name, request)
    view = load_model(model)
    shapes = runnable_shapes(view).shapes
    feeds = random_feeds(view, shapes, seed=0)
    frozen = tmp_path / "frozen.onnx"
    onnx.save(freeze_shapes(onnx.load(model), shapes)[0], frozen)
    runtimes = _runtimes(frozen, feeds)
    assert [r.name for r in runtimes] == list(RUNNERS)
    problems: list[str] = []
    for k in FROZEN_COUNTS:
        out = tmp_path / f"static-{k}"
        costs = ProfileOptions(cost="static", shapes=shapes)
        split(view, SplitOptions(out=out, plan=PlanRequest(k), profile=costs, static=True, verify=False))
        manifest = load_manifest(out)
        for runtime in runtimes:
            problems += runtime.chain(out, manifest, feeds)
    assert not problems, "\n".join(problems)
