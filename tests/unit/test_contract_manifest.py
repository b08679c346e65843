"""The boundary contract's manifest fields (schema 3 additions): written, read back, validated."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from manifest_edits import sealed

from onnxpipe.core.errors import ManifestError
from onnxpipe.manifest import Manifest

from .test_manifest import two_stage_manifest


def with_contract() -> Manifest:
    m = two_stage_manifest()
    s0 = m.stages[0]
    s0 = replace(
        s0,
        inputs=(replace(s0.inputs[0], profiled_shape=(4, 8), batch_axis=0),),
        outputs=(replace(s0.outputs[0], profiled_shape=(4, 16), batch_axis=0),),
        required_opsets=(("", 17), ("com.microsoft", 1)),
        recomputed_node_count=3,
    )
    inputs = tuple(replace(t, profiled_shape=(4, 8), batch_axis=0) for t in m.model_inputs)
    return replace(m, stages=(s0, *m.stages[1:]), model_inputs=inputs)


def test_contract_fields_round_trip() -> None:
    m = with_contract()
    back = Manifest.from_json(m.to_json())
    assert back.stages[0].inputs[0].profiled_shape == (4, 8)
    assert back.stages[0].outputs[0].batch_axis == 0
    assert back.stages[0].required_opsets == (("", 17), ("com.microsoft", 1))
    assert back.stages[0].recomputed_node_count == 3
    assert back.model_inputs[0].profiled_shape == (4, 8)
    obj = json.loads(m.to_json())
    assert obj["stages"][0]["required_opsets"] == {"": 17, "com.microsoft": 1}


def test_absent_contract_fields_read_as_unknown() -> None:
    back = Manifest.from_json(two_stage_manifest().to_json())
    assert back.stages[0].inputs[0].profiled_shape is None
    assert back.stages[0].inputs[0].batch_axis is None
    assert back.stages[0].required_opsets == ()
    assert "profiled_shape" not in two_stage_manifest().to_json()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("stages", 0, "inputs", 0, "profiled_shape"), [4, 8, 1], "2 dims"),
        (("stages", 0, "inputs", 0, "profiled_shape"), [4, -1], "integer"),
        (("stages", 0, "inputs", 0, "batch_axis"), 2, "below its rank 2"),
        (("stages", 0, "required_opsets"), {"": 0}, "integer"),
        (("stages", 0, "required_opsets"), [17], "object"),
    ],
)
def test_bad_contract_fields_are_refused(path: tuple[object, ...], value: object, message: str) -> None:
    obj = json.loads(with_contract().to_json())
    target = obj
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(sealed(obj))
