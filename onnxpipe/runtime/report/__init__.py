"""Measure a running pipeline and describe what it delivered: throughput, latency, each stage's time
against the manifest's estimate, the bottleneck, each worker's memory, and how it fares against running
the model without a pipeline (:mod:`.baselines`).  An interleaved split's stages share workers: the
report then also sums each worker's stages (:class:`.model.WorkerReport`).

:func:`.measure.measure` streams micro-batches through a pipeline after a warm-up and keeps every
output; :func:`.build.build_report` turns that into a :class:`.model.RunReport`, which
:meth:`.model.RunReport.to_obj` writes as JSON (``onnxpipe run --report``) and
:func:`.text.format_report` as text.  :mod:`.ceiling` says how fast a balanced pipeline could have run
on the machine as it was.
"""
