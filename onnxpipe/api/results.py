"""What each door returns, and the one JSON document a command's ``--json`` prints of it.

The documents use the manifest's field names: a script reading ``onnxpipe plan --json`` and a reader of
``manifest.json`` see the same names for the same things (``bottleneck_seconds``,
``estimated_compute_seconds``, ``schedule``...), so that a plan printed and a split written can be
compared field by field.  The schema is in docs/cli.md.  Every float follows the manifest's rule:
``+inf`` is written as ``null``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxpipe.core.codec import number as num
from onnxpipe.core.dims import Dim
from onnxpipe.ir.decoder import DecoderInfo
from onnxpipe.ir.decoder_dims import DecoderFacts
from onnxpipe.ir.load import ModelSummary
from onnxpipe.ir.model import ModelView
from onnxpipe.manifest import Manifest
from onnxpipe.manifest.layout import dumps, timeline_obj
from onnxpipe.planning.types import Plan, stage_boundary
from onnxpipe.runtime.generation.result import Generation
from onnxpipe.runtime.options import Sampling
from onnxpipe.runtime.report.cluster import GenerationCluster, recovery_obj
from onnxpipe.runtime.report.model import RunReport
from onnxpipe.runtime.report.model import num as finite  # a difference not finite (unequal shapes): null
from onnxpipe.verification.compare import OutputComparison
from onnxpipe.verification.verify import OnRuntime, VerifyReport

JSON_SCHEMA_VERSION = 1
"""The version of the documents below (``"json_schema_version"``), bumped on a change a reader of the
previous one would misread."""


def document(command: str, **parts: Any) -> str:
    """The one document a command prints: ``{"command": ..., "json_schema_version": ..., **parts}``,
    indented as ``manifest.json`` is (short lists on one line)."""
    return dumps({"command": command, "json_schema_version": JSON_SCHEMA_VERSION, **parts})


@dataclass(frozen=True)
class PlanResult:
    """What :func:`onnxpipe.plan` made: the plan, and the picture it drew (if asked)."""

    plan: Plan
    drawn: Path | None = None

    def to_json(self) -> str:
        return document("plan", plan=plan_obj(self.plan))


@dataclass(frozen=True)
class SplitResult:
    """What :func:`onnxpipe.split` produced: the plan, the manifest written, and the verification (if
    run)."""

    plan: Plan
    manifest: Manifest
    out_dir: Path
    report: VerifyReport | None

    @property
    def ok(self) -> bool:
        """Whether the split verified (True when it was not verified)."""
        return self.report is None or self.report.ok

    def to_json(self) -> str:
        verification = None if self.report is None else verification_obj(self.report)
        return document("split", manifest=self.manifest.to_obj(), verification=verification)


@dataclass(frozen=True)
class FolderInspection:
    """A split folder: its manifest, and what is wrong with its stage files (each one missing, or
    changed since the split; ``checked``: whether they were looked at)."""

    manifest: Manifest
    file_problems: tuple[str, ...] = ()
    checked: bool = False

    @property
    def ok(self) -> bool:
        """Whether the folder holds the stage files its manifest names, as they were written."""
        return not self.file_problems

    def to_json(self) -> str:
        files = None if not self.checked else list(self.file_problems)
        return document("inspect", manifest=self.manifest.to_obj(), file_problems=files)


@dataclass(frozen=True)
class ModelInspection:
    """A model: the model itself, its summary, and its KV cache if it is a decoder LLM."""

    view: ModelView
    summary: ModelSummary
    decoder: DecoderInfo | None
    facts: DecoderFacts | None = None
    """A decoder's dims, context and own config (:func:`onnxpipe.ir.decoder_dims.decoder_facts`)."""

    def to_json(self) -> str:
        return document("inspect", model=model_obj(self.summary))


Inspection = FolderInspection | ModelInspection


@dataclass(frozen=True)
class GenerateResult:
    """What :func:`onnxpipe.generate` made: each run's tokens and time (``pipeline``; with ``compare``,
    ``unsplit`` and ``replicas``), for ``stages`` stages on ``workers`` workers."""

    prompts: tuple[tuple[int, ...], ...]
    runs: Mapping[str, Generation]
    sampling: Sampling | None
    stages: int
    workers: int
    backend: str = "local"
    cluster: GenerationCluster | None = None
    """On Ray: each stage's node, each hop's share of a step's time, each lost actor brought back."""

    @property
    def tokens(self) -> tuple[tuple[int, ...], ...]:
        """The pipeline's new tokens of each prompt, in prompt order."""
        return self.runs["pipeline"].tokens

    @property
    def texts(self) -> tuple[str, ...] | None:
        """The pipeline's new tokens of each prompt as text, when the prompts were text."""
        return self.runs["pipeline"].texts

    @property
    def same(self) -> bool:
        """Whether every run made the pipeline's tokens."""
        return all(g.tokens == self.tokens for g in self.runs.values())

    def to_json(self) -> str:
        drawn = None if self.sampling is None else dataclasses.asdict(self.sampling)
        runs = {
            name: {
                "new_tokens": g.new_tokens,
                "seconds": num(g.seconds),
                "tokens_per_second": num(g.tokens_per_second),
                "steps": g.steps,
                "batch": g.batch,
                "time_to_first_token_seconds": num(g.time_to_first_token()),
                "time_per_token_seconds": {
                    "p50": num(g.time_per_token(0.5)),
                    "p90": num(g.time_per_token(0.9)),
                },
                "busy_shares": [num(b) for b in g.busy_shares],
                "rebuilt_sequences": g.rebuilt,
                "same_tokens": g.tokens == self.tokens,
            }
            for name, g in self.runs.items()
        }
        sequences = [list(t) for t in self.tokens]
        texts = None if self.texts is None else list(self.texts)
        cluster = None if self.cluster is None else _cluster_obj(self.cluster)
        return document(
            "generate",
            sequences=sequences,
            texts=texts,
            runs=runs,
            same=self.same,
            sampling=drawn,
            backend=self.backend,
            cluster=cluster,
        )


def _cluster_obj(cluster: GenerationCluster) -> dict[str, Any]:
    """A generation's cluster part: each stage's node, each hop's time and share, the recoveries."""
    return {
        "stages": [
            {
                "stage": stage,
                "node_id": node.node_id,
                "address": node.address,
                "host": node.host,
                "run_share": num(cluster.stage_shares[i]) if i < len(cluster.stage_shares) else None,
            }
            for i, (stage, node) in enumerate(zip(cluster.stages, cluster.nodes, strict=True))
        ],
        "hops": [
            {"source": h.source, "target": h.target, "median_ms": num(h.median_ms), "share": num(h.share)}
            for h in cluster.hops
        ],
        "recoveries": [recovery_obj(r) for r in cluster.recoveries],
    }


def plan_obj(plan: Plan) -> dict[str, Any]:
    """A plan with the field names of the manifest's ``plan``, ``stages`` and ``schedule``."""
    obj: dict[str, Any] = {
        "objective": plan.objective,
        "k": plan.k,
        "bottleneck_seconds": num(plan.bottleneck_seconds),
        "lower_bound_seconds": num(plan.lower_bound_seconds),
        "ratio_to_lower_bound": num(plan.ratio_to_lower_bound),
        "cost_source": plan.cost_source,
        "threads": plan.threads,
        "bandwidth_bytes_per_s": num(plan.bandwidth_bytes_per_s),
        "profiled_input_shapes": {k: list(v) for k, v in plan.input_shapes.items()},
        "notes": list(plan.notes),
        **(
            {}
            if plan.workers is None
            else {
                "workers": plan.workers,
                "time_slack": plan.time_slack,
                "worker_param_bytes": list(plan.worker_param_bytes or ()),
            }
        ),
        **({} if plan.link_model is None else {"link_model": plan.link_model}),
        **({} if plan.optimized_for is None else {"optimized_for": plan.optimized_for}),
        "latency_seconds": num(plan.latency_seconds),
        "stages": [
            {
                "index": s.index,
                "device": s.device,
                **({} if s.worker is None else {"worker": s.worker}),
                **(
                    {}
                    if not plan.boundary_dtypes
                    else {"boundary_dtype": stage_boundary(plan.boundary_dtypes, s)}
                ),
                "node_count": len(s.node_names),
                "estimated_compute_seconds": num(s.compute_seconds),
                "estimated_transfer_seconds": num(s.transfer_seconds),
                "bytes_in": s.bytes_in,
                "link_bytes_in": s.link_bytes_in,
                "bytes_out": s.bytes_out,
                "param_bytes": s.param_bytes,
                "peak_activation_bytes": s.peak_activation_bytes,
            }
            for s in plan.stages
        ],
    }
    if plan.stage_counts_tried:
        what = "latency_seconds" if plan.optimized_for == "latency" else "bottleneck_seconds"
        obj["stage_counts_tried"] = [{"k": k, what: num(seconds)} for k, seconds in plan.stage_counts_tried]
    if plan.timeline is not None:
        obj["schedule"] = timeline_obj(plan.timeline, [s.device for s in plan.stages])
    return obj


def verification_obj(report: VerifyReport) -> dict[str, Any]:
    """A verification: the verdict, the tolerance, the seed and shapes, and each output's differences
    from onnxruntime (``ok``: it passes, against onnxruntime or the whole model on the stages' runtime,
    ``on_runtime``)."""
    return {
        "ok": report.ok,
        "rtol": report.rtol,
        "atol": report.atol,
        "seed": report.seed,
        "runs": report.runs,
        "input_shapes": {k: list(v) for k, v in report.input_shapes.items()},
        "outputs": [
            {
                "name": o.name,
                "ok": report.passes(i),
                "rtol": o.rtol,
                "atol": o.atol,
                "max_abs_diff": finite(o.max_abs_diff),
                "max_rel_diff": finite(o.max_rel_diff),
            }
            for i, o in enumerate(report.outputs)
        ],
        "on_runtime": _on_runtime_obj(report.on_runtime),
        "notes": report.notes,
    }


def _on_runtime_obj(on: OnRuntime | None) -> dict[str, Any] | None:
    """The whole model on the stages' one runtime (null where they ran on onnxruntime on the CPU, or on
    several): per output, the stages against it and it against onnxruntime."""
    if on is None:
        return None

    def diffs(c: OutputComparison) -> dict[str, Any]:
        return {"ok": c.ok, "max_abs_diff": finite(c.max_abs_diff), "max_rel_diff": finite(c.max_rel_diff)}

    return {
        "runtime": on.label,
        "not_run": on.not_run,
        "outputs": [
            {"name": s.name, "stages_vs_whole": diffs(s), "whole_vs_onnxruntime": diffs(w)}
            for s, w in zip(on.stages, on.whole, strict=True)
        ],
    }


def verify_json(report: VerifyReport) -> str:
    """``verify --json``: the verification alone."""
    return document("verify", verification=verification_obj(report))


def run_json(report: RunReport) -> str:
    """``run --json``: the run's report, as ``run --report`` writes it."""
    return document("run", report=report.to_obj())


def model_obj(s: ModelSummary) -> dict[str, Any]:
    """``inspect MODEL``: the model's inputs and outputs (``shape`` as the manifest's ``model_inputs``
    write it: a list of sizes, symbol names and nulls, or null for an unknown rank), opsets, counts."""
    return {
        "name": s.name,
        "model_inputs": [{"name": t.name, "dtype": t.dtype, "shape": _shape(t.shape)} for t in s.inputs],
        "model_outputs": [{"name": t.name, "dtype": t.dtype, "shape": _shape(t.shape)} for t in s.outputs],
        "ir_version": s.ir_version,
        "opsets": {domain: version for domain, version in s.opsets},
        "node_count": s.node_count,
        "compute_node_count": s.compute_node_count,
        "param_bytes": s.param_bytes,
        "control_flow": [{"name": name, "op_type": op} for name, op in s.control_flow],
        "external_data": [{"file": f, "tensors": n} for f, n in s.external_data],
        "op_counts": dict(s.op_counts),
    }


def _shape(dims: tuple[Dim, ...] | None) -> list[Dim] | None:
    return None if dims is None else list(dims)
