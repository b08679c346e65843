"""The ONNX conformance cases, split: every multi-node case of the installed onnx package that
onnxruntime passes whole must also pass split into ``min(3, compute nodes)`` stages and chained.

Why: the node cases of ``onnx.backend.test`` are small models written by the people who define each
op, with inputs and expected outputs of their own; the ``*_expanded`` ones are whole functions spelled
out in plain nodes (sequences, optionals, control flow, shape arithmetic).  They exercise corners of
the exporter (boundary types, sequences crossing a cut, subgraphs reading outer values) that real
models reach only now and then.  Costs are static (``--cost static``): the cases are a few microseconds
each, and the point is that every cut onnxpipe may choose writes stages that load and chain correctly.

A case counts when it has at least two nodes that compute (``Constant`` nodes do not), and onnxruntime
runs the whole model to the expected outputs within the case's own tolerances; such a case must then
pass split too.  The split stages run on the case's own inputs and are compared with its expected
outputs at the same tolerances.

    python tools/conformance.py            # every case, one line per failure, then the count
    python tools/conformance.py -k affine  # the cases whose name holds 'affine'
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from onnxpipe.api import ExportOptions
from onnxpipe.core.errors import OnnxpipeError, error_line
from onnxpipe.cost.options import ProfileOptions
from onnxpipe.cost.source import get_profile
from onnxpipe.export.stages import export_stages
from onnxpipe.ir.load import view_from_proto
from onnxpipe.ir.samples import samples_from_feeds
from onnxpipe.planning.planner import plan
from onnxpipe.planning.request import PlanRequest
from onnxpipe.verification.chain import run_stage_by_stage

MAX_STAGES = 3

ort.set_default_logger_severity(3)  # a case onnxruntime fails whole is skipped, not printed


@dataclass(frozen=True)
class Case:
    """One conformance case: the model, its inputs by name, its expected outputs, its tolerances."""

    name: str
    model: onnx.ModelProto
    inputs: dict[str, Any]
    expected: list[Any]
    rtol: float
    atol: float

    @property
    def compute_nodes(self) -> int:
        return sum(1 for n in self.model.graph.node if n.op_type != "Constant")


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # "pass", "fail" (split breaks it), "skip" (not a case that counts)
    detail: str = ""


def cases(pattern: str = "", module: str = "") -> Iterator[Case]:
    """Every node case with at least two compute nodes whose name holds ``pattern``.  With ``module`` (one of
    onnx's node case modules, ``"sequence_map"`` for ``onnx.backend.test.case.node.sequence_map``) only that
    module is imported, which makes its cases in well under a second where making every case takes about
    ten: what a test collects at import stays cheap."""
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if module:  # a module's cases are made as it is imported, into the package's one list
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
            from onnx.backend.test.case.node import _NodeTestCases as loaded
        else:
            loaded = load_node_model_tests()
    for c in loaded:
        if pattern not in c.name or c.model is None or not c.data_sets:
            continue
        model = c.model
        inputs_raw, expected = c.data_sets[0]
        names = [i.name for i in model.graph.input]
        if len(inputs_raw) > len(names):
            continue
        case = Case(c.name, model, dict(zip(names, inputs_raw, strict=False)), list(expected), c.rtol, c.atol)
        if case.compute_nodes >= 2:
            yield case


def _close(expected: Any, actual: Any, rtol: float, atol: float) -> bool:
    """onnx's own comparison: numbers within rtol/atol, everything else equal; sequences element-wise."""
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            return False
        return all(_close(e, a, rtol, atol) for e, a in zip(expected, actual, strict=True))
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or expected.keys() != actual.keys():
            return False
        return all(_close(expected[k], actual[k], rtol, atol) for k in expected)
    if expected is None:
        return actual is None
    e = np.asarray(expected)
    a = np.asarray(actual)
    if e.shape != a.shape:
        return False
    if e.dtype.kind in "fc":
        try:
            np.testing.assert_allclose(a.astype(e.dtype), e, rtol=rtol, atol=atol)
        except AssertionError:
            return False
        return True
    if e.dtype.kind in "OSU":
        return bool(np.array_equal(e.astype(object), a.astype(object)))
    return bool(np.array_equal(e, a))


def _whole(case: Case) -> list[Any] | None:
    """The whole model's outputs on the case's inputs, or None when onnxruntime cannot run it."""
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        session = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs: list[Any] = session.run(None, case.inputs)
    except Exception:  # noqa: BLE001 - a case onnxruntime does not run is not counted
        return None
    return outs


def run_case(case: Case, scratch: Path) -> Outcome:
    """Split ``case`` into min(3, compute nodes) stages, chain them on its inputs, compare."""
    whole = _whole(case)
    if whole is None:
        return Outcome(case.name, "skip", "onnxruntime does not run it whole")
    if not _close(case.expected, whole, case.rtol, case.atol):
        return Outcome(case.name, "skip", "onnxruntime does not pass it whole")
    k = min(MAX_STAGES, case.compute_nodes)
    out = scratch / case.name
    try:
        view = view_from_proto(case.model)
        samples = samples_from_feeds(view, [case.inputs], f"{case.name} inputs")
        prof = get_profile(view, ProfileOptions(cost="static", inputs=samples))
        the_plan = plan(view, prof, PlanRequest(k))
        manifest = export_stages(
            view,
            the_plan,
            out,
            ExportOptions(force=True, source_name=f"{case.name}.onnx"),
            feeds=samples.first,
        )
        got = run_stage_by_stage(out, [case.inputs])[0]
    except OnnxpipeError as e:
        return Outcome(case.name, "fail", f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - report every failure and go on to the next case
        return Outcome(case.name, "fail", f"{type(e).__name__}: {error_line(e)}")
    names = [o.name for o in manifest.model_outputs]
    actual = [got[n] for n in names]
    if not _close(case.expected, actual, case.rtol, case.atol):
        return Outcome(case.name, "fail", f"split into {k} stages: outputs differ from the expected ones")
    return Outcome(case.name, "pass")


def run_all(pattern: str = "", among: Sequence[Case] | None = None) -> list[Outcome]:
    """Every case (of ``among`` if given) whose name holds ``pattern``, split and checked."""
    chosen = [c for c in among if pattern in c.name] if among is not None else list(cases(pattern))
    with tempfile.TemporaryDirectory(prefix="onnxpipe-conformance-") as tmp:
        return [run_case(c, Path(tmp)) for c in chosen]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only the cases whose name holds this text")
    parser.add_argument("-v", action="store_true", help="also list the cases skipped, and why")
    args = parser.parse_args(argv)
    outcomes = run_all(args.k)
    for o in outcomes:
        if o.status == "fail" or (args.v and o.status == "skip"):
            print(f"{o.status}: {o.name}: {o.detail}")
    counted = [o for o in outcomes if o.status != "skip"]
    passed = sum(1 for o in counted if o.status == "pass")
    print(f"{passed}/{len(counted)} cases pass split ({len(outcomes) - len(counted)} not counted)")
    return 0 if passed == len(counted) else 1


if __name__ == "__main__":
    sys.exit(main())
