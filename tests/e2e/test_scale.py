"""Scale: graphs of many nodes, weights in external files, stages over protobuf's 2 GB limit.

A real model over 2 GB is too big and slow for CI: the 2 GB logic runs here with the limits lowered
(``export.PROTOBUF_LIMIT``, ``export.AUTO_EXTERNAL_BYTES``), and ``benchmarks/bench_bigmodel.py`` runs
the real thing.  Memory is checked by what is read (each weight read once, by the stage that holds it,
never by the loader) and, in a subprocess, by the peak resident memory of an export against the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import plan_for, save, shared_weights_model
from paths import REPO_ROOT

import onnxpipe.export.build as stagebuild
import onnxpipe.export.stages as export
import onnxpipe.export.weightfile as weightfile
import onnxpipe.ir.external as external
from onnxpipe.api import ExportOptions, PlanRequest, ProfileOptions, SplitOptions, split
from onnxpipe.core.errors import ExportError
from onnxpipe.core.files import file_sha256
from onnxpipe.cost.static import static_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import load_model
from onnxpipe.manifest import load_manifest
from onnxpipe.planning.workers import make_plan
from onnxpipe.verification.chain import StageChain
from tools.make_large_graph import make_big_weights, make_many_nodes


def chain_equals_model(out: Path, model: Path, feeds: dict[str, np.ndarray]) -> None:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(names, feeds), strict=True))
    with StageChain.from_manifest(out) as chain:
        got = chain.run(feeds)
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-5, err_msg=n)


# --------------------------------------------------------------------------------------------------
# many nodes


@pytest.mark.slow
@pytest.mark.exhaustive
def test_twenty_thousand_node_graph_splits(tmp_path: Path) -> None:
    """How long it takes is ``python -m benchmarks scale``'s to measure, not a test's to assert."""
    path = tmp_path / "many.onnx"
    onnx.save_model(make_many_nodes(20_000), str(path))
    view = load_model(path)
    plan = make_plan(view, static_profile(view), 4)
    manifest = export_stages(view, plan, tmp_path / "out")
    assert len(view.nodes) >= 20_000
    assert sum(s.node_count for s in manifest.stages) == len(view.compute_nodes)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    chain_equals_model(tmp_path / "out", path, {"x": x})


# --------------------------------------------------------------------------------------------------
# external weights: read once, by their stage


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """8 layers of two 16 x 1024 weights (64 KiB each, 1 MiB in all) in ``big.onnx.data``."""
    (tmp_path / "src").mkdir()
    return make_big_weights(tmp_path / "src" / "big.onnx", 1 << 20, layers=8, width=16)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int | None, str]]]:
    """Every tensor the exporter reads from the source's weight files, with the stage it was read for."""
    log: list[tuple[int | None, str]] = []
    stage: list[int | None] = [None]
    real_read = external.read_source
    real_externalize = export.externalize
    real_build = stagebuild.StageBuilder.build

    def read_source(t: onnx.TensorProto, src: Path) -> Iterator[bytes]:
        log.append((stage[0], t.name))
        return real_read(t, src)

    def externalize(model: onnx.ModelProto, path: Path, *args: object) -> str | None:
        stage[0] = int(path.name.split("_")[1].split(".")[0])  # stage_<i>.onnx.data
        try:
            return real_externalize(model, path, *args)  # type: ignore[arg-type]
        finally:
            stage[0] = None

    def build(self: stagebuild.StageBuilder, spec: object, **kwargs: object) -> onnx.ModelProto:
        stage[0] = spec.index  # type: ignore[attr-defined]
        try:
            return real_build(self, spec, **kwargs)  # type: ignore[arg-type]
        finally:
            stage[0] = None

    monkeypatch.setattr(external, "read_source", read_source)  # what a small weight read inline uses
    monkeypatch.setattr(weightfile, "read_source", read_source)  # what a weight copied in chunks uses
    monkeypatch.setattr(export, "externalize", externalize)
    monkeypatch.setattr(stagebuild.StageBuilder, "build", build)
    yield log


def test_each_external_weight_is_read_once_by_its_own_stage(
    big: Path, tmp_path: Path, reads: list[tuple[int | None, str]]
) -> None:
    view = load_model(big)
    assert not any(t.raw_data for t in view.proto.graph.initializer)  # loading read no weight
    plan = make_plan(view, static_profile(view), 4)
    manifest = export_stages(view, plan, tmp_path / "out")
    expected = [(s.index, t) for s in plan.stages for n in s.node_names for t in view.node_by_name[n].inputs]
    expected = [(i, t) for i, t in expected if t in view.initializers]
    assert sorted(reads) == sorted(expected)  # once each, while its stage was built, and nothing else
    assert not any(t.raw_data for t in view.proto.graph.initializer)  # the view still holds none
    for entry in manifest.stages:  # each stage's data file holds exactly its own weights
        assert entry.external_data is not None
        assert (tmp_path / "out" / entry.external_data).stat().st_size == entry.param_bytes
    assert sum(s.param_bytes for s in manifest.stages) == view.param_bytes
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    chain_equals_model(tmp_path / "out", big, {"x": x})


def test_never_over_the_limit_is_refused_before_any_weight_is_read(
    big: Path, tmp_path: Path, reads: list[tuple[int | None, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "PROTOBUF_LIMIT", 200_000)  # a stage of 4 layers holds 512 KiB
    view = load_model(big)
    plan = make_plan(view, static_profile(view), 2)
    with pytest.raises(ExportError) as info:
        export_stages(view, plan, tmp_path / "out", ExportOptions(external_data="never"))
    assert str(info.value) == (
        f"{tmp_path / 'out' / 'stage_0.onnx'}: stage 0 holds 0.00 GB, over protobuf's 2 GB limit; "
        "use `external_data=auto` or always"
    )
    assert reads == [] and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------------
# stages over 2 GB, with the limits lowered


def test_inline_model_with_a_stage_over_the_limit_goes_external_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto``: a stage over the limit gets its own weights file; the others stay one file each."""
    path = save(shared_weights_model(width=32), tmp_path / "m.onnx")  # 4 KiB per weight
    view = load_model(path)
    plan = plan_for(view, [0, 6, 9, 13])  # 3, 2, 2 weights
    monkeypatch.setattr(export, "AUTO_EXTERNAL_BYTES", 10_000)
    monkeypatch.setattr(export, "PROTOBUF_LIMIT", 10_000)
    manifest = export_stages(view, plan, tmp_path / "auto")
    assert [s.external_data for s in manifest.stages] == ["stage_0.onnx.data", None, None]
    assert (tmp_path / "auto" / "stage_0.onnx.data").stat().st_size == 3 * 4096
    x = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)
    chain_equals_model(tmp_path / "auto", path, {"x": x})
    manifest = export_stages(view, plan, tmp_path / "always", ExportOptions(external_data="always"))
    assert [s.external_data for s in manifest.stages] == [f"stage_{i}.onnx.data" for i in range(3)]
    with pytest.raises(ExportError, match=r"stage_0\.onnx: stage 0 holds .* over protobuf's 2 GB limit"):
        export_stages(view, plan, tmp_path / "never", ExportOptions(external_data="never"))
    assert not (tmp_path / "never").exists()


def test_single_stage_over_the_limit_end_to_end(
    big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K=1: the whole model is one stage over the (lowered) limit; split, verify, run."""
    monkeypatch.setattr(export, "AUTO_EXTERNAL_BYTES", 100_000)
    monkeypatch.setattr(export, "PROTOBUF_LIMIT", 100_000)
    result = split(
        big, SplitOptions(out=tmp_path / "out", plan=PlanRequest(1), profile=ProfileOptions(cost="static"))
    )
    assert result.report is not None and result.report.ok
    (entry,) = result.manifest.stages
    assert entry.external_data == "stage_0.onnx.data"
    assert (tmp_path / "out" / "stage_0.onnx").stat().st_size < 100_000
    assert load_manifest(tmp_path / "out").stages[0].external_data_sha256 == entry.external_data_sha256


# --------------------------------------------------------------------------------------------------
# peak memory


PEAK_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[3])
from onnxpipe.cost.static import static_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.core.files import file_sha256
from onnxpipe.ir.load import load_model
from onnxpipe.planning.planner import make_plan

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

view = load_model(sys.argv[1])
plan = make_plan(view, static_profile(view), 4)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
floor = status("VmRSS")
manifest = export_stages(view, plan, sys.argv[2])
largest = max(s.param_bytes for s in manifest.stages)
print(json.dumps({"floor": floor, "peak": status("VmHWM"), "largest": largest}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to read peak memory"
)
def test_export_peak_memory_follows_the_largest_stage_not_the_model(tmp_path: Path) -> None:
    total = 240_000_000
    (tmp_path / "src").mkdir()
    model = make_big_weights(tmp_path / "src" / "big.onnx", total, layers=8)
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_CHILD, str(model), str(tmp_path / "out"), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        check=True,
    )
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    above = m["peak"] - m["floor"]
    # one stage's weights in memory, plus onnxruntime's check of it: about 1.7x the largest stage
    assert m["largest"] <= 0.3 * total
    assert above < 0.6 * total, (
        f"export peak {above / 1e6:.0f} MB above the floor for a {total / 1e6:.0f} MB model"
    )
    assert above < 2.5 * m["largest"]


def test_weights_file_offsets_are_aligned_and_the_hash_is_of_the_file(tmp_path: Path) -> None:
    """Weights of 1600 bytes each: every one starts at a multiple of 4096 (onnxruntime can map them)."""
    path = save(shared_weights_model(width=20), tmp_path / "m.onnx")
    view = load_model(path)
    manifest = export_stages(
        view, plan_for(view, [0, 6, 13]), tmp_path / "out", ExportOptions(external_data="always")
    )
    for entry in manifest.stages:
        assert entry.external_data is not None
        data = tmp_path / "out" / entry.external_data
        assert entry.external_data_sha256 == file_sha256(data)
        stage = onnx.load(str(tmp_path / "out" / entry.file), load_external_data=False)
        for t in stage.graph.initializer:
            where = {e.key: int(e.value) for e in t.external_data if e.key != "location"}
            assert where["offset"] % 4096 == 0 and where["length"] == 1600
    x = np.random.default_rng(3).standard_normal((2, 20)).astype(np.float32)
    chain_equals_model(tmp_path / "out", path, {"x": x})
