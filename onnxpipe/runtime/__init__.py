"""Running a split folder: one worker per stage, locally (threads or processes) or on a Ray cluster.

Where the workers run is one config per backend (:class:`~.base.LocalConfig`, :class:`~.base.RayConfig`).

>>> from onnxpipe.runtime import Pipeline                  # doctest: +SKIP
>>> with Pipeline.from_manifest("out/") as pipe:           # doctest: +SKIP
...     outputs = pipe.run(feeds)

``onnxpipe run DIR`` (:mod:`onnxpipe.cli.run`) measures a pipeline and, with ``--compare``, the
model without one; docs/runtime.md describes both.
"""

from onnxpipe.runtime.base import DEFAULT_LOCAL_MODE, BackendConfig, LocalConfig, RayConfig
from onnxpipe.runtime.driver import Job
from onnxpipe.runtime.pipeline import Pipeline
from onnxpipe.runtime.report.build import build_report
from onnxpipe.runtime.report.measure import Measurement, measure
from onnxpipe.runtime.report.model import RunReport
from onnxpipe.runtime.report.text import format_report
from onnxpipe.runtime.session import WorkerStats
from onnxpipe.runtime.spec import Placement, WorkerSpec

__all__ = [
    "DEFAULT_LOCAL_MODE",
    "BackendConfig",
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
