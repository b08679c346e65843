"""Does the split compute what the model computes?  The chained stages against the original.

:mod:`.chain` runs a split folder's stages one after another in this process; :mod:`.compare` holds
the tolerance rule; :mod:`.verify` runs both the original and the chain on the same inputs and reports
per output (:class:`~.verify.VerifyReport`).  Imports ``core``, ``ir`` and ``manifest``.
The room is not called ``verify``: that is the public function ``onnxpipe.verify``, which a
submodule of the same name would hide.
"""
