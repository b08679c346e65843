"""Manifests written by earlier onnxpipe versions, one per schema version, still read.

Each ``schema_<version>.json`` under ``tests/data/manifests`` is the ``manifest.json`` that the onnxpipe of
its schema version wrote for the same two-stage split of a three-node model whose input is also an output
(the one field whose spelling changed, version 1's ``"model input"``): version 1 by the commit before
c65176c, version 2 by the one before 5dd752d, version 3 by fdc22b5.  ``schema_3-<what>.json`` are more
splits written by fdc22b5, with the optional fields of version 3: a decoder balanced for both phases
(``sample_models/decoders/llama_gqa.onnx``), an interleaved split (``transformer_tiny.onnx``, 4 stages on
2 workers) and a node cut in parts (``mlp.onnx``, ``--split-nodes auto``).  They are the files as written,
never edited, so a reader that stops reading one fails here, not in a user's folder.
"""

from __future__ import annotations

import json

import pytest
from paths import DATA

from onnxpipe.core.choices import Phase
from onnxpipe.core.errors import ManifestError
from onnxpipe.manifest import MODEL_INPUT, READABLE_VERSIONS, SCHEMA_VERSION, Manifest

FIXTURES = DATA / "manifests"
MORE = ("schema_3-decoder", "schema_3-interleaved", "schema_3-node_split", "schema_4-decoder")
LATEST = [name for name in (f"schema_{SCHEMA_VERSION}", *MORE) if name.startswith(f"schema_{SCHEMA_VERSION}")]
"""The files of today's version: written again, they must keep what they said."""


def _fixture(version: int | str) -> str:
    name = f"schema_{version}" if isinstance(version, int) else version
    return (FIXTURES / f"{name}.json").read_text(encoding="utf-8")


def test_there_is_a_fixture_for_every_readable_version() -> None:
    names = sorted(p.stem for p in FIXTURES.glob("schema_*.json"))
    assert names == sorted([*(f"schema_{v}" for v in READABLE_VERSIONS), *MORE])


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


@pytest.mark.parametrize("version", [*READABLE_VERSIONS, *MORE])
def test_an_older_manifest_is_written_back_as_today_and_reads_the_same(version: int | str) -> None:
    m = Manifest.from_json(_fixture(version))
    text = m.to_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert Manifest.from_json(text) == m


def test_the_version_3_file_keeps_its_digest_and_an_edit_of_it_is_refused() -> None:
    obj = json.loads(_fixture(3))
    obj["stages"][0]["estimated_compute_seconds"] = 5.0
    with pytest.raises(ManifestError, match="was changed after onnxpipe wrote it"):
        Manifest.from_json(json.dumps(obj))


def test_the_optional_fields_of_version_3_read() -> None:
    decoder = Manifest.from_json(_fixture("schema_3-decoder"))
    record = decoder.plan.decoder
    assert record is not None and record.layers == 4 and record.io is not None and record.model is not None
    assert [p.phase for p in record.phase_shapes] == [Phase.PREFILL, Phase.DECODE]
    assert [s.kv_layers for s in decoder.stages] == [(0, 1), (2, 3)]
    assert all(
        dict(s.estimated_phase_seconds).keys() == {Phase.PREFILL, Phase.DECODE} for s in decoder.stages
    )
    assert all(s.kv_cache_bytes > 0 and s.required_opsets for s in decoder.stages)
    interleaved = Manifest.from_json(_fixture("schema_3-interleaved"))
    assert interleaved.workers == 2 and [interleaved.worker_of(s) for s in range(4)] == [0, 1, 0, 1]
    assert interleaved.plan.time_slack == 0.01 and interleaved.schedule.workers == (0, 1, 0, 1)
    split = Manifest.from_json(_fixture("schema_3-node_split")).plan.node_splits
    assert [(n.node, n.kind, n.parts, n.stages) for n in split] == [("fc2.matmul", "columns", 2, (0, 1))]
    assert split[0].part_nodes == () and split[0].join == ""  # not kept before version 3's additions


def test_a_version_3_decoder_io_reads_as_its_io_contract() -> None:
    """Version 3 named the decoder's tensors; they read as the contract version 4 writes for them."""
    old = Manifest.from_json(_fixture("schema_3-decoder")).plan.decoder
    new = Manifest.from_json(_fixture("schema_4-decoder")).plan.decoder
    assert old is not None and new is not None and old.io == new.io and old.io is not None
    assert old.io.problem() is None and len(old.io.kv) == 4


OPTIONAL = (".cluster", ".device_costs", ".plan.decoder.model.")
"""Where the version-3 reader of fdc22b5 took an absent key as null or empty (``f.get(key, default)``):
a null or empty value there may be left out."""


def _holds(old: object, new: object, path: str = "") -> list[str]:
    """Where ``new`` lacks or changes a value of ``old`` (``new`` may add keys, and leave out a null or
    empty value under :data:`OPTIONAL`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        wrong: list[str] = []
        for key, value in old.items():
            where = f"{path}.{key}"
            if key in new:
                wrong += _holds(value, new[key], where)
            elif not (value in (None, [], {}) and where.startswith(OPTIONAL)):
                wrong.append(where)
        return wrong
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in _holds(a, b, f"{path}[{i}]")
        ]
    return [] if old == new else [path]


@pytest.mark.parametrize("name", LATEST)
def test_a_file_of_this_version_written_again_keeps_what_it_said(name: str) -> None:
    """What a reader of this version in an earlier onnxpipe read is written again as it was: today's writer
    adds fields (with their defaults) but neither drops nor changes one that reader needs, so that it
    reads today's files; only the digest, of the content, changes with the added fields."""
    old = json.loads(_fixture(name))
    new = json.loads(Manifest.from_json(_fixture(name)).to_json())
    old.pop("digest")
    assert _holds(old, new) == []
