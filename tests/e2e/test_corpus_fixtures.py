"""Each real-model fixture yields a model that loads, checks and runs; torch exports match torch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.external_data_helper import uses_external_data

from tools import corpus as corpus_module

REGISTRY_FIXTURES = [
    "rapidocr_det_path", "rapidocr_rec_path", "rapidocr_cls_path", "nudenet_path", "silero_vad_path",
]  # fmt: skip
TORCH_FIXTURES = [
    "gpt2_tiny_path", "gpt2_tiny_dynamo_path", "bert_tiny_path", "bert_tiny_dynamo_path",
    "minilm_l6_path", "minilm_l6_dynamo_path", "gpt2_tiny_mask_path", "gpt2_tiny_mask_dynamo_path",
]  # fmt: skip


def _check(path: Path) -> onnx.ModelProto:
    assert path.is_file(), path
    onnx.checker.check_model(str(path), full_check=True)  # by path: follows external data
    model = onnx.load(path, load_external_data=False)
    assert len(model.graph.node) > 0
    return model


@pytest.mark.corpus
@pytest.mark.parametrize("fixture", [*REGISTRY_FIXTURES, "iris_path"])
def test_fixture_model_loads_and_checks(fixture: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(fixture)
    _check(path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.corpus
def test_rapidocr_and_nudenet_run(rapidocr_det_path: Path, nudenet_path: Path) -> None:
    image = np.random.default_rng(0).random((1, 3, 64, 96), dtype=np.float32)
    for path in (rapidocr_det_path, nudenet_path):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs = sess.run(None, {sess.get_inputs()[0].name: image})
        assert all(np.isfinite(o).all() for o in outs)


@pytest.mark.corpus
@pytest.mark.parametrize("name", corpus_module.onnx_light_names())
def test_light_models(name: str, light_model: Callable[[str], Path]) -> None:
    model = _check(light_model(name))
    assert model.ir_version == 3


def test_light_names_include_the_documented_ones(corpus: ModuleType) -> None:
    assert {"resnet50", "densenet121", "inception_v2", "squeezenet"} <= set(corpus.onnx_light_names())
    with pytest.raises(ValueError, match="resnet50"):
        corpus.onnx_light("resnet51")


def test_unreachable_registry_raises_corpus_unavailable(
    corpus: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured indexes or local mirrors
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(corpus.CorpusUnavailable, match=r"pip download nudenet==3\.4\.2 failed"):
        corpus.nudenet()
    assert not list(tmp_path.rglob("*.onnx")) and not list(tmp_path.rglob("*.whl"))


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(  # MiniLM, the largest export, in the exhaustive lane only
    "fixture", [pytest.param(f, marks=pytest.mark.exhaustive) if "minilm" in f else f for f in TORCH_FIXTURES]
)
def test_torch_export_matches_torch(
    fixture: str, request: pytest.FixtureRequest, export_transformers: ModuleType
) -> None:
    path: Path = request.getfixturevalue(fixture)
    model = _check(path)
    name = fixture.removesuffix("_path").removesuffix("_dynamo")
    spec = export_transformers.SPECS[name]
    dynamo = fixture.endswith("_dynamo_path")
    external = [t.name for t in model.graph.initializer if uses_external_data(t)]
    if dynamo:
        assert path.with_name(path.name + ".data").is_file()
        assert external, "the dynamo export should keep its weights in the .data file"
    else:
        assert not external and not path.with_name(path.name + ".data").exists()
        assert model.opset_import[0].version == export_transformers.TORCHSCRIPT_OPSET

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == list(spec.input_names)
    assert [i.shape[:2] for i in sess.get_inputs()] == [["batch", "seq"]] * len(spec.input_names)
    torch_model = export_transformers.build_torch_model(name)
    for batch, seq in [(2, 16), (1, 1), (3, 37)]:
        feeds = export_transformers.example_inputs(name, batch, seq, seed=seq)
        expected = export_transformers.torch_outputs(name, feeds, torch_model)
        got = sess.run(list(spec.output_names), feeds)
        for g, e, out_name in zip(got, expected, spec.output_names, strict=True):
            assert g.shape == e.shape, out_name
            np.testing.assert_allclose(
                g, e, atol=1e-4, rtol=1e-4, err_msg=f"{fixture} {out_name} {batch}x{seq}"
            )
