"""The runtime per device: the devices file's ``runtime`` fields, the protocol's helpers, missing extras."""

from __future__ import annotations

import importlib
import re
from typing import Any

import numpy as np
import pytest

from onnxpipe.cluster.devicesfile import read_cluster
from onnxpipe.cluster.model import Device, device_type
from onnxpipe.core.choices import Runtime, choice
from onnxpipe.core.engine_tract import fact
from onnxpipe.core.errors import UsageError
from onnxpipe.core.runtimes import EngineConfig, bind_outputs, open_engine, require
from onnxpipe.cost.runtime_profile import match_layer
from onnxpipe.runtime.spec import placement_of


def _devices(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"devices": list(devices), "links": {"bandwidth_bytes_per_s": None, "latency_s": 0}}


def test_three_runtimes_are_read_with_their_settings() -> None:
    cluster = read_cluster(
        _devices(
            {
                "name": "ov",
                "runtime": "openvino",
                "openvino_device": "CPU",
                "threads": 2,
                "memory_bytes": None,
                "openvino_config": {"INFERENCE_PRECISION_HINT": "f32"},
            },
            {"name": "ort", "provider": "CPUExecutionProvider", "threads": 1, "memory_bytes": None},
            {"name": "tr", "runtime": "tract", "threads": 1, "memory_bytes": None},
        )
    )
    ov, ort, tr = cluster.devices
    assert [d.engine.runtime for d in (ov, ort, tr)] == [Runtime.OPENVINO, Runtime.ONNXRUNTIME, Runtime.TRACT]
    assert ov.engine_config().openvino_config == (("INFERENCE_PRECISION_HINT", "f32"),)
    assert ov.engine_config().threads == 2
    assert [d.engine.label for d in cluster.devices] == [
        "openvino (CPU)",
        "onnxruntime (CPUExecutionProvider)",
        "tract",
    ]
    # written back (into a manifest's cluster) and read again, the same devices
    again = read_cluster(cluster.to_obj())
    assert again.devices == cluster.devices
    assert "runtime" not in ort.to_obj()  # an onnxruntime device is written as before


def test_devices_of_other_runtimes_are_other_types() -> None:
    assert device_type(Device("a")) != device_type(Device("a", engine=EngineConfig(runtime=Runtime.TRACT)))
    assert device_type(Device("a", engine=EngineConfig(runtime=Runtime.OPENVINO))) != device_type(
        Device("a", engine=EngineConfig(runtime=Runtime.OPENVINO, openvino_device="GPU"))
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (
            {"runtime": "tensorrt"},
            "devices[0].runtime: string 'tensorrt' is not a runtime onnxpipe runs stages on",
        ),
        ({"runtime": "tract", "provider": "CPUExecutionProvider"}, "devices[0].provider: is onnxruntime's"),
        ({"runtime": "tract", "openvino_device": "GPU"}, "devices[0].openvino_device: is OpenVINO's"),
        ({}, "devices[0].provider: missing; a device run by onnxruntime names its execution provider"),
    ],
)
def test_runtime_fields_are_checked(device: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        read_cluster(_devices({"name": "d", "threads": 1, "memory_bytes": None, **device}), "devs.json")


def test_placement_carries_the_runtime() -> None:
    place = placement_of(
        Device("d", engine=EngineConfig(runtime=Runtime.OPENVINO, openvino_device="GPU", threads=3))
    )
    assert place.runtime == Runtime.OPENVINO and place.threads == 3 and place.uses_gpu
    assert place.runs_on == "openvino (GPU)"
    assert placement_of(Device("c")).runs_on == "CPUExecutionProvider"


def test_a_missing_runtime_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *args: Any) -> Any:
        if name == "tract":
            raise ImportError("No module named 'tract'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(UsageError, match=r"pip install 'onnxpipe\[tract\]'"):
        require(Runtime.TRACT)
    with pytest.raises(UsageError, match=r"runtime tract needs the tract package"):
        open_engine("stage_0.onnx", EngineConfig(runtime=Runtime.TRACT))


def test_a_runtime_choice_lists_the_choices() -> None:
    assert choice(Runtime, "openvino", "runtime") == Runtime.OPENVINO
    with pytest.raises(UsageError, match="`runtime=ov`: choose one of onnxruntime, openvino, tract"):
        choice(Runtime, "ov", "runtime")


def test_outputs_bound_by_the_files_order() -> None:
    assert bind_outputs(["b", "a"], ["a", "b"], [1, 2], "s.onnx") == [2, 1]
    with pytest.raises(UsageError, match=r"s\.onnx: has no output 'c'"):
        bind_outputs(["c"], ["a"], [1], "s.onnx")


def test_tract_facts() -> None:
    assert fact(np.zeros((2, 8), np.int64)) == "2,8,i64"
    assert fact(np.float32(1.0) * np.ones((), np.float32)) == "f32"
    with pytest.raises(ValueError, match="complex64"):
        fact(np.zeros(2, np.complex64))


def test_runtime_layers_are_matched_to_nodes() -> None:
    by_name = {"fc1.gemm": "fc1.gemm", "fc1.relu": "fc1.relu", "h1": "fc1.relu", "fc2.add": "fc2.add"}
    assert match_layer("fc1.gemm", by_name) == "fc1.gemm"  # a node's name
    assert match_layer("h1", by_name) == "fc1.relu"  # the tensor it computes
    assert match_layer("fc1.relu.low", by_name) == "fc1.relu"  # tract's suffixes
    assert match_layer("fc2.add.fix-rank.pack_b", by_name) == "fc2.add"
    assert match_layer("x_f32_bf16_fc1.gemm", by_name) == "fc1.gemm"  # OpenVINO's conversions
    assert match_layer("Multiply_18247", by_name) is None


def test_an_engine_runs_for_no_outputs_and_not_once_closed() -> None:
    """What every engine shares (:class:`~onnxpipe.core.runtimes.Engine`): no run for no outputs
    (onnxruntime would refuse one), and none once closed."""
    from onnxpipe.core.runtimes import Engine

    class Doubling(Engine):
        runtime = Runtime.ONNXRUNTIME
        released = False

        def _run(self, names: Any, feeds: Any) -> list[Any]:
            return [feeds["x"] * 2 for _ in names]

        def _release(self) -> None:
            self.released = True

    engine = Doubling(("x",), ("y",))
    assert engine.input_names == ("x",) and engine.output_names == ("y",)
    assert engine.run([], {"x": np.ones(1)}) == []
    assert engine.run(["y"], {"x": np.ones(1)})[0].tolist() == [2.0]
    engine.close()
    assert engine.released
    with pytest.raises(RuntimeError, match="closed"):
        engine.run(["y"], {"x": np.ones(1)})
