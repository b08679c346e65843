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

from concurrent.futures import Future
from pathlib import Path

from onnxpipe.manifest import Manifest, load_manifest
from onnxpipe.runtime.base import Tensors
from onnxpipe.runtime.generate import Batching, Generation, StepFeeds, batch_size
from onnxpipe.runtime.generate import generate as generate_tokens
from onnxpipe.runtime.kvstate import PadSide
from onnxpipe.runtime.pipeline import generation_input_types
from onnxpipe.runtime.prompting import Prompting
from onnxpipe.runtime.session import StageRunner
from onnxpipe.runtime.spec import generation_io, model_generation_spec, padding_side, placement_for_device
from onnxpipe.verification.verify import source_model_path


class PlainLoop:
    """The whole source model of the split ``directory`` generating in this thread (``threads`` intra-op
    threads, default the plan's; ``model``: the source model, default the manifest's)."""

    def __init__(self, directory: str | Path, *, threads: int | None = None, model: str | Path | None = None):
        d = Path(directory)
        self.manifest: Manifest = load_manifest(d, check_files=False)
        self.io = generation_io(self.manifest, d)
        path = source_model_path(d, self.manifest, model)
        n = self.manifest.plan.threads if threads is None else threads
        self.spec = model_generation_spec(path, self.manifest, placement_for_device("cpu", n))
        self.runner = StageRunner(self.spec)
        self.input_types = generation_input_types(self.manifest, self.io)
        self.side: PadSide = padding_side([path])
        self._steps = 0
        self._next_sequence = 0

    def submit(self, feeds: Tensors, lane: int) -> Future[Tensors]:
        """Run one step now; the future is done when this returns."""
        fut: Future[Tensors] = Future()
        try:
            fut.set_result(self.runner.run(self._steps, feeds))
        except Exception as e:  # noqa: BLE001 - the step's failure is the future's, as a worker's would be
            fut.set_exception(e)
        self._steps += 1
        return fut

    def generate_with(self, prompting: Prompting) -> Generation:
        """The prompts settled for the split, generated here: every sequence in flight in one step unless
        ``batch`` says fewer (one device has one step at a time: it gains nothing from several groups)."""
        options = prompting.options
        feeds = StepFeeds(self.io, self.input_types)
        size = batch_size(options, 1, 1)
        if size > 1 and options.batch is None and not feeds.can_pad(self.side):
            size = 1
        first = self._next_sequence
        self._next_sequence += len(options.prompt_ids)
        result = generate_tokens(
            self.submit, 1, feeds, options, first_ident=first, batching=Batching(size, self.side)
        )
        return prompting.with_texts(result)
