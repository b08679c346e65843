"""Tests of onnxpipe.manifest: JSON round trips and one asserted message per validation failure."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from manifest_edits import sealed

from onnxpipe.core.errors import ManifestError
from onnxpipe.core.inputfiles import InputRecord
from onnxpipe.core.iocontract import IOContract
from onnxpipe.core.kv import KVPair
from onnxpipe.manifest import (
    MODEL_INPUT,
    SCHEMA_VERSION,
    Manifest,
    ModelOutput,
    ModelTensor,
    PlanSummary,
    SourceInfo,
    StageEntry,
    StageInput,
    StageOutput,
    content_digest,
    load_manifest,
    write_manifest,
)
from onnxpipe.manifest.seq2seq import SEQ2SEQ_FILE, read_seq2seq
from onnxpipe.planning.records import DecoderRecord, NodeSplit
from onnxpipe.schedule.simulate import simulate

SHA_A = "a" * 64

SHA_B = "b" * 64

SHA_C = "c" * 64


def two_stage_manifest() -> Manifest:
    """x -> stage 0 -> h -> stage 1 -> y; x is also a model output; h skips to the model output too."""
    stage0 = StageEntry(
        index=0,
        file="stage_0.onnx",
        sha256=SHA_A,
        external_data="stage_0.onnx.data",
        external_data_sha256=SHA_B,
        node_count=3,
        constant_node_count=1,
        device="cpu",
        inputs=(StageInput("x", "float32", ("batch", 8), 32, "model"),),
        outputs=(StageOutput("h", "float32", ("batch", None), 32, (1, "model_output")),),
        estimated_compute_seconds=0.002,
        estimated_transfer_seconds=0.0,
        param_bytes=256,
        peak_activation_bytes=64,
    )
    stage1 = StageEntry(
        index=1,
        file="stage_1.onnx",
        sha256=SHA_C,
        external_data=None,
        external_data_sha256=None,
        node_count=2,
        constant_node_count=0,
        device="cpu",
        inputs=(StageInput("h", "float32", ("batch", None), 32, 0),),
        outputs=(StageOutput("y", "int64", None, 8, ("model_output",)),),
        estimated_compute_seconds=0.001,
        estimated_transfer_seconds=0.0005,
        param_bytes=0,
        peak_activation_bytes=40,
    )
    return Manifest(
        source=SourceInfo(file="m.onnx", path="../m.onnx", sha256=SHA_A),
        model_inputs=(ModelTensor("x", "float32", ("batch", 8)),),
        model_outputs=(
            ModelOutput("y", "int64", None, 1),
            ModelOutput("h", "float32", ("batch", None), 0),
            ModelOutput("x", "float32", ("batch", 8), "model_input"),
        ),
        stages=(stage0, stage1),
        plan=PlanSummary(
            objective="minimize the largest stage time",
            k=2,
            bottleneck_seconds=0.002,
            lower_bound_seconds=0.00175,
            ratio_to_lower_bound=0.002 / 0.00175,
            cost_source="profile",
            threads=1,
            bandwidth_bytes_per_s=math.inf,
            profiled_input_shapes={"x": (1, 8)},
            notes=("a note",),
        ),
        schedule=simulate("stream", [0.002, 0.0015], None, [0.0, 0.0], 2),
    )


def test_json_round_trip() -> None:
    m = two_stage_manifest()
    text = m.to_json()
    assert text.endswith("}\n")
    assert Manifest.from_json(text) == m
    obj = json.loads(text)
    assert obj["schema_version"] == SCHEMA_VERSION == 4
    assert obj["plan"]["bandwidth_bytes_per_s"] is None  # JSON has no infinity: null stands for it
    assert obj["stages"][0]["outputs"][0]["shape"] == ["batch", None]
    assert obj["stages"][1]["outputs"][0]["shape"] is None
    assert obj["schedule"]["devices"][1]["steps"][0] == ["F", 0, 0.002, 0.0035]
    assert '"shape": ["batch", 8]' in text  # short lists stay on one line


def test_a_version_1_manifest_still_reads() -> None:
    """Version 1 spelled a pass-through output's ``produced_by`` ``"model input"``; it reads as today's."""
    m = two_stage_manifest()
    obj = json.loads(m.to_json())
    obj["schema_version"] = 1
    assert obj["model_outputs"][2]["produced_by"] == "model_input"
    obj["model_outputs"][2]["produced_by"] = "model input"
    again = Manifest.from_json(sealed(obj))
    assert again == m and again.model_outputs[2].produced_by == MODEL_INPUT
    assert json.loads(again.to_json())["schema_version"] == 4  # written back in today's spelling
    obj["model_outputs"][2]["produced_by"] = "model_input"  # version 1 never wrote this
    with pytest.raises(
        ManifestError, match=r'model_outputs\[2\]\.produced_by: expected a stage index or "model input"'
    ):
        Manifest.from_json(sealed(obj))


def test_the_reference_time_round_trips_and_is_left_out_when_unknown() -> None:
    m = two_stage_manifest()
    assert "reference_seconds" not in json.loads(m.to_json())["plan"]
    timed = replace(m, plan=replace(m.plan, reference_seconds=0.0125))
    assert json.loads(timed.to_json())["plan"]["reference_seconds"] == 0.0125
    assert Manifest.from_json(timed.to_json()) == timed


def test_a_joined_embedding_model_round_trips_and_is_left_out_when_none() -> None:
    """``source.embedding``: the embedding model ``split --embedding`` joined ahead of the source."""
    m = two_stage_manifest()
    assert "embedding" not in json.loads(m.to_json())["source"]
    joined = replace(m, source=replace(m.source, embedding="../m_embedding.onnx"))
    assert json.loads(joined.to_json())["source"]["embedding"] == "../m_embedding.onnx"
    assert Manifest.from_json(joined.to_json()) == joined


def test_the_profiled_inputs_round_trip_and_are_left_out_when_random() -> None:
    m = two_stage_manifest()
    assert "profiled_inputs" not in json.loads(m.to_json())["plan"]
    record = InputRecord("speech.npz", "ab" * 32, {"input": (1, 512), "sr": ()}, 2)
    given = replace(m, plan=replace(m.plan, profiled_inputs=(record,)))
    written = json.loads(given.to_json())["plan"]["profiled_inputs"]
    assert written == [
        {"file": "speech.npz", "sha256": "ab" * 32, "shapes": {"input": [1, 512], "sr": []}, "samples": 2}
    ]
    assert Manifest.from_json(given.to_json()) == given
    obj = json.loads(given.to_json())
    obj["plan"]["profiled_inputs"][0]["samples"] = 0
    with pytest.raises(ManifestError, match=r"plan\.profiled_inputs\[0\]\.samples"):
        Manifest.from_json(sealed(obj))


def test_write_and_load(tmp_path: Path) -> None:
    m = two_stage_manifest()
    write_manifest(tmp_path / "manifest.json", m)
    assert load_manifest(tmp_path, check_files=False) == m
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_infinite_throughput_round_trips() -> None:
    m = two_stage_manifest()
    m2 = Manifest(
        m.source,
        m.model_inputs,
        m.model_outputs,
        m.stages,
        m.plan,
        simulate("stream", [0.0, 0.0], None, [0.0, 0.0], 2),
    )
    assert Manifest.from_json(m2.to_json()).schedule.steady_state_throughput_per_s == math.inf


def test_nan_is_refused_on_write() -> None:
    m = two_stage_manifest()
    bad = Manifest(
        m.source,
        m.model_inputs,
        m.model_outputs,
        m.stages,
        replace(m.plan, bottleneck_seconds=math.nan),
        m.schedule,
    )
    with pytest.raises(ValueError, match="NaN"):
        bad.to_json()


def edited(edit: Callable[[dict[str, Any]], None]) -> str:
    obj = json.loads(two_stage_manifest().to_json())
    edit(obj)
    return sealed(obj)


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = obj
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        del target[int(last) if last.isdigit() else last]

    return edit


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = obj
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(last) if last.isdigit() else last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_del("stages/0/sha256"), "m.json: missing field 'stages[0].sha256'; re-run onnxpipe split"),
        (_del("plan"), "m.json: missing field 'plan'; re-run onnxpipe split"),
        (_del("schema_version"), "m.json: missing field 'schema_version'; re-run onnxpipe split"),
        (
            _del("stages/1/inputs/0/bytes_per_sample"),
            "m.json: missing field 'stages[1].inputs[0].bytes_per_sample'; re-run onnxpipe split",
        ),
        (
            _set("stages/0/node_count", "3"),
            "m.json: stages[0].node_count: expected an integer, got string '3'; re-run onnxpipe split",
        ),
        (
            _set("stages/0/node_count", True),
            "m.json: stages[0].node_count: expected an integer, got true; re-run onnxpipe split",
        ),
        (
            _set("stages", {}),
            "m.json: stages: expected a list, got an object; re-run onnxpipe split",
        ),
        (
            _set("plan/threads", 0),
            "m.json: plan.threads: expected an integer >= 1, got 0; re-run onnxpipe split",
        ),
        (
            _set("stages/0/estimated_compute_seconds", "fast"),
            "m.json: stages[0].estimated_compute_seconds: expected a number or null (infinity), "
            "got string 'fast'; re-run onnxpipe split",
        ),
        (
            _set("model_inputs/0/shape", [1, -3]),
            "m.json: model_inputs[0].shape[1]: expected a dim (integer >= 0, symbolic name or null), "
            "got int -3; re-run onnxpipe split",
        ),
        (
            _set("stages/0/file", "../elsewhere.onnx"),
            "m.json: stages[0].file: expected a plain file name in the folder, got '../elsewhere.onnx'; "
            "re-run onnxpipe split",
        ),
        (
            _set("stages/0/sha256", "xyz"),
            "m.json: stages[0].sha256: expected a sha256 as 64 lowercase hex digits, got 'xyz'; "
            "re-run onnxpipe split",
        ),
        (
            _set("schema_version", 99),
            "m.json: schema_version 99 is not supported (this onnxpipe reads versions 1, 2, 3 and 4, "
            "writes 4); use the onnxpipe that wrote it or re-run onnxpipe split",
        ),
        (
            _set("schema_version", "1"),
            "m.json: schema_version: expected an integer, got string '1'; re-run onnxpipe split",
        ),
        (
            _set("plan/k", 3),
            "m.json: plan.k: says 3 stages but 'stages' lists 2; re-run onnxpipe split",
        ),
        (
            _set("stages/1/index", 5),
            "m.json: stages[1].index: expected 1 (stages are listed in order), got 5; re-run onnxpipe split",
        ),
        (
            _set("stages/1/inputs/0/source", 1),
            "m.json: stages[1].inputs[0].source: says stage 1 produces 'h', but no earlier stage output "
            "matches; re-run onnxpipe split",
        ),
        (
            _set("stages/0/outputs/0/consumers", [0]),
            "m.json: stages[0].outputs[0].consumers: lists stage 0, but it does not come after stage 0; "
            "re-run onnxpipe split",
        ),
        (
            _set("model_outputs/0/produced_by", 0),
            "m.json: model_outputs[0].produced_by: says stage 0 produces 'y', but that stage does not "
            "output it; re-run onnxpipe split",
        ),
        (
            _set("stages/0/external_data_sha256", None),
            "m.json: stages[0].external_data_sha256: must be null exactly when external_data is null; "
            "re-run onnxpipe split",
        ),
        (
            _set("schedule/kind", "train"),
            "m.json: schedule.kind: expected one of stream, gpipe, 1f1b, got 'train'; re-run onnxpipe split",
        ),
        (
            _set("schedule/devices/0/steps/0", [0, 1.0]),
            "m.json: schedule.devices[0].steps[0]: expected [kind, microbatch, start, end]; "
            "re-run onnxpipe split",
        ),
        # one or more malformed values per kind of field: object, string, optional string, integer,
        # index-or-word, float, list, shape, map, and the lists and objects nested in them
        (
            _set("source", "m.onnx"),
            "m.json: source: expected an object, got string 'm.onnx'; re-run onnxpipe split",
        ),
        (
            _set("source/path", 3),
            "m.json: source.path: expected a string or null, got int 3; re-run onnxpipe split",
        ),
        (
            _set("source/sha256", "A" * 64),
            f"m.json: source.sha256: expected a sha256 as 64 lowercase hex digits, got {'A' * 64!r}; "
            "re-run onnxpipe split",
        ),
        (
            _set("model_inputs/0/name", None),
            "m.json: model_inputs[0].name: expected a string, got null; re-run onnxpipe split",
        ),
        (
            _set("model_inputs/0/shape", "batch"),
            "m.json: model_inputs[0].shape: expected a list or null, got string 'batch'; "
            "re-run onnxpipe split",
        ),
        (
            _set("model_inputs/0/shape", [1.5]),
            "m.json: model_inputs[0].shape[0]: expected a dim (integer >= 0, symbolic name or null), "
            "got float 1.5; re-run onnxpipe split",
        ),
        (
            _set("model_inputs/0", ["x"]),
            "m.json: model_inputs[0]: expected an object, got a list; re-run onnxpipe split",
        ),
        (
            _set("model_outputs/0/produced_by", -1),
            'm.json: model_outputs[0].produced_by: expected a stage index or "model_input", got int -1; '
            "re-run onnxpipe split",
        ),
        (
            _set("model_outputs/2/produced_by", "model"),
            'm.json: model_outputs[2].produced_by: expected a stage index or "model_input", '
            "got string 'model'; re-run onnxpipe split",
        ),
        (
            _set("stages/1/inputs/0/source", "model input"),
            'm.json: stages[1].inputs[0].source: expected a stage index or "model", '
            "got string 'model input'; re-run onnxpipe split",
        ),
        (
            _set("stages/1/inputs/0/source", False),
            'm.json: stages[1].inputs[0].source: expected a stage index or "model", got false; '
            "re-run onnxpipe split",
        ),
        (
            _set("stages/0/outputs/0/consumers/0", True),
            'm.json: stages[0].outputs[0].consumers[0]: expected a stage index or "model_output", got true; '
            "re-run onnxpipe split",
        ),
        (
            _set("stages/0/outputs/0/consumers", "model_output"),
            "m.json: stages[0].outputs[0].consumers: expected a list, got string 'model_output'; "
            "re-run onnxpipe split",
        ),
        (
            _set("stages/0/inputs", ["x"]),
            "m.json: stages[0].inputs[0]: expected an object, got string 'x'; re-run onnxpipe split",
        ),
        (
            _set("stages/0/external_data", "data/stage_0.onnx.data"),
            "m.json: stages[0].external_data: expected a plain file name in the folder, "
            "got 'data/stage_0.onnx.data'; re-run onnxpipe split",
        ),
        (
            _set("stages/0/external_data", 7),
            "m.json: stages[0].external_data: expected a string or null, got int 7; re-run onnxpipe split",
        ),
        (
            _set("stages/0/external_data_sha256", "b" * 63),
            f"m.json: stages[0].external_data_sha256: expected a sha256 as 64 lowercase hex digits, "
            f"got {'b' * 63!r}; re-run onnxpipe split",
        ),
        (
            _set("stages/0/param_bytes", -1),
            "m.json: stages[0].param_bytes: expected an integer >= 0, got -1; re-run onnxpipe split",
        ),
        (
            _set("plan/k", 2.0),
            "m.json: plan.k: expected an integer, got float 2.0; re-run onnxpipe split",
        ),
        (
            _set("stages/0/estimated_transfer_seconds", -0.5),
            "m.json: stages[0].estimated_transfer_seconds: expected a number >= 0, got -0.5; "
            "re-run onnxpipe split",
        ),
        (
            _set("plan/bandwidth_bytes_per_s", True),
            "m.json: plan.bandwidth_bytes_per_s: expected a number or null (infinity), got true; "
            "re-run onnxpipe split",
        ),
        (
            _set("plan/bottleneck_seconds", math.nan),  # json.dumps writes NaN, which json.loads reads
            "m.json: plan.bottleneck_seconds: expected a number >= 0, got nan; re-run onnxpipe split",
        ),
        (
            _set("plan/notes", ["fine", 1]),
            "m.json: plan.notes[1]: expected a string, got int 1; re-run onnxpipe split",
        ),
        (
            _set("plan/profiled_input_shapes", [[1, 8]]),
            "m.json: plan.profiled_input_shapes: expected an object, got a list; re-run onnxpipe split",
        ),
        (
            _set("plan/profiled_input_shapes", {"x": 8}),
            "m.json: plan.profiled_input_shapes['x']: expected a list, got int 8; re-run onnxpipe split",
        ),
        (
            _set("plan/profiled_input_shapes", {"x": [1, -8]}),
            "m.json: plan.profiled_input_shapes['x'][1]: expected an integer >= 0, got -8; "
            "re-run onnxpipe split",
        ),
        (
            _set("device_costs", {}),
            "m.json: device_costs: expected a list, got an object; re-run onnxpipe split",
        ),
        (
            _set("device_costs", [{"device": "cpu", "source": "profile"}]),
            "m.json: missing field 'device_costs[0].method'; re-run onnxpipe split",
        ),
        (
            _set("cluster", "cpu"),
            "m.json: cluster: expected an object, got string 'cpu'; re-run onnxpipe split",
        ),
        (
            _set("schema_version", True),
            "m.json: schema_version: expected an integer, got true; re-run onnxpipe split",
        ),
        (
            _set("schema_version", -1),
            "m.json: schema_version -1 is not supported (this onnxpipe reads versions 1, 2, 3 and 4, "
            "writes 4); use the onnxpipe that wrote it or re-run onnxpipe split",
        ),
        (
            _set("stages", []),
            "m.json: stages: expected at least one stage, got none; re-run onnxpipe split",
        ),
        (
            _set("plan/reference_seconds", -0.01),
            "m.json: plan.reference_seconds: expected a time above 0 seconds, got -0.01; "
            "re-run onnxpipe split",
        ),
        (
            _set("plan/reference_seconds", "fast"),
            "m.json: plan.reference_seconds: expected a number, got string 'fast'; re-run onnxpipe split",
        ),
    ],
)
def test_validation_errors(edit: Callable[[dict[str, Any]], None], message: str) -> None:
    with pytest.raises(ManifestError) as info:
        Manifest.from_json(edited(edit), source="m.json")
    assert str(info.value) == message


def test_not_json() -> None:
    empty = r"^m\.json: not valid JSON \(Expecting value at line 1 column 1\); re-run"
    with pytest.raises(ManifestError, match=empty):
        Manifest.from_json("", source="m.json")
    with pytest.raises(ManifestError, match=r"\(Unterminated string starting at line 1 column 2\); re-run"):
        Manifest.from_json('{"k', source="m.json")
    with pytest.raises(ManifestError, match=r"^m\.json: manifest: expected an object, got a list"):
        Manifest.from_json("[]", source="m.json")


def test_a_version_2_manifest_still_reads() -> None:
    """Version 3 only added optional fields to version 2's: a version-2 file reads with their defaults
    and is written back as today's version."""
    m = two_stage_manifest()
    obj = json.loads(m.to_json())
    obj["schema_version"] = 2
    for absent in ("link_model", "node_splits", "profiled_inputs", "decoder"):
        obj["plan"].pop(absent, None)
    again = Manifest.from_json(sealed(obj))
    assert again == m
    assert again.plan.node_splits == () and again.plan.decoder is None and again.plan.link_model is None
    assert json.loads(again.to_json())["schema_version"] == SCHEMA_VERSION


def test_schema_version_is_checked_before_any_other_field() -> None:
    """A manifest of another version may lay out every other field differently: say so, not 'missing'."""
    with pytest.raises(ManifestError, match=r"^m\.json: schema_version 5 is not supported"):
        Manifest.from_json('{"schema_version": 5}', source="m.json")


def test_optional_top_level_fields_may_be_absent() -> None:
    """``cluster`` and ``device_costs`` came after the first manifests: absent reads as none (and a
    manifest without them leaves them out)."""
    assert not {"cluster", "device_costs"} & set(json.loads(two_stage_manifest().to_json()))

    def add(obj: dict[str, Any]) -> None:
        obj.update(cluster=None, device_costs=[])

    assert Manifest.from_json(edited(add)) == two_stage_manifest()
    text = edited(lambda obj: None)
    back = Manifest.from_json(text)
    assert back.cluster is None and back.device_costs == () and back == two_stage_manifest()


def test_unknown_fields_are_ignored() -> None:
    """Additive fields do not bump the schema version (docs/manifest.md, versioning)."""
    text = edited(_set("stages/0/future_field", {"anything": 1}))
    assert Manifest.from_json(text) == two_stage_manifest()


def test_missing_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such folder"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(ManifestError, match=r"manifest\.json: no such file; give a folder written by"):
        load_manifest(tmp_path)


def test_cluster_and_device_costs_round_trip() -> None:
    from onnxpipe.cluster.model import Cluster
    from onnxpipe.manifest import DeviceRecord

    m = two_stage_manifest()
    cluster = Cluster.homogeneous(2, 1, bandwidth_bytes_per_s=1e9)
    stages = tuple(StageEntry(**{**s.__dict__, "device": cluster.names[i]}) for i, s in enumerate(m.stages))
    m2 = Manifest(
        m.source,
        m.model_inputs,
        m.model_outputs,
        stages,
        m.plan,
        m.schedule,
        cluster=cluster,
        device_costs=(DeviceRecord("cpu0", "scaled", "scaled by 1"),),
    )
    back = Manifest.from_json(m2.to_json())
    assert back.cluster is not None and back.cluster.names == ("cpu0", "cpu1")
    assert back.device_costs == m2.device_costs
    bad = json.loads(m2.to_json())
    bad["stages"][1]["device"] = "gpu7"
    with pytest.raises(ManifestError, match=r"stages\[1\]\.device: 'gpu7' is not a device of 'cluster'"):
        Manifest.from_json(sealed(bad))


SPLIT = {
    "node": "head",
    "kind": "columns",
    "parts": 2,
    "stages": [0, 1],
    "contiguous_bound_seconds": 0.02,
    "contiguous_bottleneck_seconds": 0.021,
    "carried": ["head_bias"],
    "part_nodes": [["head_0", "head_0_bias"], ["head_1", "head_1_bias", "head_join"]],
    "join": "head_join",
    "measured": True,
}


def test_node_splits_round_trip_and_are_left_out_when_none() -> None:
    m = two_stage_manifest()
    assert "node_splits" not in json.loads(m.to_json())["plan"]
    assert m.plan.node_splits == ()
    parts = (("head_0", "head_0_bias"), ("head_1", "head_1_bias", "head_join"))
    record = NodeSplit("head", "columns", 2, (0, 1), 0.02, 0.021, ("head_bias",), parts, "head_join", True)
    cut = replace(m, plan=replace(m.plan, node_splits=(record,)))
    assert json.loads(cut.to_json())["plan"]["node_splits"] == [SPLIT]
    assert Manifest.from_json(cut.to_json()) == cut
    # a manifest written before the split kept its parts' nodes reads with the where and the bound
    old = edited(_set("plan/node_splits", [{k: SPLIT[k] for k in list(SPLIT)[:6]}]))
    read = Manifest.from_json(old).plan.node_splits[0]
    assert read.stages == (0, 1) and read.part_nodes == () and read.join == "" and not read.measured


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stages", [1, 0], "plan.node_splits[0].stages: expected 2 non-decreasing stage indices"),
        ("stages", [0], "plan.node_splits[0].stages: expected 2 non-decreasing stage indices"),
        ("parts", 1, "plan.node_splits[0].parts"),
        ("contiguous_bound_seconds", -1.0, "plan.node_splits[0].contiguous_bound_seconds"),
    ],
)
def test_bad_node_splits_are_refused(field: str, value: Any, message: str) -> None:
    text = edited(_set("plan/node_splits", [{**SPLIT, field: value}]))
    with pytest.raises(ManifestError) as info:
        Manifest.from_json(text, source="m.json")
    assert str(info.value).startswith(f"m.json: {message}")


def test_decoder_fields_round_trip_and_are_checked() -> None:
    """The optional decoder fields (added in schema 3): written only when set, read back, validated."""
    m = two_stage_manifest()
    assert "decoder" not in json.loads(m.to_json())["plan"]
    assert "kv_layers" not in json.loads(m.to_json())["stages"][0]
    record = DecoderRecord(4, True, "attached", 2048, "both", (("prefill", 64, 0), ("decode", 1, 255)))
    stages = (
        replace(
            m.stages[0], kv_layers=(0, 1), kv_cache_bytes=4096, estimated_phase_seconds=(("prefill", 0.5),)
        ),
        *m.stages[1:],
    )
    dec = replace(m, plan=replace(m.plan, decoder=record), stages=stages)
    obj = json.loads(dec.to_json())
    assert obj["plan"]["decoder"]["phase_shapes"][1] == {
        "phase": "decode",
        "new_tokens": 1,
        "past_tokens": 255,
    }
    assert obj["stages"][0]["kv_layers"] == [0, 1]
    assert Manifest.from_json(dec.to_json()) == dec
    obj["plan"]["decoder"]["ends"] = "middle"
    with pytest.raises(ManifestError, match=r"plan\.decoder\.ends: expected one of free, attached, own"):
        Manifest.from_json(sealed(obj))
    obj["plan"]["decoder"]["ends"] = "own"
    obj["plan"]["decoder"]["max_context"] = 0
    with pytest.raises(ManifestError, match="max_context"):
        Manifest.from_json(sealed(obj))


def test_decoder_io_round_trips_and_is_checked() -> None:
    """``plan.decoder.io``, the split's IO contract (each tensor a generation loop feeds or reads, with its
    role), is optional, read back, validated; schema 3's form (the tensors by name) reads as the same
    contract."""
    m = two_stage_manifest()
    kv = (
        KVPair(0, "past.0.key", "past.0.value", "present.0.key", "present.0.value"),
        KVPair(1, "past.1", None, "present.1", None),
    )
    io = IOContract.of_decoder("input_ids", "attention_mask", None, "logits", kv)
    record = DecoderRecord(2, True, "free", 2048, "decode", (("decode", 1, 255),), io)
    dec = replace(m, plan=replace(m.plan, decoder=record))
    obj = json.loads(dec.to_json())
    assert obj["plan"]["decoder"]["io"]["inputs"][:2] == [
        {"tensor": "input_ids", "role": "token_ids"},
        {"tensor": "attention_mask", "role": "attention_mask"},
    ]
    assert {"tensor": "present.1", "role": "present_key", "layer": 1} in obj["plan"]["decoder"]["io"][
        "outputs"
    ]
    again = Manifest.from_json(dec.to_json())
    assert again == dec
    assert again.plan.decoder is not None and again.plan.decoder.io is not None
    assert again.plan.decoder.io.kv == kv
    assert again.plan.decoder.io.past_to_present() == {
        "past.0.key": "present.0.key",
        "past.0.value": "present.0.value",
        "past.1": "present.1",
    }
    # schema 3 wrote the tensors by name: read as the same contract
    v3 = json.loads(dec.to_json())
    v3["schema_version"] = 3
    v3["plan"]["decoder"]["io"] = {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": None,
        "logits": "logits",
        "kv": [
            {
                "layer": p.layer,
                "past_key": p.past_key,
                "past_value": p.past_value,
                "present_key": p.present_key,
                "present_value": p.present_value,
            }
            for p in kv
        ],
    }
    assert Manifest.from_json(sealed(v3)).plan.decoder.io == io  # type: ignore[union-attr]
    v3["plan"]["decoder"]["io"]["kv"] = [{"layer": 0}]
    with pytest.raises(ManifestError, match=r"past_key"):
        Manifest.from_json(sealed(v3))
    obj["plan"]["decoder"]["io"]["outputs"] = obj["plan"]["decoder"]["io"]["outputs"][:1]
    with pytest.raises(ManifestError, match=r"plan\.decoder\.io: the IO contract is incomplete: layer 0"):
        Manifest.from_json(sealed(obj))
    obj["plan"]["decoder"]["io"]["inputs"][0]["role"] = "tokens"
    with pytest.raises(ManifestError, match=r"role: expected one of token_ids"):
        Manifest.from_json(sealed(obj))
    del obj["plan"]["decoder"]["io"]
    assert Manifest.from_json(sealed(obj)).plan.decoder.io is None  # type: ignore[union-attr]


def test_a_manifest_is_sealed_with_its_digest_and_a_hand_edit_is_refused() -> None:
    """An estimate changed by hand would be shown as the split's own (5 s at 100% under a bottleneck of
    a few ms): the file's digest no longer matches and it is refused, until the digest is deleted."""
    obj = json.loads(two_stage_manifest().to_json())
    assert obj["digest"] == content_digest(obj) and len(obj["digest"]) == 64
    obj["stages"][0]["estimated_compute_seconds"] = 5.0
    with pytest.raises(
        ManifestError, match=r'was changed after onnxpipe wrote it .* delete its "digest" line'
    ):
        Manifest.from_json(json.dumps(obj))
    del obj["digest"]  # the user takes the edit on purpose (and a manifest written before digests)
    assert Manifest.from_json(json.dumps(obj)).stages[0].estimated_compute_seconds == 5.0


def test_a_broken_seq2seq_record_names_its_file_and_what_to_do(tmp_path: Path) -> None:
    assert read_seq2seq(tmp_path) is None  # no record: not an encoder-decoder's split
    (tmp_path / SEQ2SEQ_FILE).write_text('{"encoder": ', encoding="utf-8")
    with pytest.raises(
        ManifestError, match=r"seq2seq\.json: not valid JSON \(.*\); re-run onnxpipe split on the"
    ):
        read_seq2seq(tmp_path)
