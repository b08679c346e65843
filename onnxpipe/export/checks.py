"""What export refuses before it writes anything: models it cannot split, opsets onnxruntime cannot run,
output folders in use, and plans made for another model.  Cheap, so the CLI runs them before profiling."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import helper

from onnxpipe.core.errors import ExportError, ModelLoadError, error_line
from onnxpipe.core.ortsession import open_session, session_options
from onnxpipe.export.outdir import check_target, normalized
from onnxpipe.ir.model import ModelView
from onnxpipe.planning.types import Plan


def check_exportable(view: ModelView, out_dir: str | Path | None = None, *, force: bool = False) -> None:
    """Refuse early what :func:`export_stages` would refuse after profiling and partitioning.

    A model with ``training_info`` (:class:`ExportError`); an opset or IR version the installed
    onnxruntime cannot run (:class:`ModelLoadError`); with ``out_dir``, an output folder that exists and
    is not empty (without ``force``) or that holds the source model (:class:`ExportError`).  Cheap: it
    reads no weights and opens onnxruntime on a one-node model.
    """
    where = _where(view)
    if len(view.proto.training_info):
        raise ExportError(
            f"{where}: carries training_info ({len(view.proto.training_info)} training algorithm(s) bound to "
            "its weights), which cannot be split across stages; save the model without it "
            "(del model.training_info[:]) and split that"
        )
    check_runtime_opsets(view)
    if out_dir is not None:
        check_target(normalized(out_dir), force=force, protected=(view.path, view.base_dir))


_OPSET_TOO_NEW = re.compile(r"Opset (\d+) is under development.*domain (\S+) is till opset (\d+)")


def check_runtime_opsets(view: ModelView) -> None:
    """Raise :class:`ModelLoadError` when onnxruntime refuses the model's opset imports or IR version.

    Opens a one-node model with the same imports and IR version, so nothing of the model is read.
    """
    src = view.proto
    opsets = list(src.opset_import)
    if not any(o.domain in ("", "ai.onnx") for o in opsets):
        opsets.append(helper.make_opsetid("", 1))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "opset_probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    probe = helper.make_model(graph, opset_imports=opsets, ir_version=max(src.ir_version, 4))
    options = session_options(level="ORT_DISABLE_ALL", log_severity=4)
    try:
        open_session(probe.SerializeToString(), options)
    except Exception as e:
        text = str(e)
        too_new = _OPSET_TOO_NEW.search(text)
        where = _where(view)
        if too_new:
            version, domain, newest = too_new.groups()
            raise ModelLoadError(
                f"{where}: opset {version} of domain {domain} is newer than onnxruntime {ort.__version__} "
                f"runs (up to {newest}); re-export the model at opset {newest} or lower, or upgrade "
                "onnxruntime"
            ) from e
        imports = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in src.opset_import)
        raise ModelLoadError(
            f"{where}: onnxruntime {ort.__version__} cannot run a model with IR version {src.ir_version} "
            f"and opsets {imports} ({error_line(e)}); re-export the model for this onnxruntime or "
            "upgrade onnxruntime"
        ) from e


def _where(view: ModelView) -> str:
    return str(view.path) if view.path is not None else "model"


def check_plan(view: ModelView, plan: Plan) -> None:
    specs = plan.stages
    where = view.label
    if plan.model_sha256 != view.sha256:
        raise ExportError(
            f"{where}: the plan was made for another model (sha256 {plan.model_sha256[:12]}..., this "
            f"model {view.sha256[:12]}...); make the plan from this model"
        )
    if not specs:
        raise ExportError(f"{where}: the plan has no stages; make a plan with at least one stage")
    by_name = view.node_by_name
    seen: dict[str, int] = {}
    for spec in specs:
        for name in spec.node_names + spec.constant_nodes:
            if name not in by_name:
                raise ExportError(
                    f"{where}: stage {spec.index} names node {name!r}, which the model does not have; "
                    "make the plan from this model"
                )
        for name in spec.node_names:
            if name in seen:
                raise ExportError(
                    f"{where}: node {name!r} is in stage {seen[name]} and in stage {spec.index}; "
                    "each node must be in exactly one stage"
                )
            seen[name] = spec.index
        if not set(spec.skipped_nodes) <= set(spec.node_names):
            raise ExportError(
                f"{where}: stage {spec.index} skips a node it does not hold; make the plan from this model"
            )
        made = set(spec.inputs) | {t for n in spec.file_node_names for t in by_name[n].outputs}
        for alias in spec.aliases:
            if alias.same_as not in made:
                raise ExportError(
                    f"{where}: stage {spec.index} remakes {alias.name!r} from {alias.same_as!r}, which it "
                    "neither receives nor makes; make the plan from this model"
                )
    missing = [n.name for n in view.compute_nodes if n.name not in seen]
    if missing:
        raise ExportError(
            f"{where}: node {missing[0]!r} is in no stage ({len(missing)} nodes unplaced); "
            "make the plan from this model"
        )
    made = {t for s in specs for t in s.outputs} | set(view.inputs)
    for t in view.outputs:
        if t not in made:
            raise ExportError(
                f"{where}: model output {t!r} is produced by no stage; the plan is inconsistent with the "
                "model; make the plan from this model"
            )
