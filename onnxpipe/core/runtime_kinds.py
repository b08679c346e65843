"""How to open an engine for a stage (:class:`EngineConfig`), apart from :mod:`onnxpipe.core.runtimes`
(which loads numpy) so that the devices file can name it without loading it."""

from __future__ import annotations

from dataclasses import dataclass

from onnxpipe.core.choices import Runtime

DEFAULT_OPENVINO_DEVICE = "CPU"


@dataclass(frozen=True)
class EngineConfig:
    """How to open an engine for a stage: the runtime and its settings.

    ``provider``/``provider_options`` are onnxruntime's; ``openvino_device``/``openvino_config``
    OpenVINO's; ``threads`` is the intra-op threads of onnxruntime and OpenVINO's CPU plugin (tract runs a
    model on the calling thread).  ``level`` is onnxruntime's optimization level.
    """

    runtime: Runtime = Runtime.ONNXRUNTIME
    provider: str = "CPUExecutionProvider"
    provider_options: tuple[tuple[str, str], ...] = ()
    threads: int = 1
    openvino_device: str = DEFAULT_OPENVINO_DEVICE
    openvino_config: tuple[tuple[str, str], ...] = ()
    level: str = "ORT_ENABLE_ALL"

    @property
    def label(self) -> str:
        """``"onnxruntime (CPUExecutionProvider)"``, ``"openvino (CPU)"`` or ``"tract"``."""
        if self.runtime == Runtime.ONNXRUNTIME:
            return f"onnxruntime ({self.provider})"
        if self.runtime == Runtime.OPENVINO:
            return f"openvino ({self.openvino_device})"
        return "tract"
