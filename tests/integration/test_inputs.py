"""Real sample inputs (``--inputs``) through profiling, calibration, export and verification, on the
sample model that only runs with them (an ``If`` on a sample rate, a reflect pad), and the retry at a
larger sequence size that saves a model failing at the guessed one."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run

from onnxpipe import api
from onnxpipe.api import CalibrationOptions, PlanRequest, ProfileOptions, SplitOptions, VerifyOptions, verify
from onnxpipe.core.errors import ProfileError
from onnxpipe.cost.measure import profile_model
from onnxpipe.ir.load import load_model
from onnxpipe.ir.shapes import RETRY_SEQUENCE_SIZE
from tools import make_sample_models


@pytest.fixture()
def speech(tmp_path: Path) -> Path:
    """One sample of 16 kHz audio for ``vad_like.onnx``."""
    rng = np.random.default_rng(0)
    path = tmp_path / "speech.npz"
    np.savez(
        path,
        input=rng.standard_normal((1, 512)).astype(np.float32),
        state=np.zeros((2, 1, 128), np.float32),
        sr=np.array(16000, dtype=np.int64),
    )
    return path


def test_the_real_input_models_are_regenerated_byte_for_byte(tmp_path: Path, sample_models_dir: Path) -> None:
    for path in make_sample_models.write_real_input_models(tmp_path):
        assert path.read_bytes() == (sample_models_dir / path.name).read_bytes(), (
            f"{path.name} differs from what tools/make_sample_models.py writes: regenerate it"
        )


def test_a_model_that_fails_on_random_inputs_splits_calibrates_and_verifies_with_inputs(
    sample_models_dir: Path, speech: Path, tmp_path: Path
) -> None:
    model = sample_models_dir / "vad_like.onnx"
    with pytest.raises(ProfileError) as info:
        api.split(
            model,
            SplitOptions(
                out=tmp_path / "random", plan=PlanRequest(3), profile=ProfileOptions(runs=2, warmup=1)
            ),
        )
    message = str(info.value)
    assert "'input' dim 1 = 16" in message and "`input_files" in message and "`shapes=input=" in message

    options = partial(
        SplitOptions,
        profile=ProfileOptions(runs=3, warmup=1, input_files=(speech,)),
        calibration=CalibrationOptions(rounds=1, mode="alone"),
    )
    result = api.split(model, options(out=tmp_path / "stages", plan=PlanRequest(3)))
    assert result.report is not None and result.report.ok
    assert result.report.input_shapes == {"input": (1, 512), "state": (2, 1, 128), "sr": ()}
    (record,) = result.manifest.plan.profiled_inputs
    assert record.file == "speech.npz" and record.shapes["input"] == (1, 512)
    written = json.loads((tmp_path / "stages" / "manifest.json").read_text())
    assert written["plan"]["profiled_inputs"][0]["sha256"] == record.sha256
    assert verify(tmp_path / "stages", VerifyOptions(input_files=[speech])).ok


def test_the_cli_says_which_input_and_flag_and_runs_with_inputs(
    sample_models_dir: Path, speech: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = sample_models_dir / "vad_like.onnx"
    out = tmp_path / "stages"
    code, _, err = run(["split", model, "-k", "2", "--out", tmp_path / "random", "--cost", "static"], capfd)
    assert code == 2 and "'input' dim 1 = 16" in err and "--inputs FILE.npz" in err
    (line,) = err.splitlines()  # one line says it all: onnxruntime's own log (issue 39) is not printed
    assert line.startswith("onnxpipe split: error:") and "\x1b[" not in err
    assert "'input' dim 1 = 16" in line and "the only way to set the value of sr, an int64 scalar" in line
    code, stdout, err = run(
        ["split", model, "-k", "2", "--out", out, "--cost", "static", "--inputs", speech], capfd
    )
    assert code == 0, err
    assert "match the original" in stdout
    assert run(["verify", out, "--inputs", speech], capfd)[0] == 0
    code, _, err = run(["verify", out], capfd)
    assert code == 2 and "--inputs speech.npz" in err
    # the model named by a plain path: absolute, or relative to the current folder where it lies below
    # it (a clone under /tmp is reached from the split's folder by ../ steps), never stages/../../
    named = err.split("error: ", 1)[1].split(": the model itself fails", 1)[0]
    assert Path(named).resolve() == model.resolve() and ".." not in Path(named).parts
    code, _, err = run(["verify", out, "--inputs", speech, "--shape", "input=1,512"], capfd)
    assert code == 2 and "leave --shape out" in err
    profile = tmp_path / "p.json"
    code, stdout, err = run(
        [
            "profile",
            model,
            "--out",
            profile,
            "--runs",
            "2",
            "--warmup",
            "0",
            "--inputs",
            speech,
            "--inputs",
            speech,
        ],
        capfd,
    )
    assert code == 0, err
    assert "inputs: speech.npz (1 sample), speech.npz (1 sample)" in stdout
    assert [r["file"] for r in json.loads(profile.read_text())["inputs"]] == ["speech.npz", "speech.npz"]
    np.savez(tmp_path / "bad.npz", input=np.zeros((1, 512), np.float32), sr=np.array(16000))
    code, _, err = run(["verify", out, "--inputs", tmp_path / "bad.npz"], capfd)
    assert code == 2 and "no array for model input 'state'" in err


def test_a_measured_profile_retries_sequence_dims_at_a_larger_size(
    sample_models_dir: Path, tmp_path: Path
) -> None:
    view = load_model(sample_models_dir / "reflect_pad.onnx")
    prof = profile_model(view, runs=2, warmup=1)
    assert prof.input_shapes == {"x": (1, RETRY_SEQUENCE_SIZE)}
    assert any(f"sequence dims at {RETRY_SEQUENCE_SIZE}" in n for n in prof.unattributed)
    out = api.split(
        sample_models_dir / "reflect_pad.onnx",
        SplitOptions(
            out=tmp_path / "stages",
            plan=PlanRequest(2),
            profile=ProfileOptions(runs=2, warmup=1),
            verify=False,
        ),
    )
    assert out.manifest.plan.profiled_input_shapes == {"x": (1, RETRY_SEQUENCE_SIZE)}
    assert any(f"sequence dims at {RETRY_SEQUENCE_SIZE}" in n for n in out.manifest.plan.notes)
    # sizes the user gave are not guessed: no retry, and the way out is real inputs
    with pytest.raises(ProfileError, match=r"x=\[1, 8\].*`input_files=FILE.npz`") as info:
        profile_model(view, runs=2, warmup=1, shapes={"x": (1, 8)})
    assert "512" not in str(info.value)


def test_silero_vad_failing_at_a_size_says_one_line_with_the_flags_that_help(
    silero_vad_path: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, Silero VAD verified at a size it fails at: one line (not onnxruntime's coloured log
    first), the model's path without ``../`` steps, ``--inputs`` for ``sr`` (its value picks a branch,
    no ``--shape`` sets it)."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(silero_vad_path, models / "silero_vad.onnx")
    monkeypatch.chdir(tmp_path)
    out = Path("runs", "today", "vad3")
    code, _, err = run(
        ["split", models / "silero_vad.onnx", "-k", "2", "--out", out, "--cost", "static"], capfd
    )
    assert code == 0, err
    code, out_text, err = run(["verify", out, "--shape", "input=1,16"], capfd)
    assert code == 2 and out_text == ""
    (line,) = err.splitlines()
    assert "\x1b[" not in err and line.startswith("onnxpipe verify: error: models/silero_vad.onnx: ")
    assert "--shape input=1,16 --shape state=2,1,128 (edited), or real inputs with --inputs FILE.npz" in line
    assert line.endswith("(the only way to set the value of sr, an int64 scalar, which was random here)")
    assert "sr=" not in line.split("; ", 1)[1]
