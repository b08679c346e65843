"""Manifests written by earlier onnxpipe versions, one per schema version, still read.

Each file under ``tests/data/manifests`` is the ``manifest.json`` that the onnxpipe of its schema version
wrote for the same two-stage split of a three-node model whose input is also an output (the one field
whose spelling changed, version 1's ``"model input"``): version 1 by the commit before c65176c, version 2
by the one before 5dd752d, version 3 by fdc22b5.  They are the files as written, never edited, so a
reader that stops reading one fails here, not in a user's folder.
"""

from __future__ import annotations

import json

import pytest
from paths import DATA

from onnxpipe.core.errors import ManifestError
from onnxpipe.manifest import MODEL_INPUT, READABLE_VERSIONS, SCHEMA_VERSION, Manifest

FIXTURES = DATA / "manifests"


def _fixture(version: int) -> str:
    return (FIXTURES / f"schema_{version}.json").read_text(encoding="utf-8")


def test_there_is_a_fixture_for_every_readable_version() -> None:
    assert sorted(int(p.stem.removeprefix("schema_")) for p in FIXTURES.glob("schema_*.json")) == list(
        READABLE_VERSIONS
    )


@pytest.mark.parametrize("version", READABLE_VERSIONS)
def test_a_manifest_of_each_schema_version_reads(version: int) -> None:
    text = _fixture(version)
    assert json.loads(text)["schema_version"] == version
    m = Manifest.from_json(text, source=f"schema_{version}.json")
    assert m.schema_version == SCHEMA_VERSION
    assert m.k == 2 and [s.index for s in m.stages] == [0, 1]
    assert m.source.file == "tiny.onnx" and m.source.path == "../tiny.onnx"
    assert [t.name for t in m.model_inputs] == ["x"]
    assert [(o.name, o.produced_by) for o in m.model_outputs] == [("y", 1), ("x", MODEL_INPUT)]
    assert m.plan.k == 2 and m.plan.profiled_input_shapes == {"x": (1, 8)}
    assert sum(s.node_count for s in m.stages) == 3
    assert m.stages[1].inputs[0].source == 0


@pytest.mark.parametrize("version", READABLE_VERSIONS)
def test_an_older_manifest_is_written_back_as_today_and_reads_the_same(version: int) -> None:
    m = Manifest.from_json(_fixture(version))
    text = m.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert Manifest.from_json(text) == m


def test_the_version_3_file_keeps_its_digest_and_an_edit_of_it_is_refused() -> None:
    obj = json.loads(_fixture(3))
    obj["stages"][0]["estimated_compute_seconds"] = 5.0
    with pytest.raises(ManifestError, match="was changed after onnxpipe wrote it"):
        Manifest.from_json(json.dumps(obj))
