"""The onnxruntime engine: one session at onnxpipe's settings (:mod:`onnxpipe.core.ortsession`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnxruntime as ort

from onnxpipe.core.choices import Runtime
from onnxpipe.core.ortsession import OptimizationLevel, Provider, open_session, session_options
from onnxpipe.core.runtimes import Engine, EngineConfig

CPU = "CPUExecutionProvider"


class OrtEngine(Engine):
    """An onnxruntime session as an :class:`~onnxpipe.core.runtimes.Engine`."""

    runtime = Runtime.ONNXRUNTIME

    def __init__(self, session: ort.InferenceSession) -> None:
        super().__init__(
            tuple(i.name for i in session.get_inputs()), tuple(o.name for o in session.get_outputs())
        )
        self._session: ort.InferenceSession | None = session

    def _run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        assert self._session is not None
        return list(self._session.run(list(names), dict(feeds)))

    def layer_seconds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        """None: onnxruntime's per-node costs come from its profiler, read by :mod:`onnxpipe.cost.measure`."""
        return None

    def _release(self) -> None:
        self._session = None


def providers_of(config: EngineConfig) -> list[Provider]:
    """The provider list for ``config``: its provider with its options, then the CPU as fallback."""
    providers: list[Provider] = [(config.provider, dict(config.provider_options))]
    if config.provider != CPU:
        providers.append(CPU)
    return providers


def runs_here(config: EngineConfig) -> bool:
    """Whether this onnxruntime has ``config``'s execution provider."""
    return config.provider in ort.get_available_providers()


def load(path: Path, config: EngineConfig) -> OrtEngine:
    options = session_options(threads=config.threads, level=cast(OptimizationLevel, config.level))
    return OrtEngine(open_session(path, options, providers_of(config)))
