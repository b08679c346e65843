"""The stages of splits load and run on OpenVINO and on tract wherever the whole model does, and equal
the whole model there; a chain mixing OpenVINO, onnxruntime and tract equals the model (issue 18).

Static splits (``split --static``) of the dynamic models, plain splits of the fixed-shape ones.  The
stages are compared with the whole model on the same runtime (a runtime may differ from onnxruntime on
the whole model already: OpenVINO's and tract's resize on the OCR detector), by the norm-relative
error of :func:`other_runtimes.relative_error`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from other_runtimes import (
    Runner,
    onnxruntime_runner,
    openvino_runner,
    relative_error,
    run_chain,
    tract_runner,
)

from onnxpipe.api import PlanRequest, SplitOptions, split
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import resolve_input_shapes
from onnxpipe.manifest import load_manifest

pytest.importorskip("openvino", reason="openvino is not installed (pip install -e '.[test]')")
pytest.importorskip("tract", reason="tract is not installed (pip install -e '.[test]')")

TOLERANCE = 1e-5
RUNNERS: dict[str, Callable[[], Runner]] = {"openvino": openvino_runner, "tract": tract_runner}


def split_and_feeds(model: Path, k: int, out: Path, static: bool) -> dict[str, np.ndarray]:
    opts = partial(SplitOptions, profile=ProfileOptions(cost="static"), verify=False, static=static)
    split(model, opts(out=out, plan=PlanRequest(k)))
    view = load_model(model)
    return random_feeds(view, resolve_input_shapes(view, None), seed=0)


def check_on_each_runtime(model: Path, k: int, tmp_path: Path, static: bool) -> list[str]:
    """Split, then per runtime: the whole model, and if it runs, the chained stages equal it."""
    out = tmp_path / "s"
    feeds = split_and_feeds(model, k, out, static)
    names = [o.name for o in ort.InferenceSession(str(model)).get_outputs()]
    inputs = [i.name for i in ort.InferenceSession(str(model)).get_inputs()]
    ran: list[str] = []
    for name, make in RUNNERS.items():
        runner = make()
        try:
            whole = dict(zip(names, runner(model, [feeds[i] for i in inputs]), strict=True))
        except Exception:  # noqa: BLE001 - the whole model does not run there: nothing to hold stages to
            continue
        chained = run_chain(out, feeds, [runner])
        for o in names:
            assert relative_error(whole[o], chained[o]) <= TOLERANCE, (name, o)
        ran.append(name)
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_sample_transformer(sample_models_dir: Path, tmp_path: Path, static: bool) -> None:
    assert check_on_each_runtime(sample_models_dir / "transformer_tiny.onnx", 3, tmp_path, static) == [
        "openvino",
        "tract",
    ]


@pytest.mark.slow
def test_mixed_chain_equals_the_model(sample_models_dir: Path, tmp_path: Path) -> None:
    """Stage 0 on OpenVINO, stage 1 on onnxruntime, stage 2 on tract, bound by output position."""
    model = sample_models_dir / "transformer_tiny.onnx"
    out = tmp_path / "s"
    feeds = split_and_feeds(model, 3, out, static=True)
    assert load_manifest(out).k == 3
    sess = ort.InferenceSession(str(model))
    expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = run_chain(out, feeds, [openvino_runner(), onnxruntime_runner(), tract_runner()])
    for name, value in expected.items():
        assert relative_error(value, got[name]) <= TOLERANCE, name


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "k"),
    [
        pytest.param("inception_v2", 4, marks=pytest.mark.exhaustive),
        pytest.param("resnet50", 3, marks=pytest.mark.exhaustive),
        ("squeezenet", 3),
    ],
)
def test_light_models(name: str, k: int, light_model: Callable[[str], Path], tmp_path: Path) -> None:
    assert check_on_each_runtime(light_model(name), k, tmp_path, static=False)


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(
    ("fixture", "static"),
    [
        pytest.param("nudenet_path", True, marks=pytest.mark.exhaustive),
        ("rapidocr_cls_path", False),
        pytest.param("rapidocr_det_path", False, marks=pytest.mark.exhaustive),
    ],
)
def test_registry_models(fixture: str, static: bool, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    assert check_on_each_runtime(request.getfixturevalue(fixture), 3, tmp_path, static)


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(
    "fixture", [pytest.param("gpt2_tiny_path", marks=pytest.mark.exhaustive), "bert_tiny_dynamo_path"]
)
def test_torch_exports_static(fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Static splits of the torch exports: every stage runs on both (tract cannot take the dynamic
    bert's whole model at concrete input facts, its static copy it can)."""
    model = request.getfixturevalue(fixture)
    assert check_on_each_runtime(model, 3, tmp_path, static=True) in (["openvino", "tract"], ["openvino"])
