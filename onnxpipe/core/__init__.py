"""The ground floor: what every step of the pipeline shares and nothing of onnxpipe's own is needed for.

One exception hierarchy (:mod:`.errors`), typed reading of JSON (:mod:`.jsonread`), sizes and rates as
people write them (:mod:`.units`), dims (:mod:`.dims`), file hashes and atomic writes (:mod:`.files`), a
layer's KV-cache tensor names (:mod:`.kv`), plain-text tables (:mod:`.text`), a progress bar
(:mod:`.progress`) and the one place that opens onnxruntime sessions (:mod:`.ortsession`); the runtimes a
stage can run on, behind one protocol (:mod:`.runtimes`, with :mod:`.engine_onnxruntime`,
:mod:`.engine_openvino` and :mod:`.engine_tract`).  Modules here import nothing of onnxpipe outside
``core``; importing them loads neither onnx nor onnxruntime (``ortsession`` and the onnxruntime engine load
onnxruntime; OpenVINO, tract and onnx, for a file's declared inputs and outputs, load only when an engine of
theirs is opened).
"""
