"""The runtime registry: one :class:`RuntimeKind` per runtime, the one place that knows what each runtime
is, needs and accepts, and :class:`EngineConfig`, how to open an engine for a stage.

Every room asks the registry (:func:`kind_of`) instead of comparing a :class:`Runtime` with a constant, so
that adding an engine is one entry in :data:`RUNTIMES` plus its engine module
(``onnxpipe/core/engine_<name>.py``: ``load`` and ``runs_here``) and the :class:`Runtime` choice that names
it.  This module loads nothing (no numpy, no runtime package), so that the devices file and the options
can ask it; opening an engine is :mod:`onnxpipe.core.runtimes`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onnxpipe.core.choices import Runtime

DEFAULT_OPENVINO_DEVICE = "CPU"

GPU_PROVIDERS = frozenset({"CUDAExecutionProvider", "ROCMExecutionProvider", "TensorrtExecutionProvider"})
"""onnxruntime's execution providers that run a stage on a GPU."""


@dataclass(frozen=True)
class RuntimeKind:
    """What onnxpipe knows of one runtime.

    ``package`` is the Python package its engine imports and ``extra`` onnxpipe's extra that installs it
    (None: onnxpipe depends on it).  ``reference``: the runtime the reference profile is measured on and
    verification runs by default, which a devices file leaves unsaid.  ``takes_provider``: a device
    names an execution provider and its options (onnxruntime's); ``takes_openvino_device``: an OpenVINO
    device and config.  ``owns_outputs``: the arrays a run returns are the caller's to keep (OpenVINO's
    may live in its infer request's buffers, which the next run reuses: a cache kept across steps is
    copied).  ``sends_shape_values``: a stage on it can send an integer it computed from shapes (tract
    cannot: it fails the stage that sends one, so the planner copies such values into the stage that
    reads them).  ``times_layers_itself``: its profiler times many iterations per report, so one report
    is enough.  ``genai``: ONNX Runtime GenAI can run a stage on it; ``triton_backend``: the Triton
    backend that serves its stages (None: none does, onnxruntime's serves them).
    """

    runtime: Runtime
    package: str
    extra: str | None
    reference: bool = False
    takes_provider: bool = False
    takes_openvino_device: bool = False
    owns_outputs: bool = False
    sends_shape_values: bool = True
    times_layers_itself: bool = False
    genai: bool = False
    triton_backend: str | None = None

    @property
    def name(self) -> str:
        """The runtime's name as devices files and flags spell it."""
        return self.runtime.value

    @property
    def engine_module(self) -> str:
        """The module that opens its engines (``load``) and says whether a config runs here
        (``runs_here``)."""
        return f"onnxpipe.core.engine_{self.name}"


RUNTIMES: Mapping[Runtime, RuntimeKind] = {
    Runtime.ONNXRUNTIME: RuntimeKind(
        Runtime.ONNXRUNTIME,
        package="onnxruntime",
        extra=None,
        reference=True,
        takes_provider=True,
        owns_outputs=True,
        genai=True,
        triton_backend="onnxruntime",
    ),
    Runtime.OPENVINO: RuntimeKind(
        Runtime.OPENVINO,
        package="openvino",
        extra="openvino",
        takes_openvino_device=True,
        genai=True,
        triton_backend="openvino",
    ),
    Runtime.TRACT: RuntimeKind(
        Runtime.TRACT, package="tract", extra="tract", sends_shape_values=False, times_layers_itself=True
    ),
}
"""Every runtime onnxpipe can run a stage on, by its choice."""


def kind_of(runtime: Runtime) -> RuntimeKind:
    """The registry's entry for ``runtime``."""
    return RUNTIMES[runtime]


@dataclass(frozen=True)
class EngineConfig:
    """How to open an engine for a stage: the runtime and its settings.

    ``provider``/``provider_options`` are onnxruntime's; ``openvino_device``/``openvino_config``
    OpenVINO's; ``threads`` is the intra-op threads of onnxruntime and OpenVINO's CPU plugin (tract runs a
    model on the calling thread).  ``level`` is onnxruntime's optimization level.
    """

    provider: str = "CPUExecutionProvider"
    provider_options: tuple[tuple[str, str], ...] = ()
    threads: int = 1
    runtime: Runtime = Runtime.ONNXRUNTIME
    openvino_device: str = DEFAULT_OPENVINO_DEVICE
    openvino_config: tuple[tuple[str, str], ...] = ()
    level: str = "ORT_ENABLE_ALL"

    @property
    def kind(self) -> RuntimeKind:
        """The registry's entry for the runtime."""
        return kind_of(self.runtime)

    @property
    def uses_gpu(self) -> bool:
        """Whether the stage runs on a GPU (an OpenVINO device other than the CPU counts)."""
        if self.kind.takes_provider:
            return self.provider in GPU_PROVIDERS
        return self.kind.takes_openvino_device and not self.openvino_device.upper().startswith("CPU")

    @property
    def label(self) -> str:
        """``"onnxruntime (CPUExecutionProvider)"``, ``"openvino (CPU)"`` or ``"tract"``."""
        if self.kind.takes_provider:
            return f"{self.kind.name} ({self.provider})"
        if self.kind.takes_openvino_device:
            return f"{self.kind.name} ({self.openvino_device})"
        return self.kind.name

    @property
    def runs_on(self) -> str:
        """What reports name as the stage's provider: onnxruntime's provider, or the runtime's label."""
        return self.provider if self.kind.takes_provider else self.label
