"""The fixed cost of one session call on this machine: what every stage pays per micro-batch on top of
its nodes.

A profile splits the whole model's run among its nodes, so the cost of calling a session at all (binding
the feeds, allocating the outputs, the executor's own work) is spread over the nodes once; a pipeline of
K stages pays it K times per micro-batch, once in each stage.  :func:`call_seconds` measures it once per
process and thread count (a session of one ``Identity`` on one float, the median of
:data:`RUNS` calls after a warm-up) and caches it; plans of measured costs add it to each stage's
estimate (:func:`onnxpipe.planning.workers.make_plan`, which takes it as an argument in tests, so that
nothing measured decides what a test asserts).
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper

from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.core.runtimes import median_seconds

RUNS = 200
"""Timed calls of the tiny session (about 2 ms in all)."""
WARMUP = 20


@functools.cache
def call_seconds(threads: int) -> float:
    """Median seconds of one call of a session that does (almost) nothing, at ``threads`` intra-op
    threads: the per-call cost a stage adds to what its nodes cost."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "call",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    session = open_session(model.SerializeToString(), session_options(threads=max(1, threads)))
    feed = {"x": np.zeros(1, dtype=np.float32)}
    return median_seconds(lambda: session.run(None, feed), runs=RUNS, warmup=WARMUP)
