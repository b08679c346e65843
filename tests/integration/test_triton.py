"""``export-triton``: a Triton model repository from a split folder, parsed with tritonclient's own
``ModelConfig`` protobuf and its ensemble's data flow checked (no server runs here) (issue 18)."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from onnxpipe.api import PlanRequest, SplitOptions, TritonOptions, split
from onnxpipe.cluster.model import Cluster, Device, Link
from onnxpipe.core.choices import Runtime, TritonPlatform
from onnxpipe.core.errors import ExportError
from onnxpipe.core.runtime_kinds import EngineConfig
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.export.triton import (
    TritonStep,
    check_data_flow,
    export_triton,
    model_config_module,
    parse_config,
    plan_repository,
    repository_notes,
)
from onnxpipe.manifest import load_manifest

pb = model_config_module()
if pb is None:
    pytest.skip("tritonclient is not installed (pip install -e '.[test]')", allow_module_level=True)


@pytest.fixture(scope="module")
def transformer_split(tmp_path_factory: pytest.TempPathFactory, sample_models_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("triton") / "s"
    split(
        sample_models_dir / "transformer_tiny.onnx",
        SplitOptions(out=out, plan=PlanRequest(3), profile=ProfileOptions(cost="static"), verify=False),
    )
    return out


def parsed(repo: Path) -> dict[str, Any]:
    return {d.name: parse_config(pb, (d / "config.pbtxt").read_text()) for d in repo.iterdir()}


def flow_of_parsed(configs: dict[str, Any], ensemble: str) -> None:
    """The data-flow check again, on what tritonclient parsed from the files."""
    top = configs[ensemble]
    assert top.platform == "ensemble"
    types = {t.name: t.data_type for t in top.input}
    for step in top.ensemble_scheduling.step:
        model = configs[step.model_name]
        own_in = {t.name: t.data_type for t in model.input}
        own_out = {t.name: t.data_type for t in model.output}
        assert set(step.input_map) == set(own_in)
        for key, value in step.input_map.items():
            assert types[value] == own_in[key], (step.model_name, key)
        for key, value in step.output_map.items():
            assert value not in types
            types[value] = own_out[key]
    for t in top.output:
        assert types[t.name] == t.data_type


def test_repository_parses_and_flows(transformer_split: Path, tmp_path: Path) -> None:
    repo = export_triton(transformer_split, TritonOptions(tmp_path / "repo"))
    assert repo.parsed
    configs = parsed(tmp_path / "repo")
    manifest = load_manifest(transformer_split)
    assert set(configs) == {"transformer_tiny", *(f"transformer_tiny_stage{i}" for i in range(3))}
    flow_of_parsed(configs, "transformer_tiny")
    for st in manifest.stages:
        config = configs[f"transformer_tiny_stage{st.index}"]
        assert config.platform == "onnxruntime_onnx"
        assert [t.name for t in config.output] == [t.name for t in st.outputs]  # order is normative
        copied = tmp_path / "repo" / config.name / "1" / "model.onnx"
        assert copied.read_bytes() == (transformer_split / st.file).read_bytes()
    batched = all(t.batch_axis == 0 for st in manifest.stages for t in (*st.inputs, *st.outputs))
    assert configs["transformer_tiny"].max_batch_size == (8 if batched else 0)


def test_fixed_shapes_give_no_batching_and_full_dims(sample_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    opts = partial(SplitOptions, profile=ProfileOptions(cost="static"), verify=False, static=True)
    split(sample_models_dir / "mlp.onnx", opts(out=out, plan=PlanRequest(2)))
    repo = export_triton(out, TritonOptions(tmp_path / "repo", platform="openvino", name="m"))
    configs = parsed(tmp_path / "repo")
    assert configs["m"].max_batch_size == 0
    assert any(
        "max_batch_size 0 instead of 8: " in n and "'x'" in n and "no batch at axis 0" in n
        for n in repo.notes
    )
    assert list(configs["m"].input[0].dims) == [1, 64]
    assert configs["m_stage0"].backend == "openvino"
    assert configs["m_stage0"].default_model_filename == "model.onnx"
    flow_of_parsed(configs, "m")


def test_the_data_flow_check_catches_a_broken_ensemble(transformer_split: Path) -> None:
    models = plan_repository(load_manifest(transformer_split), "t", "auto", 8)
    top, stages = models[0], models[1:]
    check_data_flow(top, stages)
    first = top.steps[1]
    unmade = TritonStep(first.model, tuple((k, "nowhere") for k, _ in first.input_map), first.output_map)
    with pytest.raises(ExportError, match="which nothing before it makes"):
        check_data_flow(dataclasses.replace(top, steps=(top.steps[0], unmade, *top.steps[2:])), stages)
    with pytest.raises(ExportError, match="made by no step"):
        check_data_flow(dataclasses.replace(top, steps=top.steps[:-1]), stages)
    wrong = dataclasses.replace(
        stages[1], inputs=tuple(dataclasses.replace(t, data_type="TYPE_FP16") for t in stages[1].inputs)
    )
    with pytest.raises(ExportError, match=r"reads .* as TYPE_FP16"):
        check_data_flow(top, [stages[0], wrong, *stages[2:]])


def test_an_existing_folder_needs_force(transformer_split: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "file.txt").write_text("keep")
    with pytest.raises(ExportError, match="not empty"):
        export_triton(transformer_split, TritonOptions(other))
    with pytest.raises(ExportError, match="not a Triton repository"):
        export_triton(transformer_split, TritonOptions(other, force=True))
    assert (other / "file.txt").read_text() == "keep"
    export_triton(transformer_split, TritonOptions(tmp_path / "repo"))
    export_triton(transformer_split, TritonOptions(tmp_path / "repo", force=True, name="again"))
    assert {p.name for p in (tmp_path / "repo").iterdir()} == {
        "again",
        *(f"again_stage{i}" for i in range(3)),
    }


def test_auto_platform_follows_each_devices_runtime(transformer_split: Path) -> None:
    """A stage whose device runs OpenVINO (the devices file's ``runtime``) gets the openvino backend;
    the others, tract's included (Triton has no tract backend), onnxruntime_onnx."""
    manifest = load_manifest(transformer_split)
    kinds = [Runtime.ONNXRUNTIME, Runtime.OPENVINO, Runtime.TRACT]
    devices = tuple(Device(name=f"d{i}", engine=EngineConfig(runtime=kind)) for i, kind in enumerate(kinds))
    stages = tuple(dataclasses.replace(st, device=f"d{st.index}") for st in manifest.stages)
    cluster = Cluster(devices=devices, links=(Link(), Link()))
    on_devices = dataclasses.replace(manifest, stages=stages, cluster=cluster)
    models = plan_repository(on_devices, "t", "auto", 8)
    (said,) = [n for n in repository_notes(on_devices, TritonPlatform.AUTO, 8) if "tract" in n]
    assert said.startswith("stage(s) 2 run on tract") and "onnxruntime_onnx serves them" in said
    assert [(m.platform, m.backend) for m in models[1:]] == [
        ("onnxruntime_onnx", None),
        (None, "openvino"),
        ("onnxruntime_onnx", None),
    ]
    for m in models:
        parse_config(pb, m.to_pbtxt())
