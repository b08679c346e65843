"""Run the stages of a split folder on OpenVINO or tract, chained by the manifest (tests only).

Outputs are bound by position, as the manifest's output order is normative: a runtime may rename them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from onnxpipe.manifest import load_manifest

Runner = Callable[[Path, Sequence[np.ndarray]], list[np.ndarray]]


def openvino_runner() -> Runner:
    import openvino as ov

    core = ov.Core()

    def run(path: Path, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # f32 throughout: by default OpenVINO may run in bf16/f16 where the CPU has it
        compiled = core.compile_model(core.read_model(str(path)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        result = compiled(list(inputs))
        return [np.asarray(result[o]) for o in compiled.outputs]

    return run


_TRACT_TYPES = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32", "bool": "bool"}


def tract_runner() -> Runner:
    import tract

    def run(path: Path, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        model = tract.onnx().load(str(path))
        for i, a in enumerate(inputs):  # the facts of this run: tract types every tensor before running
            model.set_input_fact(i, ",".join([*(str(d) for d in a.shape), _TRACT_TYPES[str(a.dtype)]]))
        for i in range(model.output_count()):  # declared symbols would clash with the concrete inputs
            model.set_output_fact(i, None)
        runnable = model.into_model().into_runnable()
        return [o.to_numpy() for o in runnable.run(list(inputs))]

    return run


def run_chain(
    folder: Path, feeds: Mapping[str, np.ndarray], runners: Sequence[Runner]
) -> dict[str, np.ndarray]:
    """Every stage of ``folder`` on ``runners[i % len(runners)]``; the model outputs by name."""
    manifest = load_manifest(folder)
    values: dict[str, np.ndarray] = dict(feeds)
    for st in manifest.stages:
        run = runners[st.index % len(runners)]
        got = run(folder / st.file, [values[i.name] for i in st.inputs])
        for out, v in zip(st.outputs, got, strict=True):
            values[out.name] = v
    return {o.name: values[o.name] for o in manifest.model_outputs}


def relative_error(expected: np.ndarray, actual: np.ndarray) -> float:
    """``|a - e| / |e|`` in the 2-norm (0 for two zero tensors)."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    assert e.shape == a.shape, (e.shape, a.shape)
    scale = float(np.linalg.norm(e))
    diff = float(np.linalg.norm(a - e))
    return diff / scale if scale else diff


def onnxruntime_runner() -> Runner:
    import onnxruntime as ort

    def run(path: Path, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        return [np.asarray(v) for v in sess.run(None, dict(zip(names, inputs, strict=True)))]

    return run


def made_of_shapes(model: onnx.ModelProto) -> frozenset[str]:
    """Tensors of ``model``'s main graph computed from shapes alone: the outputs of ``Shape`` and
    ``Size`` nodes, and of any node that reads nothing but such tensors, initializers and ``Constant``
    outputs (and at least one such tensor).  Written apart from the library's own analysis
    (:func:`onnxpipe.ir.shapevalues.shape_derived`), so that a test holds the library to it."""
    graph = model.graph
    known = {t.name for t in graph.initializer}
    made: set[str] = set()
    pending = list(graph.node)
    changed = True
    while changed:  # a file need not list its nodes in order
        changed = False
        rest = []
        for node in pending:
            reads = [t for t in node.input if t]
            if node.op_type == "Constant" or (reads and all(t in known for t in reads)):
                known.update(node.output)
            elif node.op_type in ("Shape", "Size") or (
                reads
                and all(t in known or t in made for t in reads)
                and not any(
                    a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
                )
                and not node.op_type.startswith("Random")
            ):
                made.update(node.output)
            else:
                rest.append(node)
                continue
            changed = True
        pending = rest
    return frozenset(made - known)
