"""Where a pipeline's workers run: threads of this process, processes joined by shared memory, or Ray
actors; each behind :class:`~onnxpipe.runtime.backends.lanes.Lanes`."""
