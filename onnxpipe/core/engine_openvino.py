"""The OpenVINO engine: OpenVINO reads the stage's ``.onnx`` file itself and compiles it for a device.

Its per-layer counters (``PERF_COUNT``) are what ``profile --runtime openvino`` maps back to nodes:
OpenVINO names most layers after the ONNX node or the tensor it computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.core.choices import Runtime
from onnxpipe.core.runtimes import OPENVINO_CPU_DEFAULTS, Engine, EngineConfig, bind_outputs, file_io


class OpenVinoEngine(Engine):
    """A model compiled by OpenVINO, with one infer request."""

    runtime = Runtime.OPENVINO

    def __init__(self, path: Path, config: EngineConfig) -> None:
        import openvino as ov

        self._path = path
        settings: dict[str, Any] = {}
        if config.openvino_device.upper().startswith("CPU"):
            settings.update(OPENVINO_CPU_DEFAULTS)
            settings["INFERENCE_NUM_THREADS"] = str(config.threads)
        settings.update(dict(config.openvino_config))
        settings["PERF_COUNT"] = "YES"  # per-layer counters cost little and make layer_seconds possible
        core = ov.Core()
        model = core.read_model(str(path))
        self._compiled: Any = core.compile_model(model, config.openvino_device, settings)
        self._request: Any = self._compiled.create_infer_request()
        super().__init__(*file_io(path))
        # OpenVINO keeps most of ONNX's tensor names, but not all (an input that feeds a Dropout takes
        # the Dropout's output name): a name it lost is bound by the file's position
        self._in_port = _ports(self._compiled.inputs, self.input_names)
        self._position = _ports(self._compiled.outputs, self.output_names)

    def _run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        result = self._request.infer(
            {p: feeds[n] for n, p in zip(self.input_names, self._in_port, strict=True) if n in feeds}
        )
        values = result.to_tuple()
        ordered = [np.asarray(values[p]) for p in self._position]
        return bind_outputs(names, self.output_names, ordered, str(self._path))

    def layer_seconds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        self.run(self.output_names, feeds)
        seconds: dict[str, float] = {}
        for info in self._request.profiling_info:
            t = info.real_time.total_seconds()
            if t > 0:
                seconds[info.node_name] = seconds.get(info.node_name, 0.0) + t
        return seconds

    def _release(self) -> None:
        self._request = None
        self._compiled = None


def _ports(ports: Sequence[Any], names: Sequence[str]) -> list[int]:
    """The port of each of ``names``: the one that carries the name, else the one at its position."""
    by_name: dict[str, int] = {}
    for i, port in enumerate(ports):
        for name in port.names:
            by_name.setdefault(name, i)
    return [by_name.get(n, i) for i, n in enumerate(names)]


def runs_here(config: EngineConfig) -> bool:
    """Whether OpenVINO sees ``config``'s device here (``GPU.1`` counts as ``GPU``)."""
    import openvino as ov

    wanted = config.openvino_device.split(".")[0].split(":")[0].upper()
    return wanted in {d.split(".")[0].upper() for d in ov.Core().available_devices}


def load(path: Path, config: EngineConfig) -> OpenVinoEngine:
    return OpenVinoEngine(path, config)
