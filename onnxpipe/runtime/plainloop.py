"""The unsplit model generating as a plain onnxruntime loop: the baseline a split's generation is honest
against.

A split is worth its cost only if it beats what a user would write without it: one session of the whole
model, in the caller's thread, the presents fed back as the next pasts.  Measured through the pipeline's
own machinery (a worker thread, queues, copies at every hop), the unsplit model looks slower than it is,
and the pipeline's gain larger.  So this loop runs the model where the caller is, with nothing between
the step and the session: each step goes straight to the model's runner (the same cache bookkeeping and
batching as a pipeline worker's, :class:`~onnxpipe.runtime.session.StageRunner`), with the same threads,
and its future is done when ``submit`` returns.

``InferenceSession.run`` with numpy arrays, not I/O binding: on the CPU provider, binding the cache as
``OrtValue`` s fed back step to step was measured side by side and made no step faster (the arrays
onnxruntime returns are already its own buffers), so it would only add code.  A GPU provider, where
binding keeps the cache on the device, would change that.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future

import numpy as np

from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.session import StageRunner, WorkerStats
from onnxpipe.runtime.spec import WorkerSpec


class PlainLoop:
    """The whole source model (``spec``: :func:`~onnxpipe.runtime.spec.model_generation_spec`) stepping in
    this thread, for a :class:`~onnxpipe.runtime.generation.generator.Generator` to drive as it drives a
    pipeline: one lane of one worker, whose steps are done when they are submitted."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.lanes = ((spec,),)
        self.runner = StageRunner(spec)
        self._steps = 0

    def submit(self, feeds: Mapping[str, np.ndarray], lane: int | None = None) -> Future[Tensors]:
        """Run one step now; the future is done when this returns."""
        fut: Future[Tensors] = Future()
        try:
            fut.set_result(self.runner.run(self._steps, feeds))
        except Exception as e:  # noqa: BLE001 - the step's failure is the future's, as a worker's would be
            fut.set_exception(e)
        self._steps += 1
        return fut

    def stats(self) -> list[WorkerStats]:
        """No worker's: the loop's time is the caller's (a :class:`Generation` of it has no busy shares)."""
        return []

    def reset_stats(self) -> None:
        """Nothing is recorded (:meth:`stats`)."""

    def close(self, graceful: bool = True) -> None:
        """Nothing runs between steps: nothing to stop."""
