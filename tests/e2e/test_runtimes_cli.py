"""The CLI on three runtimes: a 3-stage split whose devices name OpenVINO, onnxruntime and tract, run with
``--compare`` and verified on the devices' runtimes; ``profile --runtime``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run
from paths import DEVICES, REPO_ROOT

pytestmark = pytest.mark.slow


def test_run_a_split_on_three_runtimes_with_compare(
    sample_models_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "split"
    # the example's devices without profile_here: static costs, nothing measured before the split
    example = json.loads((DEVICES / "three_runtimes.json").read_text())
    for d in example["devices"]:
        del d["profile_here"]
    devices = tmp_path / "three_runtimes.json"
    devices.write_text(json.dumps(example))
    model = sample_models_dir / "resnet_tiny.onnx"
    code, stdout, err = run(
        ["split", model, "--stages", 3, "--devices", devices, "--cost", "static", "--out", out, "-q"], capfd
    )
    assert code == 0, err
    # split verified the stages where they will run
    assert (
        "stage 0 on openvino (CPU), stage 1 on onnxruntime (CPUExecutionProvider), stage 2 on tract" in stdout
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert [d.get("runtime", "onnxruntime") for d in manifest["cluster"]["devices"]] == [
        "openvino",
        "onnxruntime",
        "tract",
    ]
    code, stdout, err = run(["run", out, "--compare", "--microbatches", 8, "--warmup", 1], capfd)
    assert code == 0, err
    assert "outputs match the original model's" in stdout
    assert "the stages run on openvino (CPU), CPUExecutionProvider, tract" in stdout
    code, stdout, err = run(["verify", out, "--runtime", "devices"], capfd)
    assert code == 0, err
    assert "verify: 1 output(s) match the original" in stdout
    code, stdout, err = run(["verify", out, "--runtime", "openvino"], capfd)
    assert code == 0, err
    assert "stage 2 on openvino (CPU)" in stdout


def test_profile_on_tract(sample_models_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "tract.json"
    code, stdout, err = run(
        ["profile", sample_models_dir / "mlp.onnx", "--runtime", "tract", "--runs", 3, "--out", saved], capfd
    )
    assert code == 0, err
    assert "on tract" in stdout
    assert json.loads(saved.read_text())["runtime"] == "tract"
    code, _, err = run(
        [
            "profile",
            sample_models_dir / "mlp.onnx",
            "--runtime",
            "tract",
            "--openvino-device",
            "GPU",
            "--out",
            tmp_path / "x.json",
        ],
        capfd,
    )
    assert code == 2 and "--openvino-device is for --runtime openvino, not tract" in err


def test_the_gpu_check_skips_saying_why(tmp_path: Path) -> None:
    """``python -m benchmarks gpu`` without the provider it needs: the reason, exit 0, no result file."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "gpu",
            "--gpu-provider",
            "NoSuchExecutionProvider",
            "--out",
            tmp_path,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "onnxruntime providers: " in proc.stdout
    assert "gpu: skipped, --gpu-provider NoSuchExecutionProvider is not available here" in proc.stdout
    assert list(tmp_path.iterdir()) == []
