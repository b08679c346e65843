"""The manifest's rules that span fields: stages numbered in order, edges that point backwards, names
that resolve, workers dealt out as the planner deals them.  Each failure names the JSON path at fault."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxpipe.core.jsonread import Document
from onnxpipe.manifest.entries import MODEL, MODEL_INPUT, MODEL_OUTPUT

if TYPE_CHECKING:  # annotations only: the manifest module calls this one
    from onnxpipe.manifest.manifest import Manifest


def _check_workers(m: Manifest, doc: Document) -> None:
    """Every stage has a worker exactly when ``plan.workers`` is given, each worker runs a stage, and
    stage ``s`` runs on worker ``s % workers`` (the only assignment the planner makes)."""
    fail = doc.fail
    given = [st.worker is not None for st in m.stages]
    if m.plan.workers is None:
        if any(given):
            raise fail(f"stages[{given.index(True)}].worker", "is given but plan.workers is not")
        if m.plan.time_slack != 0.0:
            raise fail("plan.time_slack", "is given but plan.workers is not")
        if m.schedule.workers is not None:
            raise fail("schedule.devices[0].worker", "is given but plan.workers is not")
        return
    workers = m.plan.workers
    if workers > m.k or m.k % workers:
        raise fail("plan.workers", f"{workers} workers cannot each run the same number of the {m.k} stages")
    for i, st in enumerate(m.stages):
        if st.worker is None:
            raise fail(f"stages[{i}].worker", "missing; plan.workers says the stages share workers")
        if st.worker != i % workers:
            raise fail(
                f"stages[{i}].worker", f"expected {i % workers} (stage s runs on worker s % {workers})"
            )
    sched = m.schedule.workers
    if sched is None:
        raise fail("schedule.devices[0].worker", "missing; plan.workers says the stages share workers")
    for i, w in enumerate(sched):
        if w != i % workers:
            raise fail(f"schedule.devices[{i}].worker", f"expected {i % workers}, the worker of stages[{i}]")


def check_consistency(m: Manifest, doc: Document) -> None:
    """Cross-field rules: stages numbered in order, edges that point backwards, names that resolve."""
    fail = doc.fail
    k = len(m.stages)
    if k == 0:
        raise fail("stages", "expected at least one stage, got none")
    if m.plan.k != k:
        raise fail("plan.k", f"says {m.plan.k} stages but 'stages' lists {k}")
    if len(m.schedule.stages) != k:
        raise fail("schedule.devices", f"lists {len(m.schedule.stages)} stages, expected {k}")
    _check_workers(m, doc)
    if m.cluster is not None:
        names = set(m.cluster.names)
        for i, st in enumerate(m.stages):
            if st.device not in names:
                raise fail(f"stages[{i}].device", f"{st.device!r} is not a device of 'cluster'")
    files: set[str] = set()
    model_inputs = {t.name for t in m.model_inputs}
    produced: dict[str, int] = {}
    for i, st in enumerate(m.stages):
        w = f"stages[{i}]"
        if st.index != i:
            raise fail(f"{w}.index", f"expected {i} (stages are listed in order), got {st.index}")
        if (st.external_data is None) != (st.external_data_sha256 is None):
            raise fail(f"{w}.external_data_sha256", "must be null exactly when external_data is null")
        for name in (st.file, st.external_data):
            if name is None:
                continue
            if name in files:
                raise fail(w, f"file {name} is listed twice")
            files.add(name)
        for j, t in enumerate(st.inputs):
            if t.source == MODEL:
                if t.name not in model_inputs:
                    raise fail(f"{w}.inputs[{j}].source", f"{t.name!r} is not a model input")
            elif produced.get(t.name) != t.source:
                raise fail(
                    f"{w}.inputs[{j}].source",
                    f"says stage {t.source} produces {t.name!r}, but no earlier stage output matches",
                )
        received = {t.name for t in st.inputs}
        for j, a in enumerate(st.same_values):
            if a.same_as not in received:
                raise fail(f"{w}.same_values[{j}].same_as", f"{a.same_as!r} is not an input of this stage")
            if a.name in received:
                raise fail(f"{w}.same_values[{j}].name", f"{a.name!r} is an input of this stage already")
        for j, out in enumerate(st.outputs):
            for c in out.consumers:
                if c != MODEL_OUTPUT and not (i < c < k):
                    why = f"there are only {k} stages" if c >= k else f"it does not come after stage {i}"
                    raise fail(f"{w}.outputs[{j}].consumers", f"lists stage {c}, but {why}")
            produced[out.name] = i
    for j, o in enumerate(m.model_outputs):
        if o.produced_by == MODEL_INPUT:
            if o.name not in model_inputs:
                raise fail(f"model_outputs[{j}].produced_by", f"{o.name!r} is not a model input")
        elif produced.get(o.name) != o.produced_by:
            raise fail(
                f"model_outputs[{j}].produced_by",
                f"says stage {o.produced_by} produces {o.name!r}, but that stage does not output it",
            )
