"""The ground floor: what every step of the pipeline shares and nothing of onnxpipe's own is needed for.

One exception hierarchy (:mod:`.errors`), typed reading of JSON (:mod:`.jsonread`), sizes and rates
as people write them (:mod:`.units`), dims (:mod:`.dims`), file hashes and atomic writes
(:mod:`.files`), plain-text tables (:mod:`.text`), a progress bar (:mod:`.progress`) and the one place
that opens onnxruntime sessions (:mod:`.ortsession`).  Modules here import nothing of onnxpipe outside
``core``; importing them loads neither onnx nor onnxruntime (``ortsession`` loads onnxruntime).
"""
