"""Running a split folder: one worker per stage, locally (threads or processes) or on a Ray cluster.

Where the workers run is one config per backend (:class:`~.base.LocalConfig`, :class:`~.base.RayConfig`).

>>> from onnxpipe.runtime import Pipeline                  # doctest: +SKIP
>>> with Pipeline.from_manifest("out/") as pipe:           # doctest: +SKIP
...     outputs = pipe.run(feeds)
>>> with Generator.open("stages/") as gen:                  # doctest: +SKIP
...     made = gen.generate([[3, 17, 42]], max_new_tokens=8)   # a decoder's split

``onnxpipe run DIR`` (:func:`onnxpipe.run`) measures a pipeline and, with ``--compare``, the
model without one; docs/runtime.md describes both.

Names are imported on first use (:mod:`onnxpipe.core.lazy`), as :mod:`onnxpipe` does: a light module of
this package (:mod:`.options`, which the door's options objects live in) then loads neither numpy nor
onnxruntime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxpipe.core.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BackendConfig": "onnxpipe.runtime.base",
    "LocalConfig": "onnxpipe.runtime.base",
    "RayConfig": "onnxpipe.runtime.base",
    "DEFAULT_LOCAL_MODE": "onnxpipe.runtime.options",
    "Job": "onnxpipe.runtime.pipeline",
    "Generation": "onnxpipe.runtime.generation.result",
    "Generator": "onnxpipe.runtime.generation.generator",
    "Pipeline": "onnxpipe.runtime.pipeline",
    "build_report": "onnxpipe.runtime.report.build",
    "Measurement": "onnxpipe.runtime.report.measure",
    "measure": "onnxpipe.runtime.report.measure",
    "RunReport": "onnxpipe.runtime.report.model",
    "format_report": "onnxpipe.runtime.report.text",
    "WorkerStats": "onnxpipe.runtime.session",
    "Placement": "onnxpipe.runtime.spec",
    "WorkerSpec": "onnxpipe.runtime.spec",
}

__all__ = [
    "DEFAULT_LOCAL_MODE",
    "BackendConfig",
    "Generation",
    "Generator",
    "Job",
    "LocalConfig",
    "Measurement",
    "Pipeline",
    "Placement",
    "RayConfig",
    "RunReport",
    "WorkerSpec",
    "WorkerStats",
    "build_report",
    "format_report",
    "measure",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

if TYPE_CHECKING:
    from onnxpipe.runtime.base import BackendConfig, LocalConfig, RayConfig
    from onnxpipe.runtime.generation.generator import Generator
    from onnxpipe.runtime.generation.result import Generation
    from onnxpipe.runtime.options import DEFAULT_LOCAL_MODE
    from onnxpipe.runtime.pipeline import Job, Pipeline
    from onnxpipe.runtime.report.build import build_report
    from onnxpipe.runtime.report.measure import Measurement, measure
    from onnxpipe.runtime.report.model import RunReport
    from onnxpipe.runtime.report.text import format_report
    from onnxpipe.runtime.session import WorkerStats
    from onnxpipe.runtime.spec import Placement, WorkerSpec
