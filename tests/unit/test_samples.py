"""``--inputs``: reading sample files, checking them against the model (every mistake one line naming
the input and what the model expects), the record the manifest and profile keep, linked unnamed dims,
and the hint a run at guessed sizes gives."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnxpipe.core.codec import Codec
from onnxpipe.core.errors import PartitionError, UsageError
from onnxpipe.core.inputfiles import InputRecord, read_input_file
from onnxpipe.core.jsonread import Document
from onnxpipe.cost.profile import Profile
from onnxpipe.cost.static import static_profile
from onnxpipe.ir.feeds import random_feeds
from onnxpipe.ir.load import load_model, view_from_proto
from onnxpipe.ir.model import ModelView
from onnxpipe.ir.samples import load_samples, samples_from_feeds
from onnxpipe.ir.shapes import failure_hint, guessed_dims, resolve_input_shapes, valued_inputs
from onnxpipe.ir.symbolic import linked_input_shapes
from onnxpipe.planning.workers import make_plan


@pytest.fixture(scope="module")
def vad(sample_models_dir: Path) -> ModelView:
    return load_model(sample_models_dir / "vad_like.onnx")


def good(batch: int = 1, samples: int = 512) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "input": rng.standard_normal((batch, samples)).astype(np.float32),
        "state": np.zeros((2, batch, 128), np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }


def save(tmp_path: Path, name: str = "a.npz", **arrays: np.ndarray) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_an_npz_is_one_sample_checked_and_recorded(vad: ModelView, tmp_path: Path) -> None:
    path = save(tmp_path, **good())
    samples = load_samples(vad, [path])
    assert len(samples.feeds) == 1
    assert samples.shapes == {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
    (record,) = samples.records
    assert record.file == "a.npz" and record.samples == 1
    assert len(record.sha256) == 64 and record.shapes["input"] == (1, 512)


def test_a_folder_of_npy_files_and_repeated_files_are_samples(vad: ModelView, tmp_path: Path) -> None:
    folder = tmp_path / "sample"
    folder.mkdir()
    for name, value in good().items():
        np.save(folder / f"{name}.npy", value)
    samples = load_samples(vad, [folder, save(tmp_path, **good())])
    assert len(samples.feeds) == 2
    assert [r.file for r in samples.records] == ["sample", "a.npz"]
    np.testing.assert_array_equal(samples.feeds[0]["input"], samples.feeds[1]["input"])


def test_a_stacked_npz_gives_one_sample_per_row(vad: ModelView, tmp_path: Path) -> None:
    rows = [good() for _ in range(3)]
    stacked = {n: np.stack([r[n] for r in rows]) for n in rows[0]}
    samples = load_samples(vad, [], stacked=[save(tmp_path, **stacked)])
    assert len(samples.feeds) == 3 and samples.records[0].samples == 3
    assert samples.shapes["state"] == (2, 1, 128)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda f: f.pop("state"),
            r"no array for model input 'state', which the model expects as float32 \[2, \?, 128\]",
        ),
        (
            lambda f: f.update(extra=np.zeros(1)),
            r"'extra' is not an input of the model; its inputs are input, state, sr",
        ),
        (
            lambda f: f.update(sr=np.array(16000, np.int32)),
            r"input 'sr' is int32, the model expects int64 \[\]; save it as int64",
        ),
        (
            lambda f: f.update(input=np.zeros(512, np.float32)),
            r"input 'input' has rank 1 \(shape \[512\]\), the model expects rank 2",
        ),
        (
            lambda f: f.update(state=np.zeros((2, 1, 64), np.float32)),
            r"dim 2 of input 'state' is 64, the model fixes it at 128",
        ),
    ],
    ids=["missing", "extra", "dtype", "rank", "fixed-dim"],
)
def test_every_mistake_is_one_line_naming_the_input(
    vad: ModelView, tmp_path: Path, change: object, expected: str
) -> None:
    feeds = good()
    change(feeds)  # type: ignore[operator]
    path = save(tmp_path, **feeds)
    with pytest.raises(UsageError, match=expected) as info:
        load_samples(vad, [path])
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_unreadable_files_are_refused_naming_them(vad: ModelView, tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(UsageError, match=r"`input_files=.*bad.npz`: is not an .npz file"):
        load_samples(vad, [bad])
    with pytest.raises(UsageError, match=r"no such file or folder"):
        load_samples(vad, [tmp_path / "missing.npz"])
    single = tmp_path / "one.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(UsageError, match=r"holds a single array, not one per input"):
        load_samples(vad, [single])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"the folder holds no .npy file"):
        load_samples(vad, [empty])


def test_stacked_files_must_agree_on_the_sample_count(tmp_path: Path) -> None:
    path = save(tmp_path, a=np.zeros((3, 2)), b=np.zeros((2, 2)))
    with pytest.raises(UsageError, match=r"different numbers of samples \(a: 3, b: 2\)"):
        read_input_file(path, stacked=True)
    scalar = save(tmp_path, "s.npz", a=np.array(1.0))
    with pytest.raises(UsageError, match=r"array 'a' has no leading sample axis"):
        read_input_file(scalar, stacked=True)


def test_samples_share_their_shapes(vad: ModelView, tmp_path: Path) -> None:
    with pytest.raises(
        UsageError, match=r"sample 1 gives input 'input' shape \[1, 256\], sample 0 gives \[1, 512\]"
    ):
        load_samples(vad, [save(tmp_path, **good()), save(tmp_path, "b.npz", **good(samples=256))])


def test_one_symbol_one_size(sample_models_dir: Path) -> None:
    view = load_model(sample_models_dir / "transformer_tiny.onnx")
    with pytest.raises(UsageError, match=r"rank 1"):
        samples_from_feeds(view, [{"tokens": np.zeros(4, np.int64)}])
    mlp = load_model(sample_models_dir / "mlp.onnx")
    ok = samples_from_feeds(mlp, [{"x": np.zeros((3, 64), np.float32)}], "api")
    assert ok.shapes == {"x": (3, 64)} and ok.records[0].file == "api"


def test_the_record_round_trips_through_json() -> None:
    record = InputRecord("a.npz", "ab" * 32, {"x": (1, 512), "sr": ()}, 2)
    data = json.loads(json.dumps(Codec().encode(InputRecord, record)))
    assert data == {"file": "a.npz", "sha256": "ab" * 32, "shapes": {"x": [1, 512], "sr": []}, "samples": 2}
    read = Codec().decode(InputRecord, Document("t", UsageError, "fix it").read(data))
    assert read.file == "a.npz" and read.samples == 2 and dict(read.shapes) == {"x": (1, 512), "sr": ()}


def test_unnamed_dims_that_must_agree_are_linked(vad: ModelView) -> None:
    links = linked_input_shapes(vad)
    assert links["state"][1] == links["input"][0]  # the state's rows are the input's batch
    assert links["input"][0] != links["input"][1]
    assert resolve_input_shapes(vad) == {"input": (1, 16), "state": (2, 1, 128), "sr": ()}
    # a size given for one reaches the other
    assert resolve_input_shapes(vad, {"input": (3, 512)})["state"] == (2, 3, 128)


def test_the_hint_names_the_guessed_dims_and_the_flags(vad: ModelView) -> None:
    used = resolve_input_shapes(vad)
    assert guessed_dims(vad) == [("input", 0, None), ("input", 1, None), ("state", 1, None)]
    hint = failure_hint(vad, used)
    assert "'input' dim 1 = 16" in hint and "'state' dim 1 = 1" in hint
    assert "`shapes=input=1,16` `shapes=state=2,1,128`" in hint and "`input_files=FILE.npz`" in hint
    # an input given is not guessed, nor a symbol it fixes
    assert guessed_dims(vad, {"input": (1, 512)}) == [("state", 1, None)]


def test_the_hint_sends_a_scalar_whose_value_matters_to_real_inputs(vad: ModelView) -> None:
    """Issue 39: ``sr`` (an int64 scalar choosing an If branch) was offered ``--shape sr=``, which no
    size can change; only real inputs set its value."""
    used = resolve_input_shapes(vad)
    assert valued_inputs(vad, used) == ["sr"]
    note = " (the only way to set the value of sr, an int64 scalar, which was random here)"
    assert failure_hint(vad, used).endswith("`input_files=FILE.npz`" + note)
    given = failure_hint(vad, used, used)  # every size given: nothing guessed
    assert given == (
        "give the shapes the model runs at with `shapes=input=1,16` `shapes=state=2,1,128` (edited), or real "
        "inputs with `input_files=FILE.npz`" + note
    )
    assert "sr=" not in given


def test_a_profile_keeps_the_records_of_its_inputs_not_the_data(vad: ModelView, tmp_path: Path) -> None:
    samples = load_samples(vad, [save(tmp_path, **good())])
    prof = static_profile(vad, shapes=samples.shapes)
    given = Profile.from_json(dataclasses.replace(prof, inputs=samples.records, samples=samples).to_json())
    assert given.inputs == samples.records and given.samples is None
    assert given.input_shapes == {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
    assert "inputs" not in json.loads(prof.to_json())


def test_too_many_stages_names_the_largest_number_that_works(sample_models_dir: Path) -> None:
    view = load_model(sample_models_dir / "mlp.onnx")
    m = len(view.compute_nodes)
    with pytest.raises(PartitionError, match=rf"the largest number of stages that works is {m}: "):
        make_plan(view, static_profile(view), m + 1)


def test_sequence_inputs_have_no_shape_to_guess_and_take_real_values() -> None:
    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["seq"], ["n"], name="len")],
        "g",
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    view = view_from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert resolve_input_shapes(view) == {}
    with pytest.raises(
        UsageError, match=r"input 'seq' is a sequence of float32 tensors, which onnxpipe cannot"
    ):
        random_feeds(view, {})
    samples = samples_from_feeds(view, [{"seq": [np.zeros(2, np.float32)]}])
    assert samples.shapes == {}
    with pytest.raises(UsageError, match=r"input 'seq' must be a list \(a sequence\)"):
        samples_from_feeds(view, [{"seq": np.zeros(2, np.float32)}])
