"""What each node costs: measured with onnxruntime and mapped back to the original nodes, or counted.

:mod:`.profile` holds the result (:class:`~.profile.Profile`) and its file; :mod:`.measure` times the
model at deployment settings (:mod:`.trace`), matches the optimized graph back to the original
(:mod:`.valuematch`, :mod:`.anchors`, :mod:`.sketch`) and spreads each fused group's time over its
nodes (:mod:`.attribution`); :mod:`.static` counts FLOPs and bytes instead.  Imports ``core`` and ``ir``.
"""
