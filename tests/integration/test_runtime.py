"""Tests of onnxpipe.runtime: the pipeline equals the model, in order; failures stop it cleanly.

Each pipeline here runs on real worker processes (``spawn``) or threads over stage files written by
``onnxpipe.api.split``.  No test asserts on speed: benchmarks/bench_pipeline.py measures that.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing import active_children
from multiprocessing import connection as mpc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from manifest_edits import sealed
from onnx import TensorProto, helper
from runtime_support import (
    MODES,
    assert_no_workers_left,
    assert_same,
    devices_file,
    original_outputs,
    parse,
    reshape_batches,
    split_on_devices,
    stream_until_failure,
    token_batches,
)

from onnxpipe import api
from onnxpipe.api import PlanRequest, ProfileOptions, SplitOptions
from onnxpipe.cli import run as run_command
from onnxpipe.cluster.devicesfile import read_cluster
from onnxpipe.core.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import load_manifest
from onnxpipe.runtime.backends.ray_resources import actor_options, load_ray_resources
from onnxpipe.runtime.backends.shm import SHM_DIR, ItemMessage, SlotReader, SlotWriter, unlink_prefix
from onnxpipe.runtime.base import LocalConfig
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.session import StageFailure, StageRunner
from onnxpipe.runtime.spec import (
    Placement,
    WorkerSpec,
    manifest_placements,
    placement_for_device,
    placement_of,
    stage_specs,
)

# --------------------------------------------------------------------------------------------------
# the pipeline equals the model, in order


@pytest.mark.parametrize("mode", MODES)
def test_stream_equals_the_model_in_order(tiny_split: Path, sample_models_dir: Path, mode: str) -> None:
    batches = token_batches(40)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode)) as pipe:  # type: ignore[arg-type]
        pids = pipe.worker_pids()
        assert len(pids) == (2 if mode == "processes" else 0)
        actual = list(pipe.stream(batches))
        assert_same(expected[:1], [pipe.run(batches[0])])
        stats = pipe.stats()
    assert_same(expected, actual)
    assert [s.index for s in stats] == [0, 1]
    assert all(len(s.records) == 41 for s in stats)
    assert all(s.peak_rss_bytes and s.peak_rss_bytes > 0 for s in stats)
    assert_no_workers_left(pids, pipe)


def test_stream_keeps_order_with_many_slots_and_an_endless_source(
    tiny_split: Path, sample_models_dir: Path
) -> None:
    batches = token_batches(12, seed=3)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)

    def endless() -> Iterator[dict[str, np.ndarray]]:
        j = 0
        while True:
            yield batches[j % len(batches)]
            j += 1

    with Pipeline.from_manifest(tiny_split, LocalConfig(slots=4)) as pipe:
        got = []
        for out in pipe.stream(endless()):
            got.append(out)
            if len(got) == 36:
                break
        # the abandoned stream's micro-batches finish in the background; the pipeline still works
        assert_same(expected[:3], [pipe.run(b) for b in batches[:3]])
    assert_same(expected * 3, got)


def test_submit_from_many_threads(tiny_split: Path, sample_models_dir: Path) -> None:
    batches = token_batches(24, seed=5)
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    results: dict[int, dict[str, np.ndarray]] = {}
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:

        def client(start: int) -> None:
            for j in range(start, len(batches), 4):
                results[j] = pipe.submit(batches[j]).result(timeout=60)

        clients = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
    assert_same(expected, [results[j] for j in range(len(batches))])


def test_a_model_input_read_by_a_later_stage_is_forwarded(reshape_split: Path) -> None:
    manifest = load_manifest(reshape_split)
    specs = stage_specs(reshape_split, manifest, [Placement()] * manifest.k)
    last = specs[-1]
    assert "shape" in last.inputs, "the Reshape should be in the last stage"
    assert "shape" in specs[0].receives and "shape" in specs[0].sends
    assert specs[-1].sends == ("y",)


# --------------------------------------------------------------------------------------------------
# failures


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_stage_stops_the_pipeline_naming_stage_and_tensor(reshape_split: Path, mode: str) -> None:
    batches = reshape_batches(30, bad=7)
    pipe = Pipeline.from_manifest(reshape_split, LocalConfig(mode=mode))  # type: ignore[arg-type]
    pids = pipe.worker_pids()
    got, text = stream_until_failure(pipe, batches)
    assert "stage 1 (stage_1.onnx)" in text
    assert "micro-batch 7" in text
    assert "'reshape'" in text and "'y'" in text
    assert "shape int64[2]" in text
    assert len(got) <= 7
    assert pipe.failure is not None
    with pytest.raises(RuntimeStageError, match="stopped after a failure"):
        pipe.submit(batches[0])
    pipe.close()
    assert_no_workers_left(pids, pipe)


def test_a_killed_worker_stops_the_pipeline(tiny_split: Path) -> None:
    batches = token_batches(8)
    pipe = Pipeline.from_manifest(tiny_split, LocalConfig(mode="processes"))
    pids = pipe.worker_pids()
    list(pipe.stream(batches))
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(RuntimeStageError) as info:
        for _ in range(50):
            list(pipe.stream(batches))
    # the dead worker is named, not a neighbour that saw its channel close
    text = str(info.value)
    assert "stage 1 (stage_1.onnx)" in text and "killed by SIGKILL" in text, text
    pipe.close()
    assert_no_workers_left(pids, pipe)


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_while_streaming_stops_every_worker(tiny_split: Path, mode: str) -> None:
    batches = token_batches(4)
    pipe = Pipeline.from_manifest(tiny_split, LocalConfig(mode=mode))  # type: ignore[arg-type]
    pids = pipe.worker_pids()

    def interrupted() -> Iterator[dict[str, np.ndarray]]:
        yield from batches
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        list(pipe.stream(interrupted()))
    assert_no_workers_left(pids, pipe)
    with pytest.raises(UsageError, match="closed"):
        pipe.run(batches[0])


LEAVE_SCRIPT = """
import json, os, signal, sys, time
import numpy as np
from onnxpipe.runtime import LocalConfig, Pipeline

if __name__ == "__main__":
    pipe = Pipeline.from_manifest(sys.argv[1], LocalConfig(mode="processes"))
    pipe.run({"tokens": np.zeros((2, 16), np.int64)})
    print(json.dumps({"pids": pipe.worker_pids(), "prefix": pipe.backend.prefix}), flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "wait":
        time.sleep(120)
    # else: leave without closing the pipeline
"""


def wait_gone(pids: list[int], prefix: str, timeout: float = 15.0) -> tuple[list[int], list[str]]:
    """Pids still running (zombies count as gone) and segments still there after at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _running(p)]
        left = sorted(p.name for p in SHM_DIR.glob(prefix + "*"))
        if (not alive and not left) or time.monotonic() > deadline:
            return alive, left
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_workers_and_segments_go_when_the_caller_leaves(tiny_split: Path, tmp_path: Path, how: str) -> None:
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tiny_split), how],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    info = json.loads(proc.stdout.strip().splitlines()[0])
    assert len(info["pids"]) == 2
    assert wait_gone(info["pids"], info["prefix"]) == ([], [])
    assert "leaked" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_terminating_the_whole_process_group_leaves_nothing(tiny_split: Path, tmp_path: Path) -> None:
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_split), "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        os.killpg(proc.pid, signal.SIGTERM)  # what a terminal, timeout(1) or a supervisor does
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert wait_gone(info["pids"], info["prefix"]) == ([], [])


@pytest.mark.parametrize("mode", MODES)
def test_a_stage_that_does_not_load_is_named(tmp_path: Path, sample_models_dir: Path, mode: str) -> None:
    out = tmp_path / "split"
    api.split(
        sample_models_dir / "mlp.onnx",
        SplitOptions(out=out, plan=PlanRequest(2), profile=ProfileOptions(cost="static"), verify=False),
    )
    (out / "stage_1.onnx").write_bytes(b"not an onnx model")
    before = {p.pid for p in active_children()}
    with pytest.raises(RuntimeStageError, match=r"stage 1 \(stage_1.onnx\): does not load"):
        Pipeline.from_manifest(out, LocalConfig(mode=mode), check_files=False)  # type: ignore[arg-type]
    assert {p.pid for p in active_children()} <= before
    assert not list(SHM_DIR.glob(f"onnxpipe-{os.getpid()}-*"))


def test_feeds_are_checked_before_they_reach_a_worker(tiny_split: Path) -> None:
    with Pipeline.from_manifest(tiny_split, LocalConfig(mode="threads")) as pipe:
        with pytest.raises(UsageError, match="'tokens' is not in the feeds"):
            pipe.run({})
        with pytest.raises(UsageError, match="is float32, the model takes int64"):
            pipe.run({"tokens": np.zeros((2, 16), np.float32)})
        with pytest.raises(UsageError, match="'extra' is not a model input"):
            pipe.run({"tokens": np.zeros((2, 16), np.int64), "extra": np.zeros(1)})


# --------------------------------------------------------------------------------------------------
# shared memory


def test_channel_grows_slots_and_carries_objects_and_empty_tensors() -> None:
    data_r, data_w = mpc.Pipe(duplex=False)
    free_r, free_w = mpc.Pipe(duplex=False)
    prefix = f"onnxpipe-{os.getpid()}-unit"
    writer = SlotWriter(prefix, 2, data_w, free_r)
    reader = SlotReader(data_r, free_w)
    try:
        sent: list[dict[str, np.ndarray]] = [
            {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "e": np.zeros((0, 4), np.int64)},
            {"a": np.ones((512, 1024), np.float16)},  # 1 MiB: larger than the first segment
            {"s": np.array(["x", "yz"], dtype=object), "b": np.array([True, False])},
        ]
        for seq, tensors in enumerate(sent):
            assert writer.has_room()
            writer.send(seq, tensors)
            message = reader.recv()
            assert isinstance(message, ItemMessage) and message.seq == seq
            got = reader.copies(message)
            reader.release(message.slot)
            for name, value in tensors.items():
                assert got[name].dtype == value.dtype and np.array_equal(got[name], value)
        assert writer.has_room()
        writer.send(3, sent[0])
        writer.send(4, sent[0])
        assert not writer.has_room()  # both slots are out: backpressure
    finally:
        reader.close()
        writer.close()
    assert not list(SHM_DIR.glob(prefix + "*"))
    assert unlink_prefix(prefix) == 0


def test_a_channel_carries_what_a_frame_carries() -> None:
    """The shared-memory channel writes the data plane's frame: bfloat16 and the other ml_dtypes keep
    their dtype (not a void of their size), strided and Fortran-ordered arrays and numpy scalars arrive
    as arrays, and an ONNX sequence, a map and an absent optional keep their type (not stacked)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data_r, data_w = mpc.Pipe(duplex=False)
    free_r, free_w = mpc.Pipe(duplex=False)
    prefix = f"onnxpipe-{os.getpid()}-frame"
    writer = SlotWriter(prefix, 2, data_w, free_r)
    reader = SlotReader(data_r, free_w)
    arrays = {
        "bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "bf16_strided": np.ones((4, 4), dtype=ml_dtypes.bfloat16)[::2],
        "f8": np.array([0.5, -2.0], dtype=ml_dtypes.float8_e5m2),
        "complex": np.array([1 + 2j, 3j], dtype=np.complex64),
        "big_endian": np.arange(3, dtype=">i4"),
        "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "scalar": np.float32(2.5),
        "text": np.array(["a", "bc"]),
    }
    others = {"seq": [np.zeros(2, np.float32), np.ones(3, np.float32)], "map": [{"a": 1.0}], "none": None}
    try:
        writer.send(0, {**arrays, **others})  # type: ignore[dict-item]
        message = reader.recv()
        assert isinstance(message, ItemMessage)
        got = reader.copies(message)
        reader.release(message.slot)
        assert list(got) == [*arrays, *others]
        for name, value in arrays.items():
            expected = np.asarray(value)
            assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
            assert got[name].tobytes() == expected.tobytes(), name
        seq = got["seq"]
        assert isinstance(seq, list) and [a.shape for a in seq] == [(2,), (3,)]
        assert got["map"] == [{"a": 1.0}] and got["none"] is None
    finally:
        reader.close()
        writer.close()
    assert not list(SHM_DIR.glob(prefix + "*"))


def _sequence_stage(path: Path) -> Path:
    """A stage that takes a sequence (a boundary tensor of a cut after a SequenceConstruct) and an index."""
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    at = helper.make_tensor_value_info("i", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(
        [helper.make_node("SequenceAt", ["s", "i"], ["y"], name="at")], "g", [seq, at], [y]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_stage_fed_a_sequence_fails_with_its_own_error(tmp_path: Path) -> None:
    """onnxruntime's error on a stage whose input is a sequence reaches the caller as the stage's failure,
    the sequence named as a list among its inputs."""
    path = _sequence_stage(tmp_path / "stage_1.onnx")
    runner = StageRunner(WorkerSpec(1, "stage 1", str(path), ("s", "i"), ("s", "i"), ("y",), ("y",)))
    with pytest.raises(
        StageFailure, match=r"stage 1 failed on micro-batch 3.*\[inputs: s list, i int64\[\]\]"
    ):
        runner.run(3, {"s": [np.zeros(2, np.float32)], "i": np.array(5, np.int64)})


def test_run_hashes_each_stage_file_once(tiny_split: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpipe.manifest import manifest as manifest_module

    hashed: list[str] = []
    real = manifest_module.file_sha256

    def counted(path: Path) -> str:
        hashed.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(manifest_module, "file_sha256", counted)
    report = api.run(tiny_split, api.RunOptions(microbatches=2, warmup=0))
    stage_files = [st.file for st in load_manifest(tiny_split, check_files=False).stages]
    assert report.microbatches == 2
    assert sorted(hashed) == sorted(stage_files)


# --------------------------------------------------------------------------------------------------
# the command


def test_cli_run_with_compare_writes_the_report(
    tiny_split: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    outputs = tmp_path / "outputs.npz"
    code = run_command(
        parse(
            str(tiny_split),
            "-m",
            "12",
            "--warmup",
            "2",
            "--compare",
            "--report",
            str(report),
            "--outputs",
            str(outputs),
            "--local-mode",
            "processes",
        )
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "session_1_thread" in printed and "outputs match" in printed
    obj = json.loads(report.read_text())
    assert obj["throughput_per_s"] > 0
    assert obj["microbatches"] == 12 and obj["k"] == 2 and obj["mode"] == "processes"
    assert obj["bottleneck_stage"] in (0, 1)
    for stage in obj["stages"]:
        assert stage["measured_ms"] > 0
        assert stage["estimated_ms"] > 0
        assert stage["peak_rss_bytes"] > 0
        assert stage["model_rss_bytes"] > 0
        assert stage["microbatches"] == 12
    assert set(obj["baselines"]) == {"session_1_thread", "session_total_threads", "replicas"}
    for baseline in obj["baselines"].values():
        assert baseline["throughput_per_s"] > 0
    assert obj["baselines"]["replicas"]["workers"] == 2
    assert obj["baselines"]["replicas"]["peak_rss_bytes"] > 0
    assert obj["baselines"]["replicas"]["model_rss_bytes"] > 0
    # this model's runs take microseconds: what slows a replica is Python's per-call cost, not its CPU,
    # so no ceiling (benchmarks/bench_pipeline.py gives it on models of milliseconds)
    assert obj["baselines"]["replicas"]["balanced_ceiling"] is None and "ceiling:" not in printed
    # static costs: the estimates were made at no measured speed of the machine
    assert obj["machine_slowdown"] is None and obj["estimate_max_error_at_machine_speed"] is None
    assert "machine:" not in printed
    assert obj["outputs_match"] is True
    with np.load(outputs) as saved:
        assert saved["logits"].shape[0] == 12


def test_cli_run_with_inputs_file(tiny_split: Path, tmp_path: Path, sample_models_dir: Path) -> None:
    batches = token_batches(5, seed=9)
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, tokens=np.stack([b["tokens"] for b in batches]))
    outputs = tmp_path / "outputs.npz"
    code = run_command(parse(str(tiny_split), "--inputs-stacked", str(inputs), "--outputs", str(outputs)))
    assert code == 0
    expected = original_outputs(sample_models_dir / "transformer_tiny.onnx", batches)
    with np.load(outputs) as saved:
        assert_same(expected, [{"logits": saved["logits"][j]} for j in range(5)])
    # one micro-batch per file, as split reads its samples
    files = []
    for j, batch in enumerate(batches[:2]):
        files += ["--inputs", str(tmp_path / f"one_{j}.npz")]
        np.savez(tmp_path / f"one_{j}.npz", tokens=batch["tokens"])
    assert run_command(parse(str(tiny_split), *files, "--outputs", str(outputs))) == 0
    with np.load(outputs) as saved:
        assert_same(expected[:2], [{"logits": saved["logits"][j]} for j in range(2)])


def test_cli_run_of_a_copied_folder_needs_no_source_model(tiny_split: Path, tmp_path: Path) -> None:
    """The random inputs come from the stage files when the model the manifest names is not there."""
    copied = tmp_path / "copied"
    shutil.copytree(tiny_split, copied)
    manifest = json.loads((copied / "manifest.json").read_text())
    manifest["source"]["path"] = "elsewhere/transformer_tiny.onnx"
    (copied / "manifest.json").write_text(sealed(manifest))
    assert run_command(parse(str(copied), "-m", "4", "--warmup", "0")) == 0


def test_cli_run_refuses_a_malformed_inputs_file(tiny_split: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, other=np.zeros((2, 2, 16), np.int64))
    with pytest.raises(UsageError, match="has no array 'tokens'"):
        run_command(parse(str(tiny_split), "--inputs", str(inputs)))


# --------------------------------------------------------------------------------------------------
# placement and Ray options (no Ray needed)


def test_devices_map_to_providers() -> None:
    assert placement_for_device("cpu", 2) == Placement("CPUExecutionProvider", (), 2)
    assert placement_for_device("cpu3", 1).provider == "CPUExecutionProvider"
    gpu = placement_for_device("cuda:1", 1)
    assert gpu.provider == "CUDAExecutionProvider" and gpu.provider_options == (("device_id", "1"),)
    assert placement_for_device("DmlExecutionProvider", 1).provider == "DmlExecutionProvider"
    with pytest.raises(UsageError, match="devices file"):
        placement_for_device("tpu-pod", 1)


def test_cli_run_with_a_devices_file(tiny_split: Path, tmp_path: Path) -> None:
    devices = tmp_path / "devices.json"
    cpu = {"provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": None}
    devices.write_text(
        json.dumps(
            {
                "devices": [{"name": "a", **cpu}, {"name": "b", **cpu}],
                "links": [{"bandwidth_bytes_per_s": None, "latency_s": 0}],
            }
        )
    )
    report = tmp_path / "report.json"
    assert (
        run_command(parse(str(tiny_split), "--devices", str(devices), "-m", "3", "--report", str(report)))
        == 0
    )
    assert [s["threads"] for s in json.loads(report.read_text())["stages"]] == [1, 1]


def test_a_split_made_with_devices_runs_on_its_own_devices(
    tmp_path: Path, sample_models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: 'split --devices' wrote device names ('board-a') that 'run' could not map to providers."""
    cpu = "CPUExecutionProvider"
    out = split_on_devices(tmp_path, sample_models_dir, ("board-a", cpu, 2), ("board-b", cpu, 1))
    manifest = load_manifest(out)
    assert [st.device for st in manifest.stages] == ["board-a", "board-b"]
    assert manifest_placements(manifest) == [Placement(cpu, (), 2), Placement(cpu, (), 1)]
    assert manifest_placements(manifest, threads=3) == [Placement(cpu, (), 3)] * 2
    batches = token_batches(3)
    with Pipeline.from_manifest(out) as pipe:
        assert [s.placement.threads for s in pipe.lanes[0]] == [2, 1]
        got = pipe.run_many(batches)
    assert_same(original_outputs(sample_models_dir / "transformer_tiny.onnx", batches), got)
    report = tmp_path / "report.json"
    assert run_command(parse(str(out), "-m", "3", "--report", str(report))) == 0
    assert [s["threads"] for s in json.loads(report.read_text())["stages"]] == [2, 1]
    assert run_command(parse(str(out), "-m", "2", "--threads", "1", "--report", str(report))) == 0
    assert [s["threads"] for s in json.loads(report.read_text())["stages"]] == [1, 1]
    capsys.readouterr()


def test_a_manifest_built_in_code_is_checked_as_a_read_one_is(
    tmp_path: Path, sample_models_dir: Path
) -> None:
    """Pipeline.from_manifest takes a manifest the caller made (``manifest=``), which load_manifest never
    checked: a stage on a device its cluster lacks, or a model output no stage makes, is a UsageError
    naming it, before any worker starts (not a KeyError, or a pipeline whose results never come)."""
    cpu = "CPUExecutionProvider"
    out = split_on_devices(tmp_path, sample_models_dir, ("board-a", cpu, 1), ("board-b", cpu, 1))
    manifest = load_manifest(out)
    threads_before = threading.active_count()
    elsewhere = replace(manifest, stages=(manifest.stages[0], replace(manifest.stages[1], device="board-c")))
    with pytest.raises(UsageError, match="stage 1 runs on 'board-c', which is not a device of the manifest"):
        Pipeline.from_manifest(out, manifest=elsewhere)
    ghost = replace(manifest.model_outputs[0], name="ghost")
    unmade = replace(manifest, model_outputs=(*manifest.model_outputs, ghost))
    with pytest.raises(UsageError, match="model output 'ghost' is produced by no stage of the manifest"):
        Pipeline.from_manifest(out, manifest=unmade)
    assert threading.active_count() == threads_before and not active_children()


def test_a_provider_this_machine_lacks_is_named_before_any_worker_starts(
    tmp_path: Path, sample_models_dir: Path
) -> None:
    missing = [p for p in ort.get_all_providers() if p not in ort.get_available_providers()]
    if "CUDAExecutionProvider" not in missing:
        pytest.skip("this onnxruntime has CUDA")
    cpu = "CPUExecutionProvider"
    out = split_on_devices(
        tmp_path, sample_models_dir, ("host", cpu, 1), ("gpu-box", "CUDAExecutionProvider", 1)
    )
    threads_before = threading.active_count()
    with pytest.raises(UsageError) as info:
        Pipeline.from_manifest(out)
    message = str(info.value)
    assert "device 'gpu-box'" in message and "provider CUDAExecutionProvider" in message
    assert "is not available here" in message and "`RunOptions.devices=FILE`" in message
    assert threading.active_count() == threads_before and not active_children()
    # a devices file that maps the same names to an available provider runs it here
    here = devices_file(tmp_path / "here.json", ("host", cpu, 1), ("gpu-box", cpu, 1))
    assert run_command(parse(str(out), "-m", "2", "--devices", str(here))) == 0


def test_a_manifest_without_a_cluster_maps_device_names(tiny_split: Path) -> None:
    manifest = load_manifest(tiny_split)
    assert manifest.cluster is None
    assert manifest_placements(manifest) == [Placement("CPUExecutionProvider", (), manifest.plan.threads)] * 2
    renamed = replace(manifest, stages=(manifest.stages[0], replace(manifest.stages[1], device="cuda:1")))
    assert manifest_placements(renamed, threads=2) == [
        Placement("CPUExecutionProvider", (), 2),
        Placement("CUDAExecutionProvider", (("device_id", "1"),), 2),
    ]


def test_provider_options_reach_onnxruntime_as_json_writes_them() -> None:
    given = {"name": "g", "provider": "CUDAExecutionProvider", "threads": 1, "memory_bytes": None}
    given["provider_options"] = {"device_id": 1, "flag": True}
    dev = read_cluster({"devices": [given]}).devices[0]
    assert placement_of(dev) == Placement("CUDAExecutionProvider", (("device_id", "1"), ("flag", "true")), 1)
    assert placement_of(dev, 4).threads == 4
    with pytest.raises(UsageError, match="threads 0"):
        placement_of(dev, 0)


def test_ray_resources_file(tmp_path: Path, tiny_split: Path) -> None:
    path = tmp_path / "resources.json"
    path.write_text(
        json.dumps({"default": {"num_cpus": 1}, "stages": [{"resources": {"a": 1}}, {"num_gpus": 1}]})
    )
    res = load_ray_resources(path, 2)
    assert res == [{"num_cpus": 1, "resources": {"a": 1}}, {"num_cpus": 1, "num_gpus": 1}]
    manifest = load_manifest(tiny_split)
    spec = stage_specs(tiny_split, manifest, [Placement(threads=2)] * 2)[0]
    assert actor_options(spec, {})["num_cpus"] == 2
    assert actor_options(spec, res[0])["resources"] == {"a": 1}
    path.write_text(json.dumps({"stages": [{"cpus": 1}, {}]}))
    with pytest.raises(UsageError, match=r"stages\[0\].cpus: unknown key"):
        load_ray_resources(path, 2)
    path.write_text(json.dumps({"stages": [{}]}))
    with pytest.raises(UsageError, match="1 entries for a pipeline of 2 stages"):
        load_ray_resources(path, 2)


def test_an_output_the_last_stage_does_not_make_fails_the_pipeline_not_hangs_it(tiny_split: Path) -> None:
    """``Pipeline.start`` takes the output names from its caller; one that the last stage does not send
    back fails the micro-batch and the pipeline with a RuntimeStageError naming it, instead of a result
    that never comes (the driver used to drop the job before it read the outputs)."""
    manifest = load_manifest(tiny_split)
    specs = stage_specs(tiny_split, manifest, manifest_placements(manifest, 1))
    inputs = {t.name: t.dtype for t in manifest.model_inputs}
    with Pipeline.start([specs], input_types=inputs, output_names=["ghost"]) as pipe:
        job = pipe.submit(token_batches(1)[0])
        with pytest.raises(RuntimeStageError, match="the last stage sent back no 'ghost'"):
            job.result(timeout=60)
