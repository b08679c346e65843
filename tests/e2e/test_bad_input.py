"""Bad input gets one clear line, a documented exit code, and leaves the file system as it was.

Through :func:`onnxpipe.cli.main` (in-process; a child process where a real write limit is needed).
The basic cases (missing, folder, text, truncated, checker, K out of range, folder exists, malformed
manifest, changed stage) are in ``tests/test_cli.py``; this file covers the rest of the list: opsets
onnxruntime cannot run, training info, external weights that are missing or truncated, a disk that
fills at each kind of file (stage, weights, manifest, with and without an old folder to keep), a
profile or a manifest that belongs to another model, a stage's weights file changed after export, and
manifests that are well-formed JSON but say impossible things.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_runner import preamble_only, run, run_with_file_size_limit
from manifest_edits import sealed
from models import save, shared_weights_model, training_model

from tools import conformance

# --------------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def model(work: Path) -> Path:
    """A 13-node MLP with a shared weight, inline weights."""
    return save(shared_weights_model(), work / "m.onnx")


def external_model(folder: Path) -> Path:
    """The same MLP with its weights in ``weights.bin`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ext.onnx"
    onnx.save_model(shared_weights_model(), str(path), save_as_external_data=True, location="weights.bin")
    return path


def error_line(err: str, command: str = "split", *, where: bool = True) -> str:
    """The one line on stderr: ``onnxpipe <command>: error: <where>: <what>; <what to do>``.

    Paths below the current folder are shown relative to it, whether the message named them so or made
    them absolute (``split`` names its output folder absolute).
    """
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    shape = r"\S.*: .+; \S.*" if where else r".+; \S.*"
    assert re.match(rf"^onnxpipe {command}: error: {shape}$", lines[0]), lines[0]
    return lines[0].replace(f"{Path.cwd()}{os.sep}", "")


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder below ``folder`` (hidden ones too), files with their sha256."""
    state: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        state[key] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return state


def split_static(model: Path, out: str, k: int = 3, *extra: str) -> list[object]:
    return ["split", model, "-k", k, "--out", out, "--cost", "static", *extra]


def rehash(out: Path) -> None:
    """Record every file's current sha256 in the manifest, as if the export had written them."""
    manifest = json.loads((out / "manifest.json").read_text())
    for st in manifest["stages"]:
        st["sha256"] = hashlib.sha256((out / st["file"]).read_bytes()).hexdigest()
    (out / "manifest.json").write_text(sealed(manifest))


# --------------------------------------------------------------------------------------------------
# models onnxpipe cannot split, said before anything is written


def newest_default_opset() -> int:
    """The newest ``ai.onnx`` opset this onnxruntime accepts (it refuses the next one)."""
    m = shared_weights_model()
    for version in range(17, 200):
        m.opset_import[0].version = version
        options = ort.SessionOptions()
        options.log_severity_level = 4
        try:
            ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - the first refused version ends the search
            return version - 1
    raise AssertionError("onnxruntime accepts every opset up to 200")


@pytest.fixture(scope="module")
def too_new(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    newest = newest_default_opset()
    m = shared_weights_model()
    m.opset_import[0].version = newest + 1
    m.ir_version = 11
    path = tmp_path_factory.mktemp("too_new") / "too_new.onnx"
    onnx.save_model(m, str(path))
    return path, newest


def test_opset_onnxruntime_cannot_run_exits_3(
    too_new: tuple[Path, int], work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path, newest = too_new
    code, out, err = run(split_static(path, "out"), capfd)
    assert code == 3 and out == ""
    assert error_line(err) == (
        f"onnxpipe split: error: {path}: opset {newest + 1} of domain ai.onnx is newer than onnxruntime "
        f"{ort.__version__} runs (up to {newest}); re-export the model at opset {newest} or lower, or "
        "upgrade onnxruntime"
    )
    assert list(work.iterdir()) == []


def test_opset_onnxruntime_cannot_run_exits_3_before_profiling(
    too_new: tuple[Path, int], work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path, newest = too_new
    code, _, err = run(["split", path, "-k", "2", "--out", "out"], capfd)
    assert code == 3
    assert f"opset {newest + 1} of domain ai.onnx is newer than onnxruntime" in error_line(err)
    assert list(work.iterdir()) == []


def test_ml_domain_opset_too_new_exits_3(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    m = shared_weights_model()
    m.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml", 99))
    path = work / "ml.onnx"
    onnx.save_model(m, str(path))
    before = snapshot(work)
    code, _, err = run(split_static(path, "out"), capfd)
    assert code == 3
    assert "opset 99 of domain ai.onnx.ml is newer than onnxruntime" in error_line(err)
    assert snapshot(work) == before


def test_training_info_exits_6_and_says_why(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = save(training_model(), work / "trainable.onnx")
    before = snapshot(work)
    code, out, err = run(split_static(path, "out", 2), capfd)
    assert code == 6 and out == ""
    assert error_line(err) == (
        "onnxpipe split: error: trainable.onnx: carries training_info (1 training algorithm(s) bound to "
        "its weights), which cannot be split across stages; save the model without it "
        "(del model.training_info[:]) and split that"
    )
    assert snapshot(work) == before


def test_missing_external_weights_exit_3(work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = external_model(work / "src")
    (path.parent / "weights.bin").unlink()
    before = snapshot(work)
    code, _, err = run(split_static(path, "out"), capfd)
    assert code == 3
    line = error_line(err)
    assert "ext.onnx" in line and "weights.bin" in line
    assert snapshot(work) == before


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_external_weights_exit_3(
    keep: float, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = external_model(work / "src")
    data = path.parent / "weights.bin"
    data.write_bytes(data.read_bytes()[: int(data.stat().st_size * keep)])
    before = snapshot(work)
    code, _, err = run(split_static(path, "out"), capfd)
    assert code == 3, err
    line = error_line(err)  # the loader or, failing that, the exporter finds it
    assert "weights.bin" in line and "truncated" in line and "copy it again" in line
    assert snapshot(work) == before


# --------------------------------------------------------------------------------------------------
# the disk fills


@pytest.mark.parametrize("old", [False, True], ids=["new-folder", "old-folder"])
@pytest.mark.parametrize("at", ["stage", "weights", "manifest"])
def test_disk_full_at_each_file_exits_6_and_keeps_the_old_folder(
    at: str,
    old: bool,
    model: Path,
    work: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnxpipe.core.files

    if old:  # a previous split (--force replaces only its files)
        (work / "out").mkdir()
        (work / "out" / "manifest.json").write_text("{}")
        (work / "out" / "stage_0.onnx").write_text("keep me")
    before = snapshot(work)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    failing = {"stage": "stage_1.onnx", "weights": "stage_1.onnx.data", "manifest": "manifest.json"}[at]
    if at == "manifest":

        def fsync(fd: int) -> None:
            raise full

        monkeypatch.setattr(onnxpipe.core.files.os, "fsync", fsync)
    elif at == "stage":
        real_save = onnx.save_model

        def save_model(proto: onnx.ModelProto, path: str, *args: object, **kwargs: object) -> None:
            if Path(path).name == failing:
                raise full
            real_save(proto, path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(onnx, "save_model", save_model)
    else:  # the weights file is created, then the disk is full
        real_open = Path.open

        def open_(self: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
            f = real_open(self, mode, *args, **kwargs)  # type: ignore[call-overload]
            if self.name == failing:

                def write(data: bytes) -> int:
                    raise full

                f.write = write
            return f

        monkeypatch.setattr(Path, "open", open_)
    extra = ("--force",) if old else ()
    mode = ("--external-data", "always") if at == "weights" else ()
    code, out, err = run(split_static(model, "out", 3, *extra, *mode), capfd)
    assert code == 6 and preamble_only(out)  # said what it would do, then failed writing: no result
    assert error_line(err) == (
        f"onnxpipe split: error: out/{failing}: cannot be written (No space left on device: disk full); "
        "out is left as it was; free some space or choose another --out"
    )
    assert snapshot(work) == before


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file size limits")
def test_real_write_limit_on_a_weights_file_keeps_the_old_folder(work: Path) -> None:
    """A real short write (the OS refuses the bytes past the limit) while the weights file of a stage is
    written; the old folder given with --force stays as it was."""
    big = shared_weights_model(width=64)  # 16 KiB weights per MatMul
    path = save(big, work / "big.onnx")
    (work / "out").mkdir()
    (work / "out" / "manifest.json").write_text("{}")
    (work / "out" / "stage_0.onnx").write_text("keep me")
    before = snapshot(work)
    proc = run_with_file_size_limit(
        30_000, split_static(path, "out", 2, "--force", "--external-data", "always"), work
    )
    assert proc.returncode == 6, proc.stderr
    line = error_line(proc.stderr)
    assert re.search(
        r"out/stage_\d\.onnx\.data: cannot be written \(File too large\); out is left as it was$", line
    )
    assert snapshot(work) == before


# --------------------------------------------------------------------------------------------------
# profiles and manifests of another model, files changed after export


def test_profile_of_the_model_before_it_was_edited_exits_4(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert run(["profile", model, "--out", "p.json", "--cost", "static"], capfd)[0] == 0
    edited = shared_weights_model()
    edited.graph.node[0].name = "renamed"
    save(edited, model)  # same file name, other content
    before = snapshot(work)
    code, _, err = run(["split", model, "-k", "2", "--out", "out", "--profile", "p.json"], capfd)
    assert code == 4
    line = error_line(err, where=False)
    assert "p.json: made for model m.onnx" in line and "re-run onnxpipe profile" in line
    assert snapshot(work) == before


@pytest.fixture
def two_splits(model: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    other = shared_weights_model()
    other.graph.initializer[0].raw_data = np.ones((16, 16), np.float32).tobytes()
    other_path = save(other, work / "other.onnx")
    assert run(split_static(model, "a", 2, "--external-data", "always"), capfd)[0] == 0
    assert run(split_static(other_path, "b", 2, "--external-data", "always"), capfd)[0] == 0
    return work / "a", work / "b"


def test_manifest_of_another_model_is_refused(
    two_splits: tuple[Path, Path], work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    a, b = two_splits
    shutil.copy(b / "manifest.json", a / "manifest.json")  # a's stages, b's manifest
    before = snapshot(work)
    code, _, err = run(["verify", a], capfd)
    assert code == 7
    line = error_line(err, "verify")
    assert re.search(
        r"a/manifest\.json: stage 0 file stage_0\.onnx(\.data)? changed after export \(sha256", line
    )
    # the matching model given by hand is refused too: its sha256 is not the manifest's
    code, _, err = run(["verify", b, "--model", work / "m.onnx"], capfd)
    assert code == 7 and "is not the source sha256" in error_line(err, "verify")
    assert snapshot(work) == before


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_stage_weights_file_changed_or_missing_exits_7(
    damage: str, two_splits: tuple[Path, Path], work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_splits
    data = a / "stage_1.onnx.data"
    if damage == "changed":
        raw = bytearray(data.read_bytes())
        raw[10] ^= 0xFF
        data.write_bytes(bytes(raw))
    else:
        data.unlink()
    before = snapshot(work)
    for command in (["verify", a], ["inspect", a]):
        code, out, err = run(command, capfd)
        what = "changed after export (sha256 mismatch)" if damage == "changed" else "is missing"
        if command[0] == "inspect":  # inspect still shows the folder, and names the damage
            assert code == 1 and f"error: stage 1 file stage_1.onnx.data {what}" in out
            continue
        assert code == 7
        what = "changed after export (sha256 mismatch)" if damage == "changed" else "is missing"
        assert f"stage 1 file stage_1.onnx.data {what}; re-run onnxpipe split" in error_line(err, "verify")
    assert snapshot(work) == before


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m["stages"][0]["inputs"].append({**m["stages"][1]["outputs"][0], "source": 1}), "source"),
        (lambda m: m["stages"][1].update(file="stage_0.onnx"), "listed twice"),
        (lambda m: m["model_outputs"][0].update(produced_by=0), "produced_by"),
        (lambda m: m["plan"].update(k=5), "plan.k"),
    ],
    ids=["forward-edge", "same-file-twice", "wrong-producer", "wrong-k"],
)
def test_manifest_that_says_impossible_things_exits_7(
    edit: object, says: str, two_splits: tuple[Path, Path], work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    a, _ = two_splits
    manifest = json.loads((a / "manifest.json").read_text())
    edit(manifest)  # type: ignore[operator]
    (a / "manifest.json").write_text(sealed(manifest))
    before = snapshot(work)
    for command in ("verify", "inspect"):
        code, _, err = run([command, a], capfd)
        assert code == 7
        line = error_line(err, command)
        assert "a/manifest.json" in line and says in line and line.endswith("; re-run onnxpipe split")
    assert snapshot(work) == before


def test_output_folder_holding_the_source_is_never_deleted(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(work)
    code, _, err = run(split_static(model, ".", 2, "--force"), capfd)
    assert code == 6
    assert error_line(err) == (
        f"onnxpipe split: error: {work}: holds the source model m.onnx; --force would delete it; "
        "choose another --out"
    )
    assert snapshot(work) == before


def test_output_that_is_the_source_file_itself_is_refused(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(work)
    code, _, err = run(split_static(model, "m.onnx", 2, "--force"), capfd)
    assert code == 6
    assert (
        error_line(err) == "onnxpipe split: error: m.onnx: exists and is not a folder; choose another --out"
    )
    assert snapshot(work) == before


# --------------------------------------------------------------------------------------------------
# --force replaces an earlier split, never the user's own folder


def test_force_refuses_a_folder_that_holds_no_split(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Regression: --force replaced any non-empty folder, and the user's files in it were lost."""
    (work / "out" / "photos").mkdir(parents=True)
    (work / "out" / "notes.txt").write_text("keep me")
    (work / "out" / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    (work / "out" / "stage_0.onnx").write_bytes(b"mine, not a stage")
    before = snapshot(work)
    for force in (["--force"], []):  # issue 39: without --force, the refusal does not suggest it
        code, out, err = run(split_static(model, "out", 2, *force), capfd)
        assert code == 6 and out == ""
        assert error_line(err) == (
            "onnxpipe split: error: out: exists, is not empty and holds no earlier split (manifest.json); "
            "choose another --out or empty it (--force replaces only an earlier split)"
        )
        assert snapshot(work) == before


def test_force_replaces_an_earlier_split(model: Path, work: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(split_static(model, "out", 3), capfd)
    assert code == 0, err
    code, _, err = run(split_static(model, "out", 2, "--force"), capfd)
    assert code == 0, err
    assert sorted(p.name for p in (work / "out").iterdir()) == [
        "manifest.json",
        "stage_0.onnx",
        "stage_1.onnx",
    ]
    assert sorted(p.name for p in work.iterdir()) == ["m.onnx", "out"]


@pytest.mark.parametrize("previous_split", [False, True])
def test_force_never_deletes_the_current_folder(
    previous_split: bool,
    model: Path,
    work: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: '--out . --force' deleted the current folder's files, then failed inside it."""
    here = work / "here"
    here.mkdir()
    (here / "notes.txt").write_text("keep me")
    if previous_split:  # even an earlier split: the process would be left in a deleted folder
        (here / "manifest.json").write_text("{}")
    monkeypatch.chdir(here)
    before = snapshot(work)
    code, out, err = run(split_static(model, ".", 2, "--force"), capfd)
    assert code == 6 and out == ""
    assert error_line(err) == (
        f"onnxpipe split: error: {here}: is the current folder; --force would delete it; "
        "choose another --out or run from elsewhere"
    )
    assert snapshot(work) == before
    (here / "deeper").mkdir()
    monkeypatch.chdir(here / "deeper")
    before = snapshot(work)
    code, _, err = run(split_static(model, "..", 2, "--force"), capfd)
    assert code == 6
    assert f"{here}: holds the current folder; --force would delete it" in error_line(err)
    assert snapshot(work) == before


def test_force_into_the_current_empty_folder_fills_it(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (work / "here").mkdir()
    monkeypatch.chdir(work / "here")
    code, _, err = run(split_static(model, ".", 2, "--force"), capfd)
    assert code == 0, err
    assert sorted(p.name for p in (work / "here").iterdir()) == [
        "manifest.json",
        "stage_0.onnx",
        "stage_1.onnx",
    ]


SEQUENCE_CASES = [
    c for c in conformance.cases("sequence_map", "sequence_map") if c.name.endswith("_expanded")
]


@pytest.mark.parametrize("case", SEQUENCE_CASES, ids=lambda c: c.name)
def test_a_sequence_input_is_refused_before_any_work_unless_nothing_runs_the_model(
    case: conformance.Case, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """No random value can be made for a sequence input: a split that would run the model (to measure,
    or to verify) is refused in one line before anything is written; static costs without verification
    split it."""
    path = work / "seq.onnx"
    onnx.save(case.model, str(path))
    code, out, err = run(split_static(path, "out", 2), capfd)
    assert code == 2 and "is a sequence of" in error_line(err) and "--no-verify" in err, err
    assert out == "" and not (work / "out").exists()
    code, _, err = run([*split_static(path, "out", 2), "--no-verify"], capfd)
    assert code == 0, err


def test_force_replaces_only_what_a_split_wrote(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A file the user put into an earlier split's folder stops ``--force``: nothing is deleted."""
    code, _, err = run(split_static(model, "out"), capfd)
    assert code == 0, err
    (work / "out" / "NOTES.txt").write_text("mine")
    before = snapshot(work / "out")
    for force in (["--force"], []):
        code, _, err = run([*split_static(model, "out"), *force], capfd)
        assert code == 6 and "holds NOTES.txt, which no split wrote" in error_line(err) and "--force" in err
        assert "pass --force" not in err
        assert snapshot(work / "out") == before
    (work / "out" / "NOTES.txt").unlink()
    (work / "out" / "chat_template.jinja").write_text("{{ messages }}")  # as generate --chat suggests
    code, _, err = run(split_static(model, "out"), capfd)
    assert code == 6 and error_line(err).endswith(
        "choose another --out or pass --force to replace it (the chat_template.jinja you added stay)"
    )
    code, _, err = run([*split_static(model, "out", 2), "--force"], capfd)
    assert code == 0, err
    assert (work / "out" / "chat_template.jinja").read_text() == "{{ messages }}"
    assert not (work / "out" / "stage_2.onnx").exists()


def _empty_folder_no_file_can_be_made_in(tmp: Path) -> Path:
    """An empty folder that refuses new files: a read-only one, or for root (whom permissions do not
    stop) an empty folder of /sys, which refuses files to everyone."""
    if os.geteuid() != 0:
        folder = tmp / "ro"
        folder.mkdir(mode=0o555)
        return folder
    for candidate in sorted(Path("/sys/kernel").glob("*")):
        try:
            if candidate.is_dir() and not any(candidate.iterdir()):
                (candidate / ".probe").touch()
                (candidate / ".probe").unlink()
        except OSError:
            return candidate
    pytest.skip("no empty folder that refuses files here")


def test_an_empty_folder_that_refuses_files_is_refused_before_the_model_loads(
    model: Path, work: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = _empty_folder_no_file_can_be_made_in(work)
    code, stdout, err = run(["split", model, "-k", "2", "--out", out], capfd)
    assert code == 6 and "cannot be written" in error_line(err) and stdout == ""
