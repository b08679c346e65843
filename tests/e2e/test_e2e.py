"""End to end: real models through the public API, and every property a split folder promises.

Each model is split into 2, 3 and 4 stages with :func:`onnxpipe.split` (measured costs for the models that
profile in about a second, static costs for the onnx light CNNs, whose profiling takes ~10 s; one slow test
profiles ResNet-50 all the same), and the folder is checked against the source:

* every stage file passes ``onnx.checker.check_model(full_check=True)`` and keeps the opsets and IR version;
* the chained stages reproduce the model (the verify report is ok), also at shapes other than the profiled
  ones for models with dynamic dims;
* every compute node of the source is in exactly one stage (cheap constants may be copied);
* stage files use only the source's tensor names, and their inputs/outputs are the manifest's;
* symbolic dims of boundary tensors stay symbolic (same ``dim_param``) in the stage files and the manifest;
* the manifest loads, validates its files' hashes, round-trips through JSON and agrees with the plan.

No timing is asserted anywhere.
"""

from __future__ import annotations

import collections
import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest

import onnxpipe
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions, VerifyOptions
from onnxpipe.cli import main
from onnxpipe.export.build import ALIAS_NODE_PREFIX, SHAPE_NODE_PREFIX
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import MODEL, MODEL_INPUT, Manifest, load_manifest

SAMPLES = ("mlp", "resnet_tiny", "transformer_tiny")
KS = (2, 3, 4)


# --------------------------------------------------------------------------------------------------
# models: (name, how to get the path, cost source, input shapes for a second verify at other sizes)


def _light(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        path: Path = request.getfixturevalue("light_model")(name)
        return path

    return get


def _fixture(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        path: Path = request.getfixturevalue(name)
        return path

    return get


def _sample(name: str) -> Callable[[pytest.FixtureRequest], Path]:
    def get(request: pytest.FixtureRequest) -> Path:
        return Path(request.getfixturevalue("sample_models_dir")) / f"{name}.onnx"

    return get


Shapes = Mapping[str, Sequence[int]] | None
TEXT = {"input_ids": (3, 21)}
BERT = {"input_ids": (2, 19), "attention_mask": (2, 19)}

MODELS: dict[str, tuple[Callable[[pytest.FixtureRequest], Path], str, Shapes]] = {
    "mlp": (_sample("mlp"), "profile", {"x": (5, 64)}),
    "resnet_tiny": (_sample("resnet_tiny"), "profile", {"image": (3, 3, 32, 32)}),
    "transformer_tiny": (_sample("transformer_tiny"), "profile", {"tokens": (2, 23)}),
    "light_resnet50": (_light("resnet50"), "static", None),
    "light_inception_v2": (_light("inception_v2"), "static", None),
    "rapidocr_det": (_fixture("rapidocr_det_path"), "profile", {"x": (1, 3, 96, 160)}),
    "rapidocr_rec": (_fixture("rapidocr_rec_path"), "profile", {"x": (2, 3, 48, 120)}),
    "rapidocr_cls": (_fixture("rapidocr_cls_path"), "profile", None),
    "gpt2_tiny": (_fixture("gpt2_tiny_path"), "profile", TEXT),
    "gpt2_tiny_dynamo": (_fixture("gpt2_tiny_dynamo_path"), "profile", TEXT),
    "bert_tiny": (_fixture("bert_tiny_path"), "profile", BERT),
    "bert_tiny_dynamo": (_fixture("bert_tiny_dynamo_path"), "static", BERT),
    "nudenet": (_fixture("nudenet_path"), "profile", {"images": (1, 3, 96, 128)}),
}
# real third-party models need the corpus cache (or the registry) or torch; the sample models need nothing
CORPUS = {name for name in MODELS if name not in SAMPLES}


# --------------------------------------------------------------------------------------------------
# checks of a split folder against its source


def _dims(vi: onnx.ValueInfoProto) -> tuple[Any, ...] | None:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    return tuple(
        d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
        for d in t.shape.dim
    )


def _source_tensor_names(proto: onnx.ModelProto) -> set[str]:
    g = proto.graph
    names = {i.name for i in g.input} | {o.name for o in g.output} | {t.name for t in g.initializer}
    names |= {t.values.name for t in g.sparse_initializer}
    for node in g.node:
        names.update(t for t in node.input if t)
        names.update(t for t in node.output if t)
    return names


def _stage_main_graph_names(stage: onnx.ModelProto) -> set[str]:
    g = stage.graph
    names = {i.name for i in g.input} | {o.name for o in g.output} | {t.name for t in g.initializer}
    names |= {t.values.name for t in g.sparse_initializer}
    for node in g.node:
        names.update(t for t in node.input if t)
        names.update(t for t in node.output if t)
    return names


def check_split_folder(
    model: Path, out: Path, k: int, result: onnxpipe.SplitResult | None = None
) -> Manifest:
    """Every promise of a split folder, checked against the source model; returns the manifest."""
    view = onnxpipe.load_model(model)
    src = onnx.load(str(model), load_external_data=False)

    # the manifest loads with its hashes checked, round-trips, and agrees with the plan
    manifest = load_manifest(out)
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert json.loads((out / "manifest.json").read_text())["schema_version"] == manifest.schema_version
    # K workers; a model whose embedding and LM head share a table may get K+1 stages on them (the last
    # back on worker 0 with the first: onnxpipe.planning.planner.keeping_tied), else a stage per worker
    stages = manifest.k
    assert stages == manifest.plan.k and (manifest.plan.workers or stages) == k
    assert stages == k or (stages == k + 1 and any("share" in n for n in manifest.plan.notes))
    assert [s.index for s in manifest.stages] == list(range(stages))
    assert manifest.source.sha256 == view.sha256 and manifest.source.file == model.name
    assert [t.name for t in manifest.model_inputs] == list(view.inputs)
    assert [t.name for t in manifest.model_outputs] == list(view.outputs)
    assert manifest.plan.bottleneck_seconds >= manifest.plan.lower_bound_seconds * (1 - 1e-9)
    if result is not None:
        assert result.manifest == manifest
        assert result.plan.k == stages
        assert [s.node_names for s in result.plan.stages] and all(s.node_names for s in result.plan.stages)

    compute = [n.name for n in view.compute_nodes]
    constant = {n.name for n in view.nodes if n.is_constant}
    src_names = _source_tensor_names(src)
    src_opsets = {o.domain: o.version for o in src.opset_import}
    source_symbols = {  # the symbols the source file names on its graph's interface and value_info
        d.dim_param
        for vi in (*src.graph.input, *src.graph.output, *src.graph.value_info)
        for d in vi.type.tensor_type.shape.dim
        if d.dim_param
    }
    placed: collections.Counter[str] = collections.Counter()
    skipped = 0
    available = set(view.inputs)  # tensors a later stage may receive: model inputs, earlier outputs
    for st in manifest.stages:
        path = out / st.file
        # valid on its own, external data included (check by path resolves the .data file)
        onnx.checker.check_model(str(path), full_check=True)
        stage = onnx.load(str(path), load_external_data=False)
        assert {o.domain: o.version for o in stage.opset_import} == src_opsets
        assert stage.ir_version == max(src.ir_version, 4)

        # nodes: compute nodes by their (view-given) names; cheap constants may be copies
        names = [n.name for n in stage.graph.node]
        assert len(names) == len(set(names)), f"stage {st.index} repeats a node name"
        remade = [n for n in stage.graph.node if n.name.startswith(ALIAS_NODE_PREFIX)]
        made_here = [
            n for n in names if n not in constant and not n.startswith((ALIAS_NODE_PREFIX, SHAPE_NODE_PREFIX))
        ]
        # copies of earlier stages' nodes (first in the file) make the shape and constant-only values the
        # stage would otherwise receive
        copies, own = made_here[: st.recomputed_node_count], made_here[st.recomputed_node_count :]
        position = {n.name: n.position for n in view.nodes}
        assert not copies or max(position[n] for n in copies) < min(position[n] for n in own)
        assert len(own) == st.node_count, f"stage {st.index}: manifest node_count {st.node_count}"
        assert sum(1 for n in names if n in constant) == st.constant_node_count
        placed.update(own)
        skipped += st.skipped_node_count
        if result is not None:
            spec = result.plan.stages[st.index]
            assert tuple(own) == spec.file_node_names
            assert tuple(copies) == spec.recomputed_nodes
            assert len(spec.skipped_nodes) == st.skipped_node_count
            assert not set(spec.skipped_nodes) & set(names)
            assert {(a.name, a.same_as) for a in spec.aliases} == {(n.output[0], n.input[0]) for n in remade}
        # a remade tensor is an Identity of one the stage receives (listed in the manifest) or makes
        received = {t.name for t in st.inputs}
        assert all(n.op_type == "Identity" and n.output[0] not in received for n in remade)
        assert {(a.name, a.same_as) for a in st.same_values} == {
            (n.output[0], n.input[0]) for n in remade if n.input[0] in received
        }

        # tensor names: only the source's, and the graph's inputs/outputs are the manifest's, in order
        new = {t for t in _stage_main_graph_names(stage) - src_names if not t.startswith(SHAPE_NODE_PREFIX)}
        assert not new, f"stage {st.index} invents tensor names {sorted(new)[:5]}"
        assert [i.name for i in stage.graph.input] == [t.name for t in st.inputs]
        assert [o.name for o in stage.graph.output] == [t.name for t in st.outputs]
        for t in st.inputs:
            assert t.name in available, f"stage {st.index} reads {t.name!r} before any stage makes it"
            assert (t.source == MODEL) == (t.name in view.inputs)
        available.update(t.name for t in st.outputs)

        # symbolic dims stay symbolic on the boundary: in the stage file those the source names (a symbol
        # shape inference made up is an unnamed dim there); in the manifest (the boundary contract) only
        # the model inputs' own symbols, a size, or null, never a made-up symbol or an expression
        input_symbols = {d for n in view.inputs for d in (view.tensor(n).shape or ()) if isinstance(d, str)}
        entries: dict[str, Any] = {t.name: t.shape for t in st.inputs}
        entries.update({t.name: t.shape for t in st.outputs})
        for vi in (*stage.graph.input, *stage.graph.output):
            declared = view.tensor(vi.name).shape
            if declared is None:
                continue
            got = _dims(vi)
            assert got is not None and len(got) == len(declared), f"{vi.name}: rank {got} vs {declared}"
            for axis, d in enumerate(declared):
                if isinstance(d, str):
                    want = d if d in source_symbols else None
                    assert got[axis] == want, (
                        f"stage {st.index} {vi.name} dim {axis}: {got[axis]!r} != {want!r}"
                    )
                    entry = entries[vi.name]
                    assert entry is not None and len(entry) == len(declared)
                    if d in input_symbols:
                        assert entry[axis] == d
                    else:
                        assert (
                            entry[axis] is None
                            or isinstance(entry[axis], int)
                            or entry[axis] in input_symbols
                        )

    # every compute node in exactly one stage, but those left out as remade from an equal value
    assert set(placed) <= set(compute) and len(placed) + skipped == len(compute), (
        "the stages do not hold each compute node exactly once"
    )
    assert max(placed.values()) == 1
    assert sum(s.node_count + s.skipped_node_count for s in manifest.stages) == len(compute)
    for o in manifest.model_outputs:
        assert o.produced_by == MODEL_INPUT or o.name in {
            t.name for t in manifest.stages[o.produced_by].outputs
        }
    return manifest


FAST_CORPUS = {"light_resnet50", "rapidocr_det", "gpt2_tiny", "bert_tiny_dynamo", "nudenet"}
"""The third-party models the fast lane splits (at K=3: a CNN, an OCR detector, a legacy and a dynamo torch
export, a YOLO); the exhaustive lane splits every one at every K."""


def _corpus_mark(name: str, k: int) -> list[pytest.MarkDecorator]:
    if name not in CORPUS:
        return []
    fast = name in FAST_CORPUS and k == 3
    return [pytest.mark.corpus] if fast else [pytest.mark.corpus, pytest.mark.exhaustive]


CASES = [pytest.param(name, k, id=f"{name}-k{k}", marks=_corpus_mark(name, k)) for name in MODELS for k in KS]


@pytest.mark.parametrize(("name", "k"), CASES)
def test_split_real_models(name: str, k: int, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    get, cost, other_shapes = MODELS[name]
    model = get(request)
    out = tmp_path / "stages"
    result = onnxpipe.split(
        model, SplitOptions(out=out, plan=PlanRequest(k), profile=ProfileOptions(cost=cost, runs=3, warmup=1))
    )
    assert result.out_dir == out
    assert result.report is not None
    assert result.report.ok, result.report.summary()
    assert all(o.ok for o in result.report.outputs)
    manifest = check_split_folder(model, out, k, result)
    assert manifest.plan.cost_source == cost and manifest.plan.threads == 1
    # nothing but the folder was written next to it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stages"]
    if other_shapes is not None:
        # the stage files keep symbolic dims, so the chain also runs at sizes that were never profiled
        report = onnxpipe.verify(out, VerifyOptions(shapes=other_shapes, seed=7))
        assert report.ok, report.summary()
        assert dict(report.input_shapes) == {n: tuple(s) for n, s in other_shapes.items()}


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.exhaustive
def test_measured_split_of_resnet50(light_model: Callable[[str], Path], tmp_path: Path) -> None:
    """ResNet-50 with measured costs (value-matched through the NCHWc layout): still a valid split."""
    model = light_model("resnet50")
    result = onnxpipe.split(
        model,
        SplitOptions(
            out=tmp_path / "out",
            plan=PlanRequest(3),
            profile=ProfileOptions(cost="profile", runs=3, warmup=1),
        ),
    )
    assert result.report is not None and result.report.ok
    check_split_folder(model, tmp_path / "out", 3, result)
    assert result.plan.cost_source == "profile"


def test_step_by_step_api_matches_split(sample_models_dir: Path, tmp_path: Path) -> None:
    """``load_model -> static_profile -> make_plan -> export_stages -> verify`` is what ``split`` does."""
    model = sample_models_dir / "transformer_tiny.onnx"
    view: ModelView = onnxpipe.load_model(model)
    profile = onnxpipe.static_profile(view)
    plan = onnxpipe.make_plan(view, profile, 3)
    manifest = onnxpipe.export_stages(view, plan, tmp_path / "a")
    assert onnxpipe.verify(tmp_path / "a").ok
    result = onnxpipe.split(
        model, SplitOptions(out=tmp_path / "b", plan=PlanRequest(3), profile=ProfileOptions(cost="static"))
    )
    assert [s.node_names for s in result.plan.stages] == [s.node_names for s in plan.stages]
    assert [s.sha256 for s in result.manifest.stages] == [s.sha256 for s in manifest.stages]
    check_split_folder(model, tmp_path / "a", 3)


# --------------------------------------------------------------------------------------------------
# K at and beyond the number of compute nodes


@pytest.mark.parametrize("name", ["mlp", "resnet_tiny"])
def test_one_node_per_stage(name: str, sample_models_dir: Path, tmp_path: Path) -> None:
    model = sample_models_dir / f"{name}.onnx"
    m = len(onnxpipe.load_model(model).compute_nodes)
    result = onnxpipe.split(
        model, SplitOptions(out=tmp_path / "out", plan=PlanRequest(m), profile=ProfileOptions(cost="static"))
    )
    assert result.report is not None and result.report.ok
    manifest = check_split_folder(model, tmp_path / "out", m, result)
    assert [s.node_count for s in manifest.stages] == [1] * m


@pytest.mark.parametrize("extra", [1, 50])
def test_more_stages_than_nodes_is_a_partition_error(
    extra: int, sample_models_dir: Path, tmp_path: Path
) -> None:
    model = sample_models_dir / "mlp.onnx"
    m = len(onnxpipe.load_model(model).compute_nodes)
    with pytest.raises(onnxpipe.PartitionError) as info:
        onnxpipe.split(
            model,
            SplitOptions(
                out=tmp_path / "out", plan=PlanRequest(m + extra), profile=ProfileOptions(cost="static")
            ),
        )
    message = str(info.value)
    assert f"{m + extra} non-empty stages" in message and f"between 1 and {m}" in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary folder left


def test_zero_stages_is_refused(sample_models_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(onnxpipe.OnnxpipeError):
        onnxpipe.split(
            sample_models_dir / "mlp.onnx",
            SplitOptions(out=tmp_path / "out", plan=PlanRequest(0), profile=ProfileOptions(cost="static")),
        )
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# a saved profile is reused, and a profile of another model is refused


def _no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was profiled again although a profile was given")

    monkeypatch.setattr("onnxpipe.cost.source.profile_model", refuse)
    monkeypatch.setattr("onnxpipe.cost.source.static_profile", refuse)


def test_split_reuses_a_saved_profile(
    sample_models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = sample_models_dir / "resnet_tiny.onnx"
    saved = tmp_path / "profile.json"
    assert main(["profile", str(model), "--out", str(saved), "--runs", "3", "--warmup", "1"]) == 0
    profile = onnxpipe.Profile.load(saved)
    expected = onnxpipe.make_plan(onnxpipe.load_model(model), profile, 3)

    _no_profiling(monkeypatch)
    result = onnxpipe.split(
        model, SplitOptions(out=tmp_path / "api", plan=PlanRequest(3), profile=ProfileOptions(saved=saved))
    )
    assert [s.node_names for s in result.plan.stages] == [s.node_names for s in expected.stages]
    assert result.plan.bottleneck_seconds == expected.bottleneck_seconds
    check_split_folder(model, tmp_path / "api", 3, result)

    assert (
        main(["split", str(model), "-k", "3", "--out", str(tmp_path / "cli"), "--profile", str(saved)]) == 0
    )
    cli = load_manifest(tmp_path / "cli")
    assert [s.sha256 for s in cli.stages] == [s.sha256 for s in result.manifest.stages]
    assert cli.plan.bottleneck_seconds == expected.bottleneck_seconds
    assert dict(cli.plan.profiled_input_shapes) == dict(profile.input_shapes)


def test_split_refuses_a_profile_of_another_model(
    sample_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "mlp_profile.json"
    onnxpipe.static_profile(onnxpipe.load_model(sample_models_dir / "mlp.onnx")).save(saved)
    other = sample_models_dir / "resnet_tiny.onnx"
    with pytest.raises(onnxpipe.ProfileError) as info:
        onnxpipe.split(
            other,
            SplitOptions(out=tmp_path / "out", plan=PlanRequest(2), profile=ProfileOptions(saved=saved)),
        )
    assert "mlp.onnx" in str(info.value) and "resnet_tiny.onnx" in str(info.value)
    assert not (tmp_path / "out").exists()
    capsys.readouterr()
    assert (
        main(["split", str(other), "-k", "2", "--out", str(tmp_path / "out"), "--profile", str(saved)]) == 4
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnxpipe split: error: mlp_profile.json: made for model mlp.onnx")
    assert "\n" not in err and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp_profile.json"]


def test_a_profile_of_the_same_bytes_elsewhere_is_accepted(sample_models_dir: Path, tmp_path: Path) -> None:
    """Profiles match by content (sha256), so a copy of the model under another name reuses it."""
    model = sample_models_dir / "mlp.onnx"
    copy = tmp_path / "renamed.onnx"
    copy.write_bytes(model.read_bytes())
    saved = tmp_path / "p.json"
    onnxpipe.static_profile(onnxpipe.load_model(model)).save(saved)
    result = onnxpipe.split(
        copy, SplitOptions(out=tmp_path / "out", plan=PlanRequest(2), profile=ProfileOptions(saved=saved))
    )
    assert result.report is not None and result.report.ok


# --------------------------------------------------------------------------------------------------
# the folder a split writes


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def test_split_folder_mode_follows_the_umask(sample_models_dir: Path, tmp_path: Path) -> None:
    """Regression: the folder came from tempfile.mkdtemp (0700) renamed into place, ignoring the umask."""
    out = tmp_path / "stages"
    onnxpipe.split(
        sample_models_dir / "mlp.onnx",
        SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static")),
    )
    expected = 0o777 & ~_umask()
    assert stat.S_IMODE((out / "stage_0.onnx").stat().st_mode) == 0o666 & ~_umask()
    assert oct(stat.S_IMODE(out.stat().st_mode)) == oct(expected)
